"""Qwen3-VL MoE: both hub layouts of the fused experts convert exactly, the router's auxiliary
loss is in the training loss, and the extract cache carries DeepStack."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch

from mmcore.data.mllm import Sample, Turn
from mmcore.testing.media import write_image, write_video
from mm_pack_qwen3vl.data import Encoder
from mm_pack_qwen3vl.family import ADAPTER, FAMILY, Qwen3VLData


def encoded_batch(model_dir: Path, tmp_path: Path) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """(one raw sample with an image and a video, the token ids collation needs)."""
    from transformers import AutoTokenizer

    write_image(tmp_path / "a.png", (200, 30, 30), (96, 64))
    write_video(tmp_path / "v.mp4")
    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = Encoder(tok, Qwen3VLData(image_max_pixels=96 * 64, video_max_pixels=64 * 64))
    sample = enc.encode(Sample("f", 0, [Turn("user", "<image><video>What?"), Turn("assistant", "red")], {"images": [tmp_path / "a.png"], "videos": [tmp_path / "v.mp4"]}))
    return {"input_ids": torch.tensor(sample.input_ids), "labels": torch.tensor(sample.labels), **sample.tensors}, FAMILY.token_ids_of(tok)


def test_experts_in_the_earlier_hub_layout_convert_and_round_trip_exactly(moe_dir: Path, tmp_path: Path) -> None:
    """Released Qwen3-VL-MoE checkpoints store experts [experts, in, out]; transformers 5 saves
    [experts, out, in]. Both load into the same model; the round trip gives back the source."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3VLMoeForConditionalGeneration

    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    legacy = tmp_path / "legacy"
    shutil.copytree(moe_dir, legacy)
    (shard,) = legacy.glob("*.safetensors")
    tensors = load_file(shard)
    experts = [k for k in tensors if ".mlp.experts." in k]
    assert len(experts) == 4 and all(tensors[k].shape[-1] != tensors[k].shape[-2] for k in experts)
    save_file({k: v.transpose(-1, -2).contiguous() if k in experts else v for k, v in tensors.items()}, shard, metadata={"format": "pt"})

    reference = Qwen3VLMoeForConditionalGeneration.from_pretrained(legacy).eval()  # transformers' own reading of the layout
    ids = torch.randint(0, 300, (1, 12))
    for source in (moe_dir, legacy):
        adapter = copy.deepcopy(ADAPTER)
        hf_to_dcp(source, tmp_path / f"dcp-{source.name}", adapter)
        model = FAMILY.build_model(moe_dir)
        load_converted(model, tmp_path / f"dcp-{source.name}")
        with torch.no_grad():
            assert torch.equal(model.eval()(input_ids=ids).logits, reference(input_ids=ids).logits), source
        back = tmp_path / f"back-{source.name}"
        dcp_to_hf(tmp_path / f"dcp-{source.name}", back, adapter)
        assert compare_hf(source, back, view_in_b=adapter.round_trip_tensor) == [], source
        assert compare_hf(moe_dir, back) == []  # exports are always in transformers 5's layout


def test_the_router_auxiliary_loss_is_part_of_the_training_loss(moe_dir: Path, tmp_path: Path) -> None:
    from mmcore.train.causal_lm import next_token_loss_sum

    raw, ids = encoded_batch(moe_dir, tmp_path)
    batch = FAMILY.collate([raw, raw], ids)
    model = FAMILY.build_model(moe_dir).eval()
    with torch.no_grad():
        out = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "mm_token_type_ids", *FAMILY.media_fields)}, output_router_logits=True)
        got = FAMILY.loss_sum(model, batch)
    assert out.aux_loss > 0.5  # 4 experts, 2 per token: the balanced minimum is 1
    coef = model.config.text_config.router_aux_loss_coef
    # per loss token, as transformers' own loss adds it to its token mean
    want = next_token_loss_sum(out.logits, batch["labels"]) + coef * out.aux_loss * batch["num_loss_tokens"]
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    assert (got - next_token_loss_sum(out.logits, batch["labels"])).item() == pytest.approx(coef * out.aux_loss.item() * batch["num_loss_tokens"], rel=1e-4)


@pytest.mark.parametrize("which", ["tiny_dir", "moe_dir"])
@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_loss_from_cached_features_equals_loss_from_pixels(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The cache holds the last block's and every DeepStack block's output; the mergers still run."""
    from mm_qwen_vision import split_items
    from mm_qwen_vision.deepstack import deepstack_features, use_cached_deepstack_vision

    model_dir = request.getfixturevalue(which)
    raw, ids = encoded_batch(model_dir, tmp_path)
    model = FAMILY.build_model(model_dir).eval()
    cached = dict(raw)
    with torch.no_grad():
        for pixels_name, grid_name in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
            cached[pixels_name] = torch.cat([deepstack_features(model.model.visual, p, g) for p, g in split_items(raw[pixels_name], raw[grid_name])])
        assert cached["pixel_values"].shape[-1] == 2 * model.config.vision_config.hidden_size  # last + one DeepStack block
        want = FAMILY.loss_sum(model, FAMILY.collate([raw], ids))
        cached_model = copy.deepcopy(model)
        use_cached_deepstack_vision(cached_model.model.visual)
        got = FAMILY.loss_sum(cached_model, FAMILY.collate([cached], ids))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
