"""The stepvideo pack's pipeline: training sees the text the pipeline gives its denoiser, the
sampler runs the reference's flow (time 0 = noise, velocity data - noise), the demo keeps its promise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mm_pack_stepvideo.tiny import CLIP_DIM, CLIP_LENGTH, LLM_DIM, build_init_checkpoint

CAPTION_SENSITIVITY = 1.5  # the demo's promise (tools/demo_matrix.py PROMISES["stepvideo"], the README)


def manifest(run: Path, stage: str) -> dict:  # type: ignore[type-arg]
    return json.loads((run / stage / "manifest.json").read_text())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stepvideo") / "pipe"
    build_init_checkpoint("tiny", out, seed=0)
    return out


def test_the_denoiser_gets_the_text_training_caches_at_the_reference_times(tiny: Path) -> None:
    """What extract caches for a caption (Step-LLM's states and mask, CLIP's states) is what the
    pipeline hands its transformer, the mask CLIP's ones then Step-LLM's; the times are
    1 - (linspace(1, 0, n + 1) shifted by 13), as the reference's scheduler (not reversed) runs."""
    from mm_pack_stepvideo.family import Encoders, unpack_text
    from mm_pack_stepvideo.pipeline import StepVideoPipeline

    cached = Encoders(tiny, 16).text("a red square moves right")
    states, mask, clip = unpack_text(cached[None], CLIP_DIM)
    assert states.shape == (1, 16, LLM_DIM) and clip.shape == (1, CLIP_LENGTH, CLIP_DIM)
    assert mask[0, :CLIP_LENGTH].all() and 0 < int(mask[0, CLIP_LENGTH:].sum()) < 16

    pipe = StepVideoPipeline.from_pretrained(tiny)
    pipe.set_progress_bar_config(disable=True)
    seen: list = []  # type: ignore[type-arg]
    pipe.transformer.register_forward_pre_hook(lambda module, args, kwargs: seen.append(args), with_kwargs=True)
    out = pipe("a red square moves right", height=16, width=16, num_frames=5, num_inference_steps=3, guidance_scale=4.0, max_sequence_length=16, generator=torch.Generator().manual_seed(0))
    assert out.frames.shape == (1, 5, 16, 16, 3) and 0 <= out.frames.min() and out.frames.max() <= 1
    latents, timestep, text, got_clip, got_mask = seen[0]
    assert latents.shape[0] == 2  # the prompt and the negative ("")
    torch.testing.assert_close(text[0], states[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got_clip[0], clip[0], rtol=0, atol=1e-5)
    assert torch.equal(got_mask[0].bool(), mask[0])
    s = np.linspace(1, 0, 4)
    levels = 13 * s / (1 + 12 * s)
    assert [float(a[1][0]) for a in seen] == pytest.approx(list(1 - levels[:-1]), abs=1e-6)


def test_the_sampler_follows_the_velocity_from_noise_to_data(tiny: Path) -> None:
    """With the exact velocity of the straight path from noise to a clip (data - x) / (1 - t),
    Euler's steps end on that clip: the time and the velocity's sign are the reference's."""
    from mm_pack_stepvideo.pipeline import StepVideoPipeline

    pipe = StepVideoPipeline.from_pretrained(tiny)
    pipe.set_progress_bar_config(disable=True)
    data = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    pipe.transformer.forward = lambda x, t, *args, **kwargs: ((data - x.float()) / (1 - t.float()).view(-1, 1, 1, 1, 1),)
    out = pipe("a red square moves right", height=16, width=16, num_frames=5, num_inference_steps=4, guidance_scale=1.0, max_sequence_length=16, output_type="latent")
    torch.testing.assert_close(out.frames, data, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.matrix  # the full demo (1500 steps); tools/demo_matrix.py holds its promise over seeds
@pytest.mark.compares_runs
def test_demo_keeps_its_promise(stepvideo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.testing import diffusion_demo_holds

    run = diffusion_demo_holds(stepvideo, tmp_path, "stepvideo", sensitivity=CAPTION_SENSITIVITY, agreement=0.8)
    assert manifest(run, "evaluate")["metrics"]["reconstruction_psnr"] > 17


def test_a_folder_without_the_clip_encoder_is_one_line(stepvideo, tiny: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    shutil.copytree(tiny, tmp_path / "pipe", ignore=lambda folder, names: [n for n in names if n == "text_encoder_2"])
    proc = stepvideo("download", "--pack", "stepvideo", "--preset", "tiny", "--model", str(tmp_path / "pipe"), check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("error: ") and "text_encoder_2" in last, proc.stderr


def test_extract_rules_the_frames_by_the_folders_vae(tiny: Path) -> None:
    """The config leaves frames to the VAE (Step-Video's clips of 17k frames, 204 among them, fit no
    k + 1 rule): extract takes 4k + 1 frames for a diffusers VAE compressing 4x in time and refuses
    others in one line."""
    from mmcore import StageError

    from mm_pack_stepvideo.config import StepVideoConfig
    from mm_pack_stepvideo.family import Encoders

    assert StepVideoConfig.model_validate({"data": {"buckets": [[544, 992, 204]]}}).data.buckets[0][2] == 204
    encoders = Encoders(tiny, 16)
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (6, 16, 16, 3), dtype=np.uint8))
    assert encoders.latents(frames[:5]).shape[1] == 2
    with pytest.raises(StageError, match=r"^bucket of 6 frames: the VAE compresses 4x in time after the first frame: frames must be 4k \+ 1 \(data.buckets\)$"):
        encoders.latents(frames)
