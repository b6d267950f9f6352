"""The speech tokenizer's encoder: the public (transformers 4.57 Mimi) ``encoder.*`` tensors load
strictly onto transformers 5.25's Mimi pieces, audio -> 12.5 Hz codes, bad folders fail in one line.
(Codes equal to the reference's under transformers 4.57: tools/reference_equivalence.py.)"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mm_pack_qwen3tts.config import CheckpointError
from mm_pack_qwen3tts.encoder import to_own, to_public
from mm_pack_qwen3tts.model import load_speech_encoder


def chord(seconds: float, base: float = 220.0) -> torch.Tensor:
    t = torch.arange(int(24000 * seconds)) / 24000
    return sum(torch.sin(2 * torch.pi * base * k * t) for k in (1, 1.25, 1.5)) / 4


@pytest.fixture(scope="module")
def encoder(tiny_dir: Path):  # type: ignore[no-untyped-def]
    return load_speech_encoder(tiny_dir)


def test_the_public_encoder_names_load_strictly(tiny_dir: Path, encoder) -> None:  # type: ignore[no-untyped-def]
    saved = load_file(str(tiny_dir / "speech_tokenizer" / "model.safetensors"))
    public = {k for k in saved if k.startswith("encoder.")}
    for key in (  # transformers 4.57 MimiModel's names, as the public checkpoint stores them
        "encoder.encoder.layers.0.conv.weight",
        "encoder.encoder_transformer.layers.0.self_attn.q_proj.weight",
        "encoder.encoder_transformer.layers.0.mlp.fc1.weight",
        "encoder.downsample.conv.weight",
        "encoder.quantizer.semantic_residual_vector_quantizer.input_proj.weight",
        "encoder.quantizer.acoustic_residual_vector_quantizer.layers.4.codebook.embed_sum",
    ):
        assert key in public, key
    own = encoder.state_dict()
    assert {to_own(k) for k in public} == set(own)
    assert all(torch.equal(own[to_own(k)], saved[k]) and to_public(to_own(k)) == k for k in public)


def test_audio_becomes_12_5_hz_codes(encoder) -> None:  # type: ignore[no-untyped-def]
    wav = chord(1.3) + 0.01 * torch.randn(31200, generator=torch.Generator().manual_seed(0))
    codes = encoder.encode(wav)
    assert codes.shape == (math.ceil(31200 / 1920), 4) and codes.dtype == torch.long
    assert 0 <= int(codes.min()) and int(codes.max()) < 32
    assert all(len(set(col.tolist())) > 2 for col in codes.T)  # the tiny codebooks are used, not one id
    # causal: the first frames of a clip do not depend on what follows them
    assert torch.equal(encoder.encode(wav[: 8 * 1920])[:7], codes[:7])
    # a batch of equal-length clips equals the clips one by one
    other = chord(1.3, 330.0)
    assert torch.equal(encoder(torch.stack([wav, other]))[1].T, encoder.encode(other))


def test_a_bad_encoder_fails_in_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    path = folder / "speech_tokenizer" / "model.safetensors"
    state = load_file(str(path))
    missing = dict(state)
    del missing["encoder.downsample.conv.weight"]
    save_file(missing, str(path))
    with pytest.raises(CheckpointError, match=r"1 missing \(first encoder\.downsample\.conv\.weight\)"):
        load_speech_encoder(folder)
    save_file({**state, "extra.weight": torch.zeros(1)}, str(path))
    with pytest.raises(CheckpointError, match=r"unexpected extra\.weight"):
        load_speech_encoder(folder)
    shaped = dict(state)
    shaped["encoder.encoder_transformer.layers.0.mlp.fc1.weight"] = torch.zeros(3, 3)
    save_file(shaped, str(path))
    with pytest.raises(CheckpointError, match=r"fc1\.weight: \(3, 3\) in the checkpoint"):
        load_speech_encoder(folder)
