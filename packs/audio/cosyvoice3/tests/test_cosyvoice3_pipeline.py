"""Every stage on the tiny checkpoint, as a user runs them: ``mmcore run`` (download, convert,
preprocess, train 2 steps, export, evaluate), then ``mmcore infer``; the export in the public
layout, loaded strictly, equal to the trained model; preprocess's features and bad-sample policy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcore.testing import stage_manifest


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmcore.testing import StageCLI

    root = tmp_path_factory.mktemp("cv3run")
    cli = StageCLI(root)
    cli("run", "--pack", "cosyvoice3", "--preset", "tiny", "--run-dir", "r")
    return root


@pytest.mark.matrix  # the conformance suite's tiny run covers these stages in make test (the export stage checks itself)
def test_run_trains_two_steps_and_every_stage_succeeds(tiny_run: Path) -> None:
    r = tiny_run / "r"
    pre = stage_manifest(r, "preprocess")
    assert pre["metrics"]["train_samples"] + pre["metrics"]["eval_samples"] == 12
    train = stage_manifest(r, "train")
    assert train["metrics"]["steps"] == 2 if "steps" in train["metrics"] else True
    evaluate = stage_manifest(r, "evaluate")
    assert 0 <= evaluate["metrics"]["wer"] and evaluate["metrics"]["items"] >= 1
    rows = [json.loads(line) for line in (r / "evaluate/results.jsonl").read_text().splitlines()]
    assert all(set(row) >= {"text", "heard", "word_errors"} for row in rows)
    assert "<audio" in (r / "evaluate/report.html").read_text()


@pytest.mark.matrix  # the conformance suite's tiny run covers these stages in make test (the export stage checks itself)
def test_export_has_the_public_layout_loads_strictly_and_equals_the_trained_model(tiny_run: Path) -> None:
    from mm_pack_cosyvoice3.export import probe_outputs
    from mm_pack_cosyvoice3.model import PARTS, build_model, load_pretrained, read_part
    from mmcore.train import load_converted

    r = tiny_run / "r"
    source = Path(stage_manifest(r, "download")["outputs"]["model"])
    source = source if source.is_absolute() else r / "download" / source
    out = r / "export/cosyvoice3"
    assert {p.name for p in out.iterdir()} >= {"cosyvoice3.yaml", "llm.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN"}
    for part in PARTS:
        a, b = read_part(source, part), read_part(out, part)
        assert set(a) == set(b)
        assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    ckpt = Path(stage_manifest(r, "train")["outputs"]["checkpoint"])
    trained = build_model(source)
    load_converted(trained, ckpt if ckpt.is_absolute() else r / "train" / ckpt)
    before, after = probe_outputs(trained), probe_outputs(load_pretrained(out))
    assert all(torch.equal(before[k], after[k]) for k in before)
    changed = [k for k, v in read_part(source, "llm").items() if not torch.equal(v, read_part(out, "llm")[k])]
    assert changed, "two steps of training changed no LM weight"
    assert all(torch.equal(v, read_part(out, "hift")[k]) for k, v in read_part(source, "hift").items())  # frozen


@pytest.mark.matrix  # the conformance suite's tiny run covers these stages in make test (the export stage checks itself)
def test_infer_writes_a_wav_and_says_where(tiny_run: Path) -> None:
    from mmcore.testing import StageCLI

    proc = StageCLI(tiny_run)("infer", "--run-dir", "r", "--prompt", "seven one zero")
    said = proc.stdout.strip()
    assert "audio: " in said, said
    path = Path(said.split("audio: ")[1].split(",")[0])
    assert path.is_file() and path.suffix == ".wav" and path.stat().st_size > 44


def test_preprocess_features_follow_the_yaml_and_the_tokens_align(tiny_dir: Path, tmp_path: Path) -> None:
    from mm_pack_cosyvoice3.demo import fit_clips, fit_tokenizer
    from mm_pack_cosyvoice3.preprocess import Encoder, Utterance
    from mmcore.data import write_audio

    cfg_dir = tmp_path / "m"
    import shutil

    shutil.copytree(tiny_dir, cfg_dir)
    from mm_pack_cosyvoice3.model import read_configs

    fit_tokenizer(cfg_dir, read_configs(cfg_dir)[0], fit_clips(0, 4), 0)
    encoder = Encoder(cfg_dir)
    assert (encoder.cfg.mel.n_fft, encoder.cfg.mel.hop_size, encoder.cfg.mel.num_mels, encoder.cfg.mel.fmax) == (1920, 480, 80, None)
    wav = write_audio(tmp_path / "a.wav", np.sin(np.arange(24000 * 1.01) / 24000 * 2 * np.pi * 440) * 0.5, 24000)
    out = encoder.encode(Utterance("x", 0, wav, "seven one zero", None, None))
    tokens = 26  # 1.01 s padded to whole 40 ms tokens
    assert out["speech_token"].shape == (tokens,) and out["speech_feat"].shape == (2 * tokens, 80)
    assert torch.equal(out["embedding"], torch.zeros(encoder.cfg.flow.spk_embed_dim))
    given = encoder.encode(Utterance("x", 0, wav, "seven", [1, 2, 3], None))
    assert given["speech_token"].tolist() == [1, 2, 3]


def test_bad_media_is_one_line_or_a_counted_skip(tiny_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    from mmcore.data import write_audio

    for i in range(3):
        write_audio(data / f"{i}.wav", np.random.default_rng(i).normal(0, 0.1, 24000), 24000)
    (data / "bad.wav").write_bytes(b"not a wav")
    records = [{"audio": f"{i}.wav", "text": "one two", "speech_token": [1, 2, 3]} for i in range(3)] + [{"audio": "bad.wav", "text": "three"}]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    from mmcore.testing import make_runner, plugins_with

    def runner(name: str, *overrides: str):  # type: ignore[no-untyped-def]
        run = make_runner(
            plugins_with(installed_packs=True), "cosyvoice3", tmp_path / name, preset="tiny", overrides=[f"model.source={tiny_dir}", f"data.datasets=[{data / 'train.jsonl'}]", *overrides]
        )
        run.run_stage("download")
        run.run_stage("convert")
        return run

    with pytest.raises(Exception) as info:
        runner("bad").run_stage("preprocess")
    message = str(info.value)
    assert "\n" not in message and "bad.wav" in message, message
    runner("skip", "data.on_bad_sample=skip", "data.eval_fraction=0").run_stage("preprocess")
    assert stage_manifest(tmp_path / "skip", "preprocess")["metrics"]["skipped"] == 1


@pytest.mark.compares_runs
@pytest.mark.matrix  # the whole demo (minutes): tools/demo_matrix.py runs it over seeds
def test_the_demo_learns_speech_tokens_and_speaks(tmp_path: Path) -> None:
    """The demo preset as `mmcore run --pack cosyvoice3` runs it: what the README promises (the
    LM's held-out speech-token accuracy, and the fixed checker's WER on the 20 held-out texts the
    export speaks, voiced by Griffin-Lim)."""
    from mmcore.testing import StageCLI

    StageCLI(tmp_path, timeout=1800)("run", "--pack", "cosyvoice3", "--run-dir", "demo")
    train = stage_manifest(tmp_path / "demo", "train")["metrics"]
    assert train["eval/speech_token_accuracy@0"] < 0.05 and train["eval/speech_token_accuracy"] >= 0.55, train  # final 0.826-0.854 over 8 runs (README)
    evaluate = stage_manifest(tmp_path / "demo", "evaluate")["metrics"]
    assert evaluate["items"] == 20 and evaluate["wer"] <= 0.85, evaluate  # 0.596-0.776 over 8 runs (README)
