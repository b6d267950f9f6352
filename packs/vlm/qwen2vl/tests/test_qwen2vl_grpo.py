"""GRPO on Qwen2-VL, the whole user path: a LLaMA-Factory file of image questions with reference
answers runs convert -> train (rollouts, rewards, LoRA with the adapters-off reference, two
steps per rollout) -> export -> evaluate; killed with SIGKILL while sampling and while updating,
the resumed run's rewards and losses equal an uninterrupted one's; 2 processes equal 1. (The
loss against the formula: tests/test_grpo.py; a plugin's reward: tests/test_grpo_plugin.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.testing.media import write_image, write_video

COLOURS = {"red": (220, 30, 30), "blue": (40, 60, 220), "green": (30, 170, 60)}


def write_questions(folder: Path) -> Path:
    """Questions with the reference as the assistant's turn, LLaMA-Factory's MLLM format, shaped
    like users' files: images of uneven sizes, clips and text-only questions in one file (FACTS.md,
    real data across ranks), so that two processes' micro-batches hold different media."""
    records = []
    for i in range(12):
        colour = sorted(COLOURS)[i % 3]
        if i % 4 == 3:
            records.append({"messages": [{"role": "user", "content": f"Say {colour}."}, {"role": "assistant", "content": colour}]})
            continue
        if i % 6 == 4:
            write_video(folder / "clips" / f"{i}.mp4", frames=4 + 4 * (i % 2))
            records.append({"messages": [{"role": "user", "content": "<video>What colour is it?"}, {"role": "assistant", "content": colour}], "videos": [f"clips/{i}.mp4"]})
            continue
        write_image(folder / "images" / f"{i}.png", COLOURS[colour], size=(48 + 16 * (i % 3), 48))
        records.append({"messages": [{"role": "user", "content": "<image>What colour is it?"}, {"role": "assistant", "content": colour}], "images": [f"images/{i}.png"]})
    path = folder / "questions.json"
    path.write_text(json.dumps(records))
    return path


def rows(run: Path) -> dict[int, dict]:  # type: ignore[type-arg]
    out: dict[int, dict] = {}  # type: ignore[type-arg]
    for line in (run / "train/metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            out[row["step"]] = row
    return out


GRPO = [
    "training.method=grpo",
    "training.steps=6",
    "training.checkpoint_every=2",
    "training.micro_batch_size=2",
    "training.lora.r=4",
    "training.grpo.group_size=4",
    "training.grpo.max_new_tokens=5",
    "training.grpo.epochs=2",
    "training.grpo.beta=0.04",
    "training.grpo.eval_prompts=4",
    "training.lr=0.01",
    "training.grpo.rewards={accuracy: 1.0, length: 0.5}",  # the random tiny model is never right: its answers' lengths differ
]


@pytest.mark.compares_runs
def test_grpo_runs_the_pipeline_and_resumes_identically_after_kills(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = write_questions(tmp_path / "data")
    args = ["run", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(data), "data.eval_fraction=0.25", *GRPO]
    mm(*args, "--run-dir", "straight")
    straight = rows(tmp_path / "straight")
    assert sorted(straight) == [1, 2, 3, 4, 5, 6]
    for step, row in straight.items():
        assert {"kl", "clip_fraction"} <= set(row), row
        # answers are sampled on steps 1, 3, 5 and trained on for two steps each (training.grpo.epochs)
        assert ({"reward", "rewards/accuracy", "rewards/length", "answer_tokens", "rollout_share"} <= set(row)) == (step % 2 == 1), row
    assert all(r["grad_norm"] > 0 for r in straight.values())  # every step learns (step 1's loss is 0: ratio 1, advantages sum to 0)
    assert any(r["kl"] > 0 for r in straight.values())  # the adapters moved the policy from the base
    train = json.loads((tmp_path / "straight/train/manifest.json").read_text())["metrics"]
    assert "eval/reward" in train and "eval/rewards/accuracy@0" in train
    assert json.loads((tmp_path / "straight/export/manifest.json").read_text())["metrics"]["logits_max_abs_diff"] == 0.0
    assert (tmp_path / "straight/evaluate/results.jsonl").is_file()

    for kill in ("grpo-rollout:5", "grpo-update:4"):  # sampling step 5's answers; step 4, the second on step 3's rollout
        run = f"killed-{kill.split(':')[0]}"
        assert mm(*args, "--run-dir", run, check=False, MMCORE_TEST_KILL=kill).returncode != 0
        mm(*args, "--run-dir", run)
        resumed = rows(tmp_path / run)
        for step in (5, 6):
            for key in ("loss", "reward", "kl", "clip_fraction"):
                assert resumed[step].get(key) == straight[step].get(key), (kill, step, key)


FULL = [  # full fine-tuning with a KL to the weights of the first rollout, after two supervised steps
    "training.method=grpo",
    "training.steps=6",
    "training.checkpoint_every=2",
    "training.micro_batch_size=2",
    "training.grpo.group_size=4",
    "training.grpo.max_new_tokens=5",
    "training.grpo.warmup_sft_steps=2",
    "training.grpo.beta=0.04",
    "training.grpo.entropy_coef=0.01",
    "training.grpo.skip_uniform_groups=true",
    "training.grpo.eval_prompts=4",
    "training.lr=0.01",
    "training.grpo.rewards={accuracy: 1.0, length: 0.5}",
    "evaluate.enabled=false",
]


@pytest.mark.compares_runs
def test_full_fine_tuning_keeps_the_first_rollouts_weights_as_its_reference(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Without LoRA the reference is a frozen copy of the weights at the first rollout: the KL is
    0 on that step (the policy is the reference) and grows after; killed in a later update, the
    resumed run reads the copy back from grpo-reference/ and continues identically."""
    data = write_questions(tmp_path / "data")
    args = ["run", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(data), "data.eval_fraction=0.25", *FULL]
    mm(*args, "--run-dir", "straight")
    straight = rows(tmp_path / "straight")
    assert "kl" not in straight[2] and "reward" in straight[3]  # two supervised steps, then rollouts
    assert straight[3]["kl"] < 1e-9 < straight[6]["kl"]  # the policy starts as the reference, then leaves it
    assert straight[4]["entropy"] > 0 and all(0 <= straight[s]["informative_groups"] <= 1 for s in (3, 4, 5, 6))
    assert (tmp_path / "straight/train/grpo-reference/.metadata").is_file()
    run = "killed"
    assert mm(*args, "--run-dir", run, check=False, MMCORE_TEST_KILL="grpo-update:3").returncode != 0  # in step 5's update
    mm(*args, "--run-dir", run)
    resumed = rows(tmp_path / run)
    for step in (5, 6):
        for key in ("loss", "reward", "kl", "entropy"):
            assert resumed[step].get(key) == straight[step].get(key), (step, key)


def test_grpo_refuses_what_it_cannot_train(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = write_questions(tmp_path / "data")
    base = ["run", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(data), "training.method=grpo"]
    proc = mm(*base, "training.grpo.rewards={no_such: 1.0}", "--run-dir", "run", check=False)  # the stages before train are reused
    assert proc.returncode != 0 and "unknown reward function 'no_such'; known: accuracy, brightness, colour, exact, format, length, similarity" in proc.stderr + proc.stdout


@pytest.mark.matrix
@pytest.mark.compares_runs
def test_grpo_two_processes_equal_one(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same global batch (2 prompts x 4 answers) on 1 process and on 2: rollouts seeded by
    (seed, step, prompt), so the same answers and rewards; losses equal to float rounding. The
    ranks' prompts differ in media (a text-only one beside an image one): fillers keep their
    tower calls alike."""
    data = write_questions(tmp_path / "data")
    args = ["run", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(data), *GRPO, "evaluate.enabled=false"]
    mm(*args, "--run-dir", "one", "training.balance_towers=false")
    mm(*args, "--run-dir", "two", "--nproc-per-node", "2", "training.micro_batch_size=1", "training.balance_towers=false")
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert sum(r.get("fillers", 0) for r in two.values()) > 0  # some step paired a text-only prompt with an image one
    for step in one:
        assert two[step].get("reward") == one[step].get("reward")
        assert two[step]["loss"] == pytest.approx(one[step]["loss"], rel=1e-5, abs=1e-7)


@pytest.mark.matrix
@pytest.mark.compares_runs
def test_full_fine_tuning_reference_on_two_processes_equals_one(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The frozen reference kept as each process's shards (FSDP2) and swapped in for the
    reference pass: 2 processes' KL and losses equal 1 process's."""
    data = write_questions(tmp_path / "data")
    args = ["run", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(data), *FULL]
    mm(*args, "--run-dir", "one", "training.balance_towers=false")
    mm(*args, "--run-dir", "two", "--nproc-per-node", "2", "training.micro_batch_size=1", "training.balance_towers=false")
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert two[6]["kl"] > 1e-9  # the swapped-in shards are the reference's, not the policy's
    for step in one:
        assert two[step].get("reward") == one[step].get("reward")
        for key in ("loss", "kl"):
            assert two[step].get(key, 0.0) == pytest.approx(one[step].get(key, 0.0), rel=1e-5, abs=1e-7), (step, key)
