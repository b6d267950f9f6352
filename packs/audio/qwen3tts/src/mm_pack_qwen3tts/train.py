"""Qwen3-TTS's side of training (mmcore's loop, FSDP2, checkpoints, LoRA): the talker and its
code predictor learn the preprocessed target codes of a text, teacher-forced.

The loss is :func:`mm_pack_qwen3tts.speech.loss` summed (the engine divides by the step's
codebook-0 targets, eos included): the hidden state at p predicts frame p+1's codebook 0 and,
through the code predictor, its codebooks 1..G-1 (weight 0.3), as decoding uses them. The
reference's ``finetuning/sft_12hz.py`` shifts its labels twice (pre-shifted labels into
transformers' causal-LM loss, which shifts again) and feeds the code predictor the hidden state
that has already read the frame; the pack does not follow it there. Held-out metrics:
teacher-forced accuracy of codebook 0 (``codebook0_accuracy``) and of codebooks 1..G-1
(``code_predictor_accuracy``), and the held-out loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore import Manifest, StageContext
from mmcore.data import ShardDataset
from mmcore.train import TrainRecipe

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "talker": ["talker.model.layers.*", "talker.model.norm.*", "talker.codec_head.*"],
    "embeddings": ["talker.model.codec_embedding.*", "talker.model.text_embedding.*", "talker.text_projection.*"],
    "code_predictor": ["talker.code_predictor.*"],
}


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``text_ids`` [B, longest] and ``codes`` [B, most frames, G] right-padded, their lengths,
    ``speaker`` / ``language`` (-1: none); ``num_loss_tokens``: codebook-0 targets (frames + eos)."""
    import torch

    text_len = torch.tensor([len(s["text_ids"]) for s in samples])
    frames = torch.tensor([len(s["codes"]) for s in samples])
    groups = samples[0]["codes"].shape[1]
    text = torch.full((len(samples), int(text_len.max())), -1, dtype=torch.long)
    codes = torch.zeros(len(samples), int(frames.max()), groups, dtype=torch.long)
    for b, s in enumerate(samples):
        text[b, : len(s["text_ids"])] = s["text_ids"]
        codes[b, : len(s["codes"])] = s["codes"]
    speaker = torch.tensor([int(s.get("speaker", -1)) for s in samples])
    language = torch.tensor([int(s.get("language", -1)) for s in samples])
    return {"text_ids": text, "text_len": text_len, "codes": codes, "frames": frames, "speaker": speaker, "language": language, "num_loss_tokens": int(frames.sum()) + len(samples)}


class Samples:
    """A split of the preprocessed shards, each sample with its speaker / language ids."""

    def __init__(self, data: ShardDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        meta = self.data.meta(i)
        return {**self.data[i], "speaker": meta.get("speaker", -1), "language": meta.get("language", -1)}


def held_out_metrics(ctx: StageContext, model: Any, held: Samples) -> dict[str, float]:
    """Teacher-forced accuracy of codebook 0 (the talker's) and of codebooks 1..G-1 (the code
    predictor's, each frame's codebook 0 given), and the mean loss, over the held-out split (the
    work split across ranks)."""
    import torch

    from mmcore.engines import sharded_sums

    if len(held) == 0:
        return {}

    def measure(i: int) -> list[float]:
        with torch.no_grad():
            out = model(collate([held[i]]))
        return [float(out["hits"]), float(out["targets"]), float(out["loss"]), float(out["sub_hits"]), float(out["sub_targets"])]

    hits, targets, loss, sub_hits, sub_targets = sharded_sums(ctx, len(held), measure, 5)
    return {"codebook0_accuracy": hits / max(targets, 1), "code_predictor_accuracy": sub_hits / max(sub_targets, 1), "held_out_loss": loss / max(targets, 1)}


def shard_modules(model: Any) -> list[Any]:
    return [*model.talker.model.layers, *model.talker.code_predictor.model.layers]


def recipe(ctx: StageContext, upstream: Mapping[str, Manifest]) -> TrainRecipe:
    from mm_pack_qwen3tts.model import build_model

    model_dir = Path(upstream["download"].output("model"))
    dataset = ShardDataset(upstream["preprocess"].output("dataset"))

    return TrainRecipe(
        build_model=lambda ctx, upstream: build_model(model_dir),
        weights=lambda ctx, upstream: upstream["convert"].output("checkpoint"),
        dataset=lambda ctx, upstream: Samples(dataset.split("train")),
        collate=collate,
        loss=lambda model, batch: model(batch)["loss"],
        shard_modules=shard_modules,
        freeze_groups=FREEZE_GROUPS,
        lora_targets=["talker.model.layers.*"],  # LoRA on the talker's decoder stack by default
        evaluate=lambda ctx, model, step: held_out_metrics(ctx, model, Samples(dataset.split("eval"))),
        method="sft",
    )
