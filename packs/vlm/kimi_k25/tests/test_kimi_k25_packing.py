"""Sequence packing: Kimi-K2.5's decoder (DeepSeek-V3: multi-head latent attention, 1-D RoPE)
takes 1-D positions and a causal mask, so a packed row (restarting positions, the core's
``varlen_attention``) must equal the padded batch and each sample alone. MoonViT runs per image
(its attention kept within each image by ``cu_seqlens``) whatever the packing, and the MoE routes
each token on its own (no capacity limit, no router loss), so nothing else crosses samples."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from mmcore.testing.packing import each_sample_equals_it_alone, mixed_rows, packed_copy, packed_equals_padded, packed_training_matches_padded
from mm_pack_kimi_k25.family import FAMILY, KimiK25Config, encoder


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return mixed_rows(FAMILY, encoder, KimiK25Config(), tiny_dir, tmp_path_factory.mktemp("media"))


@pytest.mark.compares_runs
def test_packed_row_equals_the_padded_batch_and_each_sample_alone(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """Tolerances as :mod:`mmcore.testing.packing` states them (fp32); every expert and the tower learn."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir)
    packed_net = packed_copy(model)
    assert FAMILY.collate(data, ids, pack=True)["image_grid_thw"].shape[0] == 2
    grads = packed_equals_padded(FAMILY, model, data, ids, packed_net=packed_net)
    assert any(".experts." in n for n in grads) and any("vision_tower.layers" in n for n in grads)
    each_sample_equals_it_alone(FAMILY, model, packed_net, data, ids)


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_loss_from_cached_vision_features_equals_loss_from_pixels(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """The frozen-vision cache (extract: MoonViT's merged patch groups per image; the projector
    still runs) changes no loss."""
    from mm_pack_kimi_k25.extract import split_images, use_cached_vision, vision_features

    data, ids = batches
    model = FAMILY.build_model(tiny_dir).eval()
    with torch.no_grad():
        want = FAMILY.loss_sum(model, FAMILY.collate(data, ids))
        cached = [dict(s, pixel_values=torch.cat([vision_features(model, p, g) for p, g in split_images(s["pixel_values"], s["image_grid_thw"])])) if "pixel_values" in s else s for s in data]
        got = FAMILY.loss_sum(use_cached_vision(copy.deepcopy(model)), FAMILY.collate(cached, ids))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


@pytest.mark.compares_runs
def test_packed_training_runs_the_losses_of_padded_training(tmp_path: Path) -> None:
    """The whole stage with ``training.packing`` (in process): the same steps' losses as the padded run (rel 1e-5, fp32)."""
    packed_training_matches_padded("kimi-k2.5", tmp_path)
