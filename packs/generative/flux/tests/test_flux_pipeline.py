"""FLUX for real: the pipeline's latent packing, bit-reproducible tiny builds, cache == on the
fly, FSDP2, and the demo's held-out loss falling with an export FluxPipeline generates from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcore.testing import cache_matches_on_the_fly, diffusion_demo_holds, two_processes_match_one

TINY = ["--pack", "flux", "--preset", "tiny"]


def test_latents_are_packed_as_the_pipeline_packs_them() -> None:
    """The pack uses the kit's public layouts; FluxPipeline's private ones are the reference."""
    import torch
    from diffusers import FluxPipeline

    from mm_pack_flux.family import denoiser_inputs
    from mmcore.kits import pack_latents, unpack_latents

    latents = torch.randn(2, 16, 8, 6)
    packed = pack_latents(latents, patch=2)
    assert torch.equal(packed, FluxPipeline._pack_latents(latents, 2, 16, 8, 6))
    assert torch.equal(unpack_latents(packed, None, 8, 6, patch=2), latents)
    # the pipeline's unpacking takes pixel sizes (latents x its VAE's 8)
    assert torch.equal(FluxPipeline._unpack_latents(packed, 64, 48, 8), latents)
    config = type("Config", (), {"pooled_projection_dim": 4, "guidance_embeds": False})
    inputs = denoiser_inputs(type("Model", (), {"config": config}), packed, 8, 6, torch.ones(2), torch.zeros(2, 5, 8), 1.0)
    assert torch.equal(inputs["img_ids"], FluxPipeline._prepare_latent_image_ids(2, 4, 3, packed.device, packed.dtype))


def test_two_builds_of_a_preset_are_identical(tmp_path: Path) -> None:
    """Run directories are compared, so init:tiny gives the same files every time (the CLIP
    and T5 vocabularies are built, not trained: a BPE trainer breaks ties at random)."""
    from mm_pack_flux.tiny import build_init_checkpoint

    build_init_checkpoint("tiny", tmp_path / "a", seed=0)
    build_init_checkpoint("tiny", tmp_path / "b", seed=0)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert {"tokenizer/tokenizer.json", "tokenizer_2/tokenizer.json", "transformer/config.json"} <= {f.as_posix() for f in files}
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_training_from_the_cache_equals_encoding_on_the_fly(flux, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """VAE latents, T5 states and CLIP's pooled vector from the cache, or encoded per batch:
    bit-identical losses (the same frozen encoders on one image or caption at a time), and the
    held-out loss at fixed noise the same too."""
    cache_matches_on_the_fly(flux, tmp_path, [*TINY, "data.demo_samples=12", "data.eval_fraction=0.25"])


@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # qwen2vl's and qwen3vl-moe's FSDP2 tests are the representative cases in `make test`
def test_two_process_fsdp2_matches_one_process(flux, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # each sample's noise, noise level and caption dropout come from its own seed (TrainRecipe.sample_seeds)
    two_processes_match_one(flux, tmp_path, [*TINY, "data.demo_samples=8", "training.caption_dropout=0.5"])


@pytest.mark.slow
@pytest.mark.matrix  # 4 min under CI's load; tools/demo_matrix.py holds its promise, the tiny run below the user's path after it
@pytest.mark.compares_runs
def test_demo_held_out_loss_falls_and_the_export_generates_in_plain_diffusers(flux, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The README's promise: the held-out velocity error at fixed noise falls below 0.6x its
    # start, with another picture's caption it is at least 1.5x that with its own, and at least
    # 80 % of the pictures sampled for the held-out captions are in the caption's colour.
    run = diffusion_demo_holds(flux, tmp_path, "flux", sensitivity=1.5)  # one image per held-out caption
    evaluate = json.loads((run / "evaluate/manifest.json").read_text())["metrics"]
    assert evaluate["colour_agreement"] >= 0.8 and (run / "evaluate/samples/sample-0.png").is_file(), evaluate
    export_generates_and_infer_agrees(flux, run, "demo")


def test_the_export_generates_in_plain_diffusers_and_infer_agrees(flux, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The user's path after training, on the tiny preset (the demo's promise is the matrix test above)."""
    flux("run", *TINY, "data.demo_samples=8", "data.eval_fraction=0.25", "--run-dir", "tiny")
    run = tmp_path / "tiny"
    assert json.loads((run / "export/manifest.json").read_text())["metrics"]["weights_identical"]
    assert (run / "evaluate/samples/sample-0.png").is_file()
    export_generates_and_infer_agrees(flux, run, "tiny")


def export_generates_and_infer_agrees(flux, run: Path, run_dir: str) -> None:  # type: ignore[no-untyped-def]
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(run / "export/pipeline")
    image = pipe("a red circle", height=64, width=64, num_inference_steps=2, max_sequence_length=8, output_type="np").images[0]
    assert image.shape == (64, 64, 3) and np.isfinite(image).all()
    # `mmcore infer`: the same image from the training checkpoint and from the export (same seed)
    pictures = []
    for which in ("latest", "export"):
        proc = flux("infer", "--run-dir", run_dir, "--checkpoint", which, "--prompt", "a blue square", "--num-inference-steps", "3")
        from PIL import Image

        pictures.append(np.asarray(Image.open(Path(proc.stdout.split("image: ")[1].split(",")[0].strip()))).astype(int))
    assert np.abs(pictures[0] - pictures[1]).max() <= 2  # same weights; CPU kernels may round by the buffers' alignment
