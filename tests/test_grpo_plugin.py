"""A team's reward function shipped as its own small package: installed from its folder, registered
through ``mmcore_register_rewards``, used by name in ``training.grpo.rewards`` by a qwen2vl run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore_helpers import CLI, pip_install_target, write_pack_project

VERIFIER = """
from mmcore import hookimpl
from mmcore.framework.registry import RewardSpec


def shorter_is_better(completions, references, prompts, **_):
    return [1.0 / (1 + len(c)) for c in completions]


@hookimpl
def mmcore_register_rewards(register):
    register(RewardSpec("team.short", "mm_team_rewards:shorter_is_better", summary="1 / (1 + characters)"))
"""


@pytest.mark.slow
def test_a_plugin_reward_is_used_by_name(tmp_path: Path) -> None:
    project = write_pack_project(tmp_path / "projects", "mm-team-rewards", "mm_team_rewards", VERIFIER, {"team_rewards": "mm_team_rewards"}, group="mmcore.plugins")
    site = tmp_path / "site"
    pip_install_target([project], site)
    cli = CLI(tmp_path, [site])
    assert "rewards (training.grpo.rewards): accuracy, exact, format, length, similarity, team.short" in cli("list").stdout
    proc = cli(
        "run",
        "--pack",
        "qwen2vl",
        "--preset",
        "tiny",
        "training.method=grpo",
        "training.steps=2",
        "training.grpo.group_size=2",
        "training.grpo.max_new_tokens=3",
        "training.grpo.rewards={team.short: 1.0}",
        "evaluate.enabled=false",
    )
    rows = [json.loads(line) for line in (tmp_path / "runs/qwen2vl-tiny/train/metrics.jsonl").read_text().splitlines()]
    sampled = [r for r in rows if "rewards/team.short" in r]
    assert len(sampled) == 2 and all(0 < r["rewards/team.short"] <= 1 for r in sampled), proc.stdout


PICTURE_SCORE = """
import numpy as np

from mmcore import hookimpl
from mmcore.framework.registry import RewardSpec


def redness(images, prompts, **_):
    return [float(np.asarray(frames)[..., 0].mean() - np.asarray(frames)[..., 1:].mean()) for frames in images]


@hookimpl
def mmcore_register_rewards(register):
    register(RewardSpec("team.redness", "mm_team_pictures:redness", summary="red minus the other channels", takes="image"))
"""


@pytest.mark.slow
def test_a_plugin_reward_on_images_is_used_by_name_in_a_diffusion_run(tmp_path: Path) -> None:
    project = write_pack_project(tmp_path / "projects", "mm-team-pictures", "mm_team_pictures", PICTURE_SCORE, {"team_pictures": "mm_team_pictures"}, group="mmcore.plugins")
    site = tmp_path / "site"
    pip_install_target([project], site)
    cli = CLI(tmp_path, [site])
    assert "; on images: brightness, colour, team.redness" in cli("list").stdout
    args = ["run", "--pack", "flux", "--preset", "tiny", "training.method=grpo", "training.steps=2", "training.grpo.group_size=2", "training.grpo.sample_steps=2"]
    proc = cli(*args, "training.grpo.rewards={team.redness: 1.0}", "evaluate.enabled=false")
    rows = [json.loads(line) for line in (tmp_path / "runs/flux-tiny/train/metrics.jsonl").read_text().splitlines()]
    sampled = [r for r in rows if "rewards/team.redness" in r]
    assert len(sampled) == 2 and all(-1 <= r["rewards/team.redness"] <= 1 for r in sampled), proc.stdout
    refused = cli(*args, "training.grpo.rewards={team.redness: 1.0, accuracy: 1.0}", check=False)
    assert refused.returncode != 0 and "reward 'accuracy' scores texts" in refused.stdout + refused.stderr
