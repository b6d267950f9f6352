"""Whisper's side of training: build the model, batch -> summed loss, held-out WER.

The decoder reads ``labels[:-1]`` and predicts ``labels[1:]``: every token after
``<|startoftranscript|>`` is supervised (language, task, text, end). With the extract stage's
cache the encoder is skipped and its stored outputs go in as ``encoder_outputs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore import StageContext
from mmcore.engines import remote_code
from mmcore.data import ShardDataset
from mmcore import Manifest
from mmcore.train import TrainRecipe, load_converted

IGNORE = -100

# training.freeze accepts these names as well as parameter globs. proj_out is tied to the
# decoder's token embedding, so "decoder" covers both.
FREEZE_GROUPS = {
    "encoder": ["model.encoder.*"],
    "decoder": ["model.decoder.*"],
}


def build_model(model_dir: Path, checkpoint: Path | None = None, training: Any = None) -> Any:
    """The model of ``model_dir``'s config, weights from a DCP ``checkpoint``; ``training`` (the
    config section) switches SpecAugment on."""
    from transformers import AutoConfig, WhisperForConditionalGeneration

    config = AutoConfig.from_pretrained(model_dir, **remote_code())
    config._attn_implementation = "sdpa"
    if training is not None and training.spec_augment:
        config.apply_spec_augment = True
        config.mask_time_prob, config.mask_time_length = training.mask_time_prob, training.mask_time_length
        config.mask_feature_prob, config.mask_feature_length = training.mask_feature_prob, training.mask_feature_length
    model = WhisperForConditionalGeneration(config)
    if checkpoint is not None:
        load_converted(model, checkpoint)
    return model


def collate(samples: list[dict[str, Any]], eos_id: int) -> dict[str, Any]:
    """Features stacked (or cached encoder states), labels right-padded; decoder input = labels[:-1]."""
    import torch

    longest = max(len(s["labels"]) for s in samples)
    labels = torch.full((len(samples), longest), IGNORE, dtype=torch.long)
    for row, sample in enumerate(samples):
        labels[row, : len(sample["labels"])] = sample["labels"]
    batch: dict[str, Any] = {
        "decoder_input_ids": labels[:, :-1].masked_fill(labels[:, :-1] == IGNORE, eos_id),
        "targets": labels[:, 1:],
    }
    source = "encoder_states" if "encoder_states" in samples[0] else "input_features"
    batch[source] = torch.stack([s[source] for s in samples])
    batch["num_loss_tokens"] = int((batch["targets"] != IGNORE).sum())
    return batch


def forward(model: Any, batch: dict[str, Any], **kwargs: Any) -> Any:
    if "encoder_states" in batch:
        from transformers.modeling_outputs import BaseModelOutput

        kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=batch["encoder_states"])
    else:
        kwargs["input_features"] = batch["input_features"]
    return model(decoder_input_ids=batch["decoder_input_ids"], use_cache=False, **kwargs)


def loss_sum(model: Any, batch: dict[str, Any]) -> Any:
    """Summed cross-entropy over supervised decoder tokens (the engine normalises)."""
    import torch.nn.functional as F

    logits = forward(model, batch).logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1), ignore_index=IGNORE, reduction="sum")


def evaluate_wer(ctx: StageContext, model: Any, held_out: ShardDataset, tokenizer: Any, eos_id: int) -> dict[str, float]:
    """Word error rate of greedy transcripts of the held-out split (the work split across ranks)."""
    from mm_pack_whisper.generate import greedy_decode
    from mmcore.engines import sharded_sums, word_errors

    if len(held_out) == 0:
        return {}
    device = next(model.parameters()).device
    size = max(1, ctx.config.training.micro_batch_size)
    # Batches of one prefix length (samples with and without a language token do not mix).
    batches: list[list[int]] = []
    for i in range(len(held_out)):
        if batches and len(batches[-1]) < size and held_out.meta(batches[-1][0])["prefix"] == held_out.meta(i)["prefix"]:
            batches[-1].append(i)
        else:
            batches.append([i])
    steps = max(held_out.length(i) for i in range(len(held_out))) - min(held_out.meta(i)["prefix"] for i in range(len(held_out)))

    def measure(b: int) -> list[float]:
        members = batches[b]
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in collate([held_out[i] for i in members], eos_id).items()}
        prefix = held_out.meta(members[0])["prefix"]
        decoded = greedy_decode(model, batch, batch["decoder_input_ids"][:, :prefix], steps, eos_id, fixed_steps=True)
        errors = words = 0
        for i, tokens in zip(members, decoded):
            e, n = word_errors(held_out.meta(i)["text"], tokenizer.decode(tokens, skip_special_tokens=True))
            errors, words = errors + e, words + n
        return [errors, words]

    errors, words = sharded_sums(ctx, len(batches), measure, 2)
    return {"wer": errors / max(words, 1)}


def step_flops() -> Any:
    """``(model, batch) -> FLOPs``: the encoder on its frames (half the mel frames; nothing when
    its outputs come from the cache), the decoder on its tokens, self- and cross-attention."""
    from mmcore.train import StepFlops, attention_flops, dense_flops

    seen = StepFlops()

    def flops(model: Any, batch: dict[str, Any]) -> float:
        config, inner = model.config, model.model
        rows, text = batch["decoder_input_ids"].shape
        frames = batch["encoder_states"].shape[1] if "encoder_states" in batch else batch["input_features"].shape[-1] // 2
        total = dense_flops(seen.counts("decoder", inner.decoder), rows * text)
        total += attention_flops(config.decoder_layers, config.d_model, [text] * rows)
        total += attention_flops(config.decoder_layers, config.d_model, [text] * rows, [frames] * rows)
        if "input_features" in batch:
            total += dense_flops(seen.counts("encoder", inner.encoder), rows * frames)
            total += attention_flops(config.encoder_layers, config.d_model, [frames] * rows)
        return total

    return flops


def shard_modules(model: Any) -> list[Any]:
    return [*model.model.encoder.layers, *model.model.decoder.layers]


def recipe(ctx: StageContext, upstream: Mapping[str, Manifest]) -> TrainRecipe:
    """The train engine's recipe; with a finished extract stage, encoder outputs come from its cache."""
    from transformers import WhisperTokenizer

    model_dir = upstream["download"].output("model")
    dataset = ShardDataset(upstream["preprocess"].output("dataset"))
    eos_id = int(dataset.index["eos_id"])
    cached = "extract" in upstream
    tokenizer = WhisperTokenizer.from_pretrained(model_dir)

    def load(split: str) -> Any:
        data = dataset.split(split)
        if cached:
            from mmcore.data import CachedSamples

            return CachedSamples(data, upstream["extract"].output("features"), replaces={"encoder_states": "input_features"})
        return data

    def build(ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:  # weights: the engine loads them
        return build_model(model_dir, None, ctx.config.training)

    return TrainRecipe(
        build_model=build,
        weights=lambda ctx, upstream: upstream["convert"].output("checkpoint"),
        flops=step_flops(),
        dataset=lambda ctx, upstream: load("train"),
        collate=lambda samples: collate(samples, eos_id),
        loss=loss_sum,
        shard_modules=shard_modules,
        freeze_groups=FREEZE_GROUPS,
        evaluate=lambda ctx, model, step: evaluate_wer(ctx, model, load("eval"), tokenizer, eos_id),
        method="sft",  # training.method dpo / grpo: refused by the engine, not trained as SFT
    )
