"""The ``mmcore`` pytest plugin: fixtures for testing packs and the core.

Fixtures:
    mmcore_plugins: a factory ``(*packs) -> Plugins`` with the infrastructure plugins plus
        exactly the given pack objects (installed packs are left out).
    mmcore_run_dir: an empty run directory under the test's ``tmp_path``.
    mmcore_runner: a factory ``(pack_object, **config) -> Runner`` on ``mmcore_run_dir``.
    mmcore_cli: runs ``mmcore ...`` in a subprocess in the test's ``tmp_path`` (see ``StageCLI``).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest


@pytest.fixture
def mmcore_plugins() -> Callable[..., Any]:
    from mmcore.testing import plugins_with

    return plugins_with


@pytest.fixture
def mmcore_run_dir(tmp_path):  # type: ignore[no-untyped-def]
    from mmcore.rundir import RunDir

    rd = RunDir(tmp_path / "run")
    rd.root.mkdir(parents=True)
    return rd


@pytest.fixture
def mmcore_runner(mmcore_run_dir) -> Callable[..., Any]:  # type: ignore[no-untyped-def]
    from mmcore.testing import make_runner, plugins_with

    def factory(pack: Any, **config_kw: Any) -> Any:
        plugins = plugins_with(pack)
        return make_runner(plugins, pack.PACK.name, mmcore_run_dir.root, **config_kw)

    return factory


@pytest.fixture
def mmcore_cli(tmp_path):  # type: ignore[no-untyped-def]
    from mmcore.testing import StageCLI

    return StageCLI(tmp_path)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped when none is present")
    config.addinivalue_line("markers", "npu: needs an Ascend NPU with torch_npu; skipped when none is present")
    config.addinivalue_line("markers", "compares_runs: compares two runs' numbers, or holds a demo to its promised figure (rerun under another CPU instruction set)")
    config.addinivalue_line("markers", "isa_sample: a compares_runs test that `make test` itself reruns under another CPU instruction set")
