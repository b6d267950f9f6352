"""Flow-GRPO on Wan, a video family: rollouts decoded by the video VAE into clips [F, H, W, 3],
the image rewards scoring every frame, full fine-tuning with the KL to the first rollout's
weights (:class:`mmcore.backends.frozen.GrpoReference`), the export and its samples. (The FLUX case, kill and resume included: packs/generative/flux/tests/test_flux_grpo.py.)"""

from __future__ import annotations

import json
from pathlib import Path


def test_flow_grpo_trains_a_video_family(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    args = ["run", "--pack", "wan", "--preset", "tiny", "data.eval_fraction=0.25", "training.method=grpo", "training.steps=2"]
    args += ["training.grpo.beta=0.04", "training.grpo.group_size=2", "training.grpo.sample_steps=3", "training.grpo.rewards={brightness: 1.0, colour: 1.0}", "training.grpo.eval_prompts=3"]
    wan(*args, "--run-dir", "run")
    rows = [json.loads(line) for line in (tmp_path / "run/train/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 2 and all({"reward", "rewards/brightness", "rewards/colour", "kl", "clip_fraction"} <= set(r) for r in steps), steps
    assert all(0 < r["rewards/brightness"] < 1 and r["grad_norm"] > 0 for r in steps)
    # the reference is the weights of the first rollout: the same policy there, moved by one update after
    assert steps[0]["kl"] == 0 and steps[1]["kl"] > 1e-9, steps
    assert (tmp_path / "run/train/grpo-reference/.metadata").is_file()
    held = [r for r in rows if "eval/reward" in r]
    assert [r["step"] for r in held] == [0, 2] and "eval/loss" in held[-1]
    assert (tmp_path / "run/evaluate/results.jsonl").is_file()
