"""The generation side's training and its demo: caption dropout as the reference's packer drops
a ``enable_cfg`` text item, the demo VAE's latent scale folded into its weights, and evaluate
judging the drawn pictures against their captions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mmcore.data import COLOURS


def _recipe(folder: Path, dropout: float):  # type: ignore[no-untyped-def]
    """The pack's recipe on ``folder`` without a run (its collate and loss are what is tested)."""
    from mm_pack_bagel.config import load_config
    from mm_pack_bagel.recipe import BagelRecipe
    from mm_pack_bagel.tiny import build_tokenizer, token_ids

    recipe = BagelRecipe.__new__(BagelRecipe)
    recipe.model_dir, recipe.ids = folder, token_ids(build_tokenizer())
    recipe.config, recipe.caption_dropout = load_config(folder, with_vae=True), dropout
    return recipe


def _picture_sample(ids: dict[str, int], caption: list[int] | None, c) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """A stored caption -> picture sample (preprocess's fields), with or without its caption."""
    g = torch.Generator().manual_seed(7)
    size = 4 * c.latent_patch_size
    text = [ids["bos"], *caption, ids["eos"]] if caption else []
    tokens = [*text, ids["soi"], *[0] * 16, ids["eoi"]]
    return {
        "input_ids": torch.tensor(tokens),
        "labels": torch.full((len(tokens),), -100),
        "image_kinds": torch.tensor([1]),
        "latent_mean": torch.randn(1, c.latent_channels, size, size, generator=g),
        "latent_std": torch.full((1, c.latent_channels, size, size), 0.05),
    }


def _loss(recipe, model, sample, seed: int) -> float:  # type: ignore[no-untyped-def]
    batch = recipe.collate([sample])
    batch["global_loss_counts"] = {"all": float(batch["num_loss_tokens"]), **{k: float(v) for k, v in batch["loss_counts"].items()}}
    batch["sample_seeds"] = torch.tensor([seed])
    with torch.no_grad():
        return float(recipe.loss(model, batch))


def test_caption_dropout_trains_the_row_the_unconditional_branch_packs(tiny_dir: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A dropped caption gives exactly the loss of the sample stored without it (the same latent,
    timestep and noise: the drop is drawn after them), a kept one the loss with it; at 0.5 about
    half the seeds drop; the default is the reference's text_cond_dropout_prob."""
    from mm_pack_bagel.checkpoint import load_model
    from mm_pack_bagel.stages import BagelRunConfig

    assert BagelRunConfig().training.caption_dropout == 0.1
    model = load_model(tiny_dir).eval()
    always, never, half = _recipe(tiny_dir, 1.0), _recipe(tiny_dir, 0.0), _recipe(tiny_dir, 0.5)
    captioned = _picture_sample(always.ids, tokenizer.encode("a red square"), always.config)
    bare = _picture_sample(always.ids, None, always.config)
    dropped = 0
    for seed in range(40):
        with_caption, without = _loss(never, model, captioned, seed), _loss(never, model, bare, seed)
        assert with_caption != without, seed  # the caption changes the velocity, so the check can tell them apart
        assert _loss(always, model, captioned, seed) == without, seed
        got = _loss(half, model, captioned, seed)
        assert got in (with_caption, without), seed
        dropped += got == without
    assert 10 <= dropped <= 30, dropped


def test_the_folded_latent_scale_keeps_the_decoding_and_gives_unit_spread(tiny_dir: Path, tmp_path: Path) -> None:
    """Folding the latents' spread into the weights leaves the posterior mode's decoding as it
    was, gives latents of unit spread under FLUX's constant normalisation, a narrow posterior,
    and survives ``ae.safetensors``."""
    from mmcore.engines import set_latent_normalisation
    from mm_pack_bagel.tiny import POSTERIOR_STD, demo_pictures, fold_latent_scale
    from mm_pack_bagel.vae import SCALE, SHIFT, load_vae, save_vae

    vae = load_vae(tiny_dir / "ae.safetensors")
    x = torch.from_numpy(np.stack([p[0] for p in demo_pictures(6, 0)])).float().permute(0, 3, 1, 2) / 127.5 - 1
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mode()
        before = vae.decode(z).sample
    set_latent_normalisation(vae, z.mean((0, 2, 3)), z.std((0, 2, 3)), float(z.mean()), float(z.std()))
    measured = fold_latent_scale(vae)
    save_vae(vae, tmp_path / "ae.safetensors")
    again = load_vae(tmp_path / "ae.safetensors")
    with torch.no_grad():
        posterior = again.encode(x).latent_dist
        after = again.decode(posterior.mode()).sample
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    normalised = (posterior.mode() - SHIFT) * SCALE
    assert abs(float(normalised.std()) - 1.0) < 0.01 and abs(float(normalised.mean()) - measured["normalised_latents_mean"]) < 0.01, measured
    torch.testing.assert_close(posterior.std * SCALE, torch.full_like(posterior.std, POSTERIOR_STD))


def test_evaluate_judges_each_drawn_picture_by_its_caption() -> None:
    """The checker evaluate applies reads what a PNG the sampler wrote shows: a drawn red square
    agrees with "a red square", not with "a blue square" nor "a red triangle"."""
    from mm_pack_bagel.generation import _save_png
    from mmcore.data import caption_agreement

    canvas = torch.ones(3, 32, 32)
    canvas[:, 6:26, 8:28] = torch.tensor(COLOURS["red"], dtype=torch.float32)[:, None, None] / 127.5 - 1
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        pixels = _save_png(canvas, Path(folder) / "p.png")
    assert pixels.shape == (32, 32, 3) and pixels.dtype == np.uint8
    assert caption_agreement(pixels, "a red square")["agrees"]
    assert not caption_agreement(pixels, "a blue square")["agrees"] and not caption_agreement(pixels, "a red triangle")["agrees"]
