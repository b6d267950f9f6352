"""``mmcore infer``: answer prompts with a run's model, outside the pipeline.

The command finds the weights (:func:`model_source`), reads the requests, hands them to the
pack's ``mmcore_infer`` hook in one call (the pack batches), and prints or writes one result
per request. A request that cannot run is reported on its own line and the others still run;
the exit status is 1 when any failed. Nothing in the run directory changes but ``infer/``,
where generated files go, so a run may be tried while it trains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from mmcore.checkpoint.training import newest_complete
from mmcore.framework.context import StageContext
from mmcore.errors import StageError, UsageError
from mmcore.engines.generation import ModelSource, Request
from mmcore.framework.pack import STAGES
from mmcore.run.rundir import Manifest, RunDir, output_problems


def model_source(run_dir: RunDir, which: str, manifests: dict[str, Manifest]) -> ModelSource:
    """The weights ``--checkpoint`` names: ``latest`` (the train stage's newest complete
    checkpoint, finished or not), ``export``, or a path (a DCP checkpoint or an
    ecosystem folder)."""
    if which == "latest":
        train = manifests.get("train")
        found = train.output("checkpoint").resolve() if train is not None else newest_complete(run_dir.stage_dir("train") / "checkpoints")
        if found is None:
            raise UsageError(f"{run_dir.root} has no training checkpoint yet", hint="train first, or give --checkpoint export or a model folder")
        return ModelSource("train", Path(found))
    if which == "export":
        export = manifests.get("export")
        if export is None:
            raise UsageError(f"the export stage has not finished in {run_dir.root}", hint="run `mmcore export`, or use --checkpoint latest")
        return ModelSource("export", export.output("model"))
    path = Path(which).expanduser().resolve()
    if not path.exists():
        raise UsageError(f"--checkpoint {which}: no such file or folder (give latest, export or a path)")
    if (path / ".metadata").is_file():
        from mmcore.checkpoint.safe_dcp import read_metadata

        try:
            read_metadata(path)
        except StageError as exc:  # the command names a checkpoint that is not one: the command is to fix
            raise UsageError(f"--checkpoint {which}: {exc}", hint=exc.hint) from None
        return ModelSource("train", path)
    return ModelSource("folder", path)


def finished_manifests(run_dir: RunDir) -> dict[str, Manifest]:
    """The finished stages, each output checked as a stage checks its upstream before reading
    it (sizes, small files' sha256: ``mmcore verify --quick``): a changed file is refused."""
    found = {}
    for stage in STAGES:
        manifest = run_dir.read_manifest(stage)
        if manifest is not None and manifest.status == "finished":
            problems = output_problems(manifest)
            if problems:
                raise StageError(
                    f"the output of stage {stage!r} changed after it finished: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                    hint=f"nothing read it; rerun `mmcore {stage} --force --run-dir {run_dir.root}` (or `mmcore run`) to rebuild it, `mmcore verify` checks every file",
                )
            found[stage] = manifest
    return found


def run_infer(plugins: Any, session: Any, which: str, requests: Sequence[Request], *, debug: bool = False, echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Answer ``requests`` with the model ``which`` of ``session``'s run; one result per request."""
    from mmcore.engines.download import TRUST_REMOTE_CODE

    pack, run_dir = session.pack, session.run_dir
    if not plugins.has_infer(pack):
        raise UsageError(f"the {pack} pack has no infer (its stages: {', '.join(plugins.implemented_stages(pack))})")
    manifests = finished_manifests(run_dir)
    if "download" not in manifests:
        raise UsageError(f"{run_dir.root}: the download stage has not finished, so there is no model to try", hint=f"run `mmcore run --pack {pack} --run-dir {run_dir.root}`")
    source = model_source(run_dir, which, manifests)
    stage_dir = run_dir.stage_dir("infer")
    stage_dir.mkdir(parents=True, exist_ok=True)
    ctx = StageContext(pack=pack, spec=plugins.pack(pack).spec, stage="infer", run_dir=run_dir.root, stage_dir=stage_dir, config=session.config, debug=debug, plugins=plugins)
    TRUST_REMOTE_CODE.set(bool(session.config.model.trust_remote_code))
    _quiet_libraries()
    runnable = [r for r in requests if r.error is None]
    answers: list[dict[str, Any]] = []
    if runnable:
        echo(f"infer: {len(runnable)} request(s) with {source.kind} weights at {source.path}")
        try:
            answers = plugins.stage_caller(pack, "infer")(ctx=ctx, upstream=manifests, model=source, requests=runnable) or []
        except Exception as exc:
            if debug or isinstance(exc, (UsageError, StageError)):
                raise
            message = " ".join(str(exc).split())
            raise StageError(f"infer of pack {pack!r} failed: {type(exc).__name__}: {message}", hint="rerun with --debug for the traceback") from exc
        if len(answers) != len(runnable):
            raise StageError(f"pack {pack!r} answered {len(answers)} of {len(runnable)} requests", hint="this is a bug in the pack")
    by_request = iter(answers)
    return [{"error": r.error} if r.error is not None else next(by_request) for r in requests]


def _quiet_libraries() -> None:
    """The answer is what the user reads: no weight-loading bars or generation-config notices."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    try:
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
        diffusers_logging.set_verbosity_error()
    except ImportError:
        pass


def show(requests: Sequence[Request], results: Sequence[dict[str, Any]], output: Path | None, echo: Callable[[str], None], complain: Callable[[str], None]) -> int:
    """Print results (one request: the answer alone), or write them to ``output`` as JSONL;
    errors go to ``complain``, one line each. Returns how many failed."""
    failed = sum(1 for r in results if "error" in r)
    if output is not None:
        from mmcore.framework.files import atomic_write_text

        rows = [{"request": r.where, "prompt": r.prompt, **({"reference": r.reference} if r.reference is not None else {}), **res} for r, res in zip(requests, results)]
        atomic_write_text(output, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        for r, res in zip(requests, results):
            if "error" in res:
                complain(f"error: {r.where}: {res['error']}")
        complain(f"wrote {len(rows)} result(s) to {output}" + (f"; {failed} failed" if failed else ""))
        return failed
    for r, res in zip(requests, results):
        prefix = f"{r.where}: " if len(requests) > 1 else ""
        if "error" in res:
            complain(f"error: {r.where}: {res['error']}")
        elif "text" in res:
            echo(prefix + res["text"])
        else:
            echo(prefix + ", ".join(f"{k}: {v}" for k, v in res.items()))
    return failed


__all__ = ["finished_manifests", "model_source", "run_infer", "show"]
