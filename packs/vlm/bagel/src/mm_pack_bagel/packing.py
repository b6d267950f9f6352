"""Packing samples into one BAGEL row, in the reference's layout (``PackedDataset.pack_sequence``).

A sample is a list of items:

- ``{"type": "text", "ids": [...], "loss": bool}``: ``<|im_start|> ids <|im_end|>``, one causal
  split; with ``loss`` the labels are ``ids + [<|im_end|>]`` at the positions before them
  (``"open": True``: no ``<|im_end|>``, an answer still being generated);
- ``{"type": "vit", "image": [3, H, W]}``: ``<|vision_start|>``, the image's ViT patches,
  ``<|vision_end|>``, a ``full`` split sharing one RoPE position;
- ``{"type": "vae", "latent": [c, h*p, w*p], "loss": bool, "timestep": float}``: the same frame
  around the image's latent tokens; with ``loss`` a ``noise`` split noised at the raw Gaussian
  ``timestep`` (the RoPE position is not advanced: a generated image ends its sample), without
  it a clean ``full`` conditioning split.

The result holds the reference ``Bagel.forward``'s argument names, so one batch feeds both.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from mm_pack_bagel.vision import flat_positions, patchify


def pack(samples: Sequence[Sequence[Mapping[str, Any]]], tokens: Mapping[str, int], *, vit_patch: int, vit_max_per_side: int, latent_patch: int, max_latent_size: int) -> dict[str, Any]:
    """``tokens``: ids of ``bos`` (<|im_start|>), ``eos`` (<|im_end|>), ``soi``, ``eoi`` (vision start/end)."""
    s: dict[str, list] = {
        k: [] for k in ("text_ids", "text_idx", "labels", "ce_idx", "pos", "vit", "vit_pos", "vit_idx", "vit_lens", "latents", "latent_shapes", "latent_pos", "vae_idx", "timesteps", "mse_idx")
    }
    sample_lens, split_lens, modes = [], [], []
    cur = 0
    for number, sample in enumerate(samples):
        rope, start = 0, cur
        for item in sample:
            kind = item.get("type")
            if kind == "text":
                ids = [tokens["bos"], *item["ids"]]
                closed = ids + ([] if item.get("open") else [tokens["eos"]])  # open: an answer being generated
                s["text_ids"] += closed
                s["text_idx"] += list(range(cur, cur + len(closed)))
                if item.get("loss"):
                    s["ce_idx"] += list(range(cur, cur + len(ids)))
                    s["labels"] += [*item["ids"], tokens["eos"]]
                s["pos"] += list(range(rope, rope + len(closed)))
                rope += len(closed)
                split_lens.append(len(closed))
                modes.append("causal")
                cur += len(closed)
                continue
            if kind == "vit":
                image = item["image"]
                patches = patchify(image, vit_patch)
                n = patches.shape[0]
                s["vit"].append(patches)
                s["vit_pos"].append(flat_positions(image.shape[1] // vit_patch, image.shape[2] // vit_patch, vit_max_per_side))
                s["vit_idx"] += list(range(cur + 1, cur + 1 + n))
                s["vit_lens"].append(n)
                mode, advance = "full", 1
            elif kind == "vae":
                latent = item["latent"]
                h, w = latent.shape[1] // latent_patch, latent.shape[2] // latent_patch
                n = h * w
                s["latents"].append(latent)
                s["latent_shapes"].append((h, w))
                s["latent_pos"].append(flat_positions(h, w, max_latent_size))
                s["vae_idx"] += list(range(cur + 1, cur + 1 + n))
                if item.get("loss"):
                    s["mse_idx"] += list(range(cur + 1, cur + 1 + n))
                    s["timesteps"] += [float(item["timestep"])] * n
                    mode, advance = "noise", 0
                else:
                    s["timesteps"] += [float("-inf")] * n
                    mode, advance = "full", 1
            else:
                raise ValueError(f"sample {number}: item type {kind!r} is not text, vit or vae")
            s["text_ids"] += [tokens["soi"], tokens["eoi"]]
            s["text_idx"] += [cur, cur + n + 1]
            s["pos"] += [rope] * (n + 2)
            rope += advance
            split_lens.append(n + 2)
            modes.append(mode)
            cur += n + 2
        sample_lens.append(cur - start)

    def ints(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long)

    batch: dict[str, Any] = {
        "sequence_length": cur,
        "sample_lens": sample_lens,
        "split_lens": split_lens,
        "attn_modes": modes,
        "packed_text_ids": ints(s["text_ids"]),
        "packed_text_indexes": ints(s["text_idx"]),
        "packed_position_ids": ints(s["pos"]),
    }
    if s["ce_idx"]:
        batch |= {"ce_loss_indexes": ints(s["ce_idx"]), "packed_label_ids": ints(s["labels"])}
    if s["vit"]:
        batch |= {
            "packed_vit_tokens": torch.cat(s["vit"]),
            "packed_vit_position_ids": torch.cat(s["vit_pos"]),
            "packed_vit_token_indexes": ints(s["vit_idx"]),
            "vit_token_seqlens": torch.tensor(s["vit_lens"], dtype=torch.int),
        }
    if s["latents"]:
        batch |= {
            "padded_latent": s["latents"],
            "patchified_vae_latent_shapes": s["latent_shapes"],
            "packed_latent_position_ids": torch.cat(s["latent_pos"]),
            "packed_vae_token_indexes": ints(s["vae_idx"]),
            "packed_timesteps": torch.tensor(s["timesteps"]),
            "mse_loss_indexes": ints(s["mse_idx"]) if s["mse_idx"] else None,
        }
    return batch
