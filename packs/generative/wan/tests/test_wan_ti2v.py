"""Wan2.2 TI2V-5B's layout (``init:tiny-ti2v``: the 48-channel VAE, ``expand_timesteps``): the
denoiser gets what WanPipeline and WanImageToVideoPipeline give it, the loss leaves out the
frame the image-to-video pipeline does not generate, and both pack names train it end to end."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcore.testing import cache_matches_on_the_fly

TINY = ["--preset", "tiny", "model.source=init:tiny-ti2v"]


@pytest.fixture(scope="module")
def ti2v(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_wan.tiny import build_init_checkpoint

    folder = tmp_path_factory.mktemp("ti2v") / "pipe"
    build_init_checkpoint("tiny-ti2v", folder, seed=0)
    return folder


def first_frames() -> torch.Tensor:
    from mmcore.data import MOVES, SQUARE_COLOURS, moving_square

    return torch.from_numpy(moving_square(SQUARE_COLOURS["red"], MOVES["right"], random.Random(0))[:9].copy())


def transformer_inputs(pipe, call) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """The keyword arguments of the transformer's first call during ``call()``."""
    seen: list = []  # type: ignore[type-arg]
    handle = pipe.transformer.register_forward_pre_hook(lambda module, args, kwargs: seen.append(dict(kwargs)), with_kwargs=True)
    try:
        call()
    finally:
        handle.remove()
    return seen[0]


def test_text_to_video_gives_the_timestep_per_token_as_the_pipeline_does(ti2v: Path) -> None:
    """model_index.json's expand_timesteps reaches predict, which then hands the transformer
    exactly what WanPipeline hands it: the same latents and a timestep per patch token."""
    from diffusers import WanPipeline

    from mm_pack_wan.family import FAMILY, Encoders, checkpoint_options

    assert json.loads((ti2v / "model_index.json").read_text())["expand_timesteps"] is True
    assert checkpoint_options(ti2v) == {"expand_timesteps": True}
    pipe = WanPipeline.from_pretrained(ti2v)
    assert pipe.vae.config.z_dim == 48 and pipe.transformer.config.in_channels == 48
    latents = torch.randn(1, 48, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    theirs = transformer_inputs(
        pipe, lambda: pipe("a red square moves right", height=32, width=32, num_frames=9, num_inference_steps=1, guidance_scale=1.0, max_sequence_length=16, latents=latents, output_type="latent")
    )
    text = Encoders(ti2v, 16).text("a red square moves right")[None]
    predict = functools.partial(FAMILY.predict, **checkpoint_options(ti2v))
    ours = transformer_inputs(pipe, lambda: predict(pipe.transformer, latents, pipe.scheduler.sigmas[:1], text))
    assert theirs["timestep"].shape == (1, 3)  # 3 latent frames of one 2x2 patch each
    for name in ("hidden_states", "timestep", "encoder_hidden_states"):
        assert torch.equal(ours[name], theirs[name]), name


def test_image_to_video_gives_the_first_frame_clean_at_timestep_zero(ti2v: Path) -> None:
    """The cached condition is the first frame's latents, which replace the first latent frame
    (at timestep 0 for its tokens) exactly where WanImageToVideoPipeline puts them."""
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    from mm_pack_wan.family import checkpoint_options
    from mm_pack_wan.i2v import FAMILY, ImageEncoders

    frames = first_frames()
    encoders = ImageEncoders(ti2v, 16)
    conditions = encoders.conditions(frames)
    assert conditions["condition"].shape == (48, 1, 2, 2) and conditions["image_embeds"].numel() == 0  # TI2V has no CLIP
    pipe = WanImageToVideoPipeline.from_pretrained(ti2v)
    latents = torch.randn(1, 48, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    theirs = transformer_inputs(
        pipe,
        lambda: pipe(
            image=Image.fromarray(frames[0].numpy()),
            prompt="a red square moves right",
            height=32,
            width=32,
            num_frames=9,
            num_inference_steps=1,
            guidance_scale=1.0,
            max_sequence_length=16,
            latents=latents,
            output_type="latent",
        ),
    )
    predict = functools.partial(FAMILY.predict, **checkpoint_options(ti2v), **{k: v[None] for k, v in conditions.items()})
    ours = transformer_inputs(pipe, lambda: predict(pipe.transformer, latents, pipe.scheduler.sigmas[:1], encoders.text("a red square moves right")[None]))
    assert torch.equal(ours["timestep"], theirs["timestep"]) and float(ours["timestep"][0, 0]) == 0.0 and float(ours["timestep"][0, 1]) > 0
    assert torch.equal(ours["hidden_states"][:, :, 1:], latents[:, :, 1:])  # the rest: the noisy latents as they are
    # The pipeline scales the frame by /255 * 2 - 1, we by /127.5 - 1: the last bit may differ
    # before the VAE, hence a tolerance far below the latents' scale.
    torch.testing.assert_close(ours["hidden_states"], theirs["hidden_states"], rtol=0, atol=1e-5)


def test_the_loss_leaves_out_the_given_frame(ti2v: Path) -> None:
    """The pipeline keeps the first latent frame as the image gave it, so training neither shows
    the model that frame's noisy latents nor scores its prediction there: the loss cannot
    depend on the clip's own first latent frame (it would, through the target, if it counted)."""
    from mmcore.kits import FLOW_MATCHING
    from mm_pack_wan.i2v import FAMILY, ImageEncoders

    encoders = ImageEncoders(ti2v, 16)
    frames = first_frames()
    condition = {k: v[None].expand(4, *v.shape) for k, v in encoders.conditions(frames).items()}
    model = FAMILY.build_model(ti2v).eval()
    predict = functools.partial(FAMILY.predict, expand_timesteps=True, **condition)
    generator = torch.Generator().manual_seed(0)
    latents = encoders.latents(frames)[None].expand(4, -1, -1, -1, -1)
    noise, text = torch.randn(latents.shape, generator=generator), encoders.text("a red square")[None].expand(4, -1, -1)
    levels = torch.tensor([0.2, 0.4, 0.6, 0.8])
    other_first = latents.clone()
    other_first[:, :, 0] = torch.randn(other_first[:, :, 0].shape, generator=generator)
    with torch.no_grad():
        errors = FLOW_MATCHING.errors(predict, model, latents, noise, levels, text)
        assert torch.equal(errors, FLOW_MATCHING.errors(predict, model, other_first, noise, levels, text))
        prediction, generated = predict(model, (1 - levels.view(-1, 1, 1, 1, 1)) * latents + levels.view(-1, 1, 1, 1, 1) * noise, levels, text)
    assert generated[0, 0, :, 0, 0].tolist() == [0.0, 1.0, 1.0]
    by_hand = ((prediction - (noise - latents)) ** 2)[:, :, 1:].mean(dim=(1, 2, 3, 4))
    torch.testing.assert_close(errors, by_hand, rtol=1e-6, atol=0)  # the same squares, summed in another order


def test_ti2v_trains_and_exports_for_both_pipelines(mmcore_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`--pack wan` and `--pack wan-i2v` on the TI2V layout: each export keeps expand_timesteps
    and the 48-channel VAE, loads in its pipeline and generates; a bucket the VAE and patching
    cannot take is a one-line error naming it."""
    from diffusers import WanImageToVideoPipeline, WanPipeline
    from PIL import Image

    mmcore_cli("run", "--pack", "wan", *TINY, "data.demo_samples=8", "evaluate.enabled=false", "--run-dir", "t2v")
    mmcore_cli("run", "--pack", "wan-i2v", *TINY, "--run-dir", "i2v")
    for name, cls in (("t2v", WanPipeline), ("i2v", WanImageToVideoPipeline)):
        export = tmp_path / name / "export/pipeline"
        assert json.loads((export / "model_index.json").read_text())["expand_timesteps"] is True
        assert json.loads((tmp_path / name / "export/manifest.json").read_text())["metrics"]["weights_identical"]
        pipe = cls.from_pretrained(export)
        first = {"image": Image.fromarray(first_frames()[0].numpy())} if name == "i2v" else {}
        video = pipe(prompt="a red square moves right", height=32, width=32, num_frames=5, num_inference_steps=2, max_sequence_length=16, output_type="np", **first).frames[0]
        assert video.shape == (5, 32, 32, 3) and np.isfinite(video).all()
    assert json.loads((tmp_path / "i2v/evaluate/manifest.json").read_text())["metrics"]["samples"] >= 1
    result = mmcore_cli("run", "--pack", "wan", *TINY, "data.demo_samples=8", "data.buckets=[[48, 48, 5]]", "--run-dir", "bad", check=False)
    assert result.returncode != 0
    assert "bucket 48x48: this checkpoint's VAE compresses 16x and its transformer patches 2x2 latents: height and width must be multiples of 32" in result.stderr


@pytest.mark.compares_runs
def test_ti2v_training_from_the_cache_equals_encoding_on_the_fly(mmcore_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache_matches_on_the_fly(mmcore_cli, tmp_path, ["--pack", "wan-i2v", *TINY, "data.demo_samples=12", "data.eval_fraction=0.25"])
