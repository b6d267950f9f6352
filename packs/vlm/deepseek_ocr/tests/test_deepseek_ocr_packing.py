"""Sequence packing: DeepSeek-OCR's decoder takes 1-D positions and a causal mask, so a packed
row (restarting positions, the core's ``varlen_attention``) must equal the padded batch and each
sample alone. The DeepEncoder runs per view (global views, tiles) whatever the packing, and the
MoE routes each token on its own (no capacity limit, no router loss), so nothing else crosses
samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing.packing import each_sample_equals_it_alone, mixed_rows, packed_copy, packed_equals_padded
from mm_pack_deepseek_ocr.family import FAMILY, DeepseekOcrData, DeepseekOcrRunConfig, encoder


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    config = DeepseekOcrRunConfig(data=DeepseekOcrData(base_size=64, image_size=40, image_max_tiles=4))  # the tiny preset's geometry
    return mixed_rows(FAMILY, encoder, config, tiny_dir, tmp_path_factory.mktemp("media"))


@pytest.mark.compares_runs
def test_packed_row_equals_the_padded_batch_and_each_sample_alone(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """Tolerances as :mod:`mmcore.testing.packing` states them (fp32); every expert and both towers learn."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir)
    packed_net = packed_copy(model)
    packed = FAMILY.collate(data, ids, pack=True)
    assert "pixel_values_local" in packed  # an image cut into tiles rides in the row
    grads = packed_equals_padded(FAMILY, model, data, ids, packed_net=packed_net)
    assert any(".experts." in n for n in grads) and any(n.startswith("model.sam_model.layers") for n in grads) and any(n.startswith("model.vision_model.transformer") for n in grads)
    assert "model.view_seperator" in grads and "model.image_newline" in grads
    each_sample_equals_it_alone(FAMILY, model, packed_net, data, ids)
