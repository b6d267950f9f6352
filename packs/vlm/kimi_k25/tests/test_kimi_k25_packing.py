"""Sequence packing: Kimi-K2.5's decoder (DeepSeek-V3: multi-head latent attention, 1-D RoPE)
takes 1-D positions and a causal mask, so a packed row (restarting positions, the core's
``varlen_attention``) must equal the padded batch and each sample alone. MoonViT runs per image
(its attention kept within each image by ``cu_seqlens``) whatever the packing, and the MoE routes
each token on its own (no capacity limit, no router loss), so nothing else crosses samples."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcore.data import Sample, Turn
from mm_pack_kimi_k25.family import FAMILY, KimiK25Config, encoder


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from PIL import Image
    from transformers import AutoTokenizer

    media = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (90, 200, 3), dtype=np.uint8)).save(media / "wide.png")
    Image.fromarray(rng.integers(0, 256, (50, 60, 3), dtype=np.uint8)).save(media / "small.png")
    tok = AutoTokenizer.from_pretrained(tiny_dir)

    class Ctx:
        config = KimiK25Config()

    enc = encoder(Ctx(), tiny_dir, tok)
    samples = [
        Sample("f", 0, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [media / "wide.png"]}),
        Sample("f", 1, [Turn("user", "Hello there, what colour is the square?"), Turn("assistant", "blue")]),
        Sample("f", 2, [Turn("user", "<image>What colour?"), Turn("assistant", "green")], {"images": [media / "small.png"]}),
    ]
    data = []
    for sample in samples:
        e = enc.encode(sample)
        data.append({"input_ids": torch.tensor(e.input_ids), "labels": torch.tensor(e.labels), **e.tensors})
    return data, FAMILY.token_ids_of(tok)


def packed_model(model):  # type: ignore[no-untyped-def]
    from mmcore.attention import use_packed_attention, varlen_attention

    packed = copy.deepcopy(model)
    use_packed_attention(packed, varlen_attention)
    return packed


@pytest.mark.compares_runs
def test_packed_row_equals_the_padded_batch_and_each_sample_alone(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """fp32. Loss rel 1e-5 and gradients rtol 1e-4 / atol 1e-6, logits atol 1e-5: the packed row
    and the padded batch run the same arithmetic in matrix products of other shapes (and the
    experts' index_add in another order), so sums differ in the last bits, not more."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir)
    packed_net = packed_model(model)
    padded, packed = FAMILY.collate(data, ids), FAMILY.collate(data, ids, pack=True)
    assert packed["input_ids"].shape[0] == 1 and packed["num_loss_tokens"] == padded["num_loss_tokens"]
    assert packed["image_grid_thw"].shape[0] == 2
    grads = []
    for network, batch in ((model, padded), (packed_net, packed)):
        loss = FAMILY.loss_sum(network, batch)
        loss.backward()
        grads.append((loss.item(), {n: p.grad for n, p in network.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = grads
    assert b == pytest.approx(a, rel=1e-5)
    assert ga.keys() == gb.keys() and any(".experts." in n for n in ga) and any("vision_tower.layers" in n for n in ga)
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-4, atol=1e-6), name
    model.eval()
    with torch.no_grad():
        alone = [FAMILY.forward_logits(model, FAMILY.collate([sample], ids))[0] for sample in data]
        got = FAMILY.forward_logits(packed_net.eval(), packed)[0]
    start = 0
    for i, want in enumerate(alone):
        end = start + len(want)
        assert torch.allclose(got[start:end], want, atol=1e-5), i
        start = end
    assert start == got.shape[0]


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
    import json

    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    plugins = Plugins.load()
    common = ["data.demo_samples=8", "convert.verify=false", "training.steps=2", "evaluate.enabled=false"]

    def losses(run: str, *extra: str) -> list[float]:
        make_runner(plugins, "kimi-k2.5", tmp_path / run, preset="tiny", overrides=[*common, *extra]).run_pipeline(resume="no")
        rows = [json.loads(x) for x in (tmp_path / run / "train/metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    padded, packed = losses("padded"), losses("packed", "training.packing=true")
    assert len(packed) == 2 and packed == pytest.approx(padded, rel=1e-5)
