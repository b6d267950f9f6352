"""Sequence packing: Janus's decoder takes 1-D positions and a causal mask, so a packed row
(restarting positions, the core's ``varlen_attention``) must equal the padded batch and each
sample alone -- understanding samples, and a text-to-image sample whose image tokens run
through the generation embeddings and head. The vision tower runs per image whatever the packing."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcore.data import Sample, Turn
from mm_pack_janus.family import FAMILY, JanusRunConfig, encoder


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from PIL import Image
    from transformers import AutoTokenizer

    media = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 90, 3), dtype=np.uint8)).save(media / "wide.png")
    Image.fromarray(rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)).save(media / "small.png")
    tok = AutoTokenizer.from_pretrained(tiny_dir)

    class Ctx:
        config = JanusRunConfig()

    enc = encoder(Ctx(), tiny_dir, tok)
    samples = [
        Sample("f", 0, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [media / "wide.png"]}),
        Sample("f", 1, [Turn("user", "a blue circle"), Turn("assistant", "<image>")], {"images": [media / "small.png"]}),
        Sample("f", 2, [Turn("user", "Hello there, what colour is the square?"), Turn("assistant", "blue")]),
        Sample("f", 3, [Turn("user", "<image>What colour?"), Turn("assistant", "green")], {"images": [media / "small.png"]}),
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
    """fp32. Loss rel 1e-5 and gradients rtol 1e-4 / atol 1e-6, logits atol 1e-5: the same
    arithmetic in matrix products of other shapes, so sums differ in the last bits, not more."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir)
    packed_net = packed_model(model)
    padded, packed = FAMILY.collate(data, ids), FAMILY.collate(data, ids, pack=True)
    assert packed["input_ids"].shape[0] == 1 and packed["num_loss_tokens"] == padded["num_loss_tokens"]
    grads = []
    for network, batch in ((model, padded), (packed_net, packed)):
        loss = FAMILY.loss_sum(network, batch)
        loss.backward()
        grads.append((loss.item(), {n: p.grad for n, p in network.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = grads
    assert b == pytest.approx(a, rel=1e-5)
    # both heads and both embeddings learn from the one batch; the VQ model never does
    assert any("generation_head" in n for n in ga) and any("generation_embeddings" in n for n in ga) and any("vision_model" in n for n in ga)
    assert ga.keys() == gb.keys() and not any("vqmodel" in n for n in ga)
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-4, atol=1e-6), name
    model.eval()
    with torch.no_grad():
        alone = [FAMILY.forward_logits(model, FAMILY.collate([sample], ids))[0] for sample in data]
        got = FAMILY.forward_logits(packed_net.eval(), packed)[0]
    start = 0
    for i, want in enumerate(alone):
        end = start + len(want)
        if want.shape[-1] < got.shape[-1]:  # a text sample alone: the text head's logits; in the row, the text head's half
            assert (got[start:end, want.shape[-1] :] <= -1e9).all(), i
            got_i = got[start:end, : want.shape[-1]]
        else:
            got_i = got[start:end]
        assert torch.allclose(got_i, want, atol=1e-5), i
        start = end
    assert start == got.shape[0]


def test_the_image_loss_is_the_generation_heads_cross_entropy(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """The summed loss of a text-to-image sample is the generation head's cross-entropy on the
    picture's VQ ids, each predicted from the decoder's state one step before (computed here by
    hand from transformers' modules: the generation embeddings and aligner feed the ids in)."""
    import torch.nn.functional as F

    data, ids = batches
    model = FAMILY.build_model(tiny_dir).eval()
    vocab = model.config.text_config.vocab_size
    sample = data[1]
    image = sample["input_ids"] >= vocab
    start = int(image.nonzero()[0])
    with torch.no_grad():
        got = FAMILY.loss_sum(model, FAMILY.collate([sample], ids))
        text = model.get_input_embeddings()(sample["input_ids"][:start][None])
        codes = sample["input_ids"][image] - vocab
        embeds = torch.cat([text, model.prepare_embeddings_for_image_generation(codes[None])], dim=1)
        hidden = model.model.language_model(inputs_embeds=embeds).last_hidden_state
        logits = model.model.generation_head(hidden[0, start - 1 : -1])
        want = F.cross_entropy(logits, codes, reduction="sum")
    assert got.item() == pytest.approx(want.item(), rel=1e-5) and FAMILY.collate([sample], ids)["num_loss_tokens"] == len(codes) == 16


@pytest.mark.compares_runs
def test_loss_from_cached_vision_features_equals_loss_from_pixels(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """The frozen-vision cache (extract: the tower's patch features per image; the aligner still runs) changes no loss."""
    from mm_pack_janus.extract import use_cached_vision, vision_features

    data, ids = batches
    model = FAMILY.build_model(tiny_dir).eval()
    with torch.no_grad():
        want = FAMILY.loss_sum(model, FAMILY.collate(data, ids))
        cached = [dict(s, pixel_values=torch.cat([vision_features(model, p) for p in s["pixel_values"]])) if "pixel_values" in s else s for s in data]
        got = FAMILY.loss_sum(use_cached_vision(copy.deepcopy(model)), FAMILY.collate(cached, ids))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
