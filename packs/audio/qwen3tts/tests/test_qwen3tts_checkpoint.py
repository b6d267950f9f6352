"""The public layout: a tiny checkpoint with the public config.json fields and safetensors keys
loads strictly, bad folders fail in one line, and safetensors -> DCP -> safetensors through
mmcore's engine is bit-identical."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mm_pack_qwen3tts.config import CheckpointError
from mm_pack_qwen3tts.model import build_model, load_pretrained


def test_the_public_layout_loads_strictly_with_the_public_names(tiny_dir: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    saved = load_file(str(tiny_dir / "model.safetensors"))
    state = tiny_model.state_dict()
    assert set(state) == set(saved)
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    for key in (
        "talker.model.layers.1.self_attn.q_norm.weight",
        "talker.model.codec_embedding.weight",
        "talker.model.text_embedding.weight",
        "talker.text_projection.linear_fc1.bias",
        "talker.codec_head.weight",
        "talker.code_predictor.model.codec_embedding.2.weight",
        "talker.code_predictor.lm_head.2.weight",
        "talker.code_predictor.small_to_mtp_projection.bias",
    ):
        assert key in saved, key
    assert not any("embed_tokens" in k or "rotary_emb" in k for k in saved)
    # the code predictor's codec tables are talker-width; its heads read its own width
    assert saved["talker.code_predictor.model.codec_embedding.0.weight"].shape == (32, 32)
    assert saved["talker.code_predictor.lm_head.0.weight"].shape == (32, 16)


def _broken(tiny_dir: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    out = tmp_path / "broken"
    shutil.copytree(tiny_dir, out)
    state = load_file(str(out / "model.safetensors"))
    edit(state)
    save_file(state, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: s.pop("talker.codec_head.weight"), "1 missing (first talker.codec_head.weight)"),
        (lambda s: s.update({"talker.extra.weight": torch.zeros(1)}), "1 unexpected (first talker.extra.weight)"),
        (lambda s: s.update({"talker.codec_head.weight": torch.zeros(3, 32)}), "1 of another shape (first talker.codec_head.weight: (3, 32) in the checkpoint"),
    ],
)
def test_a_checkpoint_that_does_not_fit_fails_in_one_line(tiny_dir: Path, tmp_path: Path, edit, expected: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError) as info:
        load_pretrained(_broken(tiny_dir, tmp_path, edit))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_folder_without_config_or_of_another_model_type_fails_in_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "tts_model_type": "base"}))
    with pytest.raises(CheckpointError, match=r"missing \(first speaker_encoder\.asp\.conv\.bias\)"):
        load_pretrained(folder)  # a Base config needs the speaker encoder's tensors
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2"}))
    with pytest.raises(CheckpointError, match="not a Qwen3-TTS config"):
        build_model(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        build_model(folder)


def test_safetensors_to_dcp_and_back_is_bit_identical_and_the_dcp_loads(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.engines import compare_hf, dcp_to_hf, hf_to_dcp

    from mm_pack_qwen3tts.adapter import ADAPTER

    stats = hf_to_dcp(tiny_dir, tmp_path / "dcp", ADAPTER)
    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", ADAPTER)
    assert compare_hf(tiny_dir, tmp_path / "back") == []
    a, b = load_file(str(tiny_dir / "model.safetensors")), {}
    for path in (tmp_path / "back").glob("*.safetensors"):
        b.update(load_file(str(path)))
    assert set(a) == set(b) and stats["tensors"] == len(a)
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)) for k in a)
    model = build_model(tiny_dir, checkpoint=tmp_path / "dcp")
    assert all(torch.equal(v, a[k]) for k, v in model.state_dict().items())


def test_a_base_checkpoint_loads_its_speaker_encoder_which_fills_the_speaker_slot(tmp_path: Path) -> None:
    from mm_pack_qwen3tts.speech import generate_codes
    from mm_pack_qwen3tts.tiny import build_tiny_checkpoint

    folder = build_tiny_checkpoint(tmp_path / "base", seed=1, kind="base")
    model = load_pretrained(folder)
    saved = load_file(str(folder / "model.safetensors"))
    assert set(model.state_dict()) == set(saved)
    for key in (
        "speaker_encoder.blocks.0.conv.weight",
        "speaker_encoder.blocks.2.res2net_block.blocks.2.conv.bias",
        "speaker_encoder.blocks.1.se_block.conv2.weight",
        "speaker_encoder.mfa.conv.weight",
        "speaker_encoder.asp.tdnn.conv.weight",
        "speaker_encoder.fc.bias",
    ):
        assert key in saved, key
    with torch.no_grad():
        embedding = model.speaker_encoder(torch.randn(2, 40, 16, generator=torch.Generator().manual_seed(0)))
    assert embedding.shape == (2, 32)  # enc_dim = the talker's width
    codes = generate_codes(model.talker, model.ids, [280, 7, 8, 11, 12], speaker=embedding[0], max_frames=3)
    assert codes.shape[1] == 4 and 2 <= len(codes) <= 3
