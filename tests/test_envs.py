"""Per-pack environments: conflicting pins side by side, run from one host CLI (issue: isolated envs).

Everything is built here: a small library ``mmfake`` in versions 1.0 and 2.0 as local wheels, and
two packs pinning one each. Envs get mmcore from this checkout and torch at the host's version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmcore_helpers import CLI, write_pack_project

pytestmark = pytest.mark.slow

PACK_SOURCE = """
from mmcore import PackSpec, StageResult, hookimpl
PACK = PackSpec(name="{name}")

@hookimpl
def mmcore_download(ctx):
    import os, time
    import mmfake
    for _ in range(int(os.environ.get("SLOW_DOWNLOAD", "0"))):
        time.sleep(1)
    print("{name} sees mmfake", mmfake.__version__, flush=True)
    return StageResult(outputs={{"model": "."}}, metrics={{"mmfake": mmfake.__version__}})
"""


def _library(root: Path, version: str) -> Path:
    return write_pack_project(root / version, "mmfake", "mmfake", f'__version__ = "{version}"\n', version=version)


def _pack(root: Path, name: str, pin: str) -> Path:
    source = PACK_SOURCE.format(name=name)
    return write_pack_project(root, f"mm-pack-{name}", f"mm_pack_{name}", source, {name: f"mm_pack_{name}"}, dependencies=("mmcore", pin))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("envs-projects")
    wheels = root / "wheels"
    for version in ("1.0", "2.0"):
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(_library(root, version))], check=True)
    packs = {name: _pack(root, name, pin) for name, pin in (("alpha", "mmfake==1.0"), ("beta", "mmfake==2.0"), ("gamma", "mmfake==9.9"))}
    home = tmp_path_factory.mktemp("mmcore-home")
    return {"wheels": wheels, "packs": packs, "home": home}


@pytest.fixture
def host(world, tmp_path: Path) -> CLI:  # type: ignore[no-untyped-def]
    cli = CLI(tmp_path, [])
    original = cli.env

    def env(**extra: str) -> dict[str, str]:
        return original(MMCORE_HOME=str(world["home"]), **extra)

    cli.env = env  # type: ignore[method-assign]
    return cli


def test_conflicting_pins_live_side_by_side(host: CLI, world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for name in ("alpha", "beta"):
        proc = host("env", "create", "--pack", name, "--from", str(world["packs"][name]), "--find-links", str(world["wheels"]))
        assert f"created {world['home']}/envs/{name}" in proc.stdout
    with pytest.raises(ImportError):
        __import__("mmfake")  # the host has neither version
    for name, version in (("alpha", "1.0"), ("beta", "2.0")):
        proc = host("download", "--pack", name, "--run-dir", f"run-{name}")
        assert f"{name} sees mmfake {version}" in proc.stdout  # the child's output comes through
        manifest = json.loads((tmp_path / f"run-{name}/download/manifest.json").read_text())
        assert manifest["metrics"]["mmfake"] == version
    listed = {p["name"]: p for p in json.loads(host("list", "--json").stdout)["packs"]}
    assert listed["alpha"]["location"] == str(world["home"] / "envs/alpha") and listed["beta"]["version"] == "1.0.0"
    envs = {e["pack"]: e for e in json.loads(host("env", "list", "--json").stdout)}
    assert envs["alpha"]["stale"] is None and envs["alpha"]["packs"] == ["alpha"]
    assert envs["alpha"]["fingerprint"] != envs["beta"]["fingerprint"]
    assert host("env", "path", "beta").stdout.strip() == str(world["home"] / "envs/beta")


def test_failed_install_leaves_nothing_and_names_the_requirement(host: CLI, world) -> None:  # type: ignore[no-untyped-def]
    proc = host("env", "create", "--pack", "gamma", "--from", str(world["packs"]["gamma"]), "--find-links", str(world["wheels"]), check=False)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: creating the env failed while installing") and "mmfake==9.9" in line, proc.stderr
    assert not (world["home"] / "envs/gamma").exists()
    assert "gamma" not in host("env", "list").stdout


def _like_a_terminal() -> None:
    """SIGINT handled by default, as in a terminal: a test run started in the background by a
    non-interactive shell inherits SIGINT *ignored*, and the child would never see Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_exit_codes_and_ctrl_c_come_through(host: CLI, world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if not (world["home"] / "envs/alpha").exists():
        host("env", "create", "--pack", "alpha", "--from", str(world["packs"]["alpha"]), "--find-links", str(world["wheels"]))
    proc = host("convert", "--pack", "alpha", check=False)
    assert proc.returncode == 2 and "the alpha pack has no convert stage" in proc.stderr
    child = subprocess.Popen(
        [sys.executable, "-m", "mmcore", "download", "--pack", "alpha", "--run-dir", "slow"],
        cwd=tmp_path,
        env=host.env(SLOW_DOWNLOAD="60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_like_a_terminal,
    )
    started = tmp_path / "slow/download/.started.json"  # the env's interpreter is in the stage
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.2)
    assert started.exists(), "the stage never started"
    time.sleep(0.5)
    os.killpg(child.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130 and "interrupted" in err
    assert not (tmp_path / "slow/download/manifest.json").exists()


def test_remove(host: CLI, world) -> None:  # type: ignore[no-untyped-def]
    if not (world["home"] / "envs/beta").exists():
        host("env", "create", "--pack", "beta", "--from", str(world["packs"]["beta"]), "--find-links", str(world["wheels"]))
    host("env", "remove", "beta")
    assert not (world["home"] / "envs/beta").exists()
    proc = host("env", "path", "beta", check=False)
    assert proc.returncode == 2 and "has no env" in proc.stderr


def test_real_packs_with_different_transformers_pins_run_from_one_host(host: CLI, world, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The wan pack on transformers 5.20.0 and the qwen2vl pack on the newest its pins allow,
    each in its env (the host needs no transformers at all: tox's core env has none)."""
    repo = Path(__file__).resolve().parents[1]
    host("env", "create", "--pack", "wan", "--from", str(repo / "packs/generative/wan"), "--with", "transformers==5.20.0", "--force")
    host("env", "create", "--pack", "qwen2vl", "--from", str(repo / "packs/vlm/qwen2vl"), "--force")
    seen = {}
    for pack, extra in (("wan", ["data.demo_samples=4"]), ("qwen2vl", ["data.demo_samples=8"])):
        host("run", "--pack", pack, "--preset", "tiny", "--run-dir", pack, *extra, "training.steps=1")
        seen[pack] = json.loads((tmp_path / pack / "train/manifest.json").read_text())["versions"]["libraries"]["transformers"]
    envs = {e["pack"]: e for e in json.loads(host("env", "list", "--json").stdout)}
    assert seen == {"wan": "5.20.0", "qwen2vl": envs["qwen2vl"]["versions"]["transformers"]}
    assert seen["qwen2vl"] != "5.20.0"
    # qwen2.5vl ships in the same distribution: it runs in qwen2vl's env without an env of its own.
    from mmcore.run import envs

    monkeypatch.setenv("MMCORE_HOME", str(world["home"]))
    assert envs.find("qwen2.5vl").pack == "qwen2vl"


def test_an_env_gets_the_hosts_mmcore_when_it_was_not_installed_editable(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """tox installs the project as a built package and no index has this mmcore version: the
    env still gets the host's mmcore (packed back into a wheel from the installed files)."""
    from mmcore_helpers import pip_install_target

    repo = Path(__file__).resolve().parents[1]
    site = tmp_path / "site"
    pip_install_target([repo], site)  # a regular (non-editable) install, as tox makes
    home = tmp_path / "home"
    cli = CLI(tmp_path, [site])
    check = cli.env()
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m, mmcore; print(m.distribution('mmcore').read_text('direct_url.json'), mmcore.__file__)"],
        env=check,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(site) in found and "editable" not in found  # the host really runs the non-editable copy
    proc = cli("env", "create", "--pack", "alpha", "--from", str(world["packs"]["alpha"]), "--find-links", str(world["wheels"]), MMCORE_HOME=str(home))
    assert f"created {home}/envs/alpha" in proc.stdout
    proc = cli("download", "--pack", "alpha", "--run-dir", "r", MMCORE_HOME=str(home))
    assert "alpha sees mmfake 1.0" in proc.stdout
    import mmcore

    inside = subprocess.run(
        [str(home / "envs/alpha/bin/python"), "-c", "import importlib.metadata as m, mmcore; print(m.version('mmcore'), mmcore.__file__)"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert inside[0] == mmcore.__version__ and inside[1].startswith(str(home / "envs/alpha"))


def test_a_local_library_the_pack_needs_comes_from_the_host_or_from_the_packs_source_tree(tmp_path: Path) -> None:
    """mm-qwen-vision is on no index: an env gets the host's install, or, where the host has
    none (tox's core env), the project beside the pack in its source tree."""
    from mmcore.run.env_requirements import local_dependencies

    pack, shared = tmp_path / "packs/vlm/mypack", tmp_path / "packs/vlm/shared"
    for folder, text in ((pack, '[project]\nname = "mm-pack-mine"\ndependencies = ["mmcore>=0.1", "numpy", "mm-shared-lib-xyz>=0.1"]\n'), (shared, '[project]\nname = "mm_shared.lib-xyz"\n')):
        folder.mkdir(parents=True)
        (folder / "pyproject.toml").write_text(text)
    assert local_dependencies(pack, tmp_path / "scratch") == [str(shared)]  # numpy: the host's is from an index
    assert local_dependencies(tmp_path / "packs/vlm/none", tmp_path / "scratch") == []


def test_the_pack_of_a_command_line_is_its_flag_or_its_run_directorys(tmp_path: Path) -> None:
    """`mmcore infer --run-dir R` has no --pack, yet must run in the pack's env."""
    from mmcore.run.envs import pack_from_argv

    (tmp_path / "r").mkdir()
    (tmp_path / "r/run.json").write_text(json.dumps({"pack": "wan"}))
    assert pack_from_argv(["train", "--pack", "whisper", "--run-dir", str(tmp_path / "r")]) == "whisper"
    assert pack_from_argv(["infer", "--run-dir", str(tmp_path / "r"), "--prompt", "x"]) == "wan"
    assert pack_from_argv(["infer", f"--run-dir={tmp_path / 'r'}"]) == "wan"
    assert pack_from_argv(["infer", "--run-dir", str(tmp_path / "absent")]) is None
