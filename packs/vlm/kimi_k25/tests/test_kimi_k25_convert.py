"""Conversion: the released layout (Moonshot's names, the vision attention's fused ``wqkv`` in
complex-RoPE order, one tensor per expert), transformers' ``save_pretrained`` layout and
transformers' in-memory names all convert to the model ``from_pretrained`` makes of the released
folder; the round trip is bit-exact and exports have the released layout."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch

from mm_pack_kimi_k25.family import FAMILY, adapter_for


def _hub(folder: Path) -> dict:
    from safetensors import safe_open

    from mmcore.engines.state_dict import TensorInfo

    with safe_open(next(folder.glob("*.safetensors")), "pt") as f:
        return {k: TensorInfo(tuple(f.get_slice(k).get_shape()), torch.float32) for k in f.keys()}


def test_every_hub_tensor_has_its_model_name_and_back(tiny_dir: Path) -> None:
    """Key coverage from names and shapes: every tensor of the released layout lands on a
    parameter of the model (per-expert ones stacked, ``wqkv`` split), and the way back gives
    the hub names."""
    from mmcore.engines.state_dict import TensorInfo

    hub = _hub(tiny_dir)
    for name in ("vision_tower.patch_embed.proj.weight", "vision_tower.patch_embed.pos_emb.weight", "vision_tower.encoder.blocks.1.wqkv.weight", "vision_tower.encoder.blocks.0.norm0.weight"):
        assert name in hub, name
    assert "mm_projector.pre_norm.weight" in hub and "mm_projector.proj.2.weight" in hub and "language_model.lm_head.weight" in hub
    assert "language_model.model.layers.1.mlp.experts.3.up_proj.weight" in hub and "language_model.model.layers.1.mlp.gate.e_score_correction_bias" in hub
    model = FAMILY.build_model(tiny_dir)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    adapter = adapter_for(tiny_dir)
    plan = copy.deepcopy(adapter).to_mm(hub)
    assert {k: r.info.shape for k, r in plan.items()} == want
    back = copy.deepcopy(adapter).to_hf({k: TensorInfo(s, torch.float32) for k, s in want.items()})
    assert set(back) == set(hub)


def test_released_saved_and_in_memory_layouts_convert_to_the_same_model(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file
    from transformers import Kimi_K25ForConditionalGeneration

    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    # transformers' own reading of the released folder (its Chunk + PermuteForRope for wqkv)
    reference = Kimi_K25ForConditionalGeneration.from_pretrained(tiny_dir).eval()
    saved, held = tmp_path / "saved", tmp_path / "held"
    reference.save_pretrained(saved)  # transformers' save layout: language_model.model.blocks.*, ...
    assert any(k.startswith("language_model.model.blocks.") for k in _hub(saved))
    shutil.copytree(tiny_dir, held)
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, next(held.glob("*.safetensors")), metadata={"format": "pt"})
    ids = torch.randint(0, 300, (1, 12))
    for source in (tiny_dir, saved, held):
        adapter = adapter_for(tiny_dir)
        hf_to_dcp(source, tmp_path / f"dcp-{source.name}", adapter)
        model = FAMILY.build_model(tiny_dir)
        load_converted(model, tmp_path / f"dcp-{source.name}")
        for name, tensor in reference.state_dict().items():
            assert torch.equal(model.state_dict()[name], tensor), (source, name)
        with torch.no_grad():
            assert torch.equal(model.eval()(input_ids=ids).logits, reference(input_ids=ids).logits), source
        back = tmp_path / f"back-{source.name}"
        dcp_to_hf(tmp_path / f"dcp-{source.name}", back, adapter)
        assert compare_hf(tiny_dir, back) == [], source  # exports have the released layout


def test_the_unbound_adapter_says_what_it_lacks(tiny_dir: Path) -> None:
    import pytest

    from mm_pack_kimi_k25.family import ADAPTER

    plan = copy.deepcopy(ADAPTER).to_mm(_hub(tiny_dir))
    recipe = plan["model.vision_tower.layers.0.attn.q_proj.weight"]
    with pytest.raises(ValueError, match="vision_heads"):
        recipe.combine(torch.zeros(3 * recipe.info.shape[0], recipe.info.shape[1]))
