"""BAGEL's stages besides preprocess (:mod:`mm_pack_bagel.data`) and train (the core engine on
:mod:`mm_pack_bagel.recipe`).

- **download**: the core's (hub id, local folder, ``init:tiny`` / ``init:demo``), then the
  release layout checked: the three configs read, ``ema.safetensors`` strictly matching the
  model they describe, ``ae.safetensors`` a FLUX autoencoder.
- **convert**: key coverage (every tensor of ``ema.safetensors`` lands on a parameter of the
  pack's model and every parameter has one; the names are the model's own, nothing renamed),
  then the core's streaming copy of ``ema.safetensors`` into DCP, which training shards from.
- **export**: the trained weights back in the release's layout (``ema.safetensors`` under the
  same names and dtypes, the other files copied), reloaded and checked to give the trained
  model's loss on a stored batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field

from mmcore import Manifest, StageContext, StageResult
from mmcore.config import GenerationSection, RunConfig, TrainingSection
from mm_pack_bagel.data import BagelData


class BagelGeneration(GenerationSection):
    output: Literal["text", "image"] = Field("text", description="infer: text answers, or (image) a picture per prompt by Euler flow sampling and the VAE's decoder, written as a PNG.")


class BagelTraining(TrainingSection):
    caption_dropout: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Probability of training a caption -> picture sample without its caption (the reference's text_cond_dropout_prob, 0.1), so classifier-free guidance's unconditional branch (generation.guidance_scale > 1) is trained; prompt turns that carry a loss (data.train_on_prompt) are kept.",
    )


class BagelRunConfig(RunConfig):
    data: BagelData = Field(default_factory=BagelData)
    training: BagelTraining = Field(default_factory=BagelTraining)
    generation: BagelGeneration = Field(default_factory=BagelGeneration)


def download(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from mmcore.engines import download_stage
    from mm_pack_bagel.checkpoint import build_model, check_layout
    from mm_pack_bagel.config import WEIGHTS
    from mm_pack_bagel.tiny import build_init_checkpoint

    result = download_stage(ctx, upstream, build_init=build_init_checkpoint)
    folder = Path(result.outputs["model"])
    folder = folder if folder.is_absolute() else ctx.stage_dir / folder
    tensors = check_layout(build_model(folder, device="meta"), folder / WEIGHTS)
    return StageResult(outputs=result.outputs, metrics={**result.metrics, "tensors": len(tensors)}, notes=[*result.notes, f"release layout checked: {len(tensors)} tensors in {WEIGHTS}"])


def convert(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import json

    from mmcore.engines import RenameAdapter
    from mmcore.engines import hf_to_dcp
    from mm_pack_bagel.checkpoint import build_model, check_layout
    from mm_pack_bagel.config import WEIGHTS
    from mm_pack_bagel.vae import load_vae

    folder = Path(upstream["download"].output("model"))
    model = build_model(folder, device="meta")
    tensors = check_layout(model, folder / WEIGHTS)
    vae = load_vae(folder / "ae.safetensors")
    # the DCP copy training shards from holds ema.safetensors alone (ae.safetensors is the frozen VAE's)
    staging = ctx.stage_dir / "ema-only"
    staging.mkdir(exist_ok=True)
    link = staging / WEIGHTS
    if not link.exists():
        link.symlink_to((folder / WEIGHTS).resolve())
    stats = hf_to_dcp(staging, ctx.stage_dir / "dcp", RenameAdapter(rules=[]))
    verified = False
    if ctx.config.convert.verify:  # back to safetensors through the same adapter: bit-identical
        import shutil

        from mmcore.engines import compare_hf, dcp_to_hf
        from mmcore.errors import StageError

        back = ctx.stage_dir / "verify"
        dcp_to_hf(ctx.stage_dir / "dcp", back, RenameAdapter(rules=[]))
        problems = compare_hf(staging, back)
        if problems:
            raise StageError(f"convert.verify: the DCP copy of {folder / WEIGHTS} does not round-trip: {problems[0]}")
        shutil.rmtree(back)
        verified = True
    report = {"ema.safetensors": {"tensors": len(tensors), "parameters_covered": len(model.state_dict())}, "ae.safetensors": {"tensors": len(vae.state_dict())}}
    (ctx.stage_dir / "coverage.json").write_text(json.dumps(report, indent=1))
    notes = [
        f"key coverage: every one of {len(tensors)} tensors of {WEIGHTS} lands on its parameter and every parameter has one (names unchanged); the VAE's {len(vae.state_dict())} through diffusers' conversion"
    ]
    return StageResult(
        outputs={"checkpoint": "dcp", "coverage": "coverage.json"},
        metrics={"tensors": len(tensors), "verified": verified, **{k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}},
        notes=notes,
    )


def trained_model(ctx: StageContext, upstream: Mapping[str, Manifest], source: Any = None, *, adapter_to: Path | None = None) -> Any:
    """The model with the weights ``source`` names (``mmcore infer``'s), else the train stage's,
    else the downloaded release folder's; LoRA adapters merged (and, with ``adapter_to``, first
    written there as a PEFT folder)."""
    from mmcore.train import LoraPlan, load_converted, write_peft_adapter
    from mm_pack_bagel.checkpoint import load_model

    kind = getattr(source, "kind", None)
    if kind in ("export", "folder"):
        return load_model(Path(source.path))
    base = Path(upstream["download"].output("model"))
    model = load_model(base)
    checkpoint = Path(source.path) if kind == "train" else None
    if checkpoint is None and "train" in upstream:
        from mmcore.engines import trained_checkpoint

        checkpoint = trained_checkpoint(ctx, upstream)
    if checkpoint is None:
        return model
    load_converted(model, checkpoint)
    plan = LoraPlan.read(checkpoint)
    if plan is None:
        return model
    if adapter_to is not None:
        write_peft_adapter(model, plan, adapter_to, base_model=base)
    from mmcore.train import merged_state
    from mm_pack_bagel.model import Bagel

    plain = Bagel(model.config)
    plain.load_state_dict(merged_state(model), strict=True)
    return plain


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch
    from safetensors.torch import load_file

    from mmcore.data import ShardDataset
    from mmcore.errors import StageError
    from mm_pack_bagel import checkpoint
    from mm_pack_bagel.config import WEIGHTS
    from mm_pack_bagel.model import loss
    from mm_pack_bagel.recipe import BagelRecipe

    adapter = ctx.stage_dir / "adapter"
    model = trained_model(ctx, upstream, adapter_to=adapter).eval()
    folder = checkpoint.export(model, Path(upstream["download"].output("model")), ctx.stage_dir / "bagel")
    saved, state = load_file(str(folder / WEIGHTS)), model.state_dict()
    changed = [k for k in state if not torch.equal(saved[k], state[k].to(saved[k].dtype))]
    if changed:
        raise StageError(f"{folder / WEIGHTS}: tensor {changed[0]} is not the trained one in the file's dtype")
    # the reloaded export on a stored batch (the release keeps bfloat16: near, not equal, to float32 training)
    again = checkpoint.load_model(folder).eval()
    recipe = BagelRecipe(ctx, upstream)
    recipe.config = model.config
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    batch = recipe.collate([data[i] for i in range(min(4, len(data)))])
    noise = None
    if batch.get("padded_latent"):
        clean = model.patchify_latents(batch["padded_latent"], batch["patchified_vae_latent_shapes"])
        noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trained, exported = loss(model(batch, noise=noise)).item(), loss(again(batch, noise=noise)).item()
    notes = [f"exported in the release layout to {folder} ({len(state)} tensors, each the trained one in the file's dtype); loss on a stored batch: trained {trained:.4f}, exported {exported:.4f}"]
    outputs = {"model": "bagel", **({"adapter": "adapter"} if adapter.is_dir() else {})}
    return StageResult(outputs=outputs, metrics={"probe_loss_trained": trained, "probe_loss_exported": exported}, notes=notes)
