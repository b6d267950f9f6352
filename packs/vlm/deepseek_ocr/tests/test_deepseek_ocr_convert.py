"""Conversion: the public layout (SAM's own names, CLIP's fused ``qkv_proj``, the decoder at
``model.layers`` with one tensor per routed expert) covers the composed model exactly, converts
both ways bit for bit, loads strictly, and the export loads with the same logits."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from mm_pack_deepseek_ocr.family import FAMILY
from mm_pack_deepseek_ocr.model import DeepseekOcrForCausalLM
from mm_pack_deepseek_ocr.names import ADAPTER

# The released checkpoint's names (model-00001-of-000001.safetensors, 2710 tensors), digits as <n>.
RELEASED = {
    "lm_head.weight", "model.embed_tokens.weight", "model.norm.weight", "model.image_newline", "model.view_seperator",
    "model.projector.layers.weight", "model.projector.layers.bias",
    *(f"model.layers.<n>.{k}" for k in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                                        "mlp.gate.weight", "mlp.experts.<n>.gate_proj.weight", "mlp.experts.<n>.up_proj.weight", "mlp.experts.<n>.down_proj.weight",
                                        "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight", "mlp.shared_experts.down_proj.weight")),
    *(f"model.sam_model.blocks.<n>.{k}" for k in ("norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                                                 "attn.rel_pos_h", "attn.rel_pos_w", "norm2.weight", "norm2.bias", "mlp.lin1.weight", "mlp.lin1.bias", "mlp.lin2.weight", "mlp.lin2.bias")),
    "model.sam_model.patch_embed.proj.weight", "model.sam_model.patch_embed.proj.bias", "model.sam_model.pos_embed",
    "model.sam_model.neck.<n>.weight", "model.sam_model.neck.<n>.bias", "model.sam_model.net_<n>.weight",
    "model.vision_model.embeddings.class_embedding", "model.vision_model.embeddings.patch_embedding.weight", "model.vision_model.embeddings.position_embedding.weight",
    "model.vision_model.pre_layrnorm.weight", "model.vision_model.pre_layrnorm.bias",
    *(f"model.vision_model.transformer.layers.<n>.{k}" for k in ("layer_norm1.weight", "layer_norm1.bias", "self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias",
                                                                "self_attn.out_proj.weight", "self_attn.out_proj.bias", "layer_norm2.weight", "layer_norm2.bias",
                                                                "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias")),
}  # fmt: skip


def hub_index(folder: Path) -> dict:
    from safetensors import safe_open

    from mmcore.engines.state_dict import TensorInfo

    with safe_open(folder / "model.safetensors", "pt") as f:
        return {k: TensorInfo(tuple(f.get_slice(k).get_shape()), torch.float32) for k in f.keys()}


def test_the_tiny_checkpoint_has_the_released_names(tiny_dir: Path) -> None:
    assert {re.sub(r"\.\d+", ".<n>", k).replace("net_2", "net_<n>").replace("net_3", "net_<n>") for k in hub_index(tiny_dir)} == RELEASED
    config = json.loads((tiny_dir / "config.json").read_text())
    assert set(config["vision_config"]["width"]) == {"sam_vit_b", "clip-l-14-224"} and config["projector_config"]["projector_type"] == "linear"
    assert config["language_config"]["use_mla"] is False and config["hidden_size"] == config["language_config"]["hidden_size"]  # repeated at the top, as released


@pytest.mark.parametrize("preset", ["tiny", "tiny-mla"])
def test_every_public_tensor_has_its_model_name_and_back(preset: str, tiny_dir: Path, tmp_path: Path) -> None:
    """Key coverage from names and shapes, for the released decoder (no MLA) and one with MLA."""
    from mmcore.engines.state_dict import TensorInfo
    from mm_pack_deepseek_ocr.tiny import build_init_checkpoint

    folder = tiny_dir
    if preset != "tiny":
        folder = tmp_path / preset
        build_init_checkpoint(preset, folder, seed=0)
    hub = hub_index(folder)
    assert ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in hub) == (preset == "tiny-mla")
    model = FAMILY.build_model(folder)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    plan = copy.deepcopy(ADAPTER).to_mm(hub)
    assert {k: r.info.shape for k, r in plan.items()} == want
    back = copy.deepcopy(ADAPTER).to_hf({k: TensorInfo(s, torch.float32) for k, s in want.items()})
    assert {k: r.info.shape for k, r in back.items()} == {k: v.shape for k, v in hub.items()}


def test_round_trip_is_bit_exact_and_the_export_answers_alike(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    adapter = copy.deepcopy(ADAPTER)
    hf_to_dcp(tiny_dir, tmp_path / "dcp", adapter)
    model = FAMILY.build_model(tiny_dir)
    load_converted(model, tmp_path / "dcp")
    reference = DeepseekOcrForCausalLM.from_pretrained(tiny_dir)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", adapter)
    assert compare_hf(tiny_dir, tmp_path / "back") == []  # every public tensor, bit for bit
    (tmp_path / "back" / "config.json").write_text((tiny_dir / "config.json").read_text())
    again = DeepseekOcrForCausalLM.from_pretrained(tmp_path / "back")
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


def test_a_missing_tensor_is_refused_by_name(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(tiny_dir / "model.safetensors"))
    del state["model.vision_model.pre_layrnorm.bias"]
    (tmp_path / "m").mkdir()
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    (tmp_path / "m" / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(ValueError, match="missing .*pre_layrnorm.bias"):
        DeepseekOcrForCausalLM.from_pretrained(tmp_path / "m")


def test_the_config_keeps_the_public_fields(tiny_dir: Path, tmp_path: Path) -> None:
    """An export's config.json is the public one: no derived transformers configs written back."""
    from mm_pack_deepseek_ocr.model import DeepseekOcrConfig

    DeepseekOcrConfig.from_pretrained(tiny_dir).save_pretrained(tmp_path)
    saved, public = json.loads((tmp_path / "config.json").read_text()), json.loads((tiny_dir / "config.json").read_text())
    assert not {"text_config", "sam_config", "clip_config"} & set(saved)
    for key in ("vision_config", "projector_config", "language_config", "n_routed_experts", "first_k_dense_replace", "image_token_id"):
        assert saved[key] == public[key], key


def test_the_released_config_builds_the_released_checkpoint(tmp_path: Path) -> None:
    """deepseek-ai/DeepSeek-OCR's config.json (as published) on the meta device: its 2710 public
    tensors with the released shapes and 3,336,106,240 parameters, the hub's own count."""
    from mmcore.engines.state_dict import TensorInfo
    from mm_pack_deepseek_ocr.model import DeepseekOcrConfig

    (tmp_path / "config.json").write_text((Path(__file__).parent / "released_config.json").read_text())
    config = DeepseekOcrConfig.from_pretrained(tmp_path)
    assert config.text_config.rope_parameters["rope_theta"] == 10000.0 and config.text_config.head_dim == 128 and config.image_token_id == 128815
    with torch.device("meta"):
        model = DeepseekOcrForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 3_336_106_240
    plan = copy.deepcopy(ADAPTER).to_hf({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in model.state_dict().items()})
    shapes = {k: r.info.shape for k, r in plan.items()}
    assert len(shapes) == 2710 and {re.sub(r"\.\d+", ".<n>", k).replace("net_2", "net_<n>").replace("net_3", "net_<n>") for k in shapes} == RELEASED
    assert shapes["model.sam_model.pos_embed"] == (1, 64, 64, 768) and shapes["model.sam_model.blocks.2.attn.rel_pos_h"] == (127, 64) and shapes["model.sam_model.blocks.0.attn.rel_pos_h"] == (27, 64)
    assert shapes["model.vision_model.embeddings.position_embedding.weight"] == (257, 1024) and shapes["model.sam_model.net_3.weight"] == (1024, 512, 3, 3)
    assert shapes["model.layers.11.mlp.experts.63.down_proj.weight"] == (1280, 896) and shapes["model.vision_model.transformer.layers.23.self_attn.qkv_proj.weight"] == (3072, 1024)
