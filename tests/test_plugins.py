"""Discovery of packs and plugins through entry points, and every way that can go wrong."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import pytest

from mmcore_helpers import CLI, pip_install_target, write_pack_project
from mmcore import PackSpec, StageResult, hookimpl
from mmcore.errors import PackError
from mmcore.testing import plugins_with

GOOD = """
from mmcore import PackSpec, StageResult, hookimpl
PACK = PackSpec(name="{name}", summary="from {dist}")

@hookimpl
def mmcore_download(ctx):
    return StageResult(outputs={{"model": "."}})  # the contract: download records its model folder
"""


@pytest.fixture(scope="module")
def odd_site(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Distributions that go wrong in different ways, installed together in one folder."""
    root = tmp_path_factory.mktemp("odd-projects")
    projects = [
        write_pack_project(root, "mm-pack-raises", "mm_pack_raises", "raise RuntimeError('boom at import')\n", {"raises": "mm_pack_raises"}),
        write_pack_project(root, "mm-pack-twin-a", "mm_pack_twin_a", GOOD.format(name="twin", dist="a"), {"twin": "mm_pack_twin_a"}),
        write_pack_project(root, "mm-pack-twin-b", "mm_pack_twin_b", GOOD.format(name="twin", dist="b"), {"twin": "mm_pack_twin_b"}),
        write_pack_project(
            root,
            "mm-pack-typo",
            "mm_pack_typo",
            GOOD.format(name="typo", dist="typo") + "\ndef mmcore_trian(ctx):\n    return None\n",
            {"typo": "mm_pack_typo"},
        ),
        write_pack_project(root, "mm-pack-nospec", "mm_pack_nospec", "X = 1\n", {"nospec": "mm_pack_nospec"}),
        write_pack_project(root, "mm-pack-fine", "mm_pack_fine", GOOD.format(name="fine", dist="fine"), {"fine": "mm_pack_fine"}),
    ]
    target = tmp_path_factory.mktemp("odd-site")
    pip_install_target(projects, target)
    return target


def test_installed_pack_is_discovered_without_touching_core(cli: CLI) -> None:
    out = json.loads(cli("list", "--json").stdout)
    toy = next(p for p in out["packs"] if p["name"] == "toy")
    assert toy["ok"] and toy["distribution"] == "mm-pack-toy" and toy["version"] == "0.3.0"
    assert toy["stages"] == ["download", "preprocess", "train", "export"]
    assert {p["name"] for p in out["plugins"]} >= {"cpu", "cuda", "npu", "events"}


def test_broken_and_duplicate_packs_are_reported_and_the_rest_still_works(tmp_path, toy_site, odd_site) -> None:  # type: ignore[no-untyped-def]
    cli = CLI(tmp_path, [toy_site, odd_site])
    proc = cli("list", "--json")
    packs = {p["name"]: p for p in json.loads(proc.stdout)["packs"]}
    assert packs["toy"]["ok"] and packs["fine"]["ok"]
    assert not packs["raises"]["ok"] and "RuntimeError: boom at import" in packs["raises"]["error"]
    assert not packs["twin"]["ok"]
    assert "mm-pack-twin-a 1.0.0" in packs["twin"]["error"] and "mm-pack-twin-b 1.0.0" in packs["twin"]["error"]
    assert "unknown hook 'mmcore_trian' (did you mean 'mmcore_train'?)" in packs["typo"]["error"]
    assert "PACK attribute" in packs["nospec"]["error"]
    text = cli("list").stdout
    assert "raises" in text and "BROKEN" in text
    # Using a broken pack is a one-line error, not a traceback.
    proc = cli("download", "--pack", "twin", check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: pack 'twin'") and "Traceback" not in proc.stderr
    # The healthy pack next to them runs.
    cli("download", "--pack", "fine")


def test_disable_and_trace_environment_variables(cli: CLI) -> None:
    names = {p["name"] for p in json.loads(cli("list", "--json", MMCORE_DISABLE_PLUGINS="toy,events").stdout)["packs"]}
    assert "toy" not in names
    plugins = {p["name"] for p in json.loads(cli("list", "--json", MMCORE_DISABLE_PLUGINS="events").stdout)["plugins"]}
    assert "events" not in plugins and "cpu" in plugins
    proc = cli("download", "--pack", "toy", MMCORE_TRACE_HOOKS="1")
    assert "mmcore_download" in proc.stderr


def test_list_and_help_do_not_import_torch(cli: CLI) -> None:
    for args in (["list"], ["list", "--json"], ["--help"], ["info", "toy"]):
        code = f"import sys\nfrom mmcore.cli.commands import main\ntry:\n    main({args!r})\nexcept SystemExit:\n    pass\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
        proc = subprocess.run([sys.executable, "-c", code], env=cli.env(), capture_output=True, text=True, check=True)
        assert proc.stdout.strip().splitlines()[-1] == "NO-TORCH", args


def test_unknown_pack_suggests_the_close_name(cli: CLI) -> None:
    proc = cli("download", "--pack", "toi", check=False)
    assert proc.returncode == 2
    assert "unknown pack 'toi'" in proc.stderr and "did you mean 'toy'?" in proc.stderr


def test_hookimpl_with_an_argument_not_in_the_spec_is_refused() -> None:
    class Bad:
        PACK = PackSpec(name="bad")

        @hookimpl
        def mmcore_train(self, ctx, model):  # 'model' is not a parameter of the hook
            return StageResult()

    with pytest.raises(PackError, match="broken.*model"):
        plugins_with(Bad())


def test_stage_hooks_reach_only_the_chosen_pack_plus_wrappers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []

    def make(name: str):  # type: ignore[no-untyped-def]
        class Pack:
            PACK = PackSpec(name=name)

            @hookimpl
            def mmcore_download(self, ctx):
                calls.append(name)
                return StageResult(outputs={"model": "."})

        return Pack()

    class Timing:
        @hookimpl(wrapper=True)
        def mmcore_download(self, ctx):
            calls.append("wrapper-before")
            result = yield
            calls.append("wrapper-after")
            return result

    plugins = plugins_with(make("a"), make("b"))
    plugins.pm.register(Timing(), name="plugin:timing")
    from mmcore.testing import make_runner

    make_runner(plugins, "b", tmp_path / "run").run_stage("download")
    assert calls == ["wrapper-before", "b", "wrapper-after"]


def test_a_conformance_record_of_a_selection_says_it_is_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pytest -k`` on three rules must not read as the pack having passed conformance."""
    from mmcore.framework.conformance_record import describe, read_record, write_record

    monkeypatch.setenv("MMCORE_HOME", str(tmp_path))
    write_record("ltx", "0.1.0", passed=1, failed=0, skipped=2, deselected=14)
    assert describe(read_record("ltx"), "0.1.0").endswith("(a partial session: 14 rules deselected)")
    write_record("ltx", "0.1.0", passed=15, failed=0, skipped=2)
    assert "partial" not in describe(read_record("ltx"), "0.1.0")
