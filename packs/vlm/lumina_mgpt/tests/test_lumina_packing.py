"""Sequence packing and the two kinds of logits. Chameleon's decoder takes 1-D positions and a
causal mask, so a packed row (restarting positions, the core's ``varlen_attention``) must equal
the padded batch and each sample alone -- image questions (the VQ encoder inside the forward),
text, and a text -> image sample whose picture positions predict image codes. Outside pictures
the logits are transformers' own, image codes masked as ``ChameleonForConditionalGeneration`` masks them."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcore.data import Sample, Turn
from mm_pack_lumina_mgpt.family import FAMILY, LuminaRunConfig, encoder


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
        config = LuminaRunConfig()

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
    """fp32. Loss rel 1e-5, gradients rtol 1e-4 / atol 1e-6, logits atol 1e-5: the same arithmetic in
    matrix products of other shapes. Logits at the dtype's minimum (masked codes) compare exactly."""
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
    assert b == pytest.approx(a, rel=1e-5) and a < 1e6  # no target under a masked logit
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
        assert torch.allclose(got[start:end], want, atol=1e-5), i
        start = end
    assert start == got.shape[0]


def test_logits_are_transformers_outside_pictures_and_unmasked_inside(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    from mm_pack_lumina_mgpt.pictures import picture_token_ids

    data, ids = batches
    model = FAMILY.build_model(tiny_dir).eval()
    codes, body = picture_token_ids(model.config)
    with torch.no_grad():
        for sample in (data[0], data[2]):  # an image question, text: the model's own forward, bit for bit
            batch = FAMILY.collate([sample], ids)
            assert torch.equal(FAMILY.forward_logits(model, batch), model(input_ids=batch["input_ids"], pixel_values=batch.get("pixel_values")).logits)
        batch = FAMILY.collate([data[1]], ids)
        logits = FAMILY.forward_logits(model, batch)[0]
        inside = torch.isin(batch["input_ids"][0], torch.tensor(body))
        floor = torch.finfo(logits.dtype).min
        assert (logits[~inside][:, codes] == floor).all() and (logits[inside][:, codes] > floor).all()
        # the picture's targets are learnt from the positions inside it (and its first code after the width token)
        hidden = model.model(input_ids=batch["input_ids"]).last_hidden_state[0]
        assert torch.equal(logits[inside], model.lm_head(hidden)[inside])
