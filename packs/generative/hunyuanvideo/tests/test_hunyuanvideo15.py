"""HunyuanVideo 1.5 (``--pack hunyuanvideo1.5``): the denoiser gets what HunyuanVideo15Pipeline
gives it (Qwen and ByT5 states with their masks, zero condition latents, mask and image tokens),
the tiny tokenizer cut where the pipeline cuts, the conformance suite, and the demo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmcore.testing import cache_matches_on_the_fly, diffusion_demo_holds, two_processes_match_one, PackConformance


class TestHunyuanVideo15Conformance(PackConformance):
    pack_name = "hunyuanvideo1.5"
    overrides = ("data.demo_samples=8", "data.eval_fraction=0.25")
    infer_request = {"prompt": "a red square moves right"}
    # LoRA stays in make test: this pipeline has no LoRA loader, so the adapter goes through its
    # denoiser's load_lora_adapter, a path no other pack runs; kill-and-resume is the kit's (wan's)
    matrix = ("test_training_killed_mid_run_resumes_to_the_same_losses",)


def test_the_denoiser_gets_what_the_pipeline_gives_it(tmp_path: Path) -> None:
    """A cached caption through ``predict`` reaches the transformer as the pipeline's own call
    does, bit for bit, and the caption's first token is the user's text, not the system prompt's."""
    import torch
    from diffusers import HunyuanVideo15Pipeline

    from mm_pack_hunyuanvideo.tiny import build_v15_checkpoint
    from mm_pack_hunyuanvideo.v15 import Encoders, predict

    build_v15_checkpoint("tiny", tmp_path / "pipe", seed=0)
    caption = 'a red square moves right, a sign says "hi"'  # quoted text: ByT5's glyph sequence is used
    cached = Encoders(tmp_path / "pipe", 0).text(caption)
    pipe = HunyuanVideo15Pipeline.from_pretrained(tmp_path / "pipe")
    pipe.guider = pipe.guider.new(guidance_scale=1.0)  # one conditional pass
    seen: dict = {}  # type: ignore[type-arg]
    pipe.transformer.register_forward_pre_hook(lambda module, args, kwargs: seen.update(kwargs), with_kwargs=True)
    pipe(caption, height=32, width=32, num_frames=5, num_inference_steps=1, output_type="latent")
    theirs = dict(seen)
    predict(pipe.transformer, theirs["hidden_states"][:, :8], theirs["timestep"] / 1000, cached[None])
    for name in ("hidden_states", "timestep", "encoder_hidden_states", "encoder_attention_mask", "encoder_hidden_states_2", "encoder_attention_mask_2", "image_embeds"):
        assert torch.equal(seen[name].float(), theirs[name].float()), name
    assert theirs["encoder_attention_mask_2"].sum() > 0  # the quoted text was encoded
    assert theirs["encoder_attention_mask"][0].sum() == len(pipe.tokenizer(caption).input_ids) + 5  # + <|im_end|>, \n, <|im_start|>assistant\n


@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # ~9 min here: 2000 caption and image tokens attend in every block, as the pipeline runs it
def test_v15_demo_learns_and_the_export_generates(mmcore_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = diffusion_demo_holds(mmcore_cli, tmp_path, "hunyuanvideo1.5", samples=2)
    from diffusers import HunyuanVideo15Pipeline

    pipe = HunyuanVideo15Pipeline.from_pretrained(run / "export/pipeline")
    video = pipe("a red square moves right", height=32, width=32, num_frames=9, num_inference_steps=2, output_type="np").frames[0]
    assert video.shape == (9, 32, 32, 3) and np.isfinite(video).all()


V15_TINY = ["--pack", "hunyuanvideo1.5", "--preset", "tiny"]


@pytest.mark.compares_runs
def test_v15_training_from_the_cache_equals_encoding_on_the_fly(mmcore_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """1.5's own encoders (Qwen2.5-VL and ByT5 states, masks and their layout in one cached
    tensor) give the same losses cached as encoded during training."""
    cache_matches_on_the_fly(mmcore_cli, tmp_path, [*V15_TINY, "data.demo_samples=8", "data.eval_fraction=0.25"])


@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # hunyuanvideo (1.0)'s and wan's run the same kit path
def test_v15_two_process_fsdp2_matches_one_process(mmcore_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    two_processes_match_one(mmcore_cli, tmp_path, [*V15_TINY, "data.demo_samples=8", "training.caption_dropout=0.5"])
