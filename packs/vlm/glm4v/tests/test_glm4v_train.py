"""Training for real: a dataset mixing images and videos trains and answers (kinds kept apart),
FSDP2 on 2 processes equals 1, the demo learns and its export answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.testing import stage_manifest as manifest, train_losses as losses, two_processes_match_one
from mmcore.testing.media import write_image, write_video


@pytest.mark.slow
def test_a_dataset_mixing_images_and_videos_trains_and_answers(tmp_path: Path) -> None:
    """Micro-batches of two and generation batches of four never mix the kinds (transformers'
    GLM-4V would fail on such a batch: it finds both by one token)."""
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    records = []
    for i in range(6):
        write_image(tmp_path / f"data/i{i}.png", (40 * i, 0, 0))
        write_video(tmp_path / f"data/v{i}.mp4")
        records.append({"messages": [{"role": "user", "content": "<image>Colour?"}, {"role": "assistant", "content": "red"}], "images": [f"i{i}.png"]})
        records.append({"messages": [{"role": "user", "content": "<video>What happens?"}, {"role": "assistant", "content": "it grows"}], "videos": [f"v{i}.mp4"]})
    (tmp_path / "data/train.json").write_text(json.dumps(records))
    data = f"[{tmp_path / 'data/train.json'}]"
    runner = make_runner(
        Plugins.load(),
        "glm4v",
        tmp_path / "r",
        preset="tiny",
        overrides=[
            f"data.datasets={data}",
            f"evaluate.datasets={data}",
            "data.video_max_pixels=3136",
            "training.steps=4",
            "training.micro_batch_size=2",
            "generation.batch_size=4",
            "generation.max_new_tokens=4",
        ],
    )
    runner.run_pipeline(resume="no")
    run = tmp_path / "r"
    assert manifest(run, "train")["status"] == "finished" and len(losses(run)) == 4
    assert manifest(run, "evaluate")["metrics"]["items"] == 12


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.compares_runs
def test_two_process_fsdp2_matches_one_process(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    two_processes_match_one(mm, tmp_path, ["--pack", "glm4v", "--preset", "tiny", "data.demo_samples=24", "convert.verify=false", "evaluate.enabled=false"])


@pytest.mark.slow
@pytest.mark.matrix  # the VLM kit's demo path runs in make test for qwen2vl and qwen3vl; tools/demo_matrix.py holds this one's promise
@pytest.mark.compares_runs
def test_demo_learns_and_the_export_answers_the_same(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "glm4v", "--preset", "demo")
    run = tmp_path / "runs/glm4v-demo"
    train = manifest(run, "train")["metrics"]
    # 4 colours: chance is 0.25. The README's promise, 100%, as tools/demo_matrix.py measured.
    assert train["eval/accuracy@0"] <= 0.5 and train["eval/accuracy"] == 1.0, train
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0
    assert manifest(run, "evaluate")["metrics"]["accuracy"] == 1.0


@pytest.mark.slow
def test_dpo_on_pairs_mixing_images_and_videos_keeps_the_kinds_apart(tmp_path: Path) -> None:
    """Preference pairs over images and over videos in one dataset: DPO's training, reference
    and held-out micro-batches each hold one kind, so GLM-4V takes them, and the reference
    log-probabilities land on their own pairs (rewards start at zero)."""
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    records = []
    for i in range(6):
        write_image(tmp_path / f"data/i{i}.png", (40 * i, 0, 0))
        write_video(tmp_path / f"data/v{i}.mp4")
        records.append(
            {"conversations": [{"from": "human", "value": "<image>Colour?"}], "chosen": {"from": "gpt", "value": "red"}, "rejected": {"from": "gpt", "value": "blue"}, "images": [f"i{i}.png"]}
        )
        records.append(
            {
                "conversations": [{"from": "human", "value": "<video>What happens?"}],
                "chosen": {"from": "gpt", "value": "it grows"},
                "rejected": {"from": "gpt", "value": "nothing"},
                "videos": [f"v{i}.mp4"],
            }
        )
    (tmp_path / "data/train.json").write_text(json.dumps(records))
    runner = make_runner(
        Plugins.load(),
        "glm4v",
        tmp_path / "r",
        preset="tiny",
        overrides=[
            f"data.datasets=[{tmp_path / 'data/train.json'}]",
            "data.ranking=true",
            "data.eval_fraction=0.4",
            "data.video_max_pixels=3136",
            "training.method=dpo",
            "training.steps=3",
            "training.micro_batch_size=2",
            "training.eval_every=3",
            "evaluate.enabled=false",
        ],
    )
    runner.run_pipeline(resume="no")
    run = tmp_path / "r"
    metrics = manifest(run, "train")["metrics"]
    assert manifest(run, "train")["status"] == "finished" and len(losses(run)) == 3
    assert metrics["eval/rewards/margin@0"] == 0.0 and metrics["eval/rewards/accuracy@0"] == 0.5, metrics  # the policy is the reference at step 0
