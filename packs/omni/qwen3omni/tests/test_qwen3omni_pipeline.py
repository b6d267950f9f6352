"""Training for real: packing across modalities, the frozen-tower cache with DeepStack, full
Omni checkpoints with one tensor per expert, FSDP2, and the demo learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.data import read_samples
from mmcore.testing import infer_answers_held_out, stage_manifest, train_losses, two_processes_match_one
from mm_pack_qwen3omni.data import Encoder
from mm_pack_qwen3omni.family import Qwen3OmniData

TINY = ["--pack", "qwen3omni", "--preset", "tiny", "data.demo_samples=24"]


def encoded(model_dir: Path, data: Path, cfg: Qwen3OmniData) -> list[dict]:  # type: ignore[type-arg]
    import torch
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    encoder = Encoder(AutoTokenizer.from_pretrained(model_dir), WhisperFeatureExtractor.from_pretrained(model_dir), cfg)
    out = []
    for item in read_samples(data, cfg):
        enc = encoder.encode(item)
        out.append({"input_ids": torch.tensor(enc.input_ids), "labels": torch.tensor(enc.labels), **enc.tensors})
    return out


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_packed_batch_of_mixed_modalities_equals_padded(tiny_thinker: Path, wild: Path) -> None:
    """One packed row of samples with images, a video at 4 fps (fractional times), audio and text
    only: the same summed loss as padded rows and as each sample alone, so no attention or
    position leaks between packed samples (the router's loss left out: it is per micro-batch)."""
    import torch
    from transformers import AutoTokenizer

    from mm_pack_qwen3omni.family import FAMILY, packed_positions

    samples = encoded(tiny_thinker, wild, Qwen3OmniData(image_max_pixels=4096, video_fps=4))
    ids = FAMILY.token_ids_of(AutoTokenizer.from_pretrained(tiny_thinker))
    model = FAMILY.build_model(tiny_thinker).eval()
    with torch.no_grad():
        padded = FAMILY.loss_sum(model, FAMILY.collate(samples, ids), aux_coef=0)
        packed_batch = FAMILY.collate(samples, ids, pack=True)
        packed = FAMILY.loss_sum(model, packed_batch, aux_coef=0)
        alone = sum(FAMILY.loss_sum(model, FAMILY.collate([s], ids), aux_coef=0) for s in samples)
        times = packed_positions(model, packed_batch)[1]
    assert packed_batch["input_ids"].shape[0] == 1
    assert (times != times.round()).any()  # 6.5 position ids per temporal patch of the video
    assert packed.item() == pytest.approx(padded.item(), rel=1e-5)
    assert packed.item() == pytest.approx(alone.item(), rel=1e-5)


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_frozen_towers_cache_equals_running_them(omni, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Audio tower outputs and vision features with the DeepStack block's cached: the same
    losses as running the towers, and the export (mergers trained) identical on reload."""
    common = [*TINY, "training.freeze=[audio,vision]", "training.steps=3"]
    omni("run", *common, "--run-dir", "cached")
    omni("run", *common, "--run-dir", "live", "extract.enabled=false")
    extract = stage_manifest(tmp_path / "cached", "extract")["metrics"]
    assert extract["towers"] == ["audio", "vision"] and extract["unique_media"] == 48  # 24 clips + 24 images
    cached, live = train_losses(tmp_path / "cached"), train_losses(tmp_path / "live")
    assert list(cached) == [1, 2, 3]
    for step in cached:
        assert cached[step] == pytest.approx(live[step], rel=1e-5)
    assert stage_manifest(tmp_path / "cached", "export")["metrics"]["logits_max_abs_diff"] == 0.0


def test_full_omni_checkpoint_trains_and_exports_the_thinker(omni, tiny_thinker: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The hub's Qwen3-Omni holds ``thinker.*`` (one tensor per expert), ``talker.*`` and
    ``code2wav.*`` under a config nesting the thinker's: the thinker comes in (round trip
    bit-identical), trains, and exports as a thinker-only folder in the same expert layout."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

    full = tmp_path / "full"
    shutil.copytree(tiny_thinker, full)
    weights = load_file(str(full / "model.safetensors"))
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in weights  # save_pretrained's per-expert layout
    renamed = {f"thinker.{k}": v for k, v in weights.items()}
    renamed["talker.model.embed_tokens.weight"] = torch.ones(3, 4)  # another hidden size: not the thinker's
    renamed["code2wav.pre_transformer.norm.weight"] = torch.zeros(2)
    save_file(renamed, str(full / "model.safetensors"))
    Qwen3OmniMoeConfig(thinker_config=Qwen3OmniMoeThinkerConfig.from_pretrained(tiny_thinker).to_dict()).save_pretrained(full)
    assert json.loads((full / "config.json").read_text())["model_type"] == "qwen3_omni_moe"
    proc = omni("run", *TINY, "--model", str(full), "--run-dir", "r", "convert.verify=true", "training.steps=1", "evaluate.enabled=false")
    assert "bit-identical" in proc.stdout
    assert stage_manifest(tmp_path / "r", "convert")["metrics"]["tensors"] == len(weights) - 3 * 4 * 2 + 2 * 2  # 4 experts x 3 -> 2 fused, per layer
    export = tmp_path / "r/export/hf"
    assert json.loads((export / "config.json").read_text())["model_type"] == "qwen3_omni_moe_thinker"
    assert set(load_file(str(export / "model.safetensors"))) == set(weights)
    assert stage_manifest(tmp_path / "r", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(export)


@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # qwen2vl's and qwen3vl-moe's FSDP2 tests are the representative cases in `make test`
def test_two_process_fsdp2_matches_one_process(omni, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # the router's loss is per micro-batch (one of two samples vs two of one): left out here
    two_processes_match_one(omni, tmp_path, [*TINY, "training.steps=3", "training.moe_aux_loss_coef=0"])


@pytest.mark.compares_runs
def test_the_demo_learns_to_answer_from_image_and_audio(omni, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The demo preset as `mmcore run --pack qwen3omni` runs it."""
    omni("run", "--pack", "qwen3omni", "--run-dir", "demo")
    metrics = stage_manifest(tmp_path / "demo", "train")["metrics"]
    assert metrics["eval/accuracy@0"] <= 0.2  # chance is 1 in 12
    # The README's promise, 100%, is reached by 60% of the steps with every seed, CPU
    # instruction set and thread count tools/demo_matrix.py tried.
    assert metrics["eval/accuracy"] == 1.0, metrics
    assert stage_manifest(tmp_path / "demo", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = stage_manifest(tmp_path / "demo", "evaluate")["metrics"]  # greedy generate() on the export, batched
    assert evaluate["accuracy"] == evaluate["token_accuracy"] == 1.0, evaluate
    infer_answers_held_out(omni, tmp_path, checkpoints=("export",))  # `mmcore infer` on held-out image + audio conversations
