"""The conformance status a pack last recorded: what ``mmcore info PACK`` shows.

The pytest plugin writes ``$MMCORE_HOME/conformance/<pack>.json`` when a session ran a pack's
:class:`~mmcore.testing.conformance.PackConformance` tests: passed and failed counts, the
pack's and mmcore's versions, the time. A record of another pack version is shown as such.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def record_path(pack: str) -> Path:
    from mmcore.run.envs import home

    return home() / "conformance" / f"{pack}.json"


def write_record(pack: str, version: str, passed: int, failed: int, skipped: int, deselected: int = 0) -> None:
    """``deselected``: rules the session's ``-k``/``-m`` selection left out (:func:`describe`
    calls such a record partial)."""
    from mmcore import __version__
    from mmcore.framework.files import atomic_write_text

    record = {"pack": pack, "pack_version": version, "mmcore_version": __version__, "passed": passed, "failed": failed, "skipped": skipped, "when": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if deselected:
        record["deselected"] = deselected
    path = record_path(pack)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def read_record(pack: str) -> dict[str, Any] | None:
    try:
        return json.loads(record_path(pack).read_text())
    except (OSError, ValueError):
        return None


def describe(record: dict[str, Any] | None, version: str) -> str:
    if record is None:
        return "not recorded here (run the pack's conformance tests: pytest -k Conformance)"
    verdict = "PASSED" if record["failed"] == 0 else "FAILED"
    stale = "" if record["pack_version"] == version else f" (of pack version {record['pack_version']}, installed {version})"
    partial = f" (a partial session: {record['deselected']} rules deselected)" if record.get("deselected") else ""
    return f"{verdict}: {record['passed']} passed, {record['failed']} failed, {record['skipped']} skipped with mmcore {record['mmcore_version']} at {record['when']}{stale}{partial}"
