"""Conversion: the transformers-format checkpoint's names are the model's own (transformers has
no conversion mapping for janus), every tensor lands on its parameter, the round trip is
bit-exact, and an untied ``lm_head`` (a config with ``tie_word_embeddings: false``) travels too."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch

from mm_pack_janus.family import ADAPTER, FAMILY


def test_every_hub_tensor_has_its_model_name_and_back(tiny_dir: Path) -> None:
    from safetensors import safe_open

    from mmcore.engines.state_dict import TensorInfo

    with safe_open(next(tiny_dir.glob("*.safetensors")), "pt") as f:
        hub = {k: TensorInfo(tuple(f.get_slice(k).get_shape()), torch.float32) for k in f.keys()}
    for part in ("model.vision_model.", "model.aligner.", "model.vqmodel.", "model.generation_head.", "model.generation_embeddings.", "model.language_model."):
        assert any(k.startswith(part) for k in hub), part
    assert "lm_head.weight" not in hub  # tied to the text embedding (JanusConfig's tie_word_embeddings)
    model = FAMILY.build_model(tiny_dir)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    plan = copy.deepcopy(ADAPTER).to_mm(hub)
    assert {k: r.info.shape for k, r in plan.items()} == want
    back = copy.deepcopy(ADAPTER).to_hf({k: TensorInfo(s, torch.float32) for k, s in want.items()})
    assert set(back) == set(hub)


def test_tied_and_untied_checkpoints_round_trip_bit_exactly(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import JanusForConditionalGeneration

    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    untied = tmp_path / "untied"
    shutil.copytree(tiny_dir, untied)
    config = json.loads((untied / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    torch.manual_seed(1)
    model = JanusForConditionalGeneration.from_pretrained(untied)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight))  # its own output projection
    model.save_pretrained(untied)
    ids = torch.randint(0, 300, (1, 12))
    for source in (tiny_dir, untied):
        reference = JanusForConditionalGeneration.from_pretrained(source).eval()
        adapter = copy.deepcopy(ADAPTER)
        hf_to_dcp(source, tmp_path / f"dcp-{source.name}", adapter)
        built = FAMILY.build_model(source)
        load_converted(built, tmp_path / f"dcp-{source.name}")
        for name, tensor in reference.state_dict().items():
            assert torch.equal(built.state_dict()[name], tensor), (source, name)
        with torch.no_grad():
            assert torch.equal(built.eval()(input_ids=ids).logits, reference(input_ids=ids).logits), source
        back = tmp_path / f"back-{source.name}"
        dcp_to_hf(tmp_path / f"dcp-{source.name}", back, adapter)
        assert compare_hf(source, back) == [], source
    assert not torch.equal(reference.lm_head.weight, reference.model.language_model.embed_tokens.weight)
