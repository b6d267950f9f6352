"""The inspecting commands of the ``mmcore`` CLI: ``list``, ``info``, ``doctor``. None imports torch."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from mmcore import __version__
from mmcore.errors import MmcoreError


def load_plugins():  # type: ignore[no-untyped-def]
    from mmcore.framework.plugins import Plugins

    return Plugins.load()


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """List installed packs and plugins (broken ones with the reason)."""
    plugins = load_plugins()
    packs = [e.as_dict() | {"stages": plugins.implemented_stages(n) if e.ok else []} for n, e in sorted(plugins.packs.items())]
    infra = [e.as_dict() for _, e in sorted(plugins.plugins.items())]
    from mmcore.run import envs

    for record in envs.load_records().values():
        for found in envs.packs_in(record):
            packs.append({**found, "ok": True, "error": None, "category": "", "summary": f"in env {record.path}", "stages": [], "presets": []})
    rewards = [{"name": r.name, "provider": r.provider, "summary": r.summary, "takes": r.takes} for _, r in sorted(plugins.registry.rewards.items())]
    if as_json:
        click.echo(json.dumps({"mmcore": __version__, "packs": packs, "plugins": infra, "rewards": rewards}, indent=2))
        return
    if not packs:
        click.echo("no packs installed (pip install mm-pack-<family>)")
    for p in packs:
        if p["location"] != "host":
            click.echo(f"{p['name']:<14} {p['version'] or '':<9} {'(env)':<11} {p['location']}")
        elif p["ok"]:
            click.echo(f"{p['name']:<14} {p['version'] or '':<9} {p['category']:<11} {', '.join(p['stages'])}")
            if p["summary"]:
                click.echo(f"{'':<14} {p['summary']}")
        else:
            click.echo(f"{p['name']:<14} BROKEN    ({p['distribution']}) {p['error']}")
    click.echo(f"plugins: {', '.join(p['name'] + ('' if p['ok'] else ' (BROKEN: ' + str(p['error']) + ')') for p in infra) or 'none'}")
    on_text, on_images = ([r["name"] for r in rewards if r["takes"] == kind] for kind in ("text", "image"))
    click.echo(f"rewards (training.grpo.rewards): {', '.join(on_text) or 'none'}; on images: {', '.join(on_images) or 'none'}")


def _megatron_line(spec: Any) -> str | None:
    """What the pack does with Megatron's layout, and whether megatron-core is usable here."""
    from mmcore.backends.megatron import status

    if "convert" not in spec.stages or "parallel_map" not in (getattr(spec.declared("convert"), "parts", None) or {}):
        return None
    usable, why = status()
    return "MindSpeed-MM layout both ways (export.format=mindspeed-mm, convert.mindspeed_mm); " + (
        f"tensor/pipeline-parallel training (parallel.backend=megatron) on {why}: usable" if usable else f"parallel.backend=megatron not usable: {why}"
    )


@click.command("info")
@click.argument("pack")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info_cmd(pack: str, as_json: bool) -> None:
    """Show a pack: stages, presets, requirements, and which kernel each device gets."""
    from mmcore.framework.conformance_record import describe, read_record
    from mmcore.framework.versions import requirements_of, unmet_requirements

    plugins = load_plugins()
    entry = plugins.pack(pack)
    spec = entry.spec
    assert spec is not None
    registry = plugins.registry
    own = sorted({n for (n, _) in registry.kernels if entry.pm_name in registry.kernel_providers.get((n, _), {registry.kernels[(n, _)].provider})})
    kernels = {name: {dev: _kernel_choice(registry, name, dev) for dev in sorted(registry.accelerators)} for name in own}
    data: dict[str, Any] = {
        **entry.as_dict(),
        "stages": plugins.implemented_stages(pack),
        "distributed_stages": list(spec.distributed_stages),
        "default_preset": spec.default_preset,
        "config_class": spec.config_class,
        "requirements": [str(r) for r in requirements_of(entry.distribution)],
        "unmet_requirements": unmet_requirements(entry.distribution),
        "kernels": kernels,
        "sdk": spec.sdk,
        "declared_stages": {stage: spec.declared(stage).function for stage in spec.stages},
        "conformance": read_record(pack),
        "megatron": _megatron_line(spec),
        "freeze_groups": _freeze_groups(spec),
    }
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"{pack} ({entry.distribution} {entry.version}) [{spec.category}] {spec.summary}")
    click.echo(f"  stages:       {', '.join(data['stages'])} (distributed: {', '.join(spec.distributed_stages) or 'none'})" + ("; mmcore infer" if plugins.has_infer(pack) else ""))
    click.echo(f"  presets:      {', '.join(data['presets']) or 'none'}" + (f" (default: {spec.default_preset})" if spec.default_preset else ""))
    click.echo(f"  config:       {spec.config_class}")
    click.echo(f"  sdk:          {spec.sdk}")
    click.echo(f"  conformance:  {describe(data['conformance'], entry.version)}")
    for stage, function in data["declared_stages"].items():
        click.echo(f"  {stage + ':':<13} {function}")
    click.echo(f"  requirements: {', '.join(data['requirements']) or 'none'}")
    if data["megatron"]:
        click.echo(f"  megatron:     {data['megatron']}")
    if data["freeze_groups"]:
        click.echo("  freeze:       training.freeze takes these groups (or parameter globs):")
        for group, globs in data["freeze_groups"].items():
            click.echo(f"    {group}: {', '.join(globs)}")
    for problem in data["unmet_requirements"]:
        click.echo(f"  UNMET:        {problem}")
    if kernels:
        click.echo("  kernels:")
        for name, per_device in kernels.items():
            reference = registry.kernels.get((name, "reference"))
            unwired = "" if reference is None or reference.wired else " (registered and parity-checked, not called by the model yet)"
            click.echo(f"    {name}{unwired}: " + "; ".join(f"{dev} -> {impl}" for dev, impl in per_device.items()))


def _freeze_groups(spec: Any) -> dict[str, list[str]]:
    """``training.freeze``'s group names -> parameter globs, from the train stage's recipe part:
    the ``freeze_groups`` of the object whose method it is (a kit family), else the module's
    ``FREEZE_GROUPS`` (importing a pack module imports no torch)."""
    from mmcore.framework.registry import import_object

    stage = spec.stages.get("train")
    recipe = getattr(stage, "parts", {}).get("recipe") if stage is not None else None
    if recipe is None:
        return {}
    module, _, attr = recipe.partition(":")
    owner = f"{module}:{attr.rsplit('.', 1)[0]}" if "." in attr else module
    try:
        holder = import_object(owner) if "." in attr else __import__(module, fromlist=["_"])
    except Exception:  # info shows what it can; a pack that does not import is `mmcore list`'s to report
        return {}
    groups = getattr(holder, "freeze_groups", None) or getattr(holder, "FREEZE_GROUPS", None) or {}
    return {name: list(globs) for name, globs in groups.items()}


def _kernel_choice(registry: Any, name: str, device: str) -> str:
    try:
        spec = registry.kernel_spec(name, device)
    except MmcoreError as exc:
        return f"none ({exc})"
    return f"{spec.impl}" + (" [reference]" if spec.device == "reference" else "")


@click.command("doctor")
@click.option("--pack", default=None, help="Also check this pack and its requirements.")
@click.option("--device", default="auto", show_default=True, help="The device you intend to use.")
@click.option("--rdzv-endpoint", default=None, help="HOST:PORT you intend to use for the rendezvous.")
@click.option("--run-dir-root", default="runs", show_default=True, help="Where runs are written (disk check).")
@click.option("--min-free-gb", default=5.0, show_default=True)
@click.option("--offline", is_flag=True, help="You will run with --offline (run.offline): the hub is not contacted.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor_cmd(pack: str | None, device: str, rdzv_endpoint: str | None, run_dir_root: str, min_free_gb: float, offline: bool, as_json: bool) -> None:
    """Pre-flight checks: device and driver (of the accelerators this machine has), torch/torch_npu, the hub, rendezvous port, disk, pack requirements."""
    from mmcore.cli.doctor import run_checks

    checks = run_checks(load_plugins(), pack=pack, device=device, rdzv_endpoint=rdzv_endpoint, runs_root=run_dir_root, min_free_gb=min_free_gb, offline=offline)
    failed = [c for c in checks if not c.ok and c.required]
    if as_json:
        click.echo(json.dumps({"ok": not failed, "checks": [c.as_dict() for c in checks]}, indent=2))
    else:
        for c in checks:
            mark = "PASS" if c.ok else ("FAIL" if c.required else "WARN")
            click.echo(f"[{mark}] {c.name}: {c.detail}")
            if not c.ok and c.hint:
                click.echo(f"       fix: {c.hint}")
        click.echo("all required checks passed" if not failed else f"{len(failed)} required check(s) failed")
    sys.exit(1 if failed else 0)


__all__ = ["list_cmd", "info_cmd", "doctor_cmd", "load_plugins"]
