"""Frozen-vision feature cache: training from the cache computes the same loss as from pixels."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from mm_pack_qwen2vl.config import Qwen2VLData
from mm_pack_qwen2vl.data import Encoder
from mm_pack_qwen2vl.family import use_cached_vision
from mm_qwen_vision import split_items
from mm_pack_qwen2vl.family import FAMILY
from mmcore.data import Sample, Turn
from mmcore.testing.media import write_image, write_video


@pytest.mark.parametrize("which", ["tiny_dir", "tiny25_dir"])
@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_loss_from_cached_features_equals_loss_from_pixels(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model_dir = request.getfixturevalue(which)
    write_image(tmp_path / "a.png", (200, 30, 30), (84, 56))
    write_video(tmp_path / "v.mp4")
    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = Encoder(tok, Qwen2VLData(image_max_pixels=84 * 56, video_max_pixels=56 * 56))
    sample = enc.encode(Sample("f", 0, [Turn("user", "<image><video>What?"), Turn("assistant", "red")], {"images": [tmp_path / "a.png"], "videos": [tmp_path / "v.mp4"]}))
    raw = {"input_ids": torch.tensor(sample.input_ids), "labels": torch.tensor(sample.labels), **sample.tensors}
    ids = FAMILY.token_ids_of(tok)
    model = FAMILY.build_model(model_dir).eval()
    cached = dict(raw)
    with torch.no_grad():
        for pixels_name, grid_name in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
            parts = [model.model.visual(p, grid_thw=g).last_hidden_state for p, g in split_items(raw[pixels_name], raw[grid_name])]
            cached[pixels_name] = torch.cat(parts)
        want = FAMILY.loss_sum(model, FAMILY.collate([raw], ids))
        got = FAMILY.loss_sum(use_cached_vision(copy.deepcopy(model)), FAMILY.collate([cached], ids))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_extract_runs_only_with_a_frozen_vision_tower(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    args = ["--pack", "qwen2vl", "--preset", "tiny", "data.demo_samples=16", "training.steps=2"]
    proc = mm("run", *args, "training.freeze=[vision]")
    extract = json.loads((tmp_path / "runs/qwen2vl-tiny/extract/manifest.json").read_text())
    assert extract["status"] == "finished" and extract["metrics"]["unique_media"] == 16
    assert "cached vision features" in proc.stdout
    proc = mm("run", *args, "training.freeze=[vision]")
    assert "[extract] skipped: up to date" in proc.stdout  # an unchanged rerun does no work
    proc = mm("run", *args)
    assert "[extract] skipped: declined by the qwen2vl pack" in proc.stdout and "[train] running" in proc.stdout
