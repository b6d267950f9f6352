"""Fixtures of the bagel pack's tests: a tiny release-layout folder, made offline."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_bagel.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("tiny") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture(scope="session")
def tokenizer():  # type: ignore[no-untyped-def]
    from mm_pack_bagel.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def mixed_batch():  # type: ignore[no-untyped-def]
    return _mixed_batch


def _mixed_batch(model, tokenizer, *, generate: bool = True, seed: int = 0):  # type: ignore[no-untyped-def]
    """One packed row: an image question with its answer, and (``generate``) a caption and its latent."""
    import torch

    from mm_pack_bagel.packing import pack
    from mm_pack_bagel.tiny import token_ids

    c = model.config
    g = torch.Generator().manual_seed(seed)
    samples = [
        [
            {"type": "vit", "image": torch.rand(3, 2 * c.vit.patch_size, 3 * c.vit.patch_size, generator=g) * 2 - 1},
            {"type": "text", "ids": tokenizer.encode("What colour is the shape?"), "loss": False},
            {"type": "text", "ids": tokenizer.encode("The shape is red."), "loss": True},
        ]
    ]
    if generate:
        latent = torch.randn(c.latent_channels, 2 * c.latent_patch_size, 2 * c.latent_patch_size, generator=g)
        samples.append([{"type": "text", "ids": tokenizer.encode("a red square"), "loss": False}, {"type": "vae", "latent": latent, "loss": True, "timestep": 0.2}])
    return pack(samples, token_ids(tokenizer), vit_patch=c.vit.patch_size, vit_max_per_side=c.vit_max_num_patch_per_side, latent_patch=c.latent_patch_size, max_latent_size=c.max_latent_size)


@pytest.fixture
def mm(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
