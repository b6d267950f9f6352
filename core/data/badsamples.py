"""The bad-sample policy: stop at the first (``error``) or skip, count and list them (``skip``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mmcore.errors import StageError


@dataclass
class BadSample:
    file: str
    index: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: sample {self.index}: {self.reason}"


@dataclass
class BadSamples:
    """Collects bad samples under ``policy``; never drops one silently."""

    policy: str
    out_file: Path | None = None
    found: list[BadSample] = field(default_factory=list)

    def report(self, bad: BadSample) -> None:
        if self.policy == "error":
            raise StageError(str(bad), hint="fix the sample, or set data.on_bad_sample=skip to skip and list such samples")
        self.found.append(bad)

    def close(self) -> str | None:
        """Write the list (``skip``); returns a summary line, or None when there were none."""
        if self.out_file is not None:
            self.out_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.out_file, "w", encoding="utf-8") as handle:
                for bad in self.found:
                    handle.write(json.dumps(bad.__dict__) + "\n")
        if not self.found:
            return None
        where = f"; listed in {self.out_file}" if self.out_file else ""
        return f"skipped {len(self.found)} bad sample(s){where}"
