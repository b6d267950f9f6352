"""Preprocessing: the chat template, label masks, media patches, real-world files, bad samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcore.testing.media import write_image, write_video
from mm_pack_qwen2vl.config import Qwen2VLData
from mm_pack_qwen2vl.data import IGNORE, Encoder, image_processor, load_video_frames, video_patches
from mmcore.data import Sample, Turn


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def test_text_encoding_equals_the_saved_chat_template(tokenizer) -> None:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": "What colour is the square?"}, {"role": "assistant", "content": "blue"}, {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "yes"}]
    sample = Sample("x.json", 0, [Turn(m["role"], m["content"]) for m in messages])
    encoded = Encoder(tokenizer, Qwen2VLData()).encode(sample)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert encoded.input_ids == tokenizer.encode(text, add_special_tokens=False)
    # Only the assistant answers (and their end-of-turn token) carry labels.
    supervised = tokenizer.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != IGNORE])
    assert supervised == "blue<|im_end|>yes<|im_end|>"
    with_prompt = Encoder(tokenizer, Qwen2VLData(train_on_prompt=True)).encode(sample)
    assert sum(label != IGNORE for label in with_prompt.labels) > sum(label != IGNORE for label in encoded.labels)


def test_image_placeholder_expands_to_the_processor_patches(tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_image(tmp_path / "a.png", (10, 200, 30), size=(90, 60))
    sample = Sample("x.json", 0, [Turn("user", "<image>Colour?"), Turn("assistant", "green")], {"images": [tmp_path / "a.png"]})
    cfg = Qwen2VLData(image_max_pixels=56 * 56)
    encoded = Encoder(tokenizer, cfg).encode(sample)
    from PIL import Image

    want = image_processor(cfg.image_min_pixels, cfg.image_max_pixels)(images=[Image.open(tmp_path / "a.png").convert("RGB")], return_tensors="np")
    assert np.array_equal(encoded.tensors["pixel_values"].numpy(), want["pixel_values"])
    grid = want["image_grid_thw"][0]
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert encoded.input_ids.count(pad) == int(np.prod(grid)) // 4


def test_video_patches_of_two_equal_frames_equal_the_image_patches(tmp_path: Path) -> None:
    from PIL import Image

    frame = Image.fromarray(np.random.default_rng(0).integers(0, 255, (56, 84, 3), dtype=np.uint8))
    processor = image_processor(56 * 56, 56 * 84)
    video, grid = video_patches([frame, frame], processor)
    image = processor(images=[frame], return_tensors="np")
    assert grid == image["image_grid_thw"][0].tolist()
    assert np.array_equal(video, image["pixel_values"])


def test_video_frames_are_sampled_at_the_requested_fps(tmp_path: Path) -> None:
    write_video(tmp_path / "v.mp4", frames=12, fps=4)  # 3 seconds
    assert len(load_video_frames(tmp_path / "v.mp4", fps=2.0, max_frames=16)) == 6
    assert len(load_video_frames(tmp_path / "v.mp4", fps=4.0, max_frames=8)) == 8


def test_real_world_mllm_json_preprocesses_without_edits(mm, wild_dataset: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mm("preprocess", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(wild_dataset / "data.json"), "--data", str(wild_dataset / "sharegpt.json"), "--run-dir", "r", check=False)
    assert proc.returncode == 2 and "stage 'download' has not finished" in proc.stderr
    mm("download", "--pack", "qwen2vl", "--preset", "tiny", "--run-dir", "r")
    mm("convert", "--pack", "qwen2vl", "--preset", "tiny", "--run-dir", "r")
    proc = mm("preprocess", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(wild_dataset / "data.json"), "--data", str(wild_dataset / "sharegpt.json"), "--run-dir", "r")
    assert "5 train / 0 eval samples" in proc.stdout
    index = json.loads((tmp_path / "r/preprocess/dataset/index.json").read_text())
    from mmcore.data import ShardDataset

    data = ShardDataset(tmp_path / "r/preprocess/dataset")
    fields = [set(data[i]) for i in range(len(data))]
    assert "image_grid_thw" in fields[0] and len(data[0]["image_grid_thw"]) == 2  # two images, two turns
    assert "video_grid_thw" in fields[1] and "pixel_values" not in fields[1]
    assert fields[2] == {"input_ids", "labels"}  # text only
    assert index["num_samples"] == 5


BAD_CASES = [
    ({"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "x"}], "images": ["nope.jpg"]}, "image file not found"),
    ({"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "x"}], "images": ["broken.jpg"]}, "unreadable image"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x"}], "images": ["ok.png"]}, "0 <image> placeholder(s) but 1 images"),
    ({"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "x"}], "images": ["../outside.png"]}, "escapes the dataset folder"),
    ({"messages": [{"role": "user", "content": "<video>Hi"}, {"role": "assistant", "content": "x"}], "videos": ["cut.mp4"]}, "unreadable video"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "turn 0 is from assistant, expected user"),
    ({"conversation": []}, "field 'messages' is missing"),
    (
        {"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "x"}], "images": ["bomb.png"]},
        "is 100000x100000 = 10000000000 pixels, over the limit data.max_image_pixels=89478485",
    ),
    ({"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "x"}], "images": ["ok\u0000.png"]}, "image path 'ok\\x00.png' contains a NUL byte"),
]


def write_bomb(path: Path, side: int = 100_000) -> None:
    """A PNG whose header claims side x side pixels (a decompression bomb's first bytes)."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))  # noqa: E731
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


@pytest.fixture
def bad_dataset(tmp_path: Path) -> Path:
    root = tmp_path / "bad"
    write_image(root / "ok.png", (1, 2, 3))
    write_image(tmp_path / "outside.png", (1, 2, 3))
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    write_bomb(root / "bomb.png")
    write_video(tmp_path / "full.mp4")
    (root / "cut.mp4").write_bytes((tmp_path / "full.mp4").read_bytes()[:300])
    good = {"messages": [{"role": "user", "content": "<image>Fine?"}, {"role": "assistant", "content": "yes"}], "images": ["ok.png"]}
    (root / "data.json").write_text(json.dumps([good] + [case for case, _ in BAD_CASES]))
    return root / "data.json"


def test_bad_samples_are_skipped_counted_and_listed(mm, bad_dataset: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(bad_dataset), "data.on_bad_sample=skip", "training.steps=1", "training.micro_batch_size=1")
    listed = [json.loads(line) for line in (tmp_path / "runs/qwen2vl-tiny/preprocess/bad_samples.jsonl").read_text().splitlines()]
    assert [b["index"] for b in listed] == list(range(1, len(BAD_CASES) + 1))
    for bad, (_, reason) in zip(listed, BAD_CASES):
        assert bad["file"] == str(bad_dataset) and reason in bad["reason"], bad
    manifest = json.loads((tmp_path / "runs/qwen2vl-tiny/preprocess/manifest.json").read_text())
    assert manifest["metrics"]["skipped"] == len(BAD_CASES) and manifest["metrics"]["train_samples"] == 1


def test_first_bad_sample_stops_with_one_line_by_default(mm, bad_dataset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mm("run", "--pack", "qwen2vl", "--preset", "tiny", "--data", str(bad_dataset), check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {bad_dataset}: sample 1: image file not found") and "Traceback" not in proc.stderr
    assert "data.on_bad_sample=skip" in lines[-1]


def test_preprocess_in_two_workers_writes_the_same_shards_and_bad_samples(mm, bad_dataset: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # data.num_workers encodes in forked processes; results come back in order, so the shards
    # (and the bad-sample list) are the same bytes as encoding in-process
    import shutil

    from mmcore.data import write_shape_questions

    demo, _ = write_shape_questions(tmp_path / "demo", 16, 0)  # good samples beside the bad ones (a preset's demo data never mixes into --data)
    common = ["--pack", "qwen2vl", "--preset", "tiny", "--run-dir", str(tmp_path / "run"), f"data.datasets=[{bad_dataset},{demo}]", "data.on_bad_sample=skip", "convert.verify=false"]
    for stage in ("download", "convert", "preprocess"):
        mm(stage, *common, "data.num_workers=0")
    in_process = shutil.copytree(tmp_path / "run/preprocess", tmp_path / "in-process")
    proc = mm("preprocess", *common, "data.num_workers=2")  # a changed data section: preprocess runs again
    assert "[preprocess] running" in proc.stdout and "encoded in 2 worker processes" in proc.stdout
    workers = tmp_path / "run/preprocess"
    files = sorted(p.relative_to(in_process) for p in (in_process / "dataset").rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(workers) for p in (workers / "dataset").rglob("*") if p.is_file())
    for name in files:
        assert (in_process / name).read_bytes() == (workers / name).read_bytes(), name
    assert (in_process / "bad_samples.jsonl").read_text() == (workers / "bad_samples.jsonl").read_text()
    assert len((workers / "bad_samples.jsonl").read_text().splitlines()) == len(BAD_CASES)
