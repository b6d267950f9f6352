"""Sequence packing: DeepSeek-VL2's decoder takes 1-D positions and a causal mask, so a packed
row (restarting positions, the core's ``varlen_attention``) must equal the padded batch and each
sample alone. The SigLIP tower runs per view (global views, tiles) whatever the packing, and the
MoE routes each token on its own (no capacity limit, no router loss), so nothing else crosses
samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing.packing import each_sample_equals_it_alone, mixed_rows, packed_copy, packed_equals_padded, packed_training_matches_padded
from mm_pack_deepseek_vl2.family import FAMILY, DeepseekVL2Config, encoder


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return mixed_rows(FAMILY, encoder, DeepseekVL2Config(), tiny_dir, tmp_path_factory.mktemp("media"))


@pytest.mark.compares_runs
def test_packed_row_equals_the_padded_batch_and_each_sample_alone(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """Tolerances as :mod:`mmcore.testing.packing` states them (fp32); every expert and the tower learn."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir)
    packed_net = packed_copy(model)
    packed = FAMILY.collate(data, ids, pack=True)
    assert packed["images_spatial_crop"].tolist() == [[3, 2], [2, 2]]  # a wide image tiled 3 x 2, a small one 2 x 2
    grads = packed_equals_padded(FAMILY, model, data, ids, packed_net=packed_net)
    assert any(".experts." in n for n in grads) and any(n.startswith("vision.encoder") for n in grads) and "view_seperator" in grads
    each_sample_equals_it_alone(FAMILY, model, packed_net, data, ids)


@pytest.mark.compares_runs
def test_packed_training_runs_the_losses_of_padded_training(tmp_path: Path) -> None:
    """The whole stage with ``training.packing`` (in process): the same steps' losses as the padded run (rel 1e-5, fp32)."""
    packed_training_matches_padded("deepseek-vl2", tmp_path)
