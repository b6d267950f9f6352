"""training.prefetch (on by default) changes nothing about a run: the losses of a run that reads
each step's batches ahead on a thread are those of one that reads them at each step."""

from __future__ import annotations

import json
from pathlib import Path


def test_a_run_with_prefetch_is_the_run_without(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Bit for bit, over several epochs of the tiny data (the read-ahead crosses their boundaries)."""
    common = ["--pack", "qwen2vl", "--preset", "tiny", "training.steps=8", "evaluate.enabled=false", "convert.verify=false", "--run-dir", "r"]

    def losses() -> dict[int, float]:
        rows = [json.loads(x) for x in (tmp_path / "r/train/metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    mm("run", *common)
    ahead = losses()
    mm("train", *common, "training.prefetch=false", "--force")
    assert losses() == ahead and len(ahead) == 8
