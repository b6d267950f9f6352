"""Isolated per-pack environments: one virtual environment per pack, its own pins.

``mmcore env create --pack P`` makes ``$MMCORE_HOME/envs/P`` (default ``~/.mmcore``) with
uv (fast, shared cache, hardlinked installs) or, where uv is absent, ``venv`` + pip. From then
on ``mmcore <stage> --pack P`` runs the stage in that environment as a subprocess: only paths
and JSON (the run directory and its manifests) cross the boundary.

torch is pinned to the host's exact version (and build) in every environment, and taken from
the same wheel: with uv it is hardlinked from uv's cache, so an environment costs seconds and
almost no disk for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mmcore import __version__
from mmcore.run.env_requirements import default_requirement, local_dependencies, looks_like_path, mmcore_requirement, pip_find_links, uv_binary
from mmcore.errors import MmcoreError, UsageError
from mmcore.framework.files import atomic_write_json, sha256_json
from mmcore.framework.versions import installed_version

IN_ENV = "MMCORE_IN_ENV"  # set in a child running inside a pack's env: never re-dispatch


def home() -> Path:
    return Path(os.environ.get("MMCORE_HOME", "~/.mmcore")).expanduser()


def registry_path() -> Path:
    return home() / "envs.json"


@dataclass
class EnvRecord:
    pack: str
    path: str
    requirement: str
    engine: str
    python: str
    extra: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    fingerprint: str = ""
    created_at: float = 0.0
    seconds: float = 0.0
    disk_mib: float = 0.0

    @property
    def python_exe(self) -> Path:
        return Path(self.path) / "bin" / "python"

    def site_packages(self) -> list[Path]:
        return sorted(Path(self.path).glob("lib/python*/site-packages"))

    def stale(self) -> str | None:
        """Why this env no longer matches the host (mmcore or torch changed), or None."""
        host = {"mmcore": __version__, "torch": installed_version("torch")}
        for name, version in host.items():
            if self.versions.get(name) != version:
                return f"host {name} {version}, env {self.versions.get(name)}"
        if not self.python_exe.exists():
            return f"{self.python_exe} is missing"
        return None


def load_records() -> dict[str, EnvRecord]:
    try:
        data = json.loads(registry_path().read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise MmcoreError(f"{registry_path()}: unreadable ({exc}); remove it and recreate the envs") from None
    return {name: EnvRecord(**record) for name, record in data.get("envs", {}).items()}


def save_records(records: dict[str, EnvRecord]) -> None:
    atomic_write_json(registry_path(), {"format": 1, "envs": {name: asdict(r) for name, r in sorted(records.items())}})


def find(pack: str) -> EnvRecord | None:
    """The env of ``pack``: the one created for it, else one whose metadata provides it
    (a distribution may ship several packs, e.g. ``qwen2vl`` and ``qwen2.5vl``)."""
    records = load_records()
    if pack in records:
        return records[pack]
    for record in records.values():
        if any(found["name"] == pack for found in packs_in(record)):
            return record
    return None


# --------------------------------------------------------------------------- creating


def _why(stderr: str, requirement: str) -> str:
    """The line of an installer's error output that names what could not be installed."""
    lines = [line.strip(" ╰─▶×") for line in stderr.splitlines() if line.strip()]
    for marker in ("No matching distribution found for", "Because ", "was not found", "ResolutionImpossible", "conflict", "error:"):
        for line in lines:
            if marker in line:
                return line.strip()
    return lines[-1] if lines else f"installing {requirement} failed"


def _disk_mib(path: Path) -> float:
    """Disk used by ``path``, counting each hardlinked file once (uv links from its cache)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            if st.st_nlink == 1:  # shared files are counted as the cache's, not the env's
                total += st.st_blocks * 512
    return round(total / 2**20, 1)


def create(
    pack: str,
    *,
    requirement: str | None = None,
    extra: Iterable[str] = (),
    python: str | None = None,
    find_links: Iterable[str] = (),
    index_url: str | None = None,
    offline: bool = False,
    engine: str = "auto",
    force: bool = False,
    say: Any = print,
) -> EnvRecord:
    """Make (or with ``force`` remake) pack ``pack``'s env; a failed install leaves nothing behind."""
    records = load_records()
    target = home() / "envs" / pack
    if pack in records and not force:
        raise UsageError(f"pack {pack!r} already has an env at {records[pack].path}", hint="use --force to recreate it")
    requirement = requirement or default_requirement(pack)
    if looks_like_path(requirement):
        requirement = str(Path(requirement).expanduser().absolute())
    uv = uv_binary() if engine in ("auto", "uv") else None
    if engine == "uv" and uv is None:
        raise UsageError("engine uv requested but uv is not installed (pip install uv)")
    links = [*find_links, *pip_find_links()]
    torch_version = installed_version("torch")
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{pack}-", dir=target.parent))
    constraints = scratch / "constraints.txt"
    constraints.write_text(f"torch=={torch_version}\n" if torch_version else "")
    start = time.perf_counter()
    extra = list(extra)
    try:
        local = local_dependencies(Path(requirement), scratch) if looks_like_path(requirement) else []
        packages = [*mmcore_requirement(scratch), *local, requirement, *extra]
        if uv:
            _run([uv, "venv", "--quiet", "--seed", "--python", python or sys.executable, str(target)], requirement)
            cmd = [uv, "pip", "install", "--python", str(target / "bin" / "python"), "-c", str(constraints)]
            cmd += [f"--find-links={link}" for link in links]
            if index_url:
                cmd += ["--index-url", index_url]
            if offline:
                cmd.append("--offline")
        else:
            _run([python or sys.executable, "-m", "venv", str(target)], requirement)
            cmd = [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", str(constraints)]
            cmd += [f"--find-links={link}" for link in links]
            if index_url:
                cmd += ["--index-url", index_url]
            if offline:
                cmd.append("--no-index")
        cmd += packages
        say(f"installing {requirement} into {target} ({'uv' if uv else 'venv + pip'}) ...")
        _run(cmd, requirement)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record = EnvRecord(pack=pack, path=str(target), requirement=requirement, engine="uv" if uv else "venv+pip", extra=extra, python="", created_at=time.time())
    record.seconds = round(time.perf_counter() - start, 2)
    probe = _probe(record)
    record.python = probe["python"]
    record.versions = probe["versions"]
    if pack not in probe["packs"]:
        shutil.rmtree(target, ignore_errors=True)
        found = ", ".join(probe["packs"]) or "none"
        raise MmcoreError(f"{requirement} installed, but it provides no pack {pack!r} (packs found: {found})")
    record.fingerprint = sha256_json({"pack": probe["packs"][pack], "python": record.python, "versions": record.versions, "requirement": requirement, "extra": extra})
    record.disk_mib = _disk_mib(target)
    records[pack] = record
    save_records(records)
    return record


def _run(cmd: list[str], requirement: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise MmcoreError(f"creating the env failed while installing {requirement}: {_why(proc.stderr + proc.stdout, requirement)}")


_PROBE = """
import importlib.metadata as md, json, platform
packs = {}
for dist in md.distributions():
    for ep in dist.entry_points:
        if ep.group == "mmcore.packs":
            packs[ep.name] = {"distribution": dist.metadata["Name"], "version": dist.version, "requires": dist.requires or []}
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
print(json.dumps({"python": platform.python_version(), "packs": packs, "versions": {n: v(n) for n in ("mmcore", "torch", "transformers", "diffusers") if v(n)}}))
"""


def _probe(record: EnvRecord) -> dict[str, Any]:
    """What the env holds, asked of its own interpreter (nothing imported here)."""
    proc = subprocess.run([str(record.python_exe), "-c", _PROBE], capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if proc.returncode != 0:
        raise MmcoreError(f"the env at {record.path} does not run: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


def remove(pack: str) -> EnvRecord:
    records = load_records()
    record = records.pop(pack, None)
    if record is None:
        raise UsageError(f"pack {pack!r} has no env (see `mmcore env list`)")
    shutil.rmtree(record.path, ignore_errors=True)
    save_records(records)
    return record


def packs_in(record: EnvRecord) -> list[dict[str, Any]]:
    """Packs installed in an env, read from its metadata without importing anything."""
    import importlib.metadata as md

    found = []
    for dist in md.distributions(path=[str(p) for p in record.site_packages()]):
        for ep in dist.entry_points:
            if ep.group == "mmcore.packs":
                found.append({"name": ep.name, "distribution": dist.metadata["Name"], "version": dist.version, "entry_point": ep.value, "location": record.path})
    return found


# --------------------------------------------------------------------------- running


def run_in_env(record: EnvRecord, argv: list[str]) -> int:
    """``mmcore <argv>`` with the env's interpreter; output streams through, Ctrl-C reaches it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env[IN_ENV] = record.pack
    proc = subprocess.Popen([str(record.python_exe), "-m", "mmcore", *argv], env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # The child got the same SIGINT from the terminal; give it time to stop cleanly.
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def pack_from_argv(argv: list[str]) -> str | None:
    """The pack a command line names: ``--pack``, else the pack of the run ``--run-dir`` names
    (``mmcore infer --run-dir R`` runs in that pack's env too)."""
    run_dir = None
    for i, arg in enumerate(argv):
        if arg in ("--pack", "-p") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--pack="):
            return arg.split("=", 1)[1]
        if arg == "--run-dir" and i + 1 < len(argv):
            run_dir = argv[i + 1]
        elif arg.startswith("--run-dir="):
            run_dir = arg.split("=", 1)[1]
    if run_dir is not None:
        try:
            pack = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8")).get("pack")
        except (OSError, ValueError, AttributeError):
            return None
        return pack if isinstance(pack, str) else None
    return None
