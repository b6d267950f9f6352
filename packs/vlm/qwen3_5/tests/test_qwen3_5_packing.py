"""Sequence packing through the hybrid decoder: the Gated DeltaNet layers' recurrent state and
convolution window must not cross samples. transformers' torch path does not keep them apart
(the control below); :mod:`mm_pack_qwen3_5.packing` runs those layers per sample, and a packed
row then equals the padded batch and each sample alone."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from mmcore.data.mllm import Sample, Turn
from mmcore.testing.media import write_image, write_video
from mmcore.testing.packing import LOGITS_ATOL, encoded, packed_copy, packed_equals_padded, packed_training_matches_padded, row_and_alone
from mm_pack_qwen3_5.family import FAMILY, MEAN_STD, Qwen3_5Data


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from mm_qwen_vision.qwen3vl_processor import Qwen3VLEncoder

    media = tmp_path_factory.mktemp("media")
    write_image(media / "a.png", (255, 0, 0), (70, 50))
    write_image(media / "b.png", (0, 0, 255), (64, 64))
    write_video(media / "v.mp4")
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    encoder = Qwen3VLEncoder(tok, Qwen3_5Data(image_max_pixels=2 * 64 * 64, video_max_pixels=64 * 64), MEAN_STD)
    samples = [
        Sample("f", 0, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [media / "a.png"]}),
        Sample("f", 1, [Turn("user", "Hello there, how are you today?"), Turn("assistant", "fine thanks")]),
        Sample("f", 2, [Turn("user", "<video>and <image>?"), Turn("assistant", "a bar")], {"videos": [media / "v.mp4"], "images": [media / "b.png"]}),
    ]
    return encoded(encoder, samples), FAMILY.token_ids_of(tok)


def packed_model(model):  # type: ignore[no-untyped-def]
    from mm_pack_qwen3_5.packing import isolate_linear_attention

    return packed_copy(model, isolate_linear_attention)


@pytest.mark.compares_runs
@pytest.mark.parametrize("which", ["tiny_dir", "moe_dir"])
def test_packed_loss_and_gradients_equal_the_padded_batch(which: str, request: pytest.FixtureRequest, batches) -> None:  # type: ignore[no-untyped-def]
    """Dense and MoE; the MoE router's loss is left out (coef 0), as it depends on how tokens
    are batched, not only on the samples."""
    data, ids = batches
    model = FAMILY.build_model(request.getfixturevalue(which))
    # the tolerances cover the different reduction order (the delta rule's 64-token chunks start
    # at other tokens in a packed row, matrix products have other shapes)
    grads = packed_equals_padded(FAMILY, model, data, ids, packed_net=packed_model(model), aux_coef=0.0)
    assert any(".linear_attn." in name for name in grads) and any(".self_attn." in name for name in grads)


@pytest.mark.compares_runs
def test_each_sample_of_a_packed_row_equals_it_alone_and_transformers_alone_leaks(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """Logits of every sample in the packed row equal those of the sample run alone (atol 1e-5,
    fp32). The control: the same row with only the full-attention layers isolated (what
    transformers' torch path does with restarting positions) differs after the first sample,
    because the linear-attention state crosses the boundary."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir).eval()
    leaky = packed_copy(model)
    isolated = row_and_alone(FAMILY, model, packed_model(model), data, ids)
    for i, ((got, want), (leaked, _)) in enumerate(zip(isolated, row_and_alone(FAMILY, model, leaky, data, ids))):
        assert torch.allclose(got, want, atol=LOGITS_ATOL), i
        if i == 0:  # nothing before the first sample: the control matches there
            assert torch.allclose(leaked, want, atol=LOGITS_ATOL)
        else:
            assert (leaked - want).abs().max() > 1e-3, i


@pytest.mark.compares_runs
def test_packed_training_runs_the_losses_of_padded_training(tmp_path: Path) -> None:
    """The whole stage with ``training.packing`` (in process): the same steps' losses as the
    padded run (rel 1e-5, fp32): the pack switches its linear-attention layers to per-sample runs itself."""
    packed_training_matches_padded("qwen3_5", tmp_path, steps=3, samples=12)


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_loss_from_cached_vision_features_equals_loss_from_pixels(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """The frozen-vision cache (extract: the last block's output; the merger still runs) changes
    no loss, images and video alike."""
    from mm_qwen_vision import split_items, use_cached_vision
    from mm_qwen_vision.extract import tower_output

    data, ids = batches
    model = FAMILY.build_model(tiny_dir).eval()
    with torch.no_grad():
        want = FAMILY.loss_sum(model, FAMILY.collate(data, ids))
        cached = []
        for sample in data:
            sample = dict(sample)
            for pixels, grid in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
                if pixels in sample:
                    sample[pixels] = torch.cat([tower_output(model.model.visual, p, g) for p, g in split_items(sample[pixels], sample[grid])])
            cached.append(sample)
        cached_model = copy.deepcopy(model)
        use_cached_vision(cached_model.model.visual)
        got = FAMILY.loss_sum(cached_model, FAMILY.collate(cached, ids))
    assert "pixel_values_videos" in FAMILY.collate(cached, ids) and got.item() == pytest.approx(want.item(), rel=1e-6)
