"""Flow-GRPO on FLUX, the whole user path: the demo's captioned pictures run convert -> train (two
supervised warm-up steps, then SDE rollouts scored by image rewards, LoRA with the adapters-off
reference, two steps per rollout on a subsample of the denoising steps) -> export -> evaluate;
killed with SIGKILL while sampling and while updating, the resumed run's rewards and losses equal
an uninterrupted one's. (The SDE and the loss against the formula: tests/test_flow_grpo.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY = ["run", "--pack", "flux", "--preset", "tiny", "data.eval_fraction=0.25"]

GRPO = [
    "training.method=grpo",
    "training.steps=6",
    "training.checkpoint_every=2",
    "training.micro_batch_size=2",
    "training.lora.r=4",
    "training.lr=0.01",
    "training.grpo.lr=0.005",  # from the first rollout (step 3) on, constant
    "training.grpo.warmup_sft_steps=2",
    "training.grpo.group_size=4",
    "training.grpo.sample_steps=4",
    "training.grpo.train_timesteps=2",
    "training.grpo.epochs=2",
    "training.grpo.beta=0.04",
    "training.grpo.eval_prompts=3",  # 2 held-out captions: the first again with other noise
    # the random tiny model draws no colour: brightness differs between its samples, so the advantages are not all 0
    "training.grpo.rewards={brightness: 1.0, colour: 0.5}",
]


def rows(run: Path) -> dict[int, dict]:  # type: ignore[type-arg]
    out: dict[int, dict] = {}  # type: ignore[type-arg]
    for line in (run / "train/metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            out[row["step"]] = row
    return out


@pytest.mark.compares_runs
def test_flow_grpo_runs_the_pipeline_and_resumes_identically_after_kills(flux, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    args = [*TINY, *GRPO]
    flux(*args, "--run-dir", "straight")
    straight = rows(tmp_path / "straight")
    assert sorted(straight) == [1, 2, 3, 4, 5, 6]
    for step, row in straight.items():
        # steps 1-2 learn the pictures (SFT); samples are drawn on steps 3 and 5 and trained on for two steps each
        assert ({"kl", "clip_fraction"} <= set(row)) == (step > 2), row
        assert ({"reward", "reward_std", "rewards/brightness", "rewards/colour", "rollout_share"} <= set(row)) == (step in (3, 5)), row
        assert row["grad_norm"] > 0, row
    assert all(0 < straight[s]["reward"] < 1 and straight[s]["reward_std"] > 0 for s in (3, 5))
    assert any(straight[s]["kl"] > 0 for s in (4, 5, 6))  # the adapters moved the policy from the base
    assert "timesteps_per_s" in straight[3]  # the loss unit: one sample's denoising step
    assert [straight[s]["lr"] for s in (3, 4, 5, 6)] == [pytest.approx(0.005)] * 4  # training.grpo.lr
    train = json.loads((tmp_path / "straight/train/manifest.json").read_text())["metrics"]
    assert {"eval/reward@0", "eval/reward", "eval/rewards/brightness", "eval/loss"} <= set(train), train
    logged = [json.loads(line) for line in (tmp_path / "straight/train/rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [3, 5] and len(logged[0]["rewards"]) == 4
    assert json.loads((tmp_path / "straight/export/manifest.json").read_text())["metrics"]["lora_r"] == 4  # the adapter, as after LoRA SFT
    assert (tmp_path / "straight/evaluate/samples/sample-0.png").is_file()
    # training.grpo.fresh_optimizer: Adam's state restarted at the first rollout (step 3), so the
    # checkpoint of step 4 holds two of its steps, not four
    from mmcore.checkpoint.dcp_tensors import dcp_index, load_dcp_tensors

    ckpt = tmp_path / "straight/train/checkpoints/step-00000004"
    index = dcp_index(ckpt, prefix="optim.state.")
    counts = load_dcp_tensors(ckpt, [k for k in index if k.endswith(".step")], index, prefix="optim.state.")
    assert counts and {float(v) for v in counts.values()} == {2.0}, counts

    # sampling step 5's rollout; the second update (step 4, the second step on step 3's rollout)
    for kill in ("grpo-rollout:5", "grpo-update:2"):
        run = f"killed-{kill.split(':')[0]}"
        assert flux(*args, "--run-dir", run, check=False, MMCORE_TEST_KILL=kill).returncode != 0
        flux(*args, "--run-dir", run)
        resumed = rows(tmp_path / run)
        for step in range(3, 7):
            for key in ("loss", "reward", "rewards/colour", "kl", "clip_fraction", "grad_norm"):
                assert resumed[step].get(key) == straight[step].get(key), (kill, step, key)


def test_flow_grpo_refuses_what_it_cannot_train(flux, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base = [*TINY, "training.method=grpo", "--run-dir", "run"]
    proc = flux(*base, "training.grpo.sde_noise_level=0", check=False)
    assert proc.returncode != 0 and "training.grpo.sde_noise_level must be > 0" in proc.stderr + proc.stdout
    proc = flux(*base, "training.grpo.rewards={accuracy: 1.0}", check=False)  # the stages before train are reused
    said = proc.stderr + proc.stdout
    assert proc.returncode != 0 and "reward 'accuracy' scores texts, and this run's samples are images (rewards on images: brightness, colour)" in said, said


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.compares_runs
def test_flow_grpo_two_processes_equal_one(flux, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same global batch (2 captions x 4 samples) on 1 process and on 2: rollouts seeded by
    (seed, step, caption), so the same samples and rewards; rewards and gradients equal to float rounding
    (the loss of a rollout's first step is 0 up to rounding: its advantages sum to 0)."""
    args = [*TINY, "training.method=grpo", "training.steps=3", "training.grpo.group_size=4", "training.grpo.sample_steps=4", "training.grpo.train_timesteps=2"]
    args += ["training.grpo.rewards={brightness: 1.0}", "evaluate.enabled=false"]
    flux(*args, "--run-dir", "one", "training.micro_batch_size=2")
    flux(*args, "--run-dir", "two", "training.micro_batch_size=1", "--nproc-per-node", "2")
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2, 3]
    for step in one:
        for key in ("reward", "rewards/brightness"):  # the same samples: sums over processes differ in rounding only
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-6), (step, key)
        assert two[step]["grad_norm"] == pytest.approx(one[step]["grad_norm"], rel=1e-4)
