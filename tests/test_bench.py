"""The benchmark suite's arithmetic and its scripts' health: CI never runs a benchmark (they
measure, they do not check), so a script that no longer imports would only show up when
someone runs ``make bench``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import suite  # noqa: E402


def test_ratio_is_the_median_of_paired_repetitions_with_its_quartiles() -> None:
    # a slow repetition on both sides cancels in its own ratio; a median of medians would not
    fig = common.figure("x/y", "what", "s", [1.0, 2.2, 1.1, 1.05], [1.0, 2.0, 1.0, 1.0], baseline_name="bare", how="how", goal=("<=", 1.03))
    assert fig.ratio == pytest.approx(1.075) and fig.iqr == pytest.approx((1.0375, 1.1))
    assert fig.mmcore == pytest.approx(1.075) and fig.baseline == pytest.approx(1.0)
    assert fig.met is False
    speedup = common.figure("x/z", "what", "s", [1.0, 1.0], [3.0, 4.0], baseline_name="live", how="how", ratio_is="baseline/mmcore", goal=(">=", 3.0))
    assert speedup.ratio == pytest.approx(3.5) and speedup.met is True
    value_goal = common.figure("x/w", "what", "fraction", [0.99], [0.4], baseline_name="padded", how="how", goal=(">=", 0.97), goal_of="mmcore")
    assert value_goal.met is True and value_goal.ratio == pytest.approx(0.99 / 0.4)
    with pytest.raises(ValueError, match="3 mmcore repetitions but 2 baseline"):
        common.figure("x/v", "what", "s", [1.0, 1.0, 1.0], [1.0, 1.0], baseline_name="b", how="how")


def test_markdown_shows_every_figure_its_goal_and_the_failures() -> None:
    fig = common.figure("engine_overhead/toy", "train step", "s/step", [1.2, 1.1], [1.0, 1.0], baseline_name="bare PyTorch loop", how="2 reps", goal=("<=", 1.03))
    row = {**common.asdict(fig), "met": fig.met}
    results = {
        "quick": False,
        "date": "2026-12-01 00:00 UTC",
        "commit": "abc",
        "duration_s": 60.0,
        "threads": 2,
        "machine": {"cpu": "Xeon", "cores": 2, "torch": "2.13", "torch_isa": "AVX512", "python": "3.11", "cuda": None},
        "figures": [row],
        "failures": [{"benchmark": "convert_speed", "covers": "2. conversion", "error": "exit 1: boom"}],
        "skipped": [{"benchmark": "gpu_step", "covers": "8. GPU", "why": "no CUDA device"}],
    }
    text = suite.markdown(results)
    assert "| `engine_overhead/toy` | train step | 1.15 s/step | 1 s/step (bare PyTorch loop) | 1.15 (1.12–1.17) mmcore/baseline | ratio <= 1.03 | **missed** |" in text
    assert "**failed**: exit 1: boom" in text and "not run: no CUDA device" in text
    assert "dispatching to **AVX512**" in text and "- `engine_overhead/toy`: 2 reps." in text


@pytest.mark.parametrize("script", [name for name, _, _ in suite.BENCHMARKS] + ["suite", "gpu_step", "gpu_megatron"])
def test_every_benchmark_script_starts(script: str) -> None:
    proc = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--help"], cwd=BENCH, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_peers_write_llamafactory_data_as_its_dataset_info_names_it(tmp_path: Path) -> None:
    """bench/peers.py's data: LLaMA-Factory's MLLM layout (its mllm_demo entry), every image there."""
    import json

    import peers

    peers.write_data(tmp_path, 3, 2)
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert set(info) == {"peers_train", "peers_eval"}
    for name, entry in info.items():
        assert entry["formatting"] == "sharegpt" and entry["columns"] == {"messages": "messages", "images": "images"}
        assert entry["tags"] == {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
        records = json.loads((tmp_path / entry["file_name"]).read_text())
        assert len(records) == (3 if name == "peers_train" else 2)
        for record in records:
            assert [t["role"] for t in record["messages"]] == ["user", "assistant"]
            assert record["messages"][0]["content"].count("<image>") == len(record["images"]) == 1
            assert (tmp_path / record["images"][0]).is_file()


def test_a_rerun_at_another_thread_count_or_on_another_machine_says_so() -> None:
    results = {"quick": False, "date": "d", "commit": "c", "duration_s": 60.0, "threads": 2, "figures": [], "failures": [], "skipped": []}
    results["machine"] = {"cpu": "Xeon", "cores": 2, "torch": "2.13", "torch_isa": "AVX512", "python": "3.11", "cuda": None}
    results["reruns"] = [{"benchmarks": ["peers"], "date": "d2", "commit": "c2", "threads": 1, "machine": "AMD EPYC"}, {"benchmarks": ["caches"], "date": "d3", "commit": "c3"}]
    text = suite.markdown(results)
    assert "Rerun since: peers on d2 at `c2`, 1 thread(s) on both sides, on another machine: AMD EPYC." in text and "Rerun since: caches on d3 at `c3`." in text
