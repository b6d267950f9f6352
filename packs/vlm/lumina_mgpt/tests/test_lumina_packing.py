"""Sequence packing and the two kinds of logits. Chameleon's decoder takes 1-D positions and a
causal mask, so a packed row (restarting positions, the core's ``varlen_attention``) must equal
the padded batch and each sample alone -- image questions (the VQ encoder inside the forward),
text, and a text -> image sample whose picture positions predict image codes. Outside pictures
the logits are transformers' own, image codes masked as ``ChameleonForConditionalGeneration`` masks them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmcore.testing.packing import each_sample_equals_it_alone, mixed_rows, packed_copy, packed_equals_padded
from mm_pack_lumina_mgpt.family import FAMILY, LuminaRunConfig, encoder


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return mixed_rows(FAMILY, encoder, LuminaRunConfig(), tiny_dir, tmp_path_factory.mktemp("media"), wide=(90, 40), small=(30, 30), picture_answer=True)


@pytest.mark.compares_runs
def test_packed_row_equals_the_padded_batch_and_each_sample_alone(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """Tolerances as :mod:`mmcore.testing.packing` states them (fp32); logits at the dtype's
    minimum (masked codes) compare exactly."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir)
    packed_net = packed_copy(model)
    grads = packed_equals_padded(FAMILY, model, data, ids, packed_net=packed_net)
    assert abs(FAMILY.loss_sum(model, FAMILY.collate(data, ids)).item()) < 1e6  # no target under a masked logit
    assert not any("vqmodel" in n for n in grads)
    each_sample_equals_it_alone(FAMILY, model, packed_net, data, ids)


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
