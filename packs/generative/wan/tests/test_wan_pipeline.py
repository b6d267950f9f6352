"""The wan pack through its stages: data handling, the feature cache, resume, export in diffusers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcore.data import write_mp4

TINY = ["--pack", "wan", "--preset", "tiny"]
OWN_DATA = [*TINY, "data.demo_samples=0"]  # the tiny preset's demo clips left out: the test's files alone


def manifest(run: Path, stage: str) -> dict:  # type: ignore[type-arg]
    return json.loads((run / stage / "manifest.json").read_text())


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def moving(frames: int, size: int = 32, colour=(200, 40, 40)):  # type: ignore[no-untyped-def]
    clip = np.full((frames, size, size, 3), 255, dtype=np.uint8)
    for t in range(frames):
        clip[t, 8:16, 2 + 2 * t : 10 + 2 * t] = colour
    return clip


@pytest.fixture
def videos(tmp_path: Path) -> Path:
    """Caption JSON as MindSpeed-MM writes it, a folder with .txt captions, and broken files."""
    root = tmp_path / "data"
    write_mp4(root / "clips/a.mp4", moving(10), 8)
    write_mp4(root / "clips/b.mp4", moving(12, colour=(40, 40, 200)), 8)
    write_mp4(root / "other/a.mp4", moving(10, colour=(40, 200, 40)), 8)  # same basename, other content
    write_mp4(root / "clips/short.mp4", moving(3), 8)
    (root / "clips/corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 definitely not a video")
    (root / "clips/cut.mp4").write_bytes((root / "clips/b.mp4").read_bytes()[:400])
    from PIL import Image

    Image.fromarray(moving(1)[0]).save(root / "clips/still.png")
    records = [
        {"path": "clips/a.mp4", "cap": "a red square moves right", "num_frames": 10, "fps": 8, "resolution": {"height": 32, "width": 32}},
        {"path": "clips/b.mp4", "cap": ["a blue square moves right"]},
        {"path": "other/a.mp4", "cap": "a green square moves right"},
        {"path": "clips/short.mp4", "cap": "too short"},
        {"path": "clips/corrupt.mp4", "cap": "corrupt"},
        {"path": "clips/cut.mp4", "cap": "truncated"},
        {"path": "clips/missing.mp4", "cap": "missing"},
    ]
    (root / "captions.json").write_text(json.dumps(records))
    folder = root / "folder"
    write_mp4(folder / "x.mp4", moving(9), 8)
    (folder / "x.txt").write_text("a red square moves right\n")
    write_mp4(folder / "y.mp4", moving(9), 8)  # no caption file
    write_mp4(folder / "z.mp4", moving(9), 8)
    (folder / "z.txt").write_bytes("un carr\u00e9 rouge".encode("latin-1"))  # not UTF-8
    write_mp4(folder / "zz.mp4", moving(9), 8)
    (folder / "zz.txt").write_text("  \n")  # empty
    return root


def test_bad_videos_are_reported_with_file_and_reason(wan, videos: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = wan("run", *OWN_DATA, "--data", str(videos / "captions.json"), "--data", str(videos / "folder"), "data.on_bad_sample=skip", "training.steps=1", "convert.verify=true")
    assert "bit-identical" in proc.stdout and "skipped 7 bad sample(s)" in proc.stdout
    run = tmp_path / "runs/wan-tiny"
    bad = [json.loads(line) for line in (run / "preprocess/bad_samples.jsonl").read_text().splitlines()]
    reasons = {(Path(b["file"]).name, b["index"]): b["reason"] for b in bad}
    assert "too short: 3 frame(s)" in reasons[("captions.json", 3)]
    assert "unreadable video" in reasons[("captions.json", 4)]
    assert "unreadable video" in reasons[("captions.json", 5)] or "ended early" in reasons[("captions.json", 5)]
    assert "file not found" in reasons[("captions.json", 6)]
    assert "has no caption file y.txt" in reasons[("folder", 1)]
    assert "caption z.txt is not UTF-8 text (byte 0xe9 at offset 7)" in reasons[("folder", 2)]
    assert "caption zz.txt is empty" in reasons[("folder", 3)]
    pre = manifest(run, "preprocess")["metrics"]
    assert pre["clips"] == 4 and pre["skipped"] == 7
    extract = manifest(run, "extract")["metrics"]
    assert extract["clips"] == 4  # the two a.mp4 files are two clips: keys are content hashes
    proc = wan("preprocess", *OWN_DATA, "--data", str(videos / "captions.json"), "--force", check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(f"error: {videos / 'captions.json'}: sample 3: video")


def test_images_are_one_frame_videos(wan, videos: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (videos / "images.json").write_text(json.dumps([{"path": "clips/still.png", "cap": "a red square"}]))
    wan("preprocess", *OWN_DATA, "--data", str(videos / "images.json"), "data.buckets=[[32,32,1]]", "--run-dir", "t2i", check=False)
    wan("download", *TINY, "--run-dir", "t2i")
    wan("convert", *TINY, "--run-dir", "t2i")
    refused = wan("preprocess", *OWN_DATA, "--data", str(videos / "images.json"), "data.buckets=[[32,32,1]]", "--run-dir", "t2i", check=False)
    assert refused.returncode == 1 and "error: 1 training clips, fewer than one global micro-batch (1 data-parallel process(es) x training.micro_batch_size=2)" in refused.stderr
    proc = wan("preprocess", *OWN_DATA, "--data", str(videos / "images.json"), "data.buckets=[[32,32,1]]", "--run-dir", "t2i", "training.micro_batch_size=1")
    assert "1 clips in buckets 32x32x1: 1" in proc.stdout


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_training_from_the_cache_equals_encoding_on_the_fly(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    common = [*TINY, "data.demo_samples=12", "training.steps=3", "data.buckets=[[32,32,9]]"]
    wan("run", *common, "--run-dir", "cached")
    proc = wan("run", *common, "--run-dir", "fresh", "extract.enabled=false")
    assert "[extract] skipped: disabled by extract.enabled=false" in proc.stdout
    cached, fresh = losses(tmp_path / "cached"), losses(tmp_path / "fresh")
    assert list(cached) == [1, 2, 3]
    # Bit-identical by construction: both run directories preprocess the same frames (the demo
    # clips encode to the same bytes), and extract and the on-the-fly path call the same frozen
    # VAE and UMT5 on one clip at a time, in processes with the same threads and kernels.
    assert fresh == cached


def test_cache_invalidation_and_no_work_when_unchanged(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    common = [*TINY, "data.demo_samples=8", "training.steps=1", "data.buckets=[[32,32,9]]"]
    wan("run", *common)
    proc = wan("run", *common)
    assert "[extract] skipped: up to date" in proc.stdout  # an unchanged rerun does no work
    assert "[export] skipped: up to date" in proc.stdout  # (it records only outputs it wrote)
    proc = wan("run", *common, "data.fps=16")  # frame sampling changed
    assert "[preprocess] running" in proc.stdout and "[extract] running" in proc.stdout
    proc = wan("run", *common, "data.fps=16", "--model", "init:tiny-b")  # another VAE / text encoder
    assert "[extract] running" in proc.stdout


@pytest.mark.compares_runs
def test_kill_during_extract_resumes_without_redoing_work(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    common = [*TINY, "data.demo_samples=24", "training.steps=4", "training.checkpoint_every=1", "data.buckets=[[32,32,9]]"]
    wan("run", *common, "--run-dir", "straight")
    proc = wan("run", *common, "--run-dir", "killed", check=False, MMCORE_TEST_KILL="extract-chunk:1")
    assert proc.returncode != 0 and not (tmp_path / "killed/extract/manifest.json").exists()
    proc = wan("run", *common, "--run-dir", "killed")  # (a kill during train: the conformance suite's)
    assert "[extract] resuming" in proc.stdout
    straight, resumed = manifest(tmp_path / "straight", "extract")["metrics"], manifest(tmp_path / "killed", "extract")["metrics"]
    assert resumed["encoded"] < straight["encoded"]  # the chunk written before the kill was not encoded again
    assert json.loads((tmp_path / "killed/extract/features/index.json").read_text())["samples"] == json.loads((tmp_path / "straight/extract/features/index.json").read_text())["samples"]
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")


@pytest.mark.slow
@pytest.mark.matrix  # 1500 steps, 5 min on an idle core (10 under CI's load: past the test timeout); tools/demo_matrix.py holds its promise
@pytest.mark.compares_runs
def test_demo_loss_falls_and_the_export_generates_in_plain_diffusers(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    wan("run", "--pack", "wan", "--preset", "demo")
    run = tmp_path / "runs/wan-demo"
    curve = list(losses(run).values())
    assert np.mean(curve[-10:]) < 0.6 * np.mean(curve[:10]), (curve[:10], curve[-10:])
    # The README's promise: the held-out clips' loss at fixed noise levels and noise falls below
    # 0.6x its start; with another held-out clip's caption it is at least 1.5x that with its own
    # (caption sensitivity), and at least 80 % of the videos evaluate samples for the held-out
    # captions show the caption's colour and motion (tools/demo_matrix.py: by 60 % of the steps
    # with every seed and ISA tried).
    train = manifest(run, "train")["metrics"]
    assert train["eval/loss"] < 0.6 * train["eval/loss@0"], train
    assert train["eval/caption_sensitivity"] >= 1.5, train
    assert manifest(run, "export")["metrics"]["weights_identical"]
    evaluate = manifest(run, "evaluate")["metrics"]
    assert evaluate["caption_agreement"] >= 0.8 and evaluate["reconstruction_psnr"] > 17, evaluate
    assert evaluate["samples"] >= 10 and (run / "evaluate/samples/contact_sheet.png").stat().st_size > 1000
    assert "samples/contact_sheet.png" in (run / "evaluate/report.html").read_text()
    export_generates_and_infer_and_eval_run(wan, tmp_path, run, frames=9)


@pytest.mark.slow
def test_the_export_generates_in_plain_diffusers_and_infer_and_eval_run(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The user's path after training, on the tiny preset (the demo's promise is the matrix test above)."""
    wan("run", *TINY, "data.eval_fraction=0.25", "--run-dir", "tiny")
    run = tmp_path / "tiny"
    assert manifest(run, "export")["metrics"]["weights_identical"]
    assert manifest(run, "evaluate")["metrics"]["samples"] >= 1 and (run / "evaluate/samples/contact_sheet.png").stat().st_size > 500
    export_generates_and_infer_and_eval_run(wan, tmp_path, run, frames=5)


def export_generates_and_infer_and_eval_run(wan, tmp_path: Path, run: Path, frames: int) -> None:  # type: ignore[no-untyped-def]
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(run / "export/pipeline")
    generated = pipe("a red square moves left", height=32, width=32, num_frames=frames, num_inference_steps=2, max_sequence_length=16, output_type="np").frames[0]
    assert generated.shape == (frames, 32, 32, 3)
    import av

    with av.open(str(run / "evaluate/samples/sample-0.mp4")) as video:
        assert sum(1 for _ in video.decode(video=0)) == frames
    # `mmcore infer`: the same video from the training checkpoint and from the export (same seed)
    videos = []
    for which in ("latest", "export"):
        proc = wan("infer", "--run-dir", str(run), "--checkpoint", which, "--prompt", "a red square moves left", "--num-inference-steps", "3")
        path = Path(proc.stdout.split("video: ")[1].split(",")[0])
        assert path.parent == run / "infer" and path.with_suffix(".png").is_file()
        with av.open(str(path)) as video:
            videos.append(np.stack([f.to_ndarray(format="rgb24") for f in video.decode(video=0)]))
    # Same weights bit for bit; CPU kernels may still round differently with the buffers' alignment
    # (the export check's tolerance), so two uint8 levels of the lossy video may differ.
    assert videos[0].shape == (frames, 32, 32, 3) and np.abs(videos[0].astype(int) - videos[1]).max() <= 2
    proc = wan("infer", "--run-dir", str(run), "--prompt", "a square", "--image", str(run / "evaluate/samples/sample-0.png"), check=False)
    assert proc.returncode == 1 and "error: command line: give a caption (--prompt) and no media" in proc.stderr
    # `mmcore eval --data`: held-out captions from a file (no videos needed); a record without one is named
    (tmp_path / "captions.jsonl").write_text(json.dumps({"cap": "a green square moves up"}) + "\n")
    wan("eval", "--run-dir", str(run), "--data", str(tmp_path / "captions.jsonl"), "generation.num_inference_steps=2")
    assert manifest(run, "evaluate-captions")["metrics"]["samples"] == 1  # its own folder: the run's evaluate/ stays
    assert [json.loads(x)["caption"] for x in (run / "evaluate-captions/results.jsonl").read_text().splitlines()] == ["a green square moves up"]
    (tmp_path / "captions.jsonl").write_text(json.dumps({"path": "x.mp4"}) + "\n")
    proc = wan("eval", "--run-dir", str(run), "--data", str(tmp_path / "captions.jsonl"), check=False)
    assert proc.returncode == 1 and f"{tmp_path / 'captions.jsonl'}: record 0: no caption" in proc.stderr


def test_several_buckets_train_with_micro_batches_of_one_bucket(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "mixed"
    records = []
    for i, (height, width) in enumerate([(32, 32), (32, 32), (32, 48), (32, 48), (32, 32)]):
        clip = np.full((9, height, width, 3), 255, dtype=np.uint8)
        clip[:, 8:16, 4 * i : 4 * i + 8] = (200, 40, 40)
        write_mp4(root / f"c{i}.mp4", clip, 8)
        records.append({"path": f"c{i}.mp4", "cap": f"clip {i}"})
    (root / "captions.json").write_text(json.dumps(records))
    proc = wan("run", *OWN_DATA, "--data", str(root / "captions.json"), "data.buckets=[[32,32,5],[32,48,5]]", "training.micro_batch_size=2", "training.steps=4")
    assert "32x32x5: 3" in proc.stdout and "32x48x5: 2" in proc.stdout
    assert len(losses(tmp_path / "runs/wan-tiny")) == 4
    rows = [json.loads(x) for x in (tmp_path / "runs/wan-tiny/train/metrics.jsonl").read_text().splitlines()]
    assert "samples_per_s" in rows[0]
    assert all(0 <= r["data_time_s"] <= r["step_time_s"] for r in rows if "loss" in r)  # the wait for the batch is part of the step


@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # flux's runs the same kit path; qwen2vl's and qwen3vl-moe's are `make test`'s FSDP2 cases
def test_two_process_fsdp2_matches_one_process(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each sample's noise level, noise and caption dropout come from its own seed
    (``TrainRecipe.sample_seeds``), so two ranks of one sample draw what one rank of two does."""
    import torch
    from safetensors.torch import load_file

    from mmcore.testing import two_processes_match_one

    two_processes_match_one(wan, tmp_path, [*TINY, "data.demo_samples=8", "data.buckets=[[32,32,9]]", "training.ema=0.9"])
    # The moving average (training.ema) of sharded weights is what one process keeps whole. Not
    # bit for bit: gradients are summed in another order, and AdamW divides each by its own
    # magnitude, so where one is near zero the difference moves a weight by a fraction of a step
    # (lr 1e-3; measured at most 1.8e-6): 1e-5, a hundredth of one step.
    exported = [load_file(tmp_path / run / "export/pipeline/transformer/diffusion_pytorch_model.safetensors") for run in ("one", "two")]
    for name, one in exported[0].items():
        torch.testing.assert_close(exported[1][name], one, rtol=0, atol=1e-5, msg=name)


@pytest.mark.compares_runs
def test_ulysses_sequence_parallel_matches_one_process_and_resumes(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """parallel.ulysses=2 on two processes (diffusers' context-parallel plan for Wan: each rank's
    DiT blocks on half the patch tokens, Ulysses all-to-alls around self-attention): the losses
    and held-out metrics of one process, killed with kill -9 after step 2 and resumed at another
    Ulysses size -- on one process, ulysses=1: the same one data-parallel replica, so the same
    run (DCP reshards the weights and optimizer state). fp32; the split changes the order of
    sums only (measured ~1e-7 relative)."""
    import json

    args = [
        *TINY,
        "data.demo_samples=8",
        "data.buckets=[[32,32,9]]",
        "data.eval_fraction=0.25",
        "training.steps=4",
        "training.micro_batch_size=2",
        "training.checkpoint_every=1",
        "training.eval_every=2",
        "evaluate.enabled=false",
    ]

    def metrics(run: str) -> dict[int, dict[str, float]]:
        rows = [json.loads(line) for line in (tmp_path / run / "train/metrics.jsonl").read_text().splitlines()]
        return {r["step"]: {k: v for k, v in r.items() if k == "loss" or k.startswith("eval/")} for r in rows if "loss" in r or "eval/loss" in r}

    wan("run", *args, "--run-dir", "one")
    split_args = [*args, "--run-dir", "split", "--nproc-per-node", "2", "parallel.ulysses=2"]
    assert wan("run", *split_args, check=False, MMCORE_TEST_KILL="train-step:2").returncode != 0
    # resumed from the step-2 checkpoint on one process without Ulysses: the same replicas, so the
    # same run (another number of replicas would start afresh: another global batch)
    assert "[train] resuming (interrupted at step 2" in wan("run", *args, "--run-dir", "split", "parallel.ulysses=1").stdout
    one, split = metrics("one"), metrics("split")
    assert sorted(one) == sorted(split) and "eval/loss" in one[2], (one, split)
    for step, figures in one.items():
        for name, value in figures.items():
            assert split[step][name] == pytest.approx(value, rel=1e-5), (step, name, one, split)


def test_wan22_trains_one_expert_and_exports_it_beside_the_other(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Wan2.2 A14B's layout (transformer above the boundary, transformer_2 below): a run trains
    the expert training.expert names on its noise levels; the export holds it and the other
    expert as downloaded, and WanPipeline loads both."""
    from types import SimpleNamespace

    from diffusers import WanPipeline

    from mmcore import StageError
    from mm_pack_wan.family import FAMILY

    a14b = [*TINY, "model.source=init:tiny-a14b", "data.demo_samples=8", "evaluate.enabled=false"]
    wan("run", *a14b, "training.expert=low_noise", "--run-dir", "low")
    run = tmp_path / "low"
    # Without an expert chosen, the stages that build one stop with a one-line error naming the file.
    unchosen = SimpleNamespace(config=SimpleNamespace(training=SimpleNamespace(expert="none")))
    with pytest.raises(StageError, match="model_index.json: two denoisers split at noise level 0.875.*set training.expert to high_noise"):
        FAMILY.expert(unchosen, run / "download/model")  # type: ignore[arg-type]
    assert FAMILY.expert(SimpleNamespace(config=SimpleNamespace(training=SimpleNamespace(expert="high_noise"))), run / "download/model") == ("transformer", (0.875, 1.0))  # type: ignore[arg-type]
    weights = "diffusion_pytorch_model.safetensors"
    downloaded, exported = run / "download/model", run / "export/pipeline"
    assert (exported / "transformer" / weights).read_bytes() == (downloaded / "transformer" / weights).read_bytes()
    assert (exported / "transformer_2" / weights).read_bytes() != (downloaded / "transformer_2" / weights).read_bytes()
    assert manifest(run, "export")["metrics"]["weights_identical"]
    pipe = WanPipeline.from_pretrained(exported)
    assert pipe.config.boundary_ratio == 0.875 and pipe.transformer_2 is not None
    video = pipe("a red square moves right", height=32, width=32, num_frames=5, num_inference_steps=2, max_sequence_length=16, output_type="np").frames[0]
    assert video.shape == (5, 32, 32, 3) and np.isfinite(video).all()


def test_wan22_lora_on_one_expert_loads_into_that_expert(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """LoRA on the low-noise expert: the adapter file loads with diffusers' own switch for it
    (load_lora_weights(..., load_into_transformer_2=True)) into transformer_2 alone, the export
    checked the loaded expert's output against the trained one, and the pipeline generates."""
    from diffusers import WanPipeline

    a14b = [*TINY, "model.source=init:tiny-a14b", "data.demo_samples=8", "evaluate.enabled=false", "training.expert=low_noise", "training.lora.r=4"]
    wan("run", *a14b, "--run-dir", "lora")
    run = tmp_path / "lora"
    export = manifest(run, "export")
    assert export["outputs"] == {"model": "lora", "adapter": "lora"} and export["metrics"]["max_abs_diff"] <= 1e-4
    assert "transformer_2" in export["notes"][0] and "load_into_transformer_2=True" in export["notes"][0]
    pipe = WanPipeline.from_pretrained(run / "download/model")
    pipe.load_lora_weights(str(run / "export/lora"), load_into_transformer_2=True)
    assert any("lora_A" in name for name in pipe.transformer_2.state_dict())
    assert not any("lora_A" in name for name in pipe.transformer.state_dict())
    video = pipe("a red square moves right", height=32, width=32, num_frames=5, num_inference_steps=2, max_sequence_length=16, output_type="np").frames[0]
    assert video.shape == (5, 32, 32, 3) and np.isfinite(video).all()


def test_megatron_is_refused_before_download_for_a_family_without_it(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.backends.megatron import status

    if not status()[0]:
        pytest.skip(status()[1])
    proc = wan("run", *TINY, "--run-dir", "mg", "parallel.backend=megatron", check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == ["error: parallel.backend: megatron: the wan pack does not run on megatron-core (use parallel.backend: fsdp2)"], proc.stderr
    assert not (tmp_path / "mg" / "download").exists()
