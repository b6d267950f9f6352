"""Extract: VAE latents and UMT5 prompt embeddings, computed once, no grad, resumable.

Features live in safetensors chunks under ``extract/features``, keyed by content hashes: latents
by (frames, bucket, the checkpoint's fingerprint), embeddings by (caption, text length, the
checkpoint's fingerprint). Two clips with the same file name never collide, identical clips are
encoded once, and a changed VAE, text encoder or frame sampling makes new keys (the stage's own
fingerprint reruns it). A killed extract resumes at the first unwritten chunk.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.data.shards import ShardDataset
from mmcore.faults import crash_point
from mmcore.io import atomic_write_json
from mmcore.pack import StageResult
from mmcore.rundir import Manifest

CHUNK = 16


def key_of(*parts: Any) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


class Encoders:
    """The frozen VAE and UMT5 of a Wan checkpoint, used exactly as ``WanPipeline`` uses them."""

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        import torch
        from diffusers import WanPipeline

        self.pipe = WanPipeline.from_pretrained(model_dir, transformer=None)
        self.pipe.vae.eval()
        self.pipe.text_encoder.eval()
        self.max_sequence_length = max_sequence_length
        cfg = self.pipe.vae.config
        self.mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)

    def latents(self, frames: Any) -> Any:
        """uint8 (F, H, W, 3) -> normalised latents (16, F', H', W'), as the pipeline expects them."""
        import torch

        with torch.no_grad():
            video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
            z = self.pipe.vae.encode(video).latent_dist.mode()
            return ((z - self.mean) / self.std)[0]

    def text(self, caption: str) -> Any:
        import torch

        with torch.no_grad():
            embeds, _ = self.pipe.encode_prompt(caption, do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length, device=torch.device("cpu"))
            return embeds[0]


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from safetensors import safe_open
    from safetensors.torch import save_file

    data = ShardDataset(upstream["preprocess"].output("dataset"))
    identity = upstream["download"].fingerprint
    length = ctx.config.data.max_sequence_length
    out = ctx.stage_dir / "features"
    out.mkdir(parents=True, exist_ok=True)
    encoders = Encoders(upstream["download"].output("model"), length)

    done: dict[str, str] = {}  # key -> chunk file, from chunks an interrupted run finished
    for chunk in sorted(out.glob("chunk-*.safetensors")):
        with safe_open(str(chunk), "pt") as handle:
            done.update({k: chunk.name for k in handle.keys()})
    samples = []
    empty = key_of("text", "", length, identity)
    encoded = reused = 0
    pending: dict[str, Any] = {}
    if empty not in done:
        pending[empty] = encoders.text("")
    chunk_no = len(list(out.glob("chunk-*.safetensors")))
    for i in ctx.progress(range(len(data)), description="extract", unit="clip"):
        meta = data.meta(i)
        sample = data[i]
        latent_key = key_of("latents", sample["frames"].numpy().tobytes(), meta["bucket"], identity)
        text_key = key_of("text", meta["caption"], length, identity)
        for key, make in ((latent_key, lambda: encoders.latents(sample["frames"])), (text_key, lambda: encoders.text(meta["caption"]))):
            if key in done or key in pending:
                reused += 1
            else:
                pending[key] = make()
                encoded += 1
        samples.append({"latents": latent_key, "text": text_key})
        if len(pending) >= CHUNK or i == len(data) - 1:
            name = f"chunk-{chunk_no:05d}.safetensors"
            tmp = out / f".{name}.tmp"
            save_file({k: v.contiguous() for k, v in pending.items()}, str(tmp))
            tmp.replace(out / name)
            done.update({k: name for k in pending})
            pending.clear()
            chunk_no += 1
            crash_point("extract-chunk", chunk_no)
    atomic_write_json(out / "index.json", {"samples": samples, "empty_text": empty, "files": done})
    return StageResult(
        outputs={"features": "features"},
        metrics={"clips": len(data), "encoded": encoded, "reused": reused},
        notes=[f"cached latents and text embeddings of {len(data)} clips ({encoded} encoded, {reused} reused)"],
    )


class CachedFeatures:
    """Training samples from the cache: normalised latents and prompt embeddings."""

    def __init__(self, folder: Path, indices: list[int]) -> None:
        self.folder = folder
        self.index = json.loads((folder / "index.json").read_text())
        self.indices = indices
        self._handles: dict[str, Any] = {}

    def _get(self, key: str) -> Any:
        from safetensors import safe_open

        name = self.index["files"][key]
        if name not in self._handles:
            self._handles[name] = safe_open(str(self.folder / name), "pt")
        return self._handles[name].get_tensor(key)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        refs = self.index["samples"][self.indices[i]]
        return {"latents": self._get(refs["latents"]), "text": self._get(refs["text"])}

    def empty_text(self) -> Any:
        return self._get(self.index["empty_text"])
