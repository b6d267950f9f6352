"""The ``download`` and ``convert`` stages (the others: preprocess, train, export, generate).

``download`` resolves ``model.source`` as mmcore's engine does (``init:tiny``, a hub id) but checks
the folder as a CosyVoice3 one (``cosyvoice3.yaml``, ``CosyVoice-BlankEN/config.json``, the three
``.pt`` state dicts readable), not as a safetensors checkpoint with a root ``config.json``.

``convert`` reads the public ``.pt`` files (the engine reads safetensors): it writes them as one
``model.safetensors`` under the stage, checks key coverage against the model the folder's yaml
describes, streams that file to DCP through mmcore's engine, and with ``convert.verify`` converts
back to safetensors *and* to the three ``.pt`` files, requiring every tensor bit-identical to the
download's.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

from mmcore import StageError, StageResult


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """``model.source: init:tiny``: the tiny random CosyVoice3 folder in the public layout;
    ``init:demo``: the demo's (a larger tiny, with its fitted speech tokenizer and HiFT)."""
    from mm_pack_cosyvoice3.demo import build_demo_checkpoint, build_tiny_with_tokenizer

    if preset not in ("tiny", "demo"):
        raise StageError(f"init:{preset}: the cosyvoice3 pack builds init:tiny and init:demo")
    (build_demo_checkpoint if preset == "demo" else build_tiny_with_tokenizer)(Path(out), seed=seed)


def download(ctx: Any, upstream: Mapping[str, Any]) -> StageResult:
    from mmcore.engines import download_model

    from mm_pack_cosyvoice3.model import PARTS, CheckpointError, read_configs, read_part

    source = ctx.config.model.source or ""
    local = Path(source).expanduser()
    if source and not source.startswith("init:") and local.is_dir():
        ctx.record_input(local)
        result = StageResult(outputs={"model": str(local.absolute())}, metrics={"source": str(local.absolute())})
    else:
        result = download_model(ctx, build_init_checkpoint)
    folder = Path(result.outputs["model"])
    folder = folder if folder.is_absolute() else ctx.stage_dir / folder
    if ctx.world.is_local_main:
        try:
            read_configs(folder)
            tensors = sum(len(read_part(folder, part)) for part in PARTS)
        except CheckpointError as exc:
            raise StageError(str(exc)) from None
        result.notes.append(f"a CosyVoice3 folder: cosyvoice3.yaml, CosyVoice-BlankEN/config.json, llm.pt + flow.pt + hift.pt ({tensors} tensors)")
    return result


def convert(ctx: Any, upstream: Mapping[str, Any]) -> StageResult:
    import torch

    from mmcore.engines import SafetensorsFolder, compare_hf, coverage_problems, dcp_to_hf, expected_tensors, hf_to_dcp

    from mm_pack_cosyvoice3.adapter import ADAPTER
    from mm_pack_cosyvoice3.model import PARTS, CheckpointError, build_model, pt_to_safetensors, read_part, safetensors_to_pt

    model_dir = Path(upstream["download"].output("model"))
    staged, out = ctx.stage_dir / "safetensors", ctx.stage_dir / "dcp"
    for folder in (staged, out):
        shutil.rmtree(folder, ignore_errors=True)
    try:
        stats = pt_to_safetensors(model_dir, staged)
        with torch.device("meta"):
            model = build_model(model_dir)
    except CheckpointError as exc:
        raise StageError(str(exc)) from None
    planned = {key: recipe.info for key, recipe in ADAPTER.to_mm(SafetensorsFolder(staged).index).items()}
    problems = coverage_problems(planned, *expected_tensors(model))
    if problems:
        raise StageError(f"{model_dir}: the checkpoint does not fit the model cosyvoice3.yaml describes: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
    written = hf_to_dcp(staged, out, ADAPTER, progress=lambda it: ctx.progress(it, description="convert", unit="tensor"))
    notes = [f"llm.pt + flow.pt + hift.pt: {stats['tensors']} tensors (the tied lm_head once), {written['bytes'] / 2**20:.1f} MiB -> {out}", "key coverage: exactly the model's tensors, shapes equal"]
    if ctx.config.convert.verify:
        back, back_pt = ctx.stage_dir / "verify", ctx.stage_dir / "verify-pt"
        dcp_to_hf(out, back, ADAPTER)
        mismatches = compare_hf(staged, back, lambda k: k, lambda k, t: t)
        safetensors_to_pt(back, back_pt)
        for part in PARTS:
            a, b = read_part(model_dir, part), read_part(back_pt, part)
            if set(a) != set(b):
                mismatches.append(f"{part}.pt: keys differ ({sorted(set(a) ^ set(b))[0]})")
            mismatches += [
                f"{part}.pt: {k}" for k in a if k in b and (a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)))
            ]
        shutil.rmtree(back)
        shutil.rmtree(back_pt)
        if mismatches:
            raise StageError(f"round trip to mmcore and back is not exact: {mismatches[0]}" + (f" (+{len(mismatches) - 1} more)" if len(mismatches) > 1 else ""))
        notes.append("verified: .pt -> DCP -> safetensors -> .pt is bit-identical for every tensor")
    shutil.rmtree(staged)
    return StageResult(outputs={"checkpoint": "dcp"}, metrics={**written, "verified": bool(ctx.config.convert.verify)}, notes=notes)
