"""Export: a diffusers folder ``WanPipeline.from_pretrained`` loads, plus sample videos to look at."""

from __future__ import annotations

import shutil
from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.pack import StageResult
from mmcore.rundir import Manifest

TRANSFORMER_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json")


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch
    from diffusers import WanPipeline, WanTransformer3DModel

    from mm_pack_wan.adapter import ADAPTER
    from mm_pack_wan.model import build_transformer
    from mmcore.convert import dcp_to_hf
    from mmcore.data.video import contact_sheet, write_mp4

    source = upstream["download"].output("model")
    checkpoint = upstream["train"].output("checkpoint").resolve()
    out = ctx.stage_dir / "pipeline"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out, ignore=lambda folder, names: [n for n in names if n in TRANSFORMER_WEIGHTS and folder.endswith("transformer")])
    stats = dcp_to_hf(checkpoint, out / "transformer", ADAPTER)
    if stats["shards"] > 1:  # diffusers' shard names
        raise StageError("multi-shard transformer export is not supported yet; raise export max_shard_bytes")
    (out / "transformer" / "model.safetensors").rename(out / "transformer" / "diffusion_pytorch_model.safetensors")

    # The export must be the trained transformer exactly: every weight bit-identical once loaded.
    trained = build_transformer(source, checkpoint).eval()
    loaded = WanTransformer3DModel.from_pretrained(out / "transformer").eval()
    ours, theirs = trained.state_dict(), loaded.state_dict()
    differing = [k for k in ours if k not in theirs or not torch.equal(ours[k], theirs[k])]
    if differing or set(theirs) != set(ours):
        raise StageError(f"the exported transformer's weights differ from the trained ones: {(differing or sorted(set(theirs) ^ set(ours)))[0]}")
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 16, 3, 4, 4, generator=gen)
    text = torch.randn(1, ctx.config.data.max_sequence_length, trained.config.text_dim, generator=gen)
    with torch.no_grad():
        a = trained(hidden_states=latents, timestep=torch.tensor([500.0]), encoder_hidden_states=text, return_dict=False)[0]
        b = loaded(hidden_states=latents, timestep=torch.tensor([500.0]), encoder_hidden_states=text, return_dict=False)[0]
    # Same weights, same inputs; CPU kernels may still round differently with the buffers'
    # alignment (mmap-loaded vs. allocated), so outputs are compared with a tolerance.
    diff = float((a - b).abs().max())
    if diff > 1e-4:
        raise StageError(f"the exported transformer computes differently from the trained one (max |diff| {diff:.3g})")

    metrics: dict[str, Any] = {**stats, "weights_identical": True, "max_abs_diff": diff}
    notes = [f"diffusers pipeline at {out}; weights bit-identical to training, output max |diff| {diff:.2g}"]
    prompts = list(ctx.config.export.sample_prompts)
    if prompts:
        pipe = WanPipeline.from_pretrained(out)
        pipe.set_progress_bar_config(disable=True)
        height, width, frames = ctx.config.data.buckets[0]
        rows = []
        samples = ctx.stage_dir / "samples"
        for i, prompt in enumerate(prompts):
            video = pipe(prompt, height=height, width=width, num_frames=frames, num_inference_steps=ctx.config.export.sample_steps,
                         guidance_scale=ctx.config.export.guidance_scale, max_sequence_length=ctx.config.data.max_sequence_length,
                         generator=torch.Generator().manual_seed(ctx.seed + i), output_type="np").frames[0]
            pixels = (video.clip(0, 1) * 255).round().astype("uint8")
            write_mp4(samples / f"sample-{i}.mp4", pixels, ctx.config.data.fps)
            rows.append(pixels)
        contact_sheet(samples / "contact_sheet.png", rows, scale=4)
        (samples / "prompts.txt").write_text("\n".join(f"sample-{i}.mp4: {p}" for i, p in enumerate(prompts)) + "\n")
        metrics["samples"] = len(prompts)
        notes.append(f"{len(prompts)} sample videos and a contact sheet in {samples}")
    return StageResult(outputs={"model": "pipeline", "samples": "samples"}, metrics=metrics, notes=notes)
