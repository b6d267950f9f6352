"""``mmcore verify``: a run directory's finished outputs against what their manifests recorded."""

from __future__ import annotations

from pathlib import Path

import click

from mmcore.errors import StageError, UsageError
from mmcore.framework.pack import STAGES


@click.command("verify")
@click.option("--run-dir", required=True, help="The run directory to check.")
@click.option("--quick", is_flag=True, help="Sizes and small files only (what every stage checks before reading).")
def verify_cmd(run_dir: str, quick: bool) -> None:
    """Check every finished stage's outputs against the sizes and sha256 recorded when it
    finished: truncation, tampering, files gone. Exits 1 if anything changed."""
    from mmcore.run.rundir import RunDir, output_problems
    from mmcore.run.session import check_run_dir

    root = Path(run_dir)
    if check_run_dir(root, None) is None:
        raise UsageError(f"--run-dir {run_dir}: not an mmcore run directory (no run.json)")
    rd = RunDir(root)
    bad = 0
    for stage in STAGES:
        manifest, unreadable = rd.load_manifest(stage)
        if unreadable:  # what it vouched for cannot be checked: not "ok"
            bad += 1
            click.echo(f"  {stage:<11} FAILED {unreadable}")
            continue
        if manifest is None:
            continue
        if manifest.status != "finished":
            click.echo(f"  {stage:<11} -      declined")
            continue
        if not manifest.output_files:
            click.echo(f"  {stage:<11} ?      no output hashes recorded (finished by an older mmcore)")
            continue
        problems = output_problems(manifest, full=not quick)
        files = sum(len(f) for f in manifest.output_files.values())
        if problems:
            bad += 1
            click.echo(f"  {stage:<11} FAILED {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
        else:
            click.echo(f"  {stage:<11} ok     {files} file(s) {'sizes and small files' if quick else 'match their sha256'}")
    if bad:
        raise StageError(f"{bad} stage(s) of {rd.root} changed after finishing", hint="rerun them with --force (or `mmcore run`)")


__all__ = ["verify_cmd"]
