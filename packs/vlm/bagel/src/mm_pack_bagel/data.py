"""Preprocess: LLaMA-Factory's MLLM JSON into BAGEL's items, stored as shards.

Three kinds of samples mix in one dataset (Janus's format for the second direction):

- image QA: ``<image>`` in a user turn -> a ViT image item where the placeholder stands;
- text only: no media;
- text -> image: the last turn is the assistant's and is exactly ``<image>`` (one picture) ->
  the caption as text, the picture as a VAE item with the flow-matching loss.

Each turn becomes one text item (``<|im_start|> content <|im_end|>``, the reference's text item),
with the CE loss on assistant turns (``data.train_on_prompt``: on every turn). Images are
resized to squares: ``data.vit_image_size`` for the tower, ``data.vae_image_size`` for the
autoencoder, whose posterior (mean and std, normalised as the reference's ``(z - shift) *
scale``) is stored so training draws a fresh latent each step, as the reference encodes with
sampling every step.

Stored per sample: ``input_ids`` (the packed token stream: text items, and ``<|vision_start|>``
+ one ``<|endoftext|>`` per image token + ``<|vision_end|>`` for images), ``labels`` (next-token
targets at their positions, -100 elsewhere), ``image_kinds`` (0 ViT, 1 VAE, in order),
``pixel_values``, ``latent_mean``, ``latent_std``; :func:`items_of` reads the items back.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Mapping

import torch

from mmcore import Manifest, StageContext, StageResult
from mmcore.data import MLLMDataSection
from mmcore.errors import StageError
from pydantic import Field

IGNORE = -100


class BagelData(MLLMDataSection):
    vit_image_size: int = Field(32, ge=8, description="Images for the understanding tower are resized to this square (a multiple of the ViT patch).")
    vae_image_size: int = Field(32, ge=8, description="Pictures to generate are resized to this square (a multiple of the VAE's downsampling times the latent patch).")


def pixels(path: Path, size: int) -> torch.Tensor:
    """An image file as ``[3, size, size]`` in [-1, 1] (the reference's transforms normalise so)."""
    import numpy as np
    from PIL import Image

    from mmcore.data import load_image

    image = load_image(path).convert("RGB").resize((size, size), Image.BICUBIC)
    return torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 127.5 - 1


class Encoder:
    def __init__(self, ctx: StageContext, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        from mm_pack_bagel.config import load_config
        from mm_pack_bagel.tiny import token_ids
        from mm_pack_bagel.vae import load_vae

        self.cfg = ctx.config.data
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.ids = token_ids(self.tok)
        self.pad = self.tok.pad_token_id
        self.config = load_config(model_dir)
        vit_p, lat = self.config.vit.patch_size, self.config.latent_downsample
        if self.cfg.vit_image_size % vit_p:
            raise StageError(f"data.vit_image_size={self.cfg.vit_image_size} is not a multiple of the ViT patch ({vit_p})")
        if self.cfg.vae_image_size % lat:
            raise StageError(f"data.vae_image_size={self.cfg.vae_image_size} is not a multiple of {lat} (the VAE's downsampling times the latent patch)")
        self.vae = load_vae(model_dir / "ae.safetensors")

    def encode(self, sample: Any) -> dict[str, torch.Tensor] | str:
        from mm_pack_bagel.vae import SCALE, SHIFT

        ids: list[int] = []
        labels: list[int] = []
        kinds: list[int] = []
        vit: list[torch.Tensor] = []
        means: list[torch.Tensor] = []
        stds: list[torch.Tensor] = []
        images = list(sample.images)
        generate = sample.asks_for_picture
        turns = sample.turns[:-1] if generate else sample.turns
        if generate and (len(images) != 1 or any("<image>" in t.content for t in turns)):
            return "a text -> image sample has one picture, the assistant's whole last turn (<image>), and no image in the prompt"
        if not generate and sum(t.content.count("<image>") for t in turns) != len(images):
            return f"{sum(t.content.count('<image>') for t in turns)} <image> placeholders for {len(images)} images"
        for turn in turns:
            pieces = turn.content.split("<image>")
            for i, piece in enumerate(pieces):
                if i:
                    n = (self.cfg.vit_image_size // self.config.vit.patch_size) ** 2
                    vit.append(pixels(images.pop(0), self.cfg.vit_image_size))
                    kinds.append(0)
                    ids += [self.ids["soi"], *[self.pad] * n, self.ids["eoi"]]
                    labels += [IGNORE] * (n + 2)
                text = piece.strip()
                if text:
                    body = self.tok(text, add_special_tokens=False)["input_ids"]
                    trained = turn.role == "assistant" or self.cfg.train_on_prompt
                    ids += [self.ids["bos"], *body, self.ids["eos"]]
                    labels += ([*body, self.ids["eos"]] if trained else [IGNORE] * (len(body) + 1)) + [IGNORE]
        if generate:
            with torch.no_grad():
                posterior = self.vae.encode(pixels(images[0], self.cfg.vae_image_size)[None]).latent_dist
            # in the space the model learns and the sampler decodes from: the reference encodes
            # z ~ posterior and feeds (z - shift) * scale, so mean and std are mapped alike
            means.append((posterior.mean[0] - SHIFT) * SCALE)
            stds.append(posterior.std[0] * SCALE)
            kinds.append(1)
            n = (self.cfg.vae_image_size // self.config.latent_downsample) ** 2
            ids += [self.ids["soi"], *[self.pad] * n, self.ids["eoi"]]
            labels += [IGNORE] * (n + 2)
        if not any(label != IGNORE for label in labels) and not generate:
            return "nothing to learn: no assistant text and no picture to generate"
        if len(ids) > self.cfg.cutoff_len:
            return f"{len(ids)} tokens, longer than data.cutoff_len={self.cfg.cutoff_len} (BAGEL's items are not cut)"
        out = {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "image_kinds": torch.tensor(kinds, dtype=torch.long)}
        if vit:
            out["pixel_values"] = torch.stack(vit)
        if means:
            out["latent_mean"], out["latent_std"] = torch.stack(means), torch.stack(stds)
        return out


def items_of(sample: Mapping[str, torch.Tensor], ids: Mapping[str, int]) -> list[dict[str, Any]]:
    """A stored sample's items, for :func:`mm_pack_bagel.packing.pack` (latents as their posterior
    mean; the recipe draws the sample)."""
    tokens, labels = sample["input_ids"].tolist(), sample["labels"].tolist()
    kinds = sample["image_kinds"].tolist()
    vit = iter(sample.get("pixel_values", []))
    latents = iter(sample.get("latent_mean", []))
    items, i = [], 0
    while i < len(tokens):
        end = tokens.index(ids["eos"] if tokens[i] == ids["bos"] else ids["eoi"], i)
        if tokens[i] == ids["bos"]:
            items.append({"type": "text", "ids": tokens[i + 1 : end], "loss": labels[i] != IGNORE})
        elif kinds.pop(0) == 0:
            items.append({"type": "vit", "image": next(vit)})
        else:
            items.append({"type": "vae", "latent": next(latents), "loss": True, "timestep": 0.0})
        i = end + 1
    return items


def preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from mmcore.data import BadSample, BadSamples, read_samples
    from mmcore.data import ShardWriter, dataset_files, held_out, split_key

    cfg = ctx.config.data
    encoder = Encoder(ctx, Path(upstream["download"].output("model")))
    train_files, eval_files = dataset_files(ctx, write_demo, "MLLM JSON")
    bad = BadSamples(cfg.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    writer = ShardWriter(ctx.stage_dir / "dataset")
    counts = {"train": 0, "eval": 0, "pictures": 0}
    for path, split in [(p, "train") for p in train_files] + [(p, "eval") for p in eval_files]:
        for item in read_samples(path, cfg):
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            result = encoder.encode(item)
            if isinstance(result, str):
                bad.report(BadSample(item.file, item.index, result))
                continue
            this = "eval" if split == "eval" or (cfg.eval_fraction and held_out(split_key(item.file, item.index), cfg.eval_fraction)) else "train"
            media = sorted(k for k in result if k in ("pixel_values", "latent_mean"))
            writer.add(result, length=len(result["input_ids"]), meta={"split": this, "source": f"{Path(item.file).name}:{item.index}", "media": media})
            counts[this] += 1
            counts["pictures"] += int("latent_mean" in result)
    skipped = bad.close()
    if counts["train"] == 0:
        raise StageError("no usable training samples" + (f" ({skipped})" if skipped else ""))
    writer.close(tokens=encoder.ids)
    notes = [f"{counts['train']} train / {counts['eval']} eval samples, {counts['pictures']} of them pictures to generate"] + ([skipped] if skipped else [])
    return StageResult(
        outputs={"dataset": "dataset", "bad_samples": "bad_samples.jsonl"}, metrics={"train_samples": counts["train"], "eval_samples": counts["eval"], "pictures": counts["pictures"]}, notes=notes
    )


def write_demo(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    """The demo's MLLM JSON: per sample, at random, "What colour is the <shape>?" over a picture
    of it, a text-only question, or "a <colour> <shape>" -> that picture to generate."""
    import json

    from mmcore.data import COLOURS, SHAPES, shape_image

    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(samples):
        shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
        name = f"images/{i:05d}.png"
        shape_image(shape, COLOURS[colour], rng, size=32, radius=(9, 13)).save(folder / name)
        kind = rng.choice(("question", "text", "picture"))
        if kind == "question":
            records.append({"messages": [{"role": "user", "content": f"<image>What colour is the {shape}?"}, {"role": "assistant", "content": colour}], "images": [name]})
        elif kind == "text":
            records.append({"messages": [{"role": "user", "content": f"What colour is a {colour} {shape}?"}, {"role": "assistant", "content": colour}]})
        else:
            records.append({"messages": [{"role": "user", "content": f"a {colour} {shape}"}, {"role": "assistant", "content": "<image>"}], "images": [name]})
    cut = max(1, int(samples * eval_fraction))
    train, held = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[cut:], indent=1))
    held.write_text(json.dumps(records[:cut], indent=1))
    return train, held
