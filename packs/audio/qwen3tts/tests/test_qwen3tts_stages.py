"""The stages the pack declares so far: ``mmcore run`` (as a user runs it) downloads a local folder
in the public layout, converts it with ``convert.verify``, preprocesses (text ids, the encoder's
target codes) and trains on mmcore's own engines, the rest skipped visibly; bad samples are
counted and skipped, or stop preprocess in one line; a folder without weights stops download
with one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mmcore.testing import stage_manifest


def test_every_stage_runs_then_infer_speaks_a_prompt(mmcore_cli, tiny_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mmcore_cli(
        "run",
        "--pack",
        "qwen3tts",
        "--preset",
        "tiny",
        "--model",
        str(tiny_dir),
        "--run-dir",
        "r",
        "convert.verify=true",
        "training.steps=6",
        "training.eval_every=6",
        "generation.max_new_tokens=8",
        "evaluate.limit=1",
    )
    assert "verified: the round trip to mmcore and back is bit-identical for every tensor" in proc.stdout
    assert "key coverage: the 61 tensors of the training model, no more, shapes equal" in proc.stdout
    assert stage_manifest(tmp_path / "r", "convert")["metrics"]["verified"] is True
    pre = stage_manifest(tmp_path / "r", "preprocess")["metrics"]
    assert pre["train_samples"] == 14 and pre["eval_samples"] == 2 and pre["frames"] > 50
    rows = [json.loads(line) for line in (tmp_path / "r/train/metrics.jsonl").read_text().splitlines()]
    held = [r for r in rows if "eval/held_out_loss" in r]
    assert [r["step"] for r in held] == [0, 6] and held[-1]["eval/held_out_loss"] < held[0]["eval/held_out_loss"]
    assert all(0 <= r["eval/codebook0_accuracy"] <= 1 and 0 <= r["eval/code_predictor_accuracy"] <= 1 for r in held)
    # export: the public layout, same names, shapes and dtypes; the codec and tokenizer as downloaded
    assert stage_manifest(tmp_path / "r", "export")["metrics"]["logits_max_abs_diff"] == 0.0  # reloaded strictly by the pack
    out = tmp_path / "r/export/hf"
    from safetensors import safe_open

    with safe_open(str(tiny_dir / "model.safetensors"), "pt") as a, safe_open(str(out / "model.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():
            x, y = a.get_slice(key), b.get_slice(key)
            assert (x.get_shape(), x.get_dtype()) == (y.get_shape(), y.get_dtype()), key
    for name in ("config.json", "tokenizer.json", "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors"):
        assert (out / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    from mm_pack_qwen3tts.model import load_pretrained

    trained = load_pretrained(out)
    assert not torch.equal(trained.talker.codec_head.weight, load_pretrained(tiny_dir).talker.codec_head.weight)  # it trained
    # evaluate: code-level metrics of the export on the held-out texts, a report with audio players
    metrics = stage_manifest(tmp_path / "r", "evaluate")["metrics"]
    assert metrics["items"] == 1 and {"wer", "codebook0_accuracy", "code_predictor_accuracy", "exact_match_rate", "frame_match_rate"} <= set(metrics)
    assert metrics["frame_match_rate"] <= metrics["codebook0_match_rate"] <= 1  # a frame equal to the target's has its codebook 0
    rows = [json.loads(line) for line in (tmp_path / "r/evaluate/results.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["generated_frames"] > 0 and len(rows[0]["media"]) == 2  # the reference clip and the generated wav
    assert (tmp_path / "r/evaluate/report.html").read_text().count("<audio") == 2
    # infer: a prompt -> a wav, and where it is
    said = mmcore_cli("infer", "--run-dir", "r", "--checkpoint", "export", "--prompt", "one two", "generation.max_new_tokens=5")
    wav = Path(said.stdout.split("audio: ")[1].split(",")[0])
    from mmcore.data import load_audio

    frames = int(said.stdout.split("frames: ")[1].split(",")[0])
    assert wav.is_file() and 1 <= frames <= 5 and len(load_audio(wav, 24000)) == frames * 1920
    assert "heard: " in said.stdout  # what the fixed checker made of it (random weights: anything)


def chord_clips(folder: Path) -> list[dict]:  # type: ignore[type-arg]
    import numpy as np

    from mmcore.data import write_audio

    records = []
    for i, (pitch, text) in enumerate([(220.0, "zero one"), (330.0, "two"), (440.0, "three four"), (550.0, "five")]):
        t = np.arange(int(24000 * 0.5)) / 24000
        write_audio(folder / f"c{i}.wav", (0.3 * np.sin(2 * np.pi * pitch * t)).astype(np.float32), 24000)
        records.append({"audio": f"c{i}.wav", "text": text, "speaker": "tiny"})
    return records


def test_preprocess_counts_and_skips_bad_samples_or_stops_in_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.testing import make_runner, plugins_with

    data = tmp_path / "data"
    data.mkdir()
    records = chord_clips(data)
    (data / "broken.wav").write_bytes(b"RIFF\x00\x00")
    records += [
        {"audio": "broken.wav", "text": "six"},
        {"audio": "gone.wav", "text": "seven"},
        {"audio": "c0.wav", "text": "eight", "speaker": "nobody"},
        {"audio": "c1.wav", "text": "nine", "ref_audio": "c2.wav"},
        {"audio": "c1.wav", "text": ""},
    ]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    common = [f"model.source={tiny_dir}", f"data.datasets=[{data / 'train.jsonl'}]", "data.demo_samples=0"]
    runner = make_runner(plugins_with(installed_packs=True), "qwen3tts", tmp_path / "r", preset="tiny", overrides=[*common, "data.on_bad_sample=skip"])
    for stage in ("download", "convert", "preprocess"):
        runner.run_stage(stage)
    metrics = stage_manifest(tmp_path / "r", "preprocess")["metrics"]
    assert metrics["train_samples"] == 4 and metrics["skipped"] == 5
    bad = (tmp_path / "r/preprocess/bad_samples.jsonl").read_text()
    for reason in ("broken.wav", "gone.wav", "speaker 'nobody' is not one of this checkpoint's: tiny", "'ref_audio'", "'text' is empty"):
        assert reason in bad, reason
    from mmcore.data import ShardDataset

    sample = ShardDataset(tmp_path / "r/preprocess/dataset")[0]
    assert sample["text_ids"][:3].tolist() == [280, 282, 198]  # <|im_start|> assistant \n
    assert sample["codes"].shape == (7, 4)  # 0.5 s: ceil(12000 / 1920) frames x 4 codebooks
    strict = make_runner(plugins_with(installed_packs=True), "qwen3tts", tmp_path / "s", preset="tiny", overrides=common)
    strict.run_stage("download")
    strict.run_stage("convert")
    with pytest.raises(Exception) as info:
        strict.run_stage("preprocess")
    assert "\n" not in str(info.value) and "train.jsonl" in str(info.value) and "broken.wav" in str(info.value), str(info.value)


def test_download_refuses_a_folder_without_weights_in_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.testing import make_runner, plugins_with

    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").unlink()
    runner = make_runner(plugins_with(installed_packs=True), "qwen3tts", tmp_path / "r", preset="tiny", overrides=[f"model.source={broken}"])
    with pytest.raises(Exception) as info:
        runner.run_stage("download")
    message = str(info.value)
    assert "\n" not in message and f"{broken}: no model.safetensors (the talker's weights) at the top of the folder" in message, message


@pytest.mark.compares_runs
@pytest.mark.matrix  # the two-process FSDP2 path: qwen2vl's tests are the representative cases in `make test`
def test_two_process_fsdp2_trains_as_one_process(mmcore_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    common = ["--pack", "qwen3tts", "training.steps=3", "training.eval_every=3", "evaluate.enabled=false"]
    mmcore_cli("run", *common, "--run-dir", "one", "training.micro_batch_size=2")
    mmcore_cli("run", *common, "--run-dir", "two", "training.micro_batch_size=1", "--nproc-per-node", "2")
    assert stage_manifest(tmp_path / "two", "train")["world_size"] == 2

    def read(run: str) -> dict[int, float]:
        rows = [json.loads(line) for line in (tmp_path / run / "train/metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r} | {-r["step"] - 1: r["eval/held_out_loss"] for r in rows if "eval/held_out_loss" in r}

    one, two = read("one"), read("two")
    assert set(one) == set(two) and all(two[k] == pytest.approx(one[k], rel=1e-5) for k in one), (one, two)
