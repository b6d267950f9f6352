"""Lumina-mGPT's main direction, text -> picture, on a tiny model: LLaMA-Factory-style samples
whose assistant turn is a picture train the picture's tokens in Lumina's layout (the loss falls
fast), and the evaluate stage has the export draw the held-out pictures greedily."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.testing import stage_manifest as manifest
from mmcore.testing.media import write_captioned_pictures as write_pictures
from mmcore.testing import train_losses


def test_pictures_train_and_the_export_draws_them_back(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = write_pictures(tmp_path / "data")
    common = ("--preset", "tiny", f"data.datasets=[{data}]", "training.micro_batch_size=8", "convert.verify=false")
    mm("run", "--pack", "lumina-mgpt", *common, "training.steps=30", "training.lr=0.01", "training.warmup_steps=0", f"evaluate.datasets=[{data}]", "evaluate.limit=8", "--run-dir", "r")
    losses = list(train_losses(tmp_path / "r").values())
    # per token: the picture's 16 codes, its size and new-line tokens, <eoss> and the separator over
    # the whole vocabulary (~490 ids at the start)
    assert losses[0] > 4.0 and sum(losses[-5:]) / 5 < 0.5 * losses[0], losses
    evaluate = manifest(tmp_path / "r", "evaluate")["metrics"]
    # the eight training pictures, drawn from their captions (64 codes: chance is 1/64; measured 0.195
    # after 30 steps: the random tiny VQ encoder gives them 16 nearly unique codes each)
    assert evaluate["pictures"] == 8 and evaluate["image_token_accuracy"] >= 0.1, evaluate
    rows = [json.loads(line) for line in (tmp_path / "r/evaluate/pictures.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(len(r["tokens"]) == 4 * 5 + 1 for r in rows)


@pytest.mark.slow
@pytest.mark.matrix  # about a minute and a half; tools/demo_matrix.py holds its promise over seeds
@pytest.mark.compares_runs
def test_demo_draws_the_held_out_captions_colours(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "lumina-mgpt", "--preset", "demo")
    run = tmp_path / "runs/lumina-mgpt-demo"
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = manifest(run, "evaluate")["metrics"]
    # the README's promise (chance 25 %); measured 100 % of 48 held-out captions, seed 0
    assert evaluate["pictures"] == 48 and evaluate["colour_agreement"] >= 0.8, evaluate


def test_the_demo_vq_encoder_tells_colours_apart() -> None:
    """The demo's VQ encoder (fit at init:demo): pictures of different colours get different
    codes, so a drawn picture's colour is readable from its codes (a random encoder's are not)."""
    import random

    import torch
    from transformers import ChameleonVQVAE, ChameleonVQVAEConfig

    from mmcore.data import COLOURS, shape_image
    from mm_pack_lumina_mgpt.demo import code_colours, drawn_colour
    from mm_pack_lumina_mgpt.demo_vq import fit_demo_vq
    from mm_pack_lumina_mgpt.tiny import PRESETS, build_processor, build_tokenizer

    tokenizer = build_tokenizer(PRESETS["demo"]["codebook"])
    images = build_processor("demo", tokenizer).image_processor
    torch.manual_seed(0)
    vq = ChameleonVQVAE(ChameleonVQVAEConfig(embed_dim=8, num_embeddings=64, latent_channels=32, resolution=32, base_channels=32, channel_multiplier=[1, 1, 2, 2], num_res_blocks=1))
    measured = fit_demo_vq(vq, images, seed=0, steps=60, count=96)
    assert measured["codes_used"] >= 32, measured
    rng = random.Random(9)
    colours = [rng.choice(sorted(COLOURS)) for _ in range(64)]
    pixels = torch.stack([images(shape_image("square", COLOURS[c], rng, size=32, radius=(9, 13)), return_tensors="pt")["pixel_values"][0] for c in colours])
    with torch.no_grad():
        codes = vq.encode(pixels).image_tokens.view(len(colours), -1)
    samples = []
    for colour, picture in zip(colours, codes):
        caption = tokenizer(f"a {colour} square")["input_ids"]
        samples.append({"input_ids": torch.tensor(caption + picture.tolist()), "labels": torch.tensor([-100] * len(caption) + picture.tolist())})
    table = code_colours(samples[:48], tokenizer, set(range(64)))
    read = [drawn_colour(codes[i].tolist(), table) == colours[i] for i in range(48, 64)]
    assert sum(read) >= 12, read  # of 16 (chance: 4)
