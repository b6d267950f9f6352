"""The export stage: the trained denoiser in a copy of the downloaded pipeline folder under
diffusers' names, reloaded and proven bit-identical to training; after LoRA training, the
adapter as diffusers' ``load_lora_weights`` reads it (and with ``export.merge_lora`` the
pipeline with the adapters merged)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.framework.pack import StageResult
from mmcore.run.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.kits.diffusion.family import DiffusionFamily

#: the file diffusers' ``save_lora_weights`` writes and ``load_lora_weights`` reads
LORA_WEIGHTS = "pytorch_lora_weights.safetensors"


class PipelineExport:
    """The export stage of one family in one run: :meth:`run` writes the pipeline (or the LoRA
    adapter) from the trained checkpoint into the stage's folder."""

    def __init__(self, family: "DiffusionFamily", ctx: StageContext) -> None:
        self.family = family
        self.ctx = ctx

    def run(self, upstream: Mapping[str, Manifest]) -> StageResult:
        from mmcore.engines.export import trained_checkpoint
        from mmcore.train.lora import LoraPlan

        source = upstream["download"].output("model")
        checkpoint = trained_checkpoint(self.ctx, upstream)
        plan = LoraPlan.read(checkpoint)
        if plan is not None:
            return self.lora(source, checkpoint, plan)
        subfolder, _ = self.family.expert(self.ctx, source)
        trained = self.family.build_model(source, checkpoint, subfolder).eval()
        metrics, notes = self.write_pipeline(source, checkpoint, trained, subfolder)
        return StageResult(outputs={"model": "pipeline"}, metrics=metrics, notes=notes)

    def write_pipeline(self, source: Path, checkpoint: Path, trained: Any, subfolder: str | None = None) -> tuple[dict[str, Any], list[str]]:
        """A copy of the downloaded pipeline with the denoiser of ``checkpoint`` (DCP) in it (in
        ``subfolder``, default the family's: the other expert stays as downloaded); every weight
        reloaded must equal ``trained``'s, and its output too."""
        import torch

        from mmcore.engines.convert import dcp_to_hf, refuse_links_out

        family = self.family
        subfolder = subfolder or family.subfolder
        out = self.ctx.stage_dir / "pipeline"
        if out.exists():
            shutil.rmtree(out)
        weights = (family.weights_name, family.weights_name + ".index.json")
        refuse_links_out(source)
        shutil.copytree(source, out, ignore=lambda folder, names: [n for n in names if n in weights and Path(folder).name == subfolder])
        stats = dcp_to_hf(checkpoint, out / subfolder, family.adapter)
        if stats["shards"] > 1:  # diffusers' shard names
            raise StageError("multi-shard denoiser export is not supported yet; raise export max_shard_bytes")
        (out / subfolder / "model.safetensors").rename(out / subfolder / family.weights_name)

        # The folder must open in the generic loader users call, and hold the trained denoiser
        # exactly: every weight bit-identical once loaded (the pipeline's own, so one load; its
        # other models are the download's, untouched, and are not loaded: memory).
        loaded = getattr(load_pipeline(out, only=subfolder, classes=family.diffusers_class), subfolder).eval()
        ours, theirs = trained.state_dict(), loaded.state_dict()
        differing = [k for k in ours if k not in theirs or not torch.equal(ours[k], theirs[k])]
        if differing or set(theirs) != set(ours):
            raise StageError(f"the exported denoiser's weights differ from the trained ones: {(differing or sorted(set(theirs) ^ set(ours)))[0]}")
        diff = self.output_diff(trained, loaded)
        metrics: dict[str, Any] = {**stats, "weights_identical": True, "max_abs_diff": diff}
        return metrics, [f"diffusers pipeline at {out}; weights bit-identical to training, output max |diff| {diff:.2g}"]

    def output_diff(self, trained: Any, loaded: Any) -> float:
        """The largest difference of the two denoisers' outputs on the family's probe inputs."""
        import torch

        inputs = self.family.probe(trained, self.ctx, torch.Generator().manual_seed(0))
        with torch.no_grad():  # every output the denoiser returns (LTX-2: the video's and the audio's)
            ours, theirs = trained(**inputs, return_dict=False), loaded(**inputs, return_dict=False)
        # Same weights, same inputs; CPU kernels may still round differently with the buffers'
        # alignment (mmap-loaded vs. allocated), so outputs are compared with a tolerance.
        diff = max(float((a - b).abs().max()) for a, b in zip(ours, theirs) if isinstance(a, torch.Tensor))
        if diff > 1e-4:
            raise StageError(f"the exported denoiser computes differently from the trained one (max |diff| {diff:.3g})")
        return diff

    def lora(self, source: Path, checkpoint: Path, plan: Any) -> StageResult:
        """The LoRA adapter folder, loaded back into the downloaded pipeline and its output
        compared; with ``export.merge_lora`` also the pipeline with the adapters merged."""
        import tempfile

        import torch.distributed.checkpoint as dcp

        from mmcore.train.lora import diffusers_lora_state, merged_state

        family, ctx = self.family, self.ctx
        subfolder, _ = family.expert(ctx, source)
        trained = family.build_model(source, checkpoint, subfolder).eval()
        out = ctx.stage_dir / "lora"
        shutil.rmtree(out, ignore_errors=True)
        state = diffusers_lora_state(trained, plan)
        pipeline_class = family.diffusers_class(family.pipeline_class)
        if hasattr(pipeline_class, "save_lora_weights"):
            pipeline_class.save_lora_weights(str(out), transformer_lora_layers=state, transformer_lora_adapter_metadata=plan.peft_config().to_dict())
        else:  # a pipeline without a LoRA loader (HunyuanVideo 1.5): the same file, which its denoiser's load_lora_adapter reads
            from diffusers.loaders.lora_base import LoraBaseMixin

            LoraBaseMixin._save_lora_weights(save_directory=str(out), lora_layers={"transformer": state}, lora_metadata={"transformer": plan.peft_config().to_dict()})
        pipe = family.lora_pipeline(source, out, subfolder)
        diff = self.output_diff(trained, getattr(pipe, subfolder).eval())
        metrics: dict[str, Any] = {"adapter_tensors": len(state), "adapter_parameters": int(sum(t.numel() for t in state.values())), "max_abs_diff": diff, "lora_r": plan.r}
        how = (
            f"{family.pipeline_class}.load_lora_weights" + (", load_into_transformer_2=True" if subfolder == "transformer_2" else "")
            if hasattr(pipeline_class, "load_lora_weights")
            else f"pipe.{subfolder}.load_lora_adapter(folder, prefix='transformer')"
        )
        notes = [f"LoRA adapter of {subfolder} for {how} at {out}: {metrics['adapter_parameters']:,} parameters; loaded into the downloaded pipeline, the denoiser's output max |diff| {diff:.2g}"]
        outputs = {"model": "lora", "adapter": "lora"}
        if ctx.config.export.merge_lora:
            weights = merged_state(family.build_model(source, checkpoint, subfolder))  # in fp32
            merged = family.build_model(source, subfolder=subfolder).eval()
            merged.load_state_dict(weights, strict=True)
            with tempfile.TemporaryDirectory(dir=ctx.stage_dir) as tmp:
                dcp.save({f"model.{k}": v for k, v in weights.items()}, checkpoint_id=tmp, no_dist=True)
                more, merged_notes = self.write_pipeline(source, Path(tmp), merged, subfolder)
            metrics.update({f"merged_{k}": v for k, v in more.items()})
            notes += merged_notes
            outputs["model"] = "pipeline"
        return StageResult(outputs=outputs, metrics=metrics, notes=notes)


def load_pipeline(folder: Path, only: str | None = None, classes: Callable[[str], Any] | None = None) -> Any:
    """``diffusers.DiffusionPipeline.from_pretrained(folder)``, the loader users call on a pipeline
    folder (it picks the class ``model_index.json`` names); what keeps it from loading is a
    one-line :class:`StageError` naming the folder, the ``_class_name`` and the cause. ``only``:
    the component the caller needs; the text and image encoders (``transformers`` models) are
    then passed as None, not loaded (the export checks the denoiser it wrote; the encoders it
    copied can be larger than it: UMT5-XXL's 5.7B parameters beside Wan2.1-1.3B). The VAE,
    schedulers, tokenizers and processors still load. ``classes``: name -> pipeline class, for a
    pack that carries its own (:meth:`DiffusionFamily.diffusers_class`; Open-Sora Plan): that
    class's ``from_pretrained`` loads the folder."""
    import json

    import diffusers

    try:
        index = json.loads((folder / "model_index.json").read_text())
    except (OSError, ValueError) as exc:
        raise StageError(f"export: diffusers.DiffusionPipeline.from_pretrained cannot load {folder}: model_index.json: {type(exc).__name__}: {exc}") from None
    name = index.get("_class_name")
    cannot = f"export: diffusers.DiffusionPipeline.from_pretrained cannot load {folder}: model_index.json _class_name {name!r}"
    try:
        named = (classes or (lambda n: getattr(diffusers, n)))(name) if isinstance(name, str) else None
    except AttributeError:
        named = None
    if not (isinstance(named, type) and issubclass(named, diffusers.DiffusionPipeline)):
        raise StageError(f"{cannot} is not a diffusers pipeline")
    # the encoders (transformers models) only: some pipelines read their VAE's config in __init__
    skipped = {} if only is None else {part: None for part, entry in index.items() if part != only and isinstance(entry, list) and entry[:1] == ["transformers"] and _is_model(folder / part)}
    try:
        loader = diffusers.DiffusionPipeline if getattr(diffusers, name, None) is named else named  # a pack's own class loads itself
        return loader.from_pretrained(folder, **skipped)
    except Exception as exc:  # the library's own reason, in one line
        cause = " ".join(str(exc).split())[:300]
        raise StageError(f"{cannot}: {type(exc).__name__}: {cause}") from exc


def _is_model(part: Path) -> bool:
    """A pipeline component with weights (a folder holding safetensors or bin files)."""
    return part.is_dir() and any(path.suffix in (".safetensors", ".bin") for path in part.iterdir())


__all__ = ["LORA_WEIGHTS", "PipelineExport", "load_pipeline"]
