"""The ``mmcore`` command line.

Listing, inspecting and validating never import torch; stages import what they need.
Errors the user can fix print as ``error: ...`` lines with a non-zero exit; ``--debug``
(or ``MMCORE_DEBUG=1``) shows tracebacks instead.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import click

from mmcore import __version__
from mmcore.config.reference import config_cmd
from mmcore.cli.inspect_commands import doctor_cmd, info_cmd, list_cmd, load_plugins as _plugins
from mmcore.cli.newpack import new_pack_cmd
from mmcore.cli.plan import plan_cmd
from mmcore.cli.verify import verify_cmd
from mmcore.errors import MmcoreError, UsageError, file_system_error
from mmcore.framework.pack import STAGES

STAGE_HELP = {
    "download": "Fetch the model (hub id, local dir, or init:<preset> random weights).",
    "convert": "Convert the checkpoint into the training layout (DCP).",
    "preprocess": "Turn raw datasets into the pack's tokenized on-disk format.",
    "extract": "Cache frozen-encoder outputs (VAE, text/vision/audio encoders).",
    "train": "Train (one process, or many through torchrun).",
    "export": "Write the trained model in the layout transformers/diffusers load.",
    "evaluate": "Measure the export on held-out data by generating (accuracy, WER, sample videos).",
}


class MmcoreGroup(click.Group):
    """Adds commands registered by plugins (``mmcore_register_commands``) on demand."""

    _plugin_commands: dict[str, click.Command] | None = None

    def _extra(self) -> dict[str, click.Command]:
        if self._plugin_commands is None:
            self._plugin_commands = {}
            try:
                for provider, cmd in _plugins().commands():
                    if cmd.name in self.commands or cmd.name in self._plugin_commands:
                        click.echo(f"warning: {provider}: command {cmd.name!r} clashes with an existing one; ignored", err=True)
                        continue
                    self._plugin_commands[cmd.name] = cmd  # type: ignore[index]
            except Exception as exc:  # the CLI must work even if plugin loading breaks
                click.echo(f"warning: plugin commands unavailable: {exc}", err=True)
        return self._plugin_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *sorted(self._extra())]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return super().get_command(ctx, name) or self._extra().get(name)


@click.group(cls=MmcoreGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mmcore")
def cli() -> None:
    """mmcore: download -> convert -> preprocess -> extract -> train -> export,
    for multimodal models, one installable pack per model family."""


# ------------------------------------------------------------------------- inspecting

cli.add_command(list_cmd)
cli.add_command(info_cmd)
cli.add_command(doctor_cmd)
cli.add_command(config_cmd)
cli.add_command(new_pack_cmd)
cli.add_command(plan_cmd)


# ------------------------------------------------------------------------- stages


def _stage_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--pack", "-p", default=None, help="The pack (model family) to use."),
        click.option("--config", "-c", "config_file", default=None, help="YAML config file."),
        click.option("--preset", default=None, help="A pack's named config (see `mmcore info PACK`)."),
        click.option("--run-dir", default=None, help="Run directory [default: runs/<pack>-<preset or config name>]."),
        click.option("--model", default=None, help="Hub id, local directory, or init:<preset>."),
        click.option("--data", multiple=True, help="Dataset file or directory (repeatable)."),
        click.option("--device", default=None, help="auto, cpu, cuda, npu, ..."),
        click.option("--offline", is_flag=True, help="Never touch the network."),
        click.option("--resume", is_flag=True, help="Continue interrupted work (fails if its config changed)."),
        click.option("--force", is_flag=True, help="Run even when up to date."),
        click.option("--nproc-per-node", type=int, default=None, help="Processes per node (torchrun)."),
        click.option("--nnodes", type=int, default=None, help="Number of nodes (torchrun)."),
        click.option("--node-rank", type=int, default=None, help="This node's rank (torchrun)."),
        click.option("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (torchrun)."),
        click.option("--debug", is_flag=True, help="Show tracebacks."),
        click.argument("overrides", nargs=-1),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _request(kw: dict[str, Any]):
    from mmcore.run.session import Request

    overrides = list(kw["overrides"])
    for flag, key in (("nproc_per_node", "parallel.nproc_per_node"), ("nnodes", "parallel.nnodes"), ("node_rank", "parallel.node_rank"), ("rdzv_endpoint", "parallel.rdzv_endpoint")):
        if kw.get(flag) is not None:
            overrides.append(f"{key}={kw[flag]}")
    return Request(
        pack=kw["pack"],
        config_file=kw["config_file"],
        preset=kw["preset"],
        run_dir=kw["run_dir"],
        model=kw["model"],
        data=list(kw["data"]),
        device=kw["device"],
        offline=kw["offline"],
        overrides=overrides,
    )


def _follows(parallel: Any) -> bool:
    """A node other than node 0 of a multi-node run."""
    return bool(parallel.nnodes > 1 and parallel.node_rank > 0)


def _runner(kw: dict[str, Any]):
    from mmcore.run.runner import Runner
    from mmcore.run.session import open_session, record_session

    plugins = _plugins()
    request = _request(kw)
    # Every node starts at once. A following node reads the run directory only after node 0 has
    # announced itself there: before that, run.json and config.yaml may be half written.
    try:
        first_look = open_session(plugins, request, read_run_dir=False)
    except MmcoreError:  # the command alone is not a whole config: the run directory's completes it
        first_look = None
    waited = first_look is not None and _follows(first_look.config.parallel)
    if first_look is not None and waited:
        from mmcore.run.nodes import await_node0

        await_node0(first_look.run_dir.root, first_look.config.parallel, click.echo)
    session = open_session(plugins, request)
    if session.config.run.device != "auto":  # a wrong device is found now, not after an hour of preprocessing
        plugins.registry.accelerator(session.config.run.device)
    from mmcore.run.preflight import check_layout

    check_layout(plugins, session.pack, session.config, session.run_dir.root)  # so is a parallel layout that cannot work: once, here, not per rank at train
    from mmcore.framework.tracking import check_trackers

    check_trackers(session.config, plugins)  # and a tracker in logging.report_to that is not installed
    parallel = session.config.parallel
    if _follows(parallel):
        # a following node: node 0 owns the run directory (lock, run.json, config.yaml), this one joins it
        from mmcore.run.nodes import await_node0, check_config

        if not waited:  # its node settings came from the run directory's config
            await_node0(session.run_dir.root, parallel, click.echo)
        check_config(session.run_dir.root, session.config.model_dump(mode="json"), parallel.node_rank)
    else:
        session.run_dir.lock()
        record_session(session, request)
        if parallel.nnodes > 1:
            from mmcore.run.nodes import announce, keep_alive

            announce(session.run_dir.root, parallel)
            keep_alive(session.run_dir.root, 0)
    click.echo(f"run directory: {session.run_dir.root}")
    _say_trust(session.config, click.echo)
    return Runner(plugins, session.pack, session.config, session.run_dir, debug=kw["debug"])


def _say_trust(config: Any, echo: Callable[[str], None]) -> None:
    """Running a checkpoint's own code is said every time it is allowed, never silently."""
    if config.model.trust_remote_code:
        echo("model.trust_remote_code=true (given on this command line or in --config): code in the checkpoint may run")


def _make_stage_command(stage: str) -> click.Command:
    @_stage_options
    def command(**kw: Any) -> None:
        runner = _runner(kw)
        runner.run_stage(stage, resume="required" if kw["resume"] else "no", force=kw["force"])

    command.__doc__ = STAGE_HELP[stage] + "\n\nOVERRIDES are dotted config values, e.g. training.lr=1e-5."
    return click.command(stage)(command)


for _stage in STAGES:
    cli.add_command(_make_stage_command(_stage))


@cli.command("run")
@_stage_options
def run_cmd(**kw: Any) -> None:
    """Run the whole pipeline, skipping what is up to date and continuing what was interrupted.

    OVERRIDES are dotted config values, e.g. training.lr=1e-5 parallel.nproc_per_node=2.
    """
    runner = _runner(kw)
    runner.run_pipeline(resume="required" if kw["resume"] else "auto", force=kw["force"])
    click.echo(f"done: {runner.run_dir.root}")


@cli.command("eval")
@_stage_options
def eval_cmd(**kw: Any) -> None:
    """Run the evaluate stage alone (after export): generate for the held-out items and score them.

    Writes results.jsonl, metrics.json and report.html in evaluate/. --data FILE (the training data's
    format) evaluates on FILE instead, into evaluate-<FILE's stem>/; the run's own stay as they are.
    """
    from mmcore.engines.evaluation import evaluate_files

    data = kw["data"]  # --data: this command's overrides are for its evaluation only; the run's config stays as it is
    runner = _runner(dict(kw, data=(), overrides=() if data else kw["overrides"]))
    manifest = evaluate_files(runner, data, _request(dict(kw, data=())), force=kw["force"]) if data else runner.run_stage("evaluate", resume="no", force=kw["force"])
    if manifest is not None and "results" in manifest.outputs:
        click.echo(f"results: {manifest.output('results')}")


_GENERATION_FLAGS = (("max_new_tokens", int), ("temperature", float), ("top_p", float), ("num_inference_steps", int), ("guidance_scale", float), ("seed", int), ("batch_size", int))


@cli.command("infer")
@click.option("--pack", "-p", default=None, help="The pack (default: the run's).")
@click.option("--run-dir", required=True, help="The run whose model to use.")
@click.option("--checkpoint", default="latest", show_default=True, help="latest (the train stage's newest checkpoint), export, or a path (DCP checkpoint or model folder).")
@click.option("--prompt", default=None, help="What to ask, caption to generate, or prompt for a transcript.")
@click.option("--image", "images", multiple=True, help="An image file (repeatable; one <image> in the prompt each, or none).")
@click.option("--video", "videos", multiple=True, help="A video file (repeatable).")
@click.option("--audio", "audios", multiple=True, help="An audio file (repeatable).")
@click.option("--input", "input_file", default=None, help="JSONL of requests: prompt or messages, images/videos/audios.")
@click.option("--output", default=None, help="Write results as JSONL here (with --input; default: print them).")
@click.option("--allow-any-media-path", is_flag=True, help="Let --input's media paths be absolute or leave its folder (a request file you trust).")
@click.option("--max-new-tokens", type=int, default=None)
@click.option("--temperature", type=float, default=None, help="0: greedy (default); > 0: sample.")
@click.option("--top-p", type=float, default=None)
@click.option("--num-inference-steps", type=int, default=None, help="Denoising steps (video and image packs).")
@click.option("--guidance-scale", type=float, default=None, help="Classifier-free guidance (video and image packs).")
@click.option("--seed", type=int, default=None)
@click.option("--batch-size", type=int, default=None, help="Requests generated together.")
@click.option("--device", default=None, help="auto, cpu, cuda, npu, ...")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.argument("overrides", nargs=-1)
def infer_cmd(**kw: Any) -> None:
    """Answer a prompt (VLM, omni), transcribe audio (whisper) or generate a video (wan) with a
    run's trained model. Exits 1 if any request failed; the others still run.

    OVERRIDES are dotted config values, e.g. generation.max_new_tokens=32.
    """
    from mmcore.engines.generation import read_requests, request_from_flags
    from mmcore.engines.infer import run_infer, show
    from mmcore.run.session import Request as SessionRequest
    from mmcore.run.session import check_run_dir, open_session

    if (kw["input_file"] is None) == (kw["prompt"] is None and not (kw["images"] or kw["videos"] or kw["audios"])):
        raise UsageError("give a request: --prompt (with any --image/--video/--audio), or --input FILE.jsonl, not both")
    if kw["output"] and not kw["input_file"]:
        raise UsageError("--output goes with --input (a single request's answer is printed)")
    if kw["output"] and _same_file(Path(kw["output"]), Path(kw["input_file"])):
        raise UsageError(f"--output {kw['output']} is the --input file: the requests would be overwritten by the results", hint="write the results to another file")
    if check_run_dir(Path(kw["run_dir"]), kw["pack"]) is None:
        raise UsageError(f"--run-dir {kw['run_dir']}: not an mmcore run directory (no run.json)", hint="give the run directory `mmcore run` made")
    overrides = [*kw["overrides"], *(f"generation.{name}={kw[name]}" for name, _ in _GENERATION_FLAGS if kw.get(name) is not None)]
    plugins = _plugins()
    session = open_session(plugins, SessionRequest(pack=kw["pack"], run_dir=kw["run_dir"], device=kw["device"], overrides=overrides))
    _say_trust(session.config, lambda line: click.echo(line, err=True))
    if kw["input_file"]:
        requests = read_requests(Path(kw["input_file"]), any_media_path=kw["allow_any_media_path"])
    else:
        requests = [request_from_flags(kw["prompt"], kw["images"], kw["videos"], kw["audios"])]
    results = run_infer(plugins, session, kw["checkpoint"], requests, debug=kw["debug"], echo=lambda line: click.echo(line, err=True))
    failed = show(requests, results, Path(kw["output"]) if kw["output"] else None, click.echo, lambda line: click.echo(line, err=True))
    if failed:
        raise click.exceptions.Exit(1)


def _same_file(a: Path, b: Path) -> bool:
    """The same file, through links, ``..`` or hard links."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


@cli.command("status")
@_stage_options
def status_cmd(**kw: Any) -> None:
    """Show each stage of a run: finished, up to date, stale, interrupted or not run."""
    from mmcore.run.runner import Runner
    from mmcore.run.session import open_session

    plugins = _plugins()
    session = open_session(plugins, _request(kw))
    runner = Runner(plugins, session.pack, session.config, session.run_dir)
    click.echo(f"run directory: {session.run_dir.root}")
    _say_trust(session.config, click.echo)
    blocked_by: str | None = None
    for stage in STAGES:
        if stage not in runner.stages:
            click.echo(f"  {stage:<11} -     the pack has no {stage} stage")
            continue
        if blocked_by is not None:
            click.echo(f"  {stage:<11} todo  after {blocked_by}")
            continue
        fresh, why = runner.freshness(stage, runner.plan(stage, runner.upstream(stage)))
        click.echo(f"  {stage:<11} {'ok' if fresh else 'todo'}  {'  ' if fresh else ''}{why}")
        if not fresh:
            blocked_by = stage


cli.add_command(verify_cmd)


# ------------------------------------------------------------------------- entry point


ENV_DISPATCHED = (*STAGES, "run", "status", "info", "doctor", "infer", "eval")


def _dispatch_to_env(args: list[str]) -> int | None:
    """Run the command in the pack's own env when it has one (and we are not in it already)."""
    if not args or args[0] not in ENV_DISPATCHED or os.environ.get("MMCORE_IN_ENV") or os.environ.get("MMCORE_NO_ENVS"):
        return None
    from mmcore.run import envs

    pack = envs.pack_from_argv(args) or (args[1] if args[0] == "info" and len(args) > 1 else None)
    record = envs.find(pack) if pack else None
    if record is None:
        return None
    return envs.run_in_env(record, args)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("MMCORE_DEBUG") == "1"
    try:
        code = _dispatch_to_env(args)
        if code is not None:
            sys.exit(code)
        code = cli.main(args=args, prog_name="mmcore", standalone_mode=False)
        if isinstance(code, int) and code:  # a command's click.exceptions.Exit(code), returned by click in this mode
            sys.exit(code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except MmcoreError as exc:
        if debug:
            traceback.print_exc()
        for line in exc.one_line().splitlines():
            click.echo(f"error: {line}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        fs_error = file_system_error(exc, "cannot write")
        if debug or fs_error is None:
            if debug:
                raise
            click.echo(f"error: {exc.filename or 'file system'}: {exc.strerror or exc} (rerun with --debug for the traceback)", err=True)
            sys.exit(1)
        click.echo(f"error: {fs_error.one_line()}", err=True)
        sys.exit(1)
    except Exception as exc:  # a bug, in mmcore or a pack
        if debug:
            raise
        click.echo(f"error: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", err=True)
        sys.exit(1)
