"""MindSpeed-MM's Megatron checkpoint layout, read and written, so trained weights move between
it and mmcore both ways.

The layout (what MindSpeed-MM's ``mm-convert`` writes and its training saves)::

    latest_checkpointed_iteration.txt        "release", or the iteration number
    release/ (or iter_0001000/)
        mp_rank_00/model_optim_rng.pt        one file per tensor-parallel rank ...
        mp_rank_00_001/model_optim_rng.pt    ... and pipeline stage, when there are several

each file a ``torch.save``d ``{"model": state_dict, "checkpoint_version": 3.0}`` (a virtual
pipeline: ``model0``, ``model1``, ... one per chunk; a trained one also holds the optimizer, RNG
and the run's arguments, which are not read). The files are pickles, so they are read with
``torch.load(weights_only=True)`` only: tensors, containers and numbers, plus
``argparse.Namespace`` (Megatron's saved arguments); anything else is refused with the file's
name. Names, fusions and splits come from the family's :class:`mmcore.backends.megatron.tensor_map.ParallelMap`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.errors import StageError
from mmcore.backends.megatron.tensor_map import ParallelMap, State, even_layers

if TYPE_CHECKING:
    import torch

LATEST = "latest_checkpointed_iteration.txt"
FILE = "model_optim_rng.pt"
CHECKPOINT_VERSION = 3.0
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")


def rank_dir(tp_rank: int, pp_rank: int, pp: int) -> str:
    return f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "")


def write_checkpoint(
    folder: Path, pmap: ParallelMap, hf_state: Mapping[str, "torch.Tensor"], tp: int = 1, pp: int = 1, layers: Mapping[str, Sequence[int]] | None = None, iteration: str = "release"
) -> dict[str, Any]:
    """Write ``hf_state`` (an HF state dict) in MindSpeed-MM's layout at ``tp`` x ``pp``.
    ``layers``: each stack's layer count per pipeline stage (default: the vision stacks on the
    first stage, the language model's layers spread by :func:`even_layers`; MindSpeed-MM's
    ``pipeline_num_layers``). Returns the placement written."""
    import torch

    megatron = pmap.to_megatron(hf_state)
    placement = {s.prefix: list(layers[s.prefix]) if layers and s.prefix in layers else default_layers(pmap, megatron, s.prefix, pp) for s in pmap.stacks}
    folder.mkdir(parents=True, exist_ok=True)
    for tp_rank, rank_state in enumerate(pmap.split_tp(megatron, tp)):
        for pp_rank, stage in enumerate(pmap.split_pp(rank_state, placement) if pmap.stacks else [rank_state]):
            out = folder / iteration / rank_dir(tp_rank, pp_rank, pp) / FILE
            out.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": stage, "checkpoint_version": CHECKPOINT_VERSION}, out)
    (folder / LATEST).write_text(iteration)
    return {"tensor_parallel": tp, "pipeline_parallel": pp, "layers": placement}


def default_layers(pmap: ParallelMap, megatron: State, prefix: str, pp: int) -> list[int]:
    """The last stack (the language model) spread over the stages; the others on the first."""
    total = pmap.layer_count(megatron, next(s for s in pmap.stacks if s.prefix == prefix))
    if prefix == pmap.stacks[-1].prefix:
        return even_layers(total, pp)
    return [total] + [0] * (pp - 1)


def is_checkpoint(folder: Path) -> bool:
    return (folder / LATEST).is_file()


def read_checkpoint(folder: Path, pmap: ParallelMap) -> tuple[State, dict[str, Any]]:
    """(the HF state dict, what was found: iteration, tensor_parallel, pipeline_parallel) of a
    MindSpeed-MM checkpoint folder, whatever its TP/PP: the layer placement is read from the
    files themselves (no ``pipeline_num_layers`` to repeat)."""
    loaded, found = _read_rank_files(folder)
    for path, chunks in loaded.values():  # a tensor the table does not know: named with the file that holds it
        for chunk in chunks:
            for name in chunk:
                try:
                    pmap.rule_of(name)
                except StageError as exc:
                    raise StageError(f"{path}: {exc}") from None
    stages = _in_pipeline_order(loaded, found)
    ranks = [pmap.merge_pp(per_tp) for per_tp in stages]
    return pmap.to_hf(pmap.merge_tp(ranks)), found


def read_stages(folder: Path) -> tuple[list[list[State]], dict[str, Any]]:
    """The model state of every (tensor-parallel rank, pipeline stage) of the checkpoint, stages
    in pipeline order (a virtual pipeline's chunks interleaved as Megatron runs them)."""
    loaded, found = _read_rank_files(folder)
    return _in_pipeline_order(loaded, found), found


def _in_pipeline_order(loaded: Mapping[tuple[int, int], tuple[Path, list[State]]], found: Mapping[str, Any]) -> list[list[State]]:
    tp, pp = found["tensor_parallel"], found["pipeline_parallel"]
    stages: list[list[State]] = []
    for t in range(tp):
        chunks = [loaded[(t, p)][1] for p in range(pp)]
        stages.append([chunks[p][v] for v in range(len(chunks[0])) for p in range(pp)])  # Megatron's order: chunk v of every stage, then v + 1
    return stages


def _read_rank_files(folder: Path) -> tuple[dict[tuple[int, int], tuple[Path, list[State]]], dict[str, Any]]:
    """(tensor-parallel rank, pipeline stage) -> (its file, its model chunks), and what was
    found; every problem of one file is an error naming that file."""
    latest = folder / LATEST
    if not latest.is_file():
        raise StageError(f"{folder}: no {LATEST}: not a MindSpeed-MM (Megatron) checkpoint folder")
    iteration = latest.read_text().strip()
    if iteration != "release" and not iteration.isdigit():
        raise StageError(f"{latest}: {iteration!r} is neither 'release' nor an iteration number")
    root = folder / (iteration if iteration == "release" else f"iter_{int(iteration):07d}")
    if not root.is_dir():
        raise StageError(f"{latest} names iteration {iteration}, but {root} does not exist")
    ranks: dict[tuple[int, int], Path] = {}
    for child in sorted(root.iterdir()):
        match = _RANK_DIR.match(child.name)
        if not match:
            continue
        if match.group(3) is not None:
            raise StageError(f"{child}: expert-parallel checkpoints (mp_rank_TT_PPP_EEE) are not supported yet")
        ranks[(int(match.group(1)), int(match.group(2) or 0))] = child / FILE
    if not ranks:
        raise StageError(f"{root}: no mp_rank_* folders")
    tp = 1 + max(t for t, _ in ranks)
    pp = 1 + max(p for _, p in ranks)
    missing = [rank_dir(t, p, pp) for t in range(tp) for p in range(pp) if (t, p) not in ranks]
    if missing:
        raise StageError(f"{root}: {missing[0]} is missing (the checkpoint has {tp} tensor-parallel ranks x {pp} pipeline stages)")
    loaded = {key: (path, _load(path)) for key, path in sorted(ranks.items())}
    for (t, p), (path, chunks) in loaded.items():
        # the tensor-parallel ranks of a stage hold the same tensors, each its shard: the odd one out is named
        first, reference = loaded[(0, p)]
        for v, chunk in enumerate(chunks):
            other = reference[v] if v < len(reference) else {}
            if set(chunk) != set(other):
                odd = sorted(set(chunk) ^ set(other))[0]
                has = ("holds", "does not") if odd in chunk else ("lacks", "holds")
                raise StageError(f"{path}: {has[0]} tensor {odd}, which {first} (tensor-parallel rank 0 of the same stage) {has[1]}")
    found = {"iteration": iteration, "tensor_parallel": tp, "pipeline_parallel": pp, "virtual_pipeline": len(loaded[(0, 0)][1])}
    return loaded, found


def _load(path: Path) -> list[State]:
    """One rank file's model state(s) (one per virtual chunk), tensors only."""
    import argparse
    import pickle

    import torch

    if not path.is_file():
        raise StageError(f"{path}: missing")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StageError(f"{path}: refused to unpickle (weights_only): {first}") from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise StageError(f"{path}: unreadable ({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None
    if not isinstance(saved, dict):
        raise StageError(f"{path}: holds a {type(saved).__name__}, not a Megatron checkpoint dict")
    chunks = [saved["model"]] if "model" in saved else [saved[k] for k in sorted((k for k in saved if re.fullmatch(r"model\d+", str(k))), key=lambda k: int(k[5:]))]
    if not chunks:
        raise StageError(f"{path}: no 'model' state dict in it (keys: {', '.join(map(str, list(saved)[:6]))})")
    out = []
    for chunk in chunks:
        if not isinstance(chunk, dict):
            raise StageError(f"{path}: its model state is a {type(chunk).__name__}, not a dict of tensors")
        # Transformer Engine's _extra_state entries (None or bytes) carry no weights
        tensors = {k: v for k, v in chunk.items() if isinstance(v, torch.Tensor) and not k.endswith("._extra_state")}
        bad = next((k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())), None)
        if bad is not None:
            raise StageError(f"{path}: tensor {bad} holds nan or inf values (a diverged or damaged checkpoint)")
        out.append(tensors)
    return out


def export_mindspeed(ctx: Any, hf_folder: Path, parallel_map: Callable[[Path], ParallelMap]) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """The export stage's ``export.format: mindspeed-mm`` part: the exported HF folder in
    MindSpeed-MM's layout at ``export.tensor_parallel`` x ``export.pipeline_parallel`` in
    ``<stage>/mindspeed-mm``, read back and required bit-identical. Returns (outputs, metrics, notes)."""
    import shutil

    from safetensors.torch import load_file

    files = sorted(hf_folder.glob("*.safetensors"))
    if not (hf_folder / "config.json").is_file() or not files or any(f.name.startswith("adapter_model") for f in files):
        raise StageError(f"{hf_folder}: export.format=mindspeed-mm writes whole weights, and this export is not a full model (after LoRA training set export.merge_lora: true)")
    cfg = ctx.config.export
    state: State = {}
    for path in files:
        state.update(load_file(path))
    pmap = parallel_map(hf_folder)
    layers = {pmap.stacks[-1].prefix: list(cfg.pipeline_layers)} if cfg.pipeline_layers and pmap.stacks else None
    out = ctx.stage_dir / "mindspeed-mm"
    shutil.rmtree(out, ignore_errors=True)
    written = write_checkpoint(out, pmap, state, cfg.tensor_parallel, cfg.pipeline_parallel, layers)
    back, _ = read_checkpoint(out, pmap)
    differing = sorted(k for k in state if k not in back or not _identical(back[k], state[k])) or sorted(set(back) - set(state))
    if differing:
        raise StageError(f"{out}: read back, tensor {differing[0]} differs from the export")
    placement = "; ".join(f"{prefix.rstrip('.')}: {counts}" for prefix, counts in written["layers"].items())
    note = (
        f"MindSpeed-MM (Megatron) layout at TP={cfg.tensor_parallel} x PP={cfg.pipeline_parallel} in {out} (layers per stage: {placement}); "
        f"read back, all {len(state)} tensors bit-identical to the export"
    )
    metrics = {"mindspeed_tensor_parallel": cfg.tensor_parallel, "mindspeed_pipeline_parallel": cfg.pipeline_parallel}
    return {"mindspeed_mm": "mindspeed-mm"}, metrics, [note]


def import_mindspeed(ctx: Any, folder: Path, model_dir: Path, parallel_map: Callable[[Path], ParallelMap]) -> tuple[Path, str]:
    """The convert stage's ``convert.mindspeed_mm`` part: the checkpoint's weights as an HF
    folder (``<stage>/imported``, with ``model_dir``'s config and side files) for the usual
    conversion. Returns (that folder, a note)."""
    import shutil

    from safetensors.torch import save_file

    from mmcore.engines.convert import copy_side_files

    if not folder.is_dir():
        raise StageError(f"convert.mindspeed_mm: {folder} is not a folder")
    ctx.record_input(folder)
    state, found = read_checkpoint(folder, parallel_map(model_dir))
    out = ctx.stage_dir / "imported"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    copy_side_files(model_dir, out)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    note = (
        f"imported the MindSpeed-MM checkpoint {folder} (iteration {found['iteration']}, TP={found['tensor_parallel']} x "
        f"PP={found['pipeline_parallel']}): {len(state)} tensors, config and tokenizer from {model_dir}"
    )
    return out, note


def _identical(a: "torch.Tensor", b: "torch.Tensor") -> bool:
    import torch

    return a.dtype == b.dtype and torch.equal(a, b)


__all__ = ["LATEST", "FILE", "write_checkpoint", "read_checkpoint", "read_stages", "is_checkpoint", "rank_dir", "default_layers", "export_mindspeed", "import_mindspeed"]
