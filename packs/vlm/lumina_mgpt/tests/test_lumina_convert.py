"""Conversion: transformers' Chameleon names both ways, bit for bit; Lumina-mGPT's own layout
(q/k norms stored one row per model-parallel shard, ``ChameleonXLLMXForConditionalGeneration``
in the config) is read, repeated per head exactly as its model does at run time, and exported
in transformers' layout, which ``ChameleonForConditionalGeneration`` loads with equal logits."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mm_pack_lumina_mgpt.family import ADAPTER, FAMILY


def _hub(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def test_every_hub_tensor_lands_on_its_parameter_and_back(tiny_dir: Path) -> None:
    from mmcore.engines import TensorInfo

    hub = {k: TensorInfo(tuple(v.shape), v.dtype) for k, v in _hub(tiny_dir).items()}
    assert any(k.startswith("model.vqmodel.encoder.") for k in hub) and "lm_head.weight" in hub  # untied, as Chameleon's
    model = FAMILY.build_model(tiny_dir)
    plan = copy.deepcopy(ADAPTER).to_mm(hub)
    assert {k: r.info.shape for k, r in plan.items()} == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert set(copy.deepcopy(ADAPTER).to_hf({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in model.state_dict().items()})) == set(hub)


def lumina_layout(source: Path, out: Path, shards: int) -> dict[str, torch.Tensor]:
    """``source`` rewritten as Lumina-mGPT's checkpoints are: q/k norms one row per shard (the
    rows of a shard's heads equal), its config class and fields. Returns transformers' tensors."""
    shutil.copytree(source, out)
    tensors = _hub(out)
    torch.manual_seed(3)
    expanded = {}
    for key, value in list(tensors.items()):
        if ".self_attn.q_norm." in key or ".self_attn.k_norm." in key:
            rows = torch.randn(shards, value.shape[-1]) + (1.0 if key.endswith("weight") else 0.0)
            tensors[key] = rows
            expanded[key] = rows.repeat_interleave(value.shape[0] // shards, dim=0)
    for file in out.glob("*.safetensors"):
        file.unlink()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=["ChameleonXLLMXForConditionalGeneration"], model_parallel_size=shards, z_loss_weight=1e-5, mask_image_logits=False, dropout=0.05)
    (out / "config.json").write_text(json.dumps(config))
    return {**tensors, **expanded}


@pytest.mark.parametrize("shards", [1, 2])
def test_lumina_layout_converts_and_exports_to_transformers_layout(tiny_dir: Path, tmp_path: Path, shards: int) -> None:
    from transformers import ChameleonForConditionalGeneration

    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    lumina = tmp_path / "lumina"
    want = lumina_layout(tiny_dir, lumina, shards)
    adapter = copy.deepcopy(ADAPTER)
    hf_to_dcp(lumina, tmp_path / "dcp", adapter)
    built = FAMILY.build_model(lumina)
    load_converted(built, tmp_path / "dcp")
    for name, tensor in built.state_dict().items():
        assert torch.equal(tensor, want[name]), name
    back = tmp_path / "back"
    dcp_to_hf(tmp_path / "dcp", back, adapter)
    # the round trip gives transformers' layout: Lumina's rows, each repeated per head, bit for bit
    assert compare_hf(lumina, back, adapter.round_trip_name, adapter.round_trip_tensor) == []
    shutil.copy(tiny_dir / "config.json", back / "config.json")
    reference = ChameleonForConditionalGeneration.from_pretrained(back).eval()
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        assert torch.equal(reference(input_ids=ids).logits, built.eval()(input_ids=ids).logits)


def test_transformers_layout_round_trips_bit_exactly(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    adapter = copy.deepcopy(ADAPTER)
    hf_to_dcp(tiny_dir, tmp_path / "dcp", adapter)
    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", adapter)
    assert compare_hf(tiny_dir, tmp_path / "back") == []
    assert not adapter._lumina  # nothing was Lumina's layout
