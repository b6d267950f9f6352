"""Conversion: the public layout (timm's SigLIP names with a fused qkv, one tensor per routed
expert) covers the composed model exactly, converts both ways bit for bit, and the export
loads with the same logits."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from mm_pack_deepseek_vl2.family import FAMILY
from mm_pack_deepseek_vl2.model import DeepseekVL2ForCausalLM
from mm_pack_deepseek_vl2.names import ADAPTER


def hub_index(folder: Path) -> dict:
    from safetensors import safe_open

    from mmcore.engines.state_dict import TensorInfo

    with safe_open(folder / "model.safetensors", "pt") as f:
        return {k: TensorInfo(tuple(f.get_slice(k).get_shape()), torch.float32) for k in f.keys()}


@pytest.mark.parametrize("preset", ["tiny", "tiny-mla"])
def test_every_public_tensor_has_its_model_name_and_back(preset: str, tiny_dir: Path, tmp_path: Path) -> None:
    """Key coverage from names and shapes, for the decoder without MLA (VL2-Tiny) and with it."""
    from mmcore.engines.state_dict import TensorInfo
    from mm_pack_deepseek_vl2.tiny import build_init_checkpoint

    folder = tiny_dir
    if preset != "tiny":
        folder = tmp_path / preset
        build_init_checkpoint(preset, folder, seed=0)
    hub = hub_index(folder)
    assert "vision.blocks.1.attn.qkv.weight" in hub and "vision.pos_embed" in hub and "view_seperator" in hub and "image_newline" in hub
    assert "language.model.layers.1.mlp.experts.3.up_proj.weight" in hub and "projector.layers.2.weight" in hub and "language.lm_head.weight" in hub
    assert ("language.model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in hub) == (preset == "tiny-mla")
    model = FAMILY.build_model(folder)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    plan = copy.deepcopy(ADAPTER).to_mm(hub)
    assert {k: r.info.shape for k, r in plan.items()} == want
    back = copy.deepcopy(ADAPTER).to_hf({k: TensorInfo(s, torch.float32) for k, s in want.items()})
    assert {k: r.info.shape for k, r in back.items()} == {k: v.shape for k, v in hub.items()}


def test_the_attention_pool_head_is_left_out(tiny_dir: Path) -> None:
    """The released checkpoint may hold SigLIP's attention-pool head (timm builds it; the model ignores it)."""
    from mmcore.engines.state_dict import TensorInfo

    hub = hub_index(tiny_dir)
    hub["vision.attn_pool.latent"] = TensorInfo((1, 1, 32), torch.float32)
    assert "vision.attn_pool.latent" not in str(list(copy.deepcopy(ADAPTER).to_mm(hub)))
    assert ADAPTER.round_trip_name("vision.attn_pool.latent") is None


def test_round_trip_is_bit_exact_and_the_export_answers_alike(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    adapter = copy.deepcopy(ADAPTER)
    hf_to_dcp(tiny_dir, tmp_path / "dcp", adapter)
    model = FAMILY.build_model(tiny_dir)
    load_converted(model, tmp_path / "dcp")
    reference = DeepseekVL2ForCausalLM.from_pretrained(tiny_dir)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", adapter)
    assert compare_hf(tiny_dir, tmp_path / "back") == []  # every public tensor, bit for bit
    (tmp_path / "back" / "config.json").write_text((tiny_dir / "config.json").read_text())
    again = DeepseekVL2ForCausalLM.from_pretrained(tmp_path / "back")
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
