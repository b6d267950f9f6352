"""Sequence packing: one row of samples with images, video and text, attention isolated per
sample and DeepStack features landing on their own samples, loss and gradients equal padding."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from mmcore.data.mllm import Sample, Turn
from mmcore.testing.media import write_image, write_video
from mmcore.testing.packing import encoded
from mm_pack_qwen3vl.data import Encoder
from mm_pack_qwen3vl.family import FAMILY, Qwen3VLData


@pytest.mark.compares_runs
@pytest.mark.parametrize("which", ["tiny_dir", "moe_dir"])
def test_packed_loss_and_gradients_equal_the_padded_batch(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Through the varlen attention kernel the kit wires for packed training; the MoE router's
    loss is left out (coef 0), as it depends on how tokens are batched, not only on the samples."""
    from transformers import AutoTokenizer

    from mmcore.train.attention import use_packed_attention, varlen_attention

    model_dir = request.getfixturevalue(which)
    write_image(tmp_path / "a.png", (255, 0, 0), (70, 50))
    write_image(tmp_path / "b.png", (0, 0, 255), (64, 64))
    write_video(tmp_path / "v.mp4")
    tok = AutoTokenizer.from_pretrained(model_dir)
    encoder = Encoder(tok, Qwen3VLData(image_max_pixels=2 * 64 * 64, video_max_pixels=64 * 64))
    samples = [
        Sample("f", 0, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [tmp_path / "a.png"]}),
        Sample("f", 1, [Turn("user", "Hello there, how are you today?"), Turn("assistant", "fine thanks")]),
        Sample("f", 2, [Turn("user", "<video>and <image>?"), Turn("assistant", "a bar")], {"videos": [tmp_path / "v.mp4"], "images": [tmp_path / "b.png"]}),
    ]
    data = encoded(encoder, samples)
    ids = FAMILY.token_ids_of(tok)
    model = FAMILY.build_model(model_dir)
    packed_model = copy.deepcopy(model)
    use_packed_attention(packed_model, varlen_attention)
    padded, packed = FAMILY.collate(data, ids), FAMILY.collate(data, ids, pack=True)
    assert packed["input_ids"].shape[0] == 1 and packed["num_loss_tokens"] == padded["num_loss_tokens"]
    grads = []
    for network, batch in ((model, padded), (packed_model, packed)):
        loss = FAMILY.loss_sum(network, batch, aux_coef=0.0)
        loss.backward()
        grads.append((loss.item(), {n: p.grad for n, p in network.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = grads
    assert b == pytest.approx(a, rel=1e-5)  # fp32; tolerance covers the different reduction order
    assert ga.keys() == gb.keys() and any("deepstack_merger_list" in name for name in ga)
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-4, atol=1e-6), name
    with torch.no_grad():  # the control: one continuous position range lets the samples see each other
        leaky = dict(
            packed, segments=packed["segments"].sum(0, keepdim=True), segment_images=packed["segment_images"].sum(0, keepdim=True), segment_videos=packed["segment_videos"].sum(0, keepdim=True)
        )
        assert abs(FAMILY.loss_sum(model, leaky, aux_coef=0.0).item() - a) > 1e-3
