"""Running stages: deciding what is up to date, resuming, and writing manifests.

A stage's *plan* hashes what is known before it runs: the pack and its version, the core's
version, the stage's config slice and the fingerprints of the finished stages before it.
Its *fingerprint* adds the content hashes of the inputs it declared while running and of the
files it wrote into the run directory.
A stage is up to date when its manifest has the same plan, its inputs are unchanged and its
outputs exist. Work left by an interrupted stage is resumed only when its plan is the same.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from datetime import datetime
from typing import Any, Literal

from mmcore import __version__
from mmcore.config import RunConfig
from mmcore.framework.console import say
from mmcore.framework.context import StageContext, WorldInfo
from mmcore.errors import MmcoreError, StageError, UsageError, file_system_error
from mmcore.framework.faults import crash_point
from mmcore.engines.download import TRUST_REMOTE_CODE
from mmcore.framework.files import sha256_json
from mmcore.framework.pack import STAGES, StageResult
from mmcore.framework.plugins import Plugins
from mmcore.run.status import unfinished
from mmcore.run.memory import return_freed_memory
from mmcore.framework.stages import ContractError, check_result
from mmcore.run.rundir import Manifest, RunDir, changed_inputs, hash_inputs, hash_outputs, missing_outputs, output_problems
from mmcore.framework.versions import version_record

#: ``no``: start the stage afresh; ``auto``: continue interrupted work if its plan is the
#: same, else start afresh (``mmcore run``); ``required``: continue or fail (``--resume``).
ResumeMode = Literal["no", "auto", "required"]


class Runner:
    """Runs the stages of one pack for one run directory."""

    def __init__(self, plugins: Plugins, pack: str, config: RunConfig, run_dir: RunDir, *, debug: bool = False, world: WorldInfo | None = None) -> None:
        self.plugins = plugins
        self.entry = plugins.pack(pack)
        assert self.entry.spec is not None
        self.spec = self.entry.spec
        self.pack = pack
        self.config = config
        self.run_dir = run_dir
        self.debug = debug
        self.world = world or WorldInfo()
        self.stages = plugins.implemented_stages(pack)
        self._intact: set[tuple[str, float]] = set()  # finished stages whose outputs were checked

    # ------------------------------------------------------------------ planning
    def upstream(self, stage: str) -> dict[str, Manifest]:
        """Finished manifests of the stages before ``stage``; an unfinished one is an error."""
        found: dict[str, Manifest] = {}
        for earlier in STAGES[: STAGES.index(stage)]:
            if earlier not in self.stages or self._disabled(earlier):
                continue
            manifest = self.run_dir.read_manifest(earlier)
            if manifest is None:
                raise UsageError(
                    f"stage {earlier!r} has not finished in {self.run_dir.root}, so {stage!r} cannot use its output",
                    hint=f"run `mmcore {earlier} --pack {self.pack} --run-dir {self.run_dir.root}` or `mmcore run`",
                )
            if manifest.status == "finished":
                problems = self._output_problems(manifest)
                if problems:
                    raise StageError(
                        f"the output of stage {earlier!r} changed after it finished: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                        hint=f"nothing read it; rerun `mmcore {earlier} --force` (or `mmcore run`) to rebuild it, `mmcore verify` checks every file",
                    )
                found[earlier] = manifest
        return found

    def _output_problems(self, manifest: Manifest) -> list[str]:
        """:func:`output_problems`, once per finished stage and process (a pipeline asks for
        each upstream stage again at every later stage)."""
        key = (manifest.stage, manifest.finished_at)
        if key in self._intact:
            return []
        problems = output_problems(manifest)
        if not problems:
            self._intact.add(key)
        return problems

    def plan(self, stage: str, upstream: dict[str, Manifest]) -> str:
        return sha256_json(
            {
                "pack": self.pack,
                "pack_version": self.entry.version,
                "mmcore": __version__,
                "stage": stage,
                "config": self.config.slice(self.spec.sections_for(stage)),
                "upstream": {name: m.fingerprint for name, m in upstream.items()},
            }
        )

    def freshness(self, stage: str, plan: str) -> tuple[bool, str]:
        """(up to date?, why) for ``stage`` under ``plan``."""
        manifest = self.run_dir.read_manifest(stage)
        if manifest is None:
            if not self.run_dir.read_started(stage):
                return False, "not run yet"
            return False, unfinished(self.run_dir.root, self.run_dir.stage_dir(stage)) or "not finished yet"
        if manifest.plan != plan:
            changed = changed_keys(manifest.config, self.config.slice(self.spec.sections_for(stage)))
            if changed:
                return False, "its config changed: " + "; ".join(changed[:3]) + (f" (+{len(changed) - 3} more)" if len(changed) > 3 else "")
            return False, "its config slice or an earlier stage changed"
        if manifest.status != "finished":  # same config, same upstream: the pack would decline again
            return True, f"declined by the {self.pack} pack for this config"
        changed = changed_inputs(manifest)
        if changed:
            return False, f"input changed: {changed[0]}" + (f" (+{len(changed) - 1} more)" if len(changed) > 1 else "")
        missing = missing_outputs(manifest)
        if missing:
            return False, f"output missing: {missing[0]}"
        damaged = self._output_problems(manifest)
        if damaged:
            return False, f"output changed: {damaged[0]}"
        when = datetime.fromtimestamp(manifest.finished_at).strftime("%Y-%m-%d %H:%M:%S")
        return True, f"up to date (finished {when})"

    # ------------------------------------------------------------------ running
    def run_pipeline(self, *, resume: ResumeMode = "auto", force: bool = False) -> list[Manifest]:
        """Every stage in order, skipping visibly what is absent, declined or up to date."""
        done = []
        for stage in STAGES:
            if stage not in self.stages:
                self._skipped(stage, f"the {self.pack} pack has no {stage} stage")
                continue
            if self._disabled(stage):
                self._skipped(stage, f"disabled by {stage}.enabled=false")
                continue
            manifest = self.run_stage(stage, resume=resume, force=force)
            return_freed_memory()  # the next stage's peak starts from what this one still holds
            done.extend([manifest] if manifest is not None else [])
        return done

    def _disabled(self, stage: str) -> bool:
        """A stage the config switched off: skipped by ``run``, and no later stage waits for it."""
        return (stage == "extract" and not self.config.extract.enabled) or (stage == "evaluate" and not self.config.evaluate.enabled)

    def run_stage(self, stage: str, *, resume: ResumeMode = "no", force: bool = False) -> Manifest | None:
        """Run one stage unless it is up to date; returns its manifest (None if declined)."""
        if stage not in self.stages:
            raise UsageError(f"the {self.pack} pack has no {stage} stage (it has: {', '.join(self.stages)})")
        if self.follows:
            return self._follow(stage)
        upstream = self.upstream(stage)
        plan = self.plan(stage, upstream)
        fresh, why = self.freshness(stage, plan)
        if not fresh and not force and self.run_dir.restore_replaced(stage, plan):
            say(f"[{stage}] restored the finished run of this config that an unfinished rerun had set aside (--force runs it again)")
            fresh, why = self.freshness(stage, plan)
        if fresh and not force:
            self._skipped(stage, why)
            return self.run_dir.read_manifest(stage)
        replacing = self._refuse_resuming_finished(stage, resume, force)
        resuming = self._prepare(stage, plan, resume)
        kept = f"; the finished {stage} is kept as {self.run_dir.replaced_dir(stage).name} until this one finishes" if replacing and not resuming else ""
        say(f"[{stage}] {'resuming' if resuming else 'running'}" + ("" if fresh else f" ({why})") + kept)
        if stage in self.spec.distributed_stages and self.config.world_size > 1 and not self.world.distributed:
            return self._launch(stage, plan, resuming)
        manifest = self.execute(stage, plan, upstream, resume=resuming)
        self._report(manifest)
        return manifest

    def _refuse_resuming_finished(self, stage: str, resume: ResumeMode, force: bool) -> bool:
        """``--resume`` continues interrupted work; a finished stage whose own config changed has
        none, and retraining it from scratch would replace it (refused, naming the keys). True
        when ``stage`` has a finished result that this attempt will set aside."""
        manifest, _ = self.run_dir.load_manifest(stage)  # an unreadable one: freshness has warned
        if manifest is None:
            return False
        changed = changed_keys(manifest.config, self.config.slice(self.spec.sections_for(stage)))
        if resume == "required" and changed and not force:
            raise UsageError(
                f"cannot resume {stage!r}: it finished, and its config changed since: " + "; ".join(changed[:3]) + (f" (+{len(changed) - 3} more)" if len(changed) > 3 else ""),
                hint="run it without --resume to redo it with the new config (the finished one is kept until the new one finishes), or drop the changes",
            )
        return manifest.status == "finished"

    def _prepare(self, stage: str, plan: str, resume: ResumeMode) -> bool:
        """Clear the way for ``stage``: drop its manifest, keep or wipe unfinished work."""
        started = self.run_dir.read_started(stage)
        same_plan = started is not None and started.get("plan") == plan
        if resume == "required" and started is not None and not same_plan:
            raise UsageError(
                f"cannot resume {stage!r}: its config slice or an earlier stage changed since it started",
                hint="run it without --resume to start it afresh",
            )
        resuming = resume != "no" and same_plan
        if not resuming:
            self.run_dir.start_afresh(stage)
        self.run_dir.drop_manifest(stage)
        self.run_dir.mark_started(stage, plan, resuming)
        return resuming

    @property
    def follows(self) -> bool:
        """A node other than node 0 of a multi-node run: node 0 runs the stages, this one joins
        the distributed ones (:mod:`mmcore.run.nodes`)."""
        parallel = self.config.parallel
        return parallel.nnodes > 1 and parallel.node_rank > 0 and not self.world.distributed

    def _follow(self, stage: str) -> Manifest | None:
        """Wait for node 0's manifest of ``stage``; join it under torchrun if it is distributed."""
        from mmcore.run.nodes import node0_silent_for, wait_until

        distributed = stage in self.spec.distributed_stages and self.config.world_size > 1
        parallel = self.config.parallel
        say(f"[{stage}] node {self.config.parallel.node_rank}: waiting for node 0 to " + ("start it" if distributed else "run it"))

        def ready() -> tuple[str, Any] | None:
            try:
                upstream = self.upstream(stage)
            except UsageError:
                return None  # node 0 is still on an earlier stage
            plan = self.plan(stage, upstream)
            manifest = self.run_dir.read_manifest(stage)
            if manifest is not None and manifest.plan == plan:
                return ("done", manifest)
            started = self.run_dir.read_started(stage)
            if distributed and started is not None and started.get("plan") == plan:
                return ("join", (plan, bool(started.get("resuming"))))
            silent = node0_silent_for(self.run_dir.root, parallel.node_rank)
            if silent > parallel.rdzv_timeout_s:
                raise StageError(
                    f"node 0 has given no sign of life in {self.run_dir.root} for {silent:.0f} s (parallel.rdzv_timeout_s={parallel.rdzv_timeout_s}) while this node waited for its {stage!r} stage",
                    hint="node 0 died or was stopped: start the run again on every node (finished work is kept)",
                )
            return None

        what, value = wait_until(ready, timeout=None, poll=2.0)  # type: ignore[misc]
        if what == "join":
            plan, resuming = value
            return self._launch(stage, plan, resuming)
        say(f"[{stage}] done by node 0")
        return value if value.status == "finished" else None

    def _launch(self, stage: str, plan: str, resuming: bool) -> Manifest:
        from mmcore.run.launch import launch

        args = ["--run-dir", str(self.run_dir.root), "--pack", self.pack, "--stage", stage, "--plan", plan]
        if resuming:
            args.append("--resume")
        if self.debug:
            args.append("--debug")
        if self.config.model.trust_remote_code:
            args.append("--trust-remote-code")
        launch(self.config.parallel, args, what=f"stage {stage!r}")
        manifest = self.run_dir.read_manifest(stage)
        if manifest is None or manifest.plan != plan:
            raise StageError(f"stage {stage!r} ended without writing its manifest in {self.run_dir.stage_dir(stage)}")
        self._report(manifest)
        return manifest

    def _collective_failure(self, exc: BaseException, stage: str) -> StageError | None:
        """A collective that timed out or lost a peer, said as what it means for the run."""
        if not self.world.distributed:
            return None
        text = " ".join(str(exc).split())
        rank = self.world.rank
        if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
            wait = self.config.parallel.collective_timeout_s
            return StageError(
                f"rank {rank} waited parallel.collective_timeout_s={wait} s in stage {stage!r} for the other processes in a collective: "
                "one of them stalled or hangs (a rank that printed nothing is the one)"
            )
        if any(sign in text for sign in ("Connection reset by peer", "Connection closed by peer", "Broken pipe")):
            return StageError(f"rank {rank} lost another process in a collective in stage {stage!r}: it died or was killed (torchrun's line names it)")
        return None

    def execute(self, stage: str, plan: str, upstream: dict[str, Manifest], *, resume: bool) -> Manifest:
        """Call the pack's stage hook in this process and write the manifest (local rank 0)."""
        stage_dir = self.run_dir.stage_dir(stage)
        stage_dir.mkdir(parents=True, exist_ok=True)
        ctx = StageContext(
            pack=self.pack,
            spec=self.spec,
            stage=stage,
            run_dir=self.run_dir.root,
            stage_dir=stage_dir,
            config=self.config,
            world=self.world,
            resume=resume,
            debug=self.debug,
            plugins=self.plugins,
        )
        hook = self.plugins.pm.hook
        hook.mmcore_stage_started(ctx=ctx)
        started_at = time.time()
        TRUST_REMOTE_CODE.set(bool(self.config.model.trust_remote_code))
        try:
            crash_point(f"{stage}-start")
            result = self.plugins.stage_caller(self.pack, stage)(ctx=ctx, upstream=upstream)
            check_result(self.pack, stage, result, stage_dir, check_paths=self.world.is_main)
            crash_point(f"{stage}-done")  # the work is done, the manifest not yet written
        except BaseException as exc:
            hook.mmcore_stage_finished(ctx=ctx, manifest=None, error=exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)) or (isinstance(exc, MmcoreError) and not isinstance(exc, ContractError)):
                raise
            log = stage_dir / (f"error-rank{self.world.rank}.log" if self.world.distributed else "error.log")
            try:
                log.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
            except OSError as log_exc:
                with contextlib.suppress(OSError):
                    log.unlink()  # an empty error.log would look like a failure without a reason
                log = None  # type: ignore[assignment]
                unlogged = f"no traceback saved: writing {stage_dir} failed too ({log_exc.strerror})"
            fs_error = file_system_error(exc, f"stage {stage!r} of pack {self.pack!r} could not write", where=str(stage_dir))
            if fs_error is not None:
                fs_error.hint = f"{fs_error.hint}; " + (f"the traceback is in {log}" if log is not None else unlogged)
                raise fs_error from exc
            lost = self._collective_failure(exc, stage)
            if lost is not None:
                lost.hint = f"the traceback is in {log}" if log is not None else unlogged
                raise lost from exc
            if log is None:
                raise StageError(f"stage {stage!r} of pack {self.pack!r} failed: {type(exc).__name__}: {' '.join(str(exc).split())}", hint=unlogged) from exc
            if isinstance(exc, ContractError):
                exc.hint = f"this is a bug in the pack; the traceback is in {log}"
                raise
            # one line: libraries' messages run over several (install instructions, validator reports)
            message = " ".join(str(exc).split())
            raise StageError(f"stage {stage!r} of pack {self.pack!r} failed: {type(exc).__name__}: {message}", hint=f"the traceback is in {log}") from exc
        declined = result is None
        result = result or StageResult()
        manifest = Manifest(
            pack=self.pack,
            stage=stage,
            status="declined" if declined else "finished",
            plan=plan,
            fingerprint="",
            config=self.config.slice(self.spec.sections_for(stage)),
            upstream={name: m.fingerprint for name, m in upstream.items()},
            outputs=dict(result.outputs),
            metrics=dict(result.metrics),
            notes=list(result.notes),
            versions=version_record(self.entry.distribution, self.entry.version),
            world_size=self.world.world_size,
            started_at=started_at,
            stage_dir=stage_dir,
        )
        if self.world.distributed:
            import torch.distributed as dist

            dist.barrier()  # every rank finished its part before the stage counts as finished
        if self.world.is_main:  # several nodes share one run directory: one writer
            manifest.inputs = hash_inputs(ctx.inputs)
            manifest.output_files = hash_outputs(manifest)
            # what it wrote counts: a stage redone with other bytes reruns later stages (and caches)
            outputs = {name: {rel: digest for rel, (_, digest) in files.items()} for name, files in manifest.output_files.items()}
            manifest.fingerprint = sha256_json({"plan": plan, "inputs": {p: r["sha256"] for p, r in manifest.inputs.items()}, "outputs": outputs})
            manifest.finished_at = time.time()
            self.run_dir.write_manifest(manifest)
            self.run_dir.clear_started(stage)
            self.run_dir.finish_replacing(stage)
        hook.mmcore_stage_finished(ctx=ctx, manifest=manifest, error=None)
        return manifest

    # ------------------------------------------------------------------ reporting
    def _skipped(self, stage: str, reason: str) -> None:
        say(f"[{stage}] skipped: {reason}")
        self.plugins.pm.hook.mmcore_stage_skipped(pack=self.pack, stage=stage, run_dir=str(self.run_dir.root), reason=reason)

    def _report(self, manifest: Manifest) -> None:
        if manifest.status == "declined":
            say(f"[{manifest.stage}] skipped: declined by the {self.pack} pack for this config")
            return
        say(f"[{manifest.stage}] finished in {manifest.duration_s:.1f}s -> {self.run_dir.stage_dir(manifest.stage)}")
        for note in manifest.notes:
            say(f"  {note}")


def changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``key old -> new`` for each dotted key whose value differs between two config slices."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            name = key if not prefix else f"{prefix}.{key}"
            if key not in old or key not in new:
                out.append(f"{name} {'added' if key not in old else 'removed'}")
            else:
                out += changed_keys(old[key], new[key], name)
        return out
    return [] if old == new else [f"{prefix or 'value'} {_short(old)} -> {_short(new)}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["Runner", "ResumeMode", "changed_keys"]
