"""Sequence packing: DeepSeek-OCR-2's decoder takes 1-D positions and a causal mask, so a packed
row (restarting positions, the core's ``varlen_attention``) must equal the padded batch and each
sample alone. The vision tower runs per view (global views, tiles) whatever the packing, and the
MoE routes each token on its own (no capacity limit, no router loss), so nothing else crosses
samples."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from mmcore.testing.packing import each_sample_equals_it_alone, mixed_rows, packed_copy, packed_equals_padded, packed_training_matches_padded
from mm_pack_deepseek_ocr2.family import FAMILY, DeepseekOcr2Config, encoder


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return mixed_rows(FAMILY, encoder, DeepseekOcr2Config(), tiny_dir, tmp_path_factory.mktemp("media"), question="Free OCR.")


@pytest.mark.compares_runs
def test_packed_row_equals_the_padded_batch_and_each_sample_alone(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """Tolerances as :mod:`mmcore.testing.packing` states them (fp32); every expert and the tower learn."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir)
    packed_net = packed_copy(model)
    packed = FAMILY.collate(data, ids, pack=True)
    assert packed["pixel_values_local"].shape[0] == 2 and packed["num_local_patches"].tolist() == [2, 0]
    grads = packed_equals_padded(FAMILY, model, data, ids, packed_net=packed_net)
    assert any(".experts." in n for n in grads) and any("sam_encoder" in n for n in grads)
    each_sample_equals_it_alone(FAMILY, model, packed_net, data, ids)


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_loss_from_cached_vision_features_equals_loss_from_pixels(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """The frozen-vision cache (extract: the tower's query features per view; projector and
    separator still run) changes no loss, global views and tiles alike."""
    from mm_pack_deepseek_ocr2.extract import VIEWS, use_cached_vision, vision_features

    data, ids = batches
    model = FAMILY.build_model(tiny_dir).eval()
    with torch.no_grad():
        want = FAMILY.loss_sum(model, FAMILY.collate(data, ids))
        cached = [dict(s, **{f: torch.cat([vision_features(model, v) for v in s[f]]) for f in VIEWS if f in s}) for s in data]
        got = FAMILY.loss_sum(use_cached_vision(copy.deepcopy(model)), FAMILY.collate(cached, ids))
    assert "pixel_values_local" in FAMILY.collate(cached, ids) and got.item() == pytest.approx(want.item(), rel=1e-6)


@pytest.mark.compares_runs
def test_packed_training_runs_the_losses_of_padded_training(tmp_path: Path) -> None:
    """The whole stage with ``training.packing`` (in process): the same steps' losses as the padded run (rel 1e-5, fp32)."""
    packed_training_matches_padded("deepseek-ocr2", tmp_path)
