"""Sequence packing: Janus's decoder takes 1-D positions and a causal mask, so a packed row
(restarting positions, the core's ``varlen_attention``) must equal the padded batch and each
sample alone -- understanding samples, and a text-to-image sample whose image tokens run
through the generation embeddings and head. The vision tower runs per image whatever the packing."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from mmcore.testing.packing import LOGITS_ATOL, mixed_rows, packed_copy, packed_equals_padded, row_and_alone
from mm_pack_janus.family import FAMILY, JanusRunConfig, encoder


@pytest.fixture(scope="module")
def batches(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return mixed_rows(FAMILY, encoder, JanusRunConfig(), tiny_dir, tmp_path_factory.mktemp("media"), wide=(90, 40), small=(30, 30), picture_answer=True)


@pytest.mark.compares_runs
def test_packed_row_equals_the_padded_batch_and_each_sample_alone(tiny_dir: Path, batches) -> None:  # type: ignore[no-untyped-def]
    """Tolerances as :mod:`mmcore.testing.packing` states them (fp32)."""
    data, ids = batches
    model = FAMILY.build_model(tiny_dir)
    packed_net = packed_copy(model)
    grads = packed_equals_padded(FAMILY, model, data, ids, packed_net=packed_net)
    # both heads and both embeddings learn from the one batch; the VQ model never does
    assert any("generation_head" in n for n in grads) and any("generation_embeddings" in n for n in grads) and any("vision_model" in n for n in grads)
    assert not any("vqmodel" in n for n in grads)
    for i, (got, want) in enumerate(row_and_alone(FAMILY, model, packed_net, data, ids)):
        if want.shape[-1] < got.shape[-1]:  # a text sample alone: the text head's logits; in the row, the text head's half
            assert (got[:, want.shape[-1] :] <= -1e9).all(), i
            got = got[:, : want.shape[-1]]
        assert torch.allclose(got, want, atol=LOGITS_ATOL), i


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
