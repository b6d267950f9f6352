"""``mmcore env``: per-pack environments (the engine is :mod:`mmcore.run.envs`).

Registered through ``mmcore_register_commands``, the same hook a third party uses to add commands.
"""

from __future__ import annotations

import json

import click

from mmcore import hookimpl


@click.group("env")
def env_group() -> None:
    """Per-pack virtual environments, so packs with conflicting pins live side by side."""


@env_group.command("create")
@click.option("--pack", "-p", required=True, help="Pack name (as `--pack` takes it).")
@click.option("--from", "requirement", default=None, help="What provides the pack: a requirement (mm-pack-x==1.0) or a folder [default: mm-pack-<pack>].")
@click.option("--with", "extra", multiple=True, help="Extra requirement to install alongside, e.g. transformers==5.20.0 (repeatable).")
@click.option("--python", default=None, help="Interpreter for the env [default: this one].")
@click.option("--find-links", multiple=True, help="Extra folder/URL of wheels (repeatable).")
@click.option("--index-url", default=None, help="Package index to use instead of PyPI (a mirror).")
@click.option("--offline", is_flag=True, help="Install only from caches and --find-links.")
@click.option("--engine", type=click.Choice(["auto", "uv", "pip"]), default="auto", show_default=True)
@click.option("--force", is_flag=True, help="Recreate the env if it exists.")
def create_cmd(pack: str, requirement: str | None, extra: tuple[str, ...], python: str | None, find_links: tuple[str, ...], index_url: str | None, offline: bool, engine: str, force: bool) -> None:
    """Create the env of PACK and record it; `mmcore <stage> --pack PACK` then runs there."""
    from mmcore.run import envs

    record = envs.create(pack, requirement=requirement, extra=extra, python=python, find_links=find_links, index_url=index_url, offline=offline, engine=engine, force=force, say=click.echo)
    click.echo(f"created {record.path} in {record.seconds:.1f}s with {record.engine} ({record.disk_mib:.0f} MiB not shared with other envs)")
    click.echo(f"python {record.python}, " + ", ".join(f"{k} {v}" for k, v in record.versions.items()))


@env_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """List the recorded envs, the packs inside them, and whether they still match the host."""
    from dataclasses import asdict

    from mmcore.run import envs

    rows = []
    for name, record in sorted(envs.load_records().items()):
        rows.append({**asdict(record), "stale": record.stale(), "packs": [p["name"] for p in envs.packs_in(record)]})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no envs (mmcore env create --pack P)")
    for row in rows:
        state = f"STALE ({row['stale']}): mmcore env create --pack {row['pack']} --force" if row["stale"] else "ok"
        click.echo(f"{row['pack']:<14} {state}\n{'':<14} {row['path']}  [{row['engine']}, python {row['python']}, torch {row['versions'].get('torch')}]  packs: {', '.join(row['packs'])}")


@env_group.command("remove")
@click.argument("pack")
def remove_cmd(pack: str) -> None:
    """Delete PACK's env."""
    from mmcore.run import envs

    record = envs.remove(pack)
    click.echo(f"removed {record.path}")


@env_group.command("path")
@click.argument("pack")
def path_cmd(pack: str) -> None:
    """Print the folder of PACK's env."""
    from mmcore.run import envs
    from mmcore.errors import UsageError

    record = envs.find(pack)
    if record is None:
        raise UsageError(f"pack {pack!r} has no env (see `mmcore env list`)")
    click.echo(record.path)


@hookimpl
def mmcore_register_commands(register):
    register(env_group)
