"""Conversion HF <-> mmcore (DCP): bit-exact round trips, loadable in training and by transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm_pack_qwen2vl.adapter import ADAPTER
from mm_pack_qwen2vl.family import FAMILY, model_class
from mmcore.engines import compare_hf, dcp_index, dcp_to_hf, hf_to_dcp


@pytest.mark.parametrize("which", ["tiny_dir", "tiny25_dir"])
def test_round_trip_is_bit_identical(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    source = request.getfixturevalue(which)
    hf_to_dcp(source, tmp_path / "dcp", ADAPTER)
    index = dcp_index(tmp_path / "dcp")
    assert all(k.startswith(("model.visual.", "model.language_model.", "lm_head.")) for k in index)
    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", ADAPTER)
    assert compare_hf(source, tmp_path / "back") == []


def test_compare_sees_one_flipped_bit(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    (tmp_path / "changed").mkdir()
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    key = "lm_head.weight"
    flat = tensors[key].view(-1).view(torch.int32)
    flat[7] ^= 1
    save_file(tensors, str(tmp_path / "changed" / "model.safetensors"))
    assert compare_hf(tiny_dir, tmp_path / "changed") == [f"{key}: values differ"]


def test_converted_checkpoint_gives_the_same_logits_as_from_pretrained(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig

    hf_to_dcp(tiny_dir, tmp_path / "dcp", ADAPTER)
    ours = FAMILY.build_model(tiny_dir, tmp_path / "dcp").eval()
    theirs = model_class(AutoConfig.from_pretrained(tiny_dir)).from_pretrained(tiny_dir, attn_implementation="sdpa").eval()
    ids = torch.randint(0, 300, (2, 12))
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, theirs(input_ids=ids).logits)


def test_export_in_several_shards_loads_in_transformers(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.engines import copy_side_files

    hf_to_dcp(tiny_dir, tmp_path / "dcp", ADAPTER)
    stats = dcp_to_hf(tmp_path / "dcp", tmp_path / "sharded", ADAPTER, max_shard_bytes=200_000)
    assert stats["shards"] > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    copy_side_files(tiny_dir, tmp_path / "sharded")
    assert compare_hf(tiny_dir, tmp_path / "sharded") == []
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / "sharded")
    assert model.lm_head.weight.shape[0] == model.config.text_config.vocab_size
