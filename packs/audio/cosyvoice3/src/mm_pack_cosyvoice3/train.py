"""CosyVoice3's side of training: the model, batch -> summed loss, the held-out token accuracy.

``training.parts`` picks what trains: the LM (CosyVoice's teacher-forced, label-smoothed loss,
normalised by its target tokens; the bistream interleave drawn per utterance from Python's
``random``, as the reference's processor does), the flow (the CFM loss on the mel, a prefix of
its own mel as the prompt for half the utterances; streaming chunk mask drawn per step with
probability 0.5, as the reference), or both. CosyVoice trains the LM and the flow as two runs;
here both at once sum their per-batch losses: their parameters are disjoint, so each gets the
gradient it gets alone and AdamW's per-parameter update is the same -- only gradient clipping
(one norm over both) and the one schedule are shared. HiFT is frozen (``training.freeze`` keeps
``hift``; the demo fitted it at ``init:demo``).

The engine's unit is the sample: the loss returned is the batch's mean loss times its samples.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Mapping

import torch

from mmcore import Manifest, StageContext
from mmcore.data import ShardDataset
from mmcore.train import TrainRecipe

FREEZE_GROUPS = {"llm": ["llm.*"], "flow": ["flow.*"], "hift": ["hift.*"]}


def collate(samples: list[dict[str, Any]], parts: tuple[str, ...]) -> dict[str, Any]:
    from torch.nn.utils.rnn import pad_sequence

    def lengths(key: str) -> torch.Tensor:
        return torch.tensor([len(s[key]) for s in samples])

    return {
        "text": pad_sequence([s["text"] for s in samples], batch_first=True),
        "text_len": lengths("text"),
        "speech_token": pad_sequence([s["speech_token"] for s in samples], batch_first=True),
        "speech_token_len": lengths("speech_token"),
        "speech_feat": pad_sequence([s["speech_feat"] for s in samples], batch_first=True),
        "speech_feat_len": lengths("speech_feat"),
        "embedding": torch.stack([s["embedding"] for s in samples]),
        "parts": parts,
        "num_loss_tokens": len(samples),
    }


def loss_sum(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "num_loss_tokens"}
    streaming = "flow" in batch["parts"] and bool(torch.rand(()) < 0.5)
    out = model(**inputs, rng=random._inst, streaming=streaming)  # type: ignore[attr-defined]
    total = sum(out[f"{part}_loss"] for part in batch["parts"])
    return total * batch["num_loss_tokens"]


def token_accuracy(ctx: StageContext, model: Any, held_out: ShardDataset) -> dict[str, float]:
    """Teacher-forced speech-token accuracy of the LM on the held-out split (unistream; the
    stop token counts as one more target), the work split across ranks."""
    from mmcore.engines import sharded_sums

    if len(held_out) == 0:
        return {}
    device = next(model.parameters()).device
    size = max(1, ctx.config.training.micro_batch_size)
    count = -(-len(held_out) // size)

    def measure(b: int) -> list[float]:
        batch = collate([held_out[i] for i in range(b * size, min(len(held_out), (b + 1) * size))], ("llm",))
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        batch.pop("num_loss_tokens")
        with torch.no_grad():
            out = model(**batch)
        tokens = float(out["llm_tokens"])
        return [float(out["llm_acc"]) * tokens, tokens, float(out["llm_loss"]) * tokens]

    right, tokens, loss = sharded_sums(ctx, count, measure, 3)
    return {"speech_token_accuracy": right / max(tokens, 1), "llm_loss": loss / max(tokens, 1)}


def recipe(ctx: StageContext, upstream: Mapping[str, Manifest]) -> TrainRecipe:
    from mm_pack_cosyvoice3.model import build_model

    model_dir = Path(upstream["download"].output("model"))
    dataset = ShardDataset(upstream["preprocess"].output("dataset"))
    parts = tuple(ctx.config.training.parts)

    def shard_modules(model: Any) -> list[Any]:
        return [*model.llm.llm.model.model.layers, *model.flow.decoder.estimator.transformer_blocks]

    return TrainRecipe(
        build_model=lambda ctx, upstream: build_model(model_dir),
        weights=lambda ctx, upstream: upstream["convert"].output("checkpoint"),
        dataset=lambda ctx, upstream: dataset.split("train"),
        collate=lambda samples: collate(samples, parts),
        loss=loss_sum,
        shard_modules=shard_modules,
        freeze_groups=FREEZE_GROUPS,
        evaluate=lambda ctx, model, step: token_accuracy(ctx, model, dataset.split("eval")),
        loss_unit="samples",
        lora_targets=["llm.llm.model.model.layers.*"],
        method="sft",
    )
