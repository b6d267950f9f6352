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
    from mmcore.run.rundir import RunDir

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
    config.addinivalue_line("markers", "matrix: a further case of an expensive matrix whose representative case `make test` runs; `make test-matrix` runs these")


# --------------------------------------------------------------------------- the test budget
# `make test` must stay within 40 minutes of pytest on a 2-core CI machine. Each distribution's
# share is printed at the end of a run (setup + call + teardown of its tests, by folder), so a
# pack that outgrows its budget (README, "Test budget") is seen in the run that made it so.

_SECONDS_BY_PART: dict[str, float] = {}


def _part(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:3]) if parts[0] == "packs" and len(parts) > 3 else parts[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    part = _part(report.nodeid)
    _SECONDS_BY_PART[part] = _SECONDS_BY_PART.get(part, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if len(_SECONDS_BY_PART) < 2:
        return
    terminalreporter.section("test time by distribution")
    for part, seconds in sorted(_SECONDS_BY_PART.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds / 60:6.2f} min  {part}")
    terminalreporter.write_line(f"{sum(_SECONDS_BY_PART.values()) / 60:6.2f} min  total")


#: the conformance rule that runs two processes: in ``make test`` only where a subclass opts in
MIXED_RULE = "test_mixed_media_on_two_processes_equals_one"
#: the generative packs' two-process rule: ``make test-matrix`` only (the FSDP2 path the two-process
#: tests of ``make test`` run)
TWO_PROCESS_RULE = "test_two_processes_train_as_one"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A PackConformance subclass's ``matrix`` tests get the ``matrix`` marker (and its
    two-process rule, and its mixed-data rule unless ``mixed_in_make_test``)."""
    for item in items:
        cls = getattr(item, "cls", None)
        name = getattr(item, "originalname", item.name)
        if cls is not None and _is_conformance(cls) and (name in cls.matrix or name == TWO_PROCESS_RULE or (name == MIXED_RULE and not cls.mixed_in_make_test)):
            item.add_marker(pytest.mark.matrix)


# --------------------------------------------------------------------------- conformance records

_CONFORMANCE: dict[str, dict[str, int]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    """Count each PackConformance test's outcome under its pack, for ``mmcore info``."""
    outcome = yield
    report = outcome.get_result()
    pack = getattr(getattr(item, "cls", None), "pack_name", None)
    if not pack or not _is_conformance(item.cls):
        return
    counts = _CONFORMANCE.setdefault(pack, {"passed": 0, "failed": 0, "skipped": 0})
    if report.when == "call" or report.outcome != "passed":
        counts[report.outcome if report.outcome in counts else "failed"] += 1


_DESELECTED: dict[str, int] = {}


def pytest_deselected(items: list[pytest.Item]) -> None:
    """Count the conformance rules a ``-k`` or ``-m`` selection left out (the matrix's rules are
    left out of make test by design, so they do not count): the record says it is partial."""
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and _is_conformance(cls) and item.get_closest_marker("matrix") is None:
            _DESELECTED[cls.pack_name] = _DESELECTED.get(cls.pack_name, 0) + 1


def _is_conformance(cls: type) -> bool:
    from mmcore.testing.conformance import PackConformance

    return isinstance(cls, type) and issubclass(cls, PackConformance)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _CONFORMANCE:
        return
    from importlib.metadata import entry_points

    from mmcore.framework.conformance_record import write_record

    versions = {ep.name: ep.dist.version for ep in entry_points(group="mmcore.packs") if ep.dist is not None}
    for pack, counts in _CONFORMANCE.items():
        if pack in versions:  # an installed pack, not a test's throwaway one
            try:
                write_record(pack, versions[pack], **counts, deselected=_DESELECTED.get(pack, 0))
            except OSError:
                pass  # a read-only home: the record is a convenience, the test outcome stands
