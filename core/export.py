"""The export engine's common part: trained DCP checkpoint -> Hugging Face folder, then proof.

Every pack's export writes the weights through its adapter, copies the side files
(config, tokenizer, processors, generation config), reloads the folder with plain
transformers and compares logits with the model built from the training checkpoint on a few
samples: in fp32 they must be identical. Packs then add their family's own check (greedy
answers, an ASR pipeline, generated videos).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.rundir import Manifest


@dataclass
class CheckedExport:
    folder: Path
    trained: Any  # the model built from the training checkpoint (eval mode)
    loaded: Any  # the export, reloaded with transformers (eval mode)
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def export_checked(ctx: StageContext, upstream: Mapping[str, Manifest], adapter: Any, *,
                   build_trained: Callable[[Path, Path], Any], load_exported: Callable[[Path], Any],
                   probe: dict[str, Any], logits: Callable[[Any, dict[str, Any]], Any],
                   side_files: Callable[[Path, Path], None] | None = None) -> CheckedExport:
    """Write ``<stage>/hf`` and check it reproduces the trained model.

    Args:
        ctx: the export stage's context (``export.dtype`` picks the saved dtype).
        upstream: finished stages; ``download`` gives the side files, ``train`` the checkpoint.
        adapter: the pack's state-dict adapter (training names -> hub names).
        build_trained: ``(model dir, checkpoint) -> model`` as training built it.
        load_exported: ``folder -> model`` through transformers' ``from_pretrained``.
        probe: a batch both models run.
        logits: ``(model, batch) -> logits``.
        side_files: ``(model dir, export dir)`` writes the non-weight files (default: copy them).
    """
    import torch

    from mmcore.convert import copy_side_files, dcp_to_hf

    model_dir = upstream["download"].output("model")
    checkpoint = upstream["train"].output("checkpoint").resolve()
    out = ctx.stage_dir / "hf"
    dtype = None if ctx.config.export.dtype in ("auto", "float32") else getattr(torch, ctx.config.export.dtype)
    stats = dcp_to_hf(checkpoint, out, adapter, dtype=dtype)
    (side_files or copy_side_files)(model_dir, out)
    trained = build_trained(model_dir, checkpoint).eval()
    loaded = load_exported(out).eval()
    with torch.no_grad():
        a, b = logits(trained, probe), logits(loaded, probe)
    max_diff = float((a.float() - b.float()).abs().max())
    if dtype is None and max_diff != 0.0:
        raise StageError(f"the exported model's logits differ from the trained model's (max |diff| {max_diff:.3g})")
    return CheckedExport(
        out, trained, loaded,
        metrics={**stats, "logits_max_abs_diff": max_diff},
        notes=[f"exported to {out} ({stats['shards']} shard(s)); reloaded with transformers: logits max |diff| = {max_diff:.3g}"],
    )
