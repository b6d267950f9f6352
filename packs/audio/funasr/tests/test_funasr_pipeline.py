"""Training for real: packed == padded, the export in transformers' class, the demo learning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmcore.data import Sample, Turn
from mmcore.testing import stage_manifest as manifest
from mm_pack_funasr.config import FunAsrData
from mm_pack_funasr.data import Encoder
from mm_pack_funasr.demo import digits_clip
from mm_pack_funasr.family import FAMILY, feature_settings


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_packed_batch_equals_padded_and_each_alone(tiny_funasr: Path, tmp_path: Path) -> None:
    """One packed row of clips of different lengths, two clips in one conversation and a
    text-only sample: the same summed loss as padded rows and as each sample alone."""
    import torch
    from transformers import AutoTokenizer

    from mmcore.data import write_audio

    tokenizer = AutoTokenizer.from_pretrained(tiny_funasr)
    encoder = Encoder(tokenizer, feature_settings(tiny_funasr), FunAsrData(), max_rows=2048)
    clips = []
    for i, digits in enumerate([[1], [2, 3, 4, 5], [6, 7]]):
        clips.append(write_audio(tmp_path / f"{i}.wav", digits_clip(digits, np.random.default_rng(i)), 16000))
    conversations = [
        Sample("x", 0, [Turn("user", "<audio>"), Turn("assistant", "one")], {"audios": [clips[0]]}),
        Sample("x", 1, [Turn("user", "<audio>"), Turn("assistant", "two three four five"), Turn("user", "<audio>"), Turn("assistant", "six seven")], {"audios": clips[1:]}),
        Sample("x", 2, [Turn("user", "Say hi."), Turn("assistant", "hi")], {}),
    ]
    samples = []
    for item in conversations:
        enc = encoder.encode(item)
        samples.append({"input_ids": torch.tensor(enc.input_ids), "labels": torch.tensor(enc.labels), **enc.tensors})
    ids = FAMILY.token_ids_of(tokenizer)
    model = FAMILY.build_model(tiny_funasr).eval()
    with torch.no_grad():
        padded = FAMILY.loss_sum(model, FAMILY.collate(samples, ids))
        packed = FAMILY.loss_sum(model, FAMILY.collate(samples, ids, pack=True))
        alone = sum(FAMILY.loss_sum(model, FAMILY.collate([s], ids)) for s in samples)
    assert FAMILY.collate(samples, ids, pack=True)["input_ids"].shape[0] == 1
    assert packed.item() == pytest.approx(padded.item(), rel=1e-5)
    assert packed.item() == pytest.approx(alone.item(), rel=1e-5)


def test_hub_layout_with_a_stored_lm_head_converts_both_ways(funasr, tiny_funasr: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """transformers' conversion script stores ``lm_head.weight`` beside the tied embedding: it
    is read as the embedding's and every other tensor round-trips bit-identically (the export
    loading in ``FunAsrNanoForConditionalGeneration`` with equal logits is the conformance suite's)."""
    import shutil

    from safetensors.torch import load_file, save_file

    hub = tmp_path / "hub"
    shutil.copytree(tiny_funasr, hub)
    weights = load_file(str(hub / "model.safetensors"))
    assert "lm_head.weight" not in weights and "model.audio_tower.layers.0.self_attn.fsmn.conv.weight" in weights
    weights["lm_head.weight"] = weights["model.language_model.embed_tokens.weight"].clone()
    save_file(weights, str(hub / "model.safetensors"))
    funasr("download", "--pack", "funasr", "--preset", "tiny", "--model", str(hub), "--run-dir", "r")
    proc = funasr("convert", "--pack", "funasr", "--preset", "tiny", "--run-dir", "r", "convert.verify=true")
    assert "bit-identical" in proc.stdout
    assert manifest(tmp_path / "r", "convert")["metrics"]["tensors"] == len(weights) - 1


@pytest.mark.matrix  # the kit's DPO, which qwen2vl's DPO demo runs in make test
def test_dpo_on_llama_factory_ranking_pairs_with_audio(funasr, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """LLaMA-Factory ranking data (``chosen``/``rejected`` answers to an ``<audio>`` prompt):
    DPO through the VLM kit trains, and the implicit reward margin grows."""
    import json

    from mmcore.data import write_audio
    from mmcore.testing import train_losses

    rng, records = np.random.default_rng(0), []
    for i in range(8):
        digits = [int(d) for d in rng.integers(0, 10, size=2)]
        write_audio(tmp_path / f"data/{i}.wav", digits_clip(digits, rng), 16000)
        words = [("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")[d] for d in digits]
        records.append(
            {
                "messages": [{"role": "user", "content": "<audio>"}],
                "chosen": {"role": "assistant", "content": " ".join(words)},
                "rejected": {"role": "assistant", "content": words[0]},
                "audios": [f"{i}.wav"],
            }
        )
    (tmp_path / "data/pairs.json").write_text(json.dumps(records))
    args = ["--data", str(tmp_path / "data/pairs.json"), "data.ranking=true", "training.method=dpo", "training.steps=6", "training.lr=5e-3", "evaluate.enabled=false"]
    funasr("run", "--pack", "funasr", "--preset", "tiny", "--run-dir", "r", *args)
    assert len(train_losses(tmp_path / "r")) == 6
    margins = [row["rewards/margin"] for row in map(json.loads, (tmp_path / "r/train/metrics.jsonl").read_text().splitlines()) if "rewards/margin" in row]
    assert margins[-1] > margins[0] + 0.05, margins  # measured: -0.001 at step 1, 0.16 at step 6
    assert manifest(tmp_path / "r", "export")["metrics"]["logits_max_abs_diff"] == 0.0


@pytest.mark.compares_runs
@pytest.mark.matrix  # the whole demo: tools/demo_matrix.py holds its promise over seeds
def test_the_demo_learns_to_transcribe_spoken_digits(funasr, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The demo preset as `mmcore run --pack funasr` runs it: the README's promise."""
    funasr("run", "--pack", "funasr", "--run-dir", "demo")
    assert manifest(tmp_path / "demo", "train")["metrics"]["eval/accuracy@0"] == 0.0
    evaluate = manifest(tmp_path / "demo", "evaluate")["metrics"]  # greedy generate() on the export, KV cache
    assert evaluate["wer"] <= 0.15, evaluate  # tools/demo_matrix.py: 12 runs 0-0.124, seed 0 native 0.008 (README)
    assert manifest(tmp_path / "demo", "export")["metrics"]["logits_max_abs_diff"] == 0.0
