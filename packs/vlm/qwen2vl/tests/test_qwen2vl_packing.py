"""Sequence packing: one row per micro-batch, attention isolated per sample, loss equal to padding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm_pack_qwen2vl.config import Qwen2VLData
from mm_pack_qwen2vl.data import Encoder
from mm_pack_qwen2vl.family import FAMILY
from mmcore.data.mllm import Sample, Turn
from mmcore.testing.media import write_image, write_video
from mmcore.testing.packing import encoded


@pytest.fixture(scope="module")
def batch_parts(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    media = tmp_path_factory.mktemp("media")
    write_image(media / "a.png", (255, 0, 0), (70, 50))
    write_image(media / "b.png", (0, 0, 255), (56, 56))
    write_video(media / "v.mp4")
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    encoder = Encoder(tok, Qwen2VLData(image_max_pixels=2 * 56 * 56, video_max_pixels=56 * 56))
    samples = [
        Sample("f", 0, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [media / "a.png"]}),
        Sample("f", 1, [Turn("user", "Hello there, how are you today?"), Turn("assistant", "fine thanks")]),
        Sample("f", 2, [Turn("user", "<video>and <image>?"), Turn("assistant", "a bar")], {"videos": [media / "v.mp4"], "images": [media / "b.png"]}),
    ]
    data = encoded(encoder, samples)
    ids = FAMILY.token_ids_of(tok)
    return FAMILY.build_model(tiny_dir), data, ids


@pytest.mark.compares_runs
@pytest.mark.isa_sample
@pytest.mark.parametrize("attention", ["transformers-mask", "varlen-kernel"])
def test_packed_loss_and_gradients_equal_the_padded_batch(batch_parts, attention: str) -> None:  # type: ignore[no-untyped-def]
    """Either attention path of a packed row: transformers' block-diagonal mask, or the core's
    varlen kernel the kit wires for packed training (no T x T mask)."""
    import copy

    from mmcore.train.attention import use_packed_attention, varlen_attention

    model, data, ids = batch_parts
    if attention == "varlen-kernel":
        model = copy.deepcopy(model)
        use_packed_attention(model, varlen_attention)
    padded, packed = FAMILY.collate(data, ids), FAMILY.collate(data, ids, pack=True)
    assert packed["input_ids"].shape[0] == 1 and packed["input_ids"].shape[1] == sum(len(d["input_ids"]) for d in data)
    assert packed["num_loss_tokens"] == padded["num_loss_tokens"]
    grads = []
    for batch in (padded, packed):
        model.zero_grad()
        loss = FAMILY.loss_sum(model, batch)
        loss.backward()
        grads.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = grads
    assert b == pytest.approx(a, rel=1e-5)  # fp32; tolerance covers the different reduction order
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-4, atol=1e-6), name


def test_without_isolation_the_samples_would_see_each_other(batch_parts) -> None:  # type: ignore[no-untyped-def]
    """The control: one continuous position range lets later samples attend to earlier ones."""
    model, data, ids = batch_parts
    packed = FAMILY.collate(data, ids, pack=True)
    with torch.no_grad():
        isolated = FAMILY.loss_sum(model, packed).item()
        leaky = dict(packed)
        leaky["segments"] = torch.tensor([int(packed["segments"].sum())])
        leaky["segment_images"] = packed["segment_images"].sum(0, keepdim=True)
        leaky["segment_videos"] = packed["segment_videos"].sum(0, keepdim=True)
        assert abs(FAMILY.loss_sum(model, leaky).item() - isolated) > 1e-3


@pytest.mark.compares_runs
def test_token_budget_packing_trains_and_resumes_to_the_same_losses(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """training.max_tokens: rows of mixed samples filled to 512 tokens by the length-aware
    sampler, through the varlen attention path; killed after step 2 and resumed, the losses equal
    the straight run's, bit for bit, the straight run reading each step's batches at the step
    (``training.prefetch=false``) and the killed one a step ahead on a thread (the default).
    Ulysses sequence parallelism (parallel.ulysses=2 on 2 processes: one row, each rank's decoder
    on half its tokens, samples crossing the halves' boundary, the vision tower's pictures and
    video frames split between the two) computes the same losses, killed with kill -9 after
    step 2 and resumed."""
    import json

    from mmcore.testing.media import write_mixed_mllm

    args = [
        "--pack",
        "qwen2vl",
        "--preset",
        "tiny",
        "--data",
        str(write_mixed_mllm(tmp_path / "mixed", ("image", "video"))),  # text-only, image, two-image and video samples
        "convert.verify=false",
        "training.steps=4",
        "training.packing=true",
        "training.max_tokens=512",
        "training.checkpoint_every=1",
    ]

    def losses(run: str) -> dict[int, float]:
        rows = [json.loads(x) for x in (tmp_path / run / "train/metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    mm("run", *args, "training.prefetch=false", "--run-dir", "straight")
    straight = losses("straight")
    assert list(straight) == [1, 2, 3, 4]
    assert mm("run", *args, "--run-dir", "killed", check=False, MMCORE_TEST_KILL="train-step:2").returncode != 0
    mm("run", *args, "--run-dir", "killed")
    assert losses("killed") == straight
    refused = mm("train", *args[:-3], "training.max_tokens=512", "--run-dir", "straight", check=False)
    assert refused.returncode == 1 and "error: training.max_tokens fills packed rows to a token budget: set training.packing: true" in refused.stderr

    split = ["--nproc-per-node", "2", "parallel.ulysses=2"]
    assert mm("run", *args, "--run-dir", "ulysses", *split, check=False, MMCORE_TEST_KILL="train-step:2").returncode != 0
    assert sorted(p.name for p in (tmp_path / "ulysses/train/checkpoints").glob("step-*"))[-1] == "step-00000002"
    # resumed from the step-2 checkpoint (a run on another number of processes would start afresh)
    resumed = mm("run", *args, "--run-dir", "ulysses", *split).stdout
    assert "[train] resuming (interrupted at step 2" in resumed
    assert "parallel.ulysses: the 2 ranks of a sequence group split model.visual's frames" in resumed  # each runs half the tower
    ulysses = losses("ulysses")
    assert list(ulysses) == [1, 2, 3, 4]
    for step in straight:  # fp32; the split only changes the order of sums (measured ~1e-7 relative)
        assert ulysses[step] == pytest.approx(straight[step], rel=1e-5), (step, straight, ulysses)
    odd = mm("train", *args, "--run-dir", "ulysses", "--force", "parallel.ulysses=2", check=False)
    assert odd.returncode == 1 and "error: parallel.ulysses=2 does not divide the 1 processes" in odd.stderr, odd.stderr[-800:]
    unpacked = mm("train", *args[:-3], "--run-dir", "ulysses", "--force", "parallel.ulysses=2", "--nproc-per-node", "2", check=False)
    assert unpacked.returncode == 1 and "error: parallel.ulysses splits packed rows: set training.packing: true" in unpacked.stderr, unpacked.stderr[-800:]


@pytest.mark.slow
@pytest.mark.matrix  # four processes: make test-matrix
@pytest.mark.compares_runs
def test_ulysses_inside_hsdp_replicas_matches_plain_data_parallel(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Four processes as two HSDP replicas (parallel.replicate=2), each a Ulysses group of two
    (parallel.ulysses=2): two data replicas, so two plain data-parallel processes train the same
    steps. Mixed pictures, video and text in token-budget rows: equal losses (fp32; measured equal)."""
    import json

    from mmcore.testing.media import write_mixed_mllm

    data = write_mixed_mllm(tmp_path / "mixed", ("image", "video"))
    args = ["--pack", "qwen2vl", "--preset", "tiny", "--data", str(data), "convert.verify=false", "evaluate.enabled=false"]
    args += ["training.steps=3", "training.packing=true", "training.max_tokens=512"]
    mm("run", *args, "--run-dir", "two", "--nproc-per-node", "2")
    mm("run", *args, "--run-dir", "four", "--nproc-per-node", "4", "parallel.ulysses=2", "parallel.replicate=2")

    def losses(run: str) -> list[float]:
        rows = [json.loads(x) for x in (tmp_path / run / "train/metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    assert len(losses("four")) == 3
    assert losses("four") == pytest.approx(losses("two"), rel=1e-5)


@pytest.mark.compares_runs
@pytest.mark.parametrize("pack", [False, True])
def test_a_filler_adds_exact_zero_gradients_and_leaves_the_loss(batch_parts, tiny_dir: Path, tmp_path: Path, pack: bool) -> None:  # type: ignore[no-untyped-def]
    """What a rank without images appends when another rank's micro-batch has one
    (:mod:`mmcore.data.fillers`): the vision tower runs, yet every gradient it gets from the
    filler is exactly zero, and the loss and the other gradients are those of the batch alone
    (the filler's rows add exact zeros to each weight's gradient sum, but a longer row lets the
    matrix products sum in another order: 1e-6 of the loss, 1e-6 absolute on the gradients)."""
    from transformers import AutoTokenizer

    from mmcore.data.fillers import append_fillers, encode_fillers

    model, data, ids = batch_parts
    encoder = Encoder(AutoTokenizer.from_pretrained(tiny_dir), Qwen2VLData())
    filler = encode_fillers(encoder, ["image"], tmp_path)["image"]
    assert (filler["labels"] == -100).all() and "pixel_values" in filler
    results = []
    for samples in ([data[1]], [append_fillers(data[1], [filler])]):  # the text-only sample, alone and with the filler
        model.zero_grad(set_to_none=True)
        loss = FAMILY.loss_sum(model, FAMILY.collate(samples, ids, pack=pack))
        loss.backward()
        results.append((loss.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}))
    (alone, grads_alone), (filled, grads_filled) = results
    torch.testing.assert_close(filled, alone, rtol=1e-6, atol=0)
    visual = [n for n in grads_filled if n.startswith("model.visual.")]
    assert visual and all(grads_alone[n] is None for n in visual)  # alone, the tower never ran
    assert all(grads_filled[n] is not None and not grads_filled[n].any() for n in visual), "the filler moved the vision tower"
    for name, grad in grads_alone.items():
        if grad is not None:
            torch.testing.assert_close(grads_filled[name], grad, rtol=1e-5, atol=1e-6)
