"""The export engine's common part: trained DCP checkpoint -> Hugging Face folder, then proof.

Every pack's export writes the weights through its adapter, copies the side files
(config, tokenizer, processors, generation config), reloads the folder with plain
transformers and compares logits with the model built from the training checkpoint on a few
samples: in fp32 they must be identical. Packs then add their family's own check (greedy
answers, an ASR pipeline, generated videos).

After LoRA training the export is the adapter folder ``<stage>/adapter`` that
``PeftModel.from_pretrained(base, folder)`` loads, checked the same way (peft's layers on the
base against the trained model's logits); ``export.merge_lora`` also writes the merged model to
``<stage>/hf`` (then the ``model`` output) and checks it against the trained model merged alike.
So on either backend: FSDP2 checkpoints hold the adapters (``lora.json``); megatron's hold the
weights merged, with the PEFT folder beside them (:func:`kept_adapter`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.run.rundir import Manifest


def trained_checkpoint(ctx: StageContext, upstream: Mapping[str, Manifest]) -> Path:
    """The checkpoint an export writes: the train stage's moving average of the weights where it
    kept one (``training.ema``) and ``export.weights`` is ``ema``, else its last checkpoint."""
    from mmcore.train.ema import EMA_OUTPUT

    train = upstream["train"]
    if ctx.config.export.weights == "ema" and EMA_OUTPUT in train.outputs:
        return train.output(EMA_OUTPUT).resolve()
    return train.output("checkpoint").resolve()


def kept_adapter(ctx: StageContext, upstream: Mapping[str, Manifest]) -> Path | None:
    """The PEFT adapter folder a backend that merges LoRA into its checkpoint (megatron) wrote
    beside it, the one of the weights :func:`trained_checkpoint` picks; None where the train
    stage kept none (FSDP2 checkpoints hold the adapters themselves)."""
    from mmcore.train.ema import EMA_ADAPTER, EMA_OUTPUT

    train = upstream["train"]
    key = EMA_ADAPTER if ctx.config.export.weights == "ema" and EMA_OUTPUT in train.outputs else "adapter"
    return train.output(key).resolve() if key in train.outputs else None


@dataclass
class CheckedExport:
    folder: Path
    trained: Any  # the model built from the training checkpoint (eval mode)
    loaded: Any  # the export, reloaded by the pack's loader (eval mode)
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    adapter: Path | None = None  # the LoRA adapter folder, after LoRA training

    @property
    def outputs(self) -> dict[str, str]:
        """The export stage's outputs: ``model`` (what evaluate and infer load) and ``adapter``."""
        out = {"model": self.folder.name}
        if self.adapter is not None:
            out["adapter"] = self.adapter.name
        return out


def export_checked(
    ctx: StageContext,
    upstream: Mapping[str, Manifest],
    adapter: Any,
    *,
    build_trained: Callable[[Path, Path], Any],
    load_exported: Callable[[Path], Any],
    probe: dict[str, Any],
    logits: Callable[[Any, dict[str, Any]], Any],
    side_files: Callable[[Path, Path], None] | None = None,
) -> CheckedExport:
    """Write ``<stage>/hf`` and check it reproduces the trained model.

    Args:
        ctx: the export stage's context (``export.dtype`` picks the saved dtype).
        upstream: finished stages; ``download`` gives the side files, ``train`` the checkpoint
            (:func:`trained_checkpoint`).
        adapter: the pack's state-dict adapter (training names -> hub names).
        build_trained: ``(model dir, checkpoint) -> model`` as training built it.
        load_exported: ``folder -> model`` through transformers' ``from_pretrained``.
        probe: a batch both models run.
        logits: ``(model, batch) -> logits``.
        side_files: ``(model dir, export dir)`` writes the non-weight files (default: copy them).
    """
    import torch

    from mmcore.engines.convert import copy_side_files, dcp_to_hf
    from mmcore.train.lora import LoraPlan

    model_dir = upstream["download"].output("model")
    checkpoint = trained_checkpoint(ctx, upstream)
    dtype = None if ctx.config.export.dtype in ("auto", "float32") else getattr(torch, ctx.config.export.dtype)
    plan = LoraPlan.read(checkpoint)
    if plan is not None:
        return _export_adapter(
            ctx, model_dir, checkpoint, plan, adapter, dtype, build_trained=build_trained, load_exported=load_exported, probe=probe, logits=logits, side_files=side_files or copy_side_files
        )
    kept = kept_adapter(ctx, upstream)
    if kept is not None and not ctx.config.export.merge_lora:
        # LoRA merged into the checkpoint by the backend (megatron): as after LoRA on FSDP2, the
        # export is the adapter (``model`` and ``adapter``); the merged model only on request
        trained = build_trained(model_dir, checkpoint).eval()
        done = CheckedExport(ctx.stage_dir / "adapter", trained, None)
        _publish_kept_adapter(ctx, done, kept, model_dir, load_exported=load_exported, probe=probe, logits=logits, side_files=side_files or copy_side_files)
        shutil.rmtree(ctx.stage_dir / "hf", ignore_errors=True)  # a merged export of an earlier attempt: not this config's
        return done
    out = ctx.stage_dir / "hf"
    stats = dcp_to_hf(checkpoint, out, adapter, dtype=dtype)
    (side_files or copy_side_files)(model_dir, out)
    trained = build_trained(model_dir, checkpoint).eval()
    loaded = load_exported(out).eval()
    with torch.no_grad():
        a, b = logits(trained, probe), logits(loaded, probe)
    max_diff = float((a.float() - b.float()).abs().max())
    if dtype is None and max_diff != 0.0:
        raise StageError(f"the exported model's logits differ from the trained model's (max |diff| {max_diff:.3g})")
    done = CheckedExport(
        out,
        trained,
        loaded,
        metrics={**stats, "logits_max_abs_diff": max_diff},
        notes=[f"exported to {out} ({stats['shards']} shard(s)); reloaded as {type(loaded).__name__}: logits max |diff| = {max_diff:.3g}"],
    )
    if kept is not None:  # export.merge_lora: the merged model is the export, the adapter beside it
        _publish_kept_adapter(ctx, done, kept, model_dir, load_exported=load_exported, probe=probe, logits=logits, side_files=side_files or copy_side_files)
    return done


#: how far peft's unmerged adapters on the base may move the logits from the merged weights,
#: relative to the largest logit: fp32 rounding of W x + B A x against (W + B A) x is ~1e-6;
#: adapters of other weights (the last step's against the average) move them by far more
KEPT_ADAPTER_RTOL = 1e-4


def _publish_kept_adapter(
    ctx: StageContext,
    done: CheckedExport,
    kept: Path,
    model_dir: Path,
    *,
    load_exported: Callable[[Path], Any],
    probe: dict[str, Any],
    logits: Callable[[Any, dict[str, Any]], Any],
    side_files: Callable[[Path, Path], None],
) -> None:
    """``<stage>/adapter``: the train stage's PEFT folder beside the merged export, loaded with
    peft on the base and checked against the trained (merged) model's logits."""

    import torch

    from mmcore.train.lora_export import load_adapter_folder

    out = ctx.stage_dir / "adapter"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(kept, out)
    side_files(model_dir, out)
    adapted = load_adapter_folder(load_exported, out, base=model_dir).eval()
    with torch.no_grad():
        reference = logits(done.trained, probe).float()
        diff = float((reference - logits(adapted, probe).float()).abs().max())
    scale = float(reference.abs().max())
    if not diff <= KEPT_ADAPTER_RTOL * max(scale, 1.0):
        raise StageError(f"{kept}: the adapter, loaded with peft on the base, gives other logits than the trained model (max |diff| {diff:.3g}, largest logit {scale:.3g})")
    done.adapter = out
    if done.loaded is None:  # the adapter is the export
        done.loaded = adapted
    done.metrics["adapter_logits_max_abs_diff"] = diff
    done.notes.append(f"LoRA adapter (peft format) at {out}: PeftModel.from_pretrained(base, adapter) gives the trained (merged) model's logits to {diff:.3g} (fp32 rounding of the merge)")


def _compare(a_model: Any, b_model: Any, probe: dict[str, Any], logits: Callable[[Any, dict[str, Any]], Any]) -> float:
    import torch

    with torch.no_grad():
        a, b = logits(a_model, probe), logits(b_model, probe)
    return float((a.float() - b.float()).abs().max())


def _export_adapter(
    ctx: StageContext,
    model_dir: Path,
    checkpoint: Path,
    plan: Any,
    adapter: Any,
    dtype: Any,
    *,
    build_trained: Callable[[Path, Path], Any],
    load_exported: Callable[[Path], Any],
    probe: dict[str, Any],
    logits: Callable[[Any, dict[str, Any]], Any],
    side_files: Callable[[Path, Path], None],
) -> CheckedExport:
    """The peft adapter folder (and with ``export.merge_lora`` the merged model), each reloaded
    and compared with the trained model."""
    import tempfile

    from mmcore.train.lora_export import load_adapter_folder, merged_state, write_peft_adapter

    out = ctx.stage_dir / "adapter"
    shutil.rmtree(out, ignore_errors=True)
    trained = build_trained(model_dir, checkpoint).eval()
    stats = write_peft_adapter(trained, plan, out, base_model=model_dir, dtype=dtype, rename=getattr(adapter, "peft_name", None))
    side_files(model_dir, out)  # tokenizer and processor beside the adapter, as peft's hub repos have them
    loaded = load_adapter_folder(load_exported, out, base=model_dir).eval()
    diff = _compare(trained, loaded, probe, logits)
    if dtype is None and diff != 0.0:
        raise StageError(f"the exported adapter, loaded with peft, gives other logits than the trained model (max |diff| {diff:.3g})")
    metrics: dict[str, Any] = {**stats, "logits_max_abs_diff": diff, "lora_r": plan.r}
    notes = [f"LoRA adapter (peft format) at {out}: {stats['adapter_parameters']:,} parameters; PeftModel.from_pretrained(base, adapter): logits max |diff| = {diff:.3g}"]
    folder = out
    if ctx.config.export.merge_lora:
        import torch.distributed.checkpoint as dcp

        from mmcore.engines.convert import dcp_to_hf

        unmerged = trained
        trained = build_trained(model_dir, checkpoint).eval()
        state = merged_state(trained)  # in fp32, in place: ``trained`` now computes with the merged weights
        folder = ctx.stage_dir / "hf"
        with tempfile.TemporaryDirectory(dir=ctx.stage_dir) as tmp:
            dcp.save({f"model.{k}": v for k, v in state.items()}, checkpoint_id=tmp, no_dist=True)
            written = dcp_to_hf(Path(tmp), folder, adapter, dtype=dtype)
        side_files(model_dir, folder)
        loaded = load_exported(folder).eval()
        merged_diff = _compare(trained, loaded, probe, logits)
        if dtype is None and merged_diff != 0.0:
            raise StageError(f"the merged export's logits differ from the trained model merged alike (max |diff| {merged_diff:.3g})")
        rounding = _compare(unmerged, trained, probe, logits)
        del unmerged
        metrics.update(merged_shards=written["shards"], merged_logits_max_abs_diff=merged_diff, merge_rounding_max_abs_diff=rounding)
        notes.append(
            f"merged model (fp32 merge, {ctx.config.export.dtype}) at {folder}: reloaded, logits max |diff| "
            f"= {merged_diff:.3g}; merging itself moves logits by at most {rounding:.2g} (rounding of W + BA)"
        )
    return CheckedExport(folder, trained, loaded, metrics=metrics, notes=notes, adapter=out)
