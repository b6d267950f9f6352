"""Training for real: packing across modalities, the frozen-tower cache, full Omni checkpoints,
FSDP2, and the demo learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mm_pack_qwen2_5omni.config import OmniData
from mm_pack_qwen2_5omni.data import Encoder
from mmcore.data import read_samples
from mmcore.testing import infer_answers_held_out, stage_manifest as manifest, train_losses as losses

TINY = ["--pack", "qwen2.5omni", "--preset", "tiny", "data.demo_samples=24"]


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_packed_batch_of_mixed_modalities_equals_padded(tiny_omni: Path, wild_omni: Path) -> None:
    """One packed row of samples with images, a video, audio and text only: the same summed
    loss as padded rows, so no attention or position leaks between packed samples."""
    import torch
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    from mm_pack_qwen2_5omni.family import FAMILY

    tokenizer = AutoTokenizer.from_pretrained(tiny_omni)
    encoder = Encoder(tokenizer, WhisperFeatureExtractor.from_pretrained(tiny_omni), OmniData(image_max_pixels=3136))
    samples = []
    for item in read_samples(wild_omni / "data.json", OmniData()):
        enc = encoder.encode(item)
        samples.append({"input_ids": torch.tensor(enc.input_ids), "labels": torch.tensor(enc.labels), **enc.tensors})
    ids = FAMILY.token_ids_of(tokenizer)
    model = FAMILY.build_model(tiny_omni).eval()
    with torch.no_grad():
        padded = FAMILY.loss_sum(model, FAMILY.collate(samples, ids))
        packed = FAMILY.loss_sum(model, FAMILY.collate(samples, ids, pack=True))
        alone = sum(FAMILY.loss_sum(model, FAMILY.collate([s], ids)) for s in samples)
    assert FAMILY.collate(samples, ids, pack=True)["input_ids"].shape[0] == 1
    assert packed.item() == pytest.approx(padded.item(), rel=1e-5)
    assert packed.item() == pytest.approx(alone.item(), rel=1e-5)


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_frozen_towers_cache_equals_running_them(omni, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    common = [*TINY, "training.freeze=[audio,vision]", "training.steps=3"]
    omni("run", *common, "--run-dir", "cached")
    omni("run", *common, "--run-dir", "live", "extract.enabled=false")
    extract = manifest(tmp_path / "cached", "extract")["metrics"]
    assert extract["towers"] == ["audio", "vision"] and extract["unique_media"] == 48  # 24 clips + 24 images
    cached, live = losses(tmp_path / "cached"), losses(tmp_path / "live")
    assert list(cached) == [1, 2, 3]
    for step in cached:
        assert cached[step] == pytest.approx(live[step], rel=1e-5)
    assert manifest(tmp_path / "cached", "export")["metrics"]["logits_max_abs_diff"] == 0.0


def test_full_omni_checkpoint_trains_and_exports_the_thinker(omni, tiny_omni: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The hub's Qwen2.5-Omni holds ``thinker.*``, ``talker.*`` and ``token2wav.*`` and a config
    nesting the thinker's: the thinker comes in (round trip bit-identical), trains, and exports
    as a thinker-only folder with the thinker's config."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    full = tmp_path / "full"
    shutil.copytree(tiny_omni, full)
    weights = load_file(str(full / "model.safetensors"))
    renamed = {f"thinker.{k}": v for k, v in weights.items()}
    renamed["talker.model.embed_tokens.weight"] = torch.ones(3, 4)
    renamed["token2wav.code2wav_dit_model.proj.weight"] = torch.zeros(2, 2)
    save_file(renamed, str(full / "model.safetensors"))
    Qwen2_5OmniConfig(thinker_config=Qwen2_5OmniThinkerConfig.from_pretrained(tiny_omni).to_dict()).save_pretrained(full)
    assert json.loads((full / "config.json").read_text())["model_type"] == "qwen2_5_omni"
    proc = omni("run", *TINY, "--model", str(full), "--run-dir", "r", "convert.verify=true", "training.steps=1")
    assert "bit-identical" in proc.stdout
    assert manifest(tmp_path / "r", "convert")["metrics"]["tensors"] == len(weights)
    export = tmp_path / "r/export/hf"
    assert json.loads((export / "config.json").read_text())["model_type"] == "qwen2_5_omni_thinker"
    assert manifest(tmp_path / "r", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(export)


@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # qwen2vl's FSDP2 tests (full and LoRA) are the representative cases in `make test`
@pytest.mark.parametrize("lora", [[], ["training.lora.r=4", "training.lr=1e-2"]], ids=["full", "lora"])
def test_two_process_fsdp2_matches_one_process(omni, tmp_path: Path, lora: list[str]) -> None:  # type: ignore[no-untyped-def]
    omni("run", *TINY, "--run-dir", "one", "training.steps=3", "training.micro_batch_size=2", *lora)
    omni("run", *TINY, "--run-dir", "two", "training.steps=3", "training.micro_batch_size=1", "--nproc-per-node", "2", *lora)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step


@pytest.mark.compares_runs
def test_the_demo_learns_to_answer_from_image_and_audio(omni, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The demo preset as `mmcore run --pack qwen2.5omni` runs it."""
    omni("run", "--pack", "qwen2.5omni", "--run-dir", "demo")
    metrics = manifest(tmp_path / "demo", "train")["metrics"]
    assert metrics["eval/accuracy@0"] <= 0.2  # chance is 1 in 12
    # The README's promise, 100%, is reached by 60% of the steps with every seed, CPU
    # instruction set and thread count tools/demo_matrix.py tried.
    assert metrics["eval/accuracy"] == 1.0, metrics
    assert manifest(tmp_path / "demo", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = manifest(tmp_path / "demo", "evaluate")["metrics"]  # greedy generate() on the export, batched
    assert evaluate["accuracy"] == evaluate["token_accuracy"] == 1.0, evaluate
    infer_answers_held_out(omni, tmp_path)  # `mmcore infer` on held-out image + audio conversations, from either weights
