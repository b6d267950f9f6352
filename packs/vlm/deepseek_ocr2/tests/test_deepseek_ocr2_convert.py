"""Conversion: the released layout (deepseek-ai's names, one tensor per expert), which
transformers' ``save_pretrained`` writes, and transformers' own names both convert to the same
model; the round trip is bit-exact and exports have the released layout."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch

from mm_pack_deepseek_ocr2.family import ADAPTER, FAMILY


def test_every_hub_tensor_has_its_model_name_and_back(tiny_dir: Path) -> None:
    """Key coverage from names and shapes: every tensor of the saved checkpoint lands on a
    parameter of the model (the per-expert ones stacked), and the way back gives the hub names."""
    from safetensors import safe_open

    from mmcore.engines.state_dict import TensorInfo

    with safe_open(next(tiny_dir.glob("*.safetensors")), "pt") as f:
        hub = {k: TensorInfo(tuple(f.get_slice(k).get_shape()), torch.float32) for k in f.keys()}
    assert any(k.startswith("model.sam_model.") for k in hub) and any(k.startswith("model.qwen2_model.") for k in hub) and "model.view_seperator" in hub
    assert any(".mlp.experts.3.up_proj.weight" in k for k in hub)
    model = FAMILY.build_model(tiny_dir)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    plan = copy.deepcopy(ADAPTER).to_mm(hub)
    assert {k: r.info.shape for k, r in plan.items()} == want
    back = copy.deepcopy(ADAPTER).to_hf({k: TensorInfo(s, torch.float32) for k, s in want.items()})
    assert set(back) == set(hub)


def test_released_and_transformers_layouts_convert_to_the_same_model(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file
    from transformers import DeepseekOcr2ForConditionalGeneration

    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    reference = DeepseekOcr2ForConditionalGeneration.from_pretrained(tiny_dir).eval()
    held = tmp_path / "held"
    shutil.copytree(tiny_dir, held)
    state = {k: v.contiguous() for k, v in reference.state_dict().items() if k != "lm_head.weight" or not reference.config.tie_word_embeddings}
    save_file(state, next(held.glob("*.safetensors")), metadata={"format": "pt"})
    ids = torch.randint(0, 300, (1, 12))
    for source in (tiny_dir, held):
        adapter = copy.deepcopy(ADAPTER)
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
