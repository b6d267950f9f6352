"""Preprocessing equals transformers' Glm4vProcessor; images and videos never share a forward."""

from __future__ import annotations

import copy
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcore.data import Sample, Turn
from mmcore.testing.media import write_image, write_video
from mm_pack_glm4v.data import Encoder
from mm_pack_glm4v.family import FAMILY
from mm_qwen_vision import QwenVisionData, split_items, use_cached_vision


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def processor(tokenizer, cfg: QwenVisionData):  # type: ignore[no-untyped-def]
    """The family's processor on its PIL image processor; its video processor needs torchvision,
    so its video code is driven with the number it reads."""
    from transformers import Glm4vProcessor
    from transformers.processing_utils import ProcessorMixin

    from mm_pack_glm4v.data import image_processor

    class WithoutVideo(Glm4vProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):  # type: ignore[no-untyped-def]
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            self.video_processor = types.SimpleNamespace(merge_size=2)
            self.image_token, self.video_token = "<|image|>", "<|video|>"
            self.image_token_id, self.video_token_id = tokenizer.convert_tokens_to_ids(["<|image|>", "<|video|>"])
            self.video_start_id, self.video_end_id = tokenizer.convert_tokens_to_ids(["<|begin_of_video|>", "<|end_of_video|>"])

    return WithoutVideo(image_processor=image_processor(cfg.image_min_pixels, cfg.image_max_pixels), tokenizer=tokenizer, chat_template=tokenizer.chat_template)


def test_an_image_conversation_equals_the_processor(tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    write_image(tmp_path / "a.png", (10, 200, 30), size=(100, 70))
    cfg = QwenVisionData(image_max_pixels=84 * 84)
    encoded = Encoder(tokenizer, cfg).encode(Sample("x.json", 0, [Turn("user", "<image>What colour is the square?"), Turn("assistant", "green")], {"images": [tmp_path / "a.png"]}))
    proc = processor(tokenizer, cfg)
    text = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]}, {"role": "assistant", "content": [{"type": "text", "text": "green"}]}],
        tokenize=False,
    )
    want = proc(text=[text], images=[Image.open(tmp_path / "a.png").convert("RGB")], return_tensors="np")
    assert encoded.input_ids == want["input_ids"][0].tolist()
    assert np.array_equal(encoded.tensors["pixel_values"].numpy(), want["pixel_values"])
    assert encoded.tensors["image_grid_thw"].tolist() == want["image_grid_thw"].tolist()
    supervised = tokenizer.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != -100])
    assert supervised == "green<|endoftext|>"  # the answer and the end GLM's template leaves out


def test_a_video_is_frames_with_their_seconds_and_video_token_types(tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers.video_utils import VideoMetadata

    from mm_qwen_vision import sample_video

    write_video(tmp_path / "v.mp4", frames=12, fps=4)  # 3 s; at 2 fps: source frames 0 2 4 6 8 10
    cfg = QwenVisionData(video_max_pixels=56 * 56)
    encoded = Encoder(tokenizer, cfg).encode(Sample("x.json", 0, [Turn("user", "<video>What happens?"), Turn("assistant", "it grows")], {"videos": [tmp_path / "v.mp4"]}))
    grid = encoded.tensors["video_grid_thw"].tolist()
    video = sample_video(tmp_path / "v.mp4", cfg.video_fps, cfg.video_max_frames)
    proc = processor(tokenizer, cfg)
    metadata = VideoMetadata(total_num_frames=12, fps=video.source_fps, frames_indices=video.indices)
    expanded = proc.replace_video_token({"video_grid_thw": np.array(grid), "video_metadata": [metadata]}, 0)
    assert expanded.count("<|begin_of_image|>") == 3 and expanded.endswith("<|end_of_image|>2")  # frames 0, 4, 8 -> seconds 0, 1, 2
    text = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}, {"role": "assistant", "content": [{"type": "text", "text": "it grows"}]}], tokenize=False
    )
    want = tokenizer(text.replace("<|video|>", expanded, 1), add_special_tokens=False)["input_ids"]
    assert encoded.input_ids == want
    batch = FAMILY.collate([{"input_ids": torch.tensor(encoded.input_ids), "labels": torch.tensor(encoded.labels), **encoded.tensors}], FAMILY.token_ids_of(tokenizer))
    assert batch["mm_token_type_ids"].tolist()[0] == proc.create_mm_token_type_ids([encoded.input_ids])[0]


def test_images_and_videos_are_kept_apart(tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.data import MediaError

    write_image(tmp_path / "a.png", (255, 0, 0))
    write_video(tmp_path / "v.mp4")
    both = Sample("x.json", 3, [Turn("user", "<image><video>?"), Turn("assistant", "a")], {"images": [tmp_path / "a.png"], "videos": [tmp_path / "v.mp4"]})
    with pytest.raises(MediaError, match="images or videos in one sample, not both"):
        Encoder(tokenizer, QwenVisionData()).encode(both)

    class Samples:  # preprocess's index: each sample's media fields
        media = [["image_grid_thw", "pixel_values"], ["pixel_values_videos", "video_grid_thw"], []]

        def meta(self, i: int) -> dict:  # type: ignore[type-arg]
            return {"media": self.media[i]}

    key = FAMILY.group_of(Samples())
    assert key(0) == key(2) != key(1)  # the trainer's sampler makes micro-batches of one key


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_packed_and_cached_losses_equal_the_padded_loss_from_pixels(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:
    """Packing (M-RoPE restarted per sample, the varlen kernel) and the frozen-vision cache
    (the downsampled tower output; the merger still runs) change no loss."""
    from mmcore.train import use_packed_attention, varlen_attention

    write_image(tmp_path / "a.png", (200, 30, 30), (84, 56))
    write_video(tmp_path / "v.mp4")
    enc = Encoder(tokenizer, QwenVisionData(image_max_pixels=84 * 56, video_max_pixels=56 * 56))
    raw = []
    for i, (turn, media) in enumerate([("<image>What?", {"images": [tmp_path / "a.png"]}), ("Hello there, how are you?", {}), ("<image>And this?", {"images": [tmp_path / "a.png"]})]):
        e = enc.encode(Sample("f", i, [Turn("user", turn), Turn("assistant", "red")], media))
        raw.append({"input_ids": torch.tensor(e.input_ids), "labels": torch.tensor(e.labels), **e.tensors})
    ids = FAMILY.token_ids_of(tokenizer)
    model = FAMILY.build_model(tiny_dir).eval()
    packed_model = copy.deepcopy(model)
    use_packed_attention(packed_model, varlen_attention)
    with torch.no_grad():
        want = FAMILY.loss_sum(model, FAMILY.collate(raw, ids))
        assert FAMILY.loss_sum(packed_model, FAMILY.collate(raw, ids, pack=True)).item() == pytest.approx(want.item(), rel=1e-5)
        cached = [
            dict(r, pixel_values=torch.cat([model.model.visual(p, grid_thw=g).last_hidden_state for p, g in split_items(r["pixel_values"], r["image_grid_thw"])])) if "pixel_values" in r else r
            for r in raw
        ]
        cached_model = copy.deepcopy(model)
        use_cached_vision(cached_model.model.visual)
        assert FAMILY.loss_sum(cached_model, FAMILY.collate(cached, ids)).item() == pytest.approx(want.item(), rel=1e-6)


def test_an_export_of_glm45v_stores_experts_as_its_save_pretrained_does(tmp_path: Path) -> None:
    """Per-expert on the hub (what GLM-4.5V ships and transformers writes), fused in training."""
    from safetensors import safe_open

    from mmcore.train import load_converted
    from mmcore.engines import dcp_to_hf, hf_to_dcp
    from mm_pack_glm4v.family import ADAPTER
    from mm_pack_glm4v.tiny import build_init_checkpoint

    build_init_checkpoint("tiny-moe", tmp_path / "hub", seed=0)
    hf_to_dcp(tmp_path / "hub", tmp_path / "dcp", ADAPTER)
    model = FAMILY.build_model(tmp_path / "hub")
    load_converted(model, tmp_path / "dcp")
    fused = model.state_dict()["model.language_model.layers.1.mlp.experts.gate_up_proj"]
    with safe_open(str(tmp_path / "hub/model.safetensors"), "pt") as hub:
        gate, up = hub.get_tensor("model.language_model.layers.1.mlp.experts.2.gate_proj.weight"), hub.get_tensor("model.language_model.layers.1.mlp.experts.2.up_proj.weight")
    assert torch.equal(fused[2], torch.cat([gate, up]))
    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", ADAPTER)
    with safe_open(str(tmp_path / "back/model.safetensors"), "pt") as back, safe_open(str(tmp_path / "hub/model.safetensors"), "pt") as hub:
        assert set(back.keys()) == set(hub.keys())


def test_lora_on_glm45v_mlp_names_is_a_clear_error_not_other_layers(tmp_path: Path) -> None:
    """peft 0.21 moved targets named like MLP projections onto GLM-4.5V's fused experts: that is
    a clear error; peft 0.22 adapts the planned layer (then exactly it, no other)."""
    from peft.tuners.lora import LoraLayer

    from mmcore import StageError
    from mmcore.train.lora import LoraPlan, inject
    from mm_pack_glm4v.tiny import build_init_checkpoint

    build_init_checkpoint("tiny-moe", tmp_path / "hub", seed=0)
    model = FAMILY.build_model(tmp_path / "hub")
    planned = "model.language_model.layers.1.mlp.shared_experts.down_proj"
    try:
        model = inject(model, LoraPlan(r=4, alpha=8, dropout=0.0, init="default", targets=[planned]))
    except StageError as error:  # peft 0.21
        assert "peft adapted other layers than the ones planned" in str(error)
    else:
        adapted = {n for n, m in model.named_modules() if isinstance(m, LoraLayer) and not n.endswith(".base_layer")}
        assert [n.removeprefix("base_model.model.") for n in adapted] == [planned], adapted
    attention = [n for n, _ in FAMILY.build_model(tmp_path / "hub").named_modules() if n.endswith("self_attn.q_proj")]
    inject(FAMILY.build_model(tmp_path / "hub"), LoraPlan(r=4, alpha=8, dropout=0.0, init="default", targets=attention))
