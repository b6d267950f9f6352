"""The malformed-input corpus, part 2 (whisper): checkpoints, datasets, audio, and files planted
in a run directory. Each case ends in one ``error:`` line with the exact message and exit code
below, or, where the user asked for skipping, a counted and listed skip; never a traceback."""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pytest

from mmcore.data import write_audio
from mmcore.testing import StageCLI
from mmcore.testing.media import tone


def _one_error_line(proc, code: int, message: str) -> str:  # type: ignore[no-untyped-def]
    assert proc.returncode == code, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return errors[0]


# --------------------------------------------------------------------------- checkpoints


def _rewrite_header(path: Path, edit: Callable[[dict], None]) -> None:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + length :])


def _resave(path: Path, edit: Callable[[dict], None]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def no_config(model: Path) -> None:
    (model / "config.json").unlink()


def truncated(model: Path) -> None:
    path = model / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def huge_header_length(model: Path) -> None:
    path = model / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 2**62) + path.read_bytes()[8:])


def header_not_json(model: Path) -> None:
    path = model / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[:8] + b"\xff" * 16 + raw[24:])


def lying_offsets(model: Path) -> None:
    def edit(header: dict) -> None:
        key = next(k for k in header if k != "__metadata__" and header[k]["shape"])
        header[key]["shape"] = [d * 2 for d in header[key]["shape"]]

    _rewrite_header(model / "model.safetensors", edit)


def wrong_shape(model: Path) -> None:
    import torch

    _resave(model / "model.safetensors", lambda t: t.__setitem__("model.decoder.embed_positions.weight", torch.zeros(3, 7)))


def missing_tensor(model: Path) -> None:
    _resave(model / "model.safetensors", lambda t: t.pop("model.decoder.layer_norm.weight"))


def index_names_missing_shard(model: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as handle:
        weight_map = dict.fromkeys(handle.keys(), "model.safetensors")
    weight_map["model.decoder.layer_norm.weight"] = "model-00002-of-00002.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def no_weights(model: Path) -> None:
    (model / "model.safetensors").unlink()


@dataclass
class CheckpointCase:
    name: str
    damage: Callable[[Path], None]
    message: str


CHECKPOINT_CASES = [
    CheckpointCase("no config.json", no_config, "no config.json (nor model_index.json): not a complete checkpoint folder"),
    CheckpointCase("truncated safetensors", truncated, "model.safetensors: not a valid safetensors file: tensor"),
    CheckpointCase("garbage header length", huge_header_length, "model.safetensors: not a valid safetensors file: header length 4611686018427387904 exceeds the file"),
    CheckpointCase("header not JSON", header_not_json, "model.safetensors: not a valid safetensors file: header is not JSON"),
    CheckpointCase("offsets disagree with shape", lying_offsets, "bytes for shape"),
    CheckpointCase("wrong-shaped tensor", wrong_shape, "model.decoder.embed_positions.weight"),
    CheckpointCase("missing tensor", missing_tensor, "model.decoder.layer_norm.weight"),
    CheckpointCase("index names a missing shard", index_names_missing_shard, "tensor 'model.decoder.layer_norm.weight' is in model-00002-of-00002.safetensors, which is missing"),
    CheckpointCase("no weights", no_weights, "no .safetensors files in the model directory"),
]


def _in_process_error(run: Path, stages: Sequence[str], *overrides: str) -> str:
    """The one line the CLI would print after ``error: ``, from the stages run in this process
    (the CLI prints exactly ``MmcoreError.one_line()``; in-process saves a 5 s start per case)."""
    from mmcore import MmcoreError
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    runner = make_runner(Plugins.load(), "whisper", run, preset="tiny", overrides=list(overrides))
    with pytest.raises(MmcoreError) as info:
        for stage in stages:
            runner.run_stage(stage, resume="auto")
    line = info.value.one_line()
    assert "\n" not in line and "internal error" not in line
    return line


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=[c.name for c in CHECKPOINT_CASES])
def test_a_damaged_checkpoint_stops_at_download_or_convert_naming_file_and_tensor(case: CheckpointCase, tiny_whisper: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_whisper, model)
    case.damage(model)
    line = _in_process_error(tmp_path / "run", ["download", "convert"], f"model.source={model}")
    assert case.message in line
    assert not (tmp_path / "run" / "convert" / "manifest.json").exists(), "a damaged checkpoint must not get past convert"


def test_a_damaged_checkpoint_through_the_command_line(tiny_whisper: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_whisper, model)
    truncated(model)
    proc = StageCLI(tmp_path)("run", "--pack", "whisper", "--preset", "tiny", "--model", str(model), "--run-dir", "run", check=False)
    _one_error_line(proc, 1, "model.safetensors: not a valid safetensors file: tensor")
    assert "[convert]" not in proc.stdout


def test_a_model_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    proc = StageCLI(tmp_path)("download", "--pack", "whisper", "--preset", "tiny", "--model", str(tmp_path / "weights.bin"), check=False)
    _one_error_line(proc, 1, "weights.bin: model.source must be a directory with the checkpoint")


def test_a_model_folder_link_leading_out_is_refused_at_download(tiny_whisper: Path, tmp_path: Path) -> None:
    """A side file that links elsewhere would be copied into export/hf (and published)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_whisper, model)
    (tmp_path / "secret.txt").write_text("not the model's")
    (model / "tokenizer_config.json").unlink()
    (model / "tokenizer_config.json").symlink_to(tmp_path / "secret.txt")
    proc = StageCLI(tmp_path)("download", "--pack", "whisper", "--preset", "tiny", "--model", str(model), "--run-dir", "run", check=False)
    _one_error_line(proc, 1, f"{model / 'tokenizer_config.json'}: a link to {tmp_path / 'secret.txt'}, outside the model folder {model}; refused")
    assert not (tmp_path / "run" / "download" / "manifest.json").exists()


# --------------------------------------------------------------------------- planted files


class Planted:
    """A pickle that would run code when unpickled (it only writes a file, to be observed)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.write_text, (self.marker, "code ran"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("converted")
    StageCLI(root)("download", "--pack", "whisper", "--preset", "tiny", "--run-dir", "run")
    StageCLI(root)("convert", "--pack", "whisper", "--preset", "tiny", "--run-dir", "run")
    return root / "run"


def test_a_planted_checkpoint_metadata_never_runs(converted: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(converted, run)
    cli = StageCLI(tmp_path)
    cli("preprocess", "--pack", "whisper", "--preset", "tiny", "--run-dir", "run", "data.demo_samples=4")
    marker = tmp_path / "pwned"
    (run / "convert" / "dcp" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    proc = cli("train", "--pack", "whisper", "--preset", "tiny", "--run-dir", "run", "data.demo_samples=4", check=False)
    _one_error_line(proc, 1, f"the output of stage 'convert' changed after it finished: {run.resolve()}/convert/dcp/.metadata: ")
    # Even with the manifest's hashes out of the way, the metadata is read by the allow-list unpickler.
    from mmcore import safe_dcp, MmcoreError

    with pytest.raises(MmcoreError, match=r"\.metadata: refused to load: it references pathlib.*\.write_text"):
        safe_dcp.read_metadata(run / "convert" / "dcp")
    assert not marker.exists()


def test_a_planted_training_checkpoint_is_refused_on_resume(converted: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(converted, run)
    cli = StageCLI(tmp_path)
    args = ["--pack", "whisper", "--preset", "tiny", "--run-dir", "run", "data.demo_samples=4", "training.checkpoint_every=1"]
    cli("preprocess", *args)
    cli("extract", *args)
    proc = cli("train", *args, check=False, MMCORE_TEST_KILL="train-step:2")
    assert proc.returncode != 0
    marker = tmp_path / "pwned"
    for metadata in (run / "train" / "checkpoints").glob("step-*/.metadata"):
        metadata.write_bytes(pickle.dumps(Planted(marker)))
    proc = cli("train", *args, "--resume", check=False)
    _one_error_line(proc, 1, ".metadata: refused to load: it references pathlib")
    assert not marker.exists()


# --------------------------------------------------------------------------- datasets and audio


@pytest.fixture
def clip(tmp_path: Path) -> Path:
    return write_audio(tmp_path / "data" / "ok.wav", tone(0.5), 16000)


def _preprocess(converted: Path, tmp_path: Path, dataset: Path, *extra: str):  # type: ignore[no-untyped-def]
    shutil.copytree(converted, tmp_path / "run")
    return StageCLI(tmp_path)("preprocess", "--pack", "whisper", "--preset", "tiny", "--run-dir", "run", "--data", str(dataset), *extra, check=False)


@dataclass
class DataCase:
    name: str
    content: Callable[[Path], bytes]  # clip path -> dataset file bytes
    message: str


OK = {"audio": "ok.wav", "text": "fine"}
DATA_CASES = [
    DataCase("not UTF-8", lambda c: json.dumps([OK]).encode().replace(b"fine", b"f\xe9e"), "not UTF-8 text (byte 0xe9 at offset"),
    DataCase("JSONL bad line", lambda c: (json.dumps(OK) + "\n" + '{"audio": "ok.wav", "text": }' + "\n").encode(), "sample 1: line 2: invalid JSON: Expecting value"),
    DataCase("not JSON at all", lambda c: b"audio,text\nok.wav,fine\n", ":1: invalid JSON: Expecting value (neither a JSON list nor JSONL)"),
    DataCase("empty list", lambda c: b"[]", "the dataset holds no samples"),
    DataCase("empty file", lambda c: b"", "the dataset holds no samples"),
    DataCase("top level a number", lambda c: b"42", "expected a list of samples, got int"),
    DataCase("NUL in a path", lambda c: json.dumps([{"audio": "ok\u0000.wav", "text": "x"}]).encode(), "sample 0: audio path 'ok\\x00.wav' contains a NUL byte"),
    DataCase("path escapes", lambda c: json.dumps([{"audio": "../../etc/passwd", "text": "x"}]).encode(), "sample 0: audio path '../../etc/passwd' escapes the dataset folder"),
    DataCase("audio missing", lambda c: json.dumps([{"audio": "gone.wav", "text": "x"}]).encode(), "sample 0: audio file not found:"),
    DataCase("audio garbage", lambda c: (c.parent / "bad.wav").write_bytes(b"RIFF\x00garbage") and json.dumps([{"audio": "bad.wav", "text": "x"}]).encode(), "sample 0: unreadable audio"),
    DataCase("no transcript", lambda c: json.dumps([{"audio": "ok.wav"}]).encode(), "sample 0: no text field"),
]


@pytest.mark.parametrize("case", DATA_CASES, ids=[c.name for c in DATA_CASES])
def test_a_bad_dataset_is_one_line_naming_file_and_sample(case: DataCase, converted: Path, clip: Path, tmp_path: Path) -> None:
    dataset = clip.parent / "train.json"
    dataset.write_bytes(case.content(clip))
    shutil.copytree(converted, tmp_path / "run")
    line = _in_process_error(tmp_path / "run", ["preprocess"], f"data.datasets=[{dataset}]")
    assert case.message in line and line.startswith(str(dataset))


def test_a_missing_dataset_file(converted: Path, tmp_path: Path) -> None:
    _one_error_line(_preprocess(converted, tmp_path, tmp_path / "nope.json"), 1, f"{tmp_path / 'nope.json'}: dataset file not found")


def test_skipping_counts_and_lists_every_bad_sample_with_its_line(converted: Path, clip: Path, tmp_path: Path) -> None:
    dataset = clip.parent / "train.jsonl"
    dataset.write_text(json.dumps(OK) + "\n{broken\n" + json.dumps({"audio": "ok\u0000.wav", "text": "x"}) + "\n" + json.dumps(OK) + "\n")
    proc = _preprocess(converted, tmp_path, dataset, "data.on_bad_sample=skip")
    assert proc.returncode == 0, proc.stderr
    assert "skipped 2 bad sample(s); listed in" in proc.stdout
    listed = [json.loads(line) for line in (tmp_path / "run/preprocess/bad_samples.jsonl").read_text().splitlines()]
    assert [(b["index"], b["reason"].split(":")[0]) for b in listed] == [(1, "line 2"), (2, "audio path 'ok\\x00.wav' contains a NUL byte")]
    assert json.loads((tmp_path / "run/preprocess/manifest.json").read_text())["metrics"]["skipped"] == 2


def test_a_disk_too_small_for_the_checkpoint_is_refused_before_writing(tiny_whisper: Path, tmp_path: Path) -> None:
    cli = StageCLI(tmp_path)
    cli("download", "--pack", "whisper", "--preset", "tiny", "--run-dir", "run")
    proc = cli("convert", "--pack", "whisper", "--preset", "tiny", "--run-dir", "run", check=False, MMCORE_MIN_FREE_BYTES=str(1 << 62))
    _one_error_line(proc, 1, "the converted checkpoint needs about")
    assert "kept free (MMCORE_MIN_FREE_BYTES), and only " in proc.stderr and " are free (hint: free disk space or point --run-dir at a larger disk)" in proc.stderr
    assert not any((tmp_path / "run" / "convert").rglob("*.distcp"))


def test_audio_longer_than_the_limit_is_a_bad_sample_found_before_decoding(converted: Path, clip: Path, tmp_path: Path) -> None:
    dataset = clip.parent / "train.json"
    dataset.write_text(json.dumps([OK]))
    shutil.copytree(converted, tmp_path / "run")
    line = _in_process_error(tmp_path / "run", ["preprocess"], f"data.datasets=[{dataset}]", "data.max_media_seconds=0.2")
    assert line.startswith(f"{dataset}: sample 0: audio {clip} lasts 0.5 s, over the limit data.max_media_seconds=0.2")
