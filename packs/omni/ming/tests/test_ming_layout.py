"""The release layout: names, strict load (one line naming the tensor and the file), the
talker's tensors kept, export back bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mm_pack_ming.checkpoint import INDEX, export, load_model
from mmcore.errors import StageError


def _all(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("model-*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_the_tiny_folder_has_the_release_files_and_names(tiny_dir: Path) -> None:
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", INDEX, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.json"} <= names
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["BailingMMNativeForConditionalGeneration"] and config["mlp_depth"] == 2
    assert config["llm_config"]["multi_gate"] and config["llm_config"]["norm_head"]
    weight_map = json.loads((tiny_dir / INDEX).read_text())["weight_map"]
    for key in (
        "model.model.word_embeddings.weight",
        "model.model.layers.1.attention.query_key_value.weight",
        "model.model.layers.0.attention.dense.weight",
        "model.model.layers.0.mlp.gate.weight",
        "model.model.layers.0.mlp.image_gate.weight",
        "model.model.layers.1.mlp.audio_gate.weight",
        "model.model.layers.1.mlp.experts.3.down_proj.weight",
        "model.model.layers.0.mlp.shared_experts.up_proj.weight",
        "model.model.norm.weight",
        "model.lm_head.weight",
        "vision.patch_embed.proj.weight",
        "vision.blocks.1.attn.qkv.bias",
        "vision.merger.mlp.2.weight",
        "audio.encoders0.0.self_attn.linear_q_k_v.weight",
        "audio.encoders.0.self_attn.fsmn_block.weight",
        "audio.encoders.0.feed_forward.w_1.bias",
        "audio.after_norm.weight",
        "linear_proj.2.weight",
        "linear_proj_audio.0.weight",
        "linear_proj_audio.3.weight",
    ):
        assert key in weight_map, key
    assert not any("inv_freq" in k or "rotary" in k for k in weight_map)
    with safe_open(tiny_dir / weight_map["model.lm_head.weight"], "pt") as f:
        assert f.get_slice("model.lm_head.weight").get_dtype() == "BF16"
    llm = config["llm_config"]
    qkv = _all(tiny_dir)["model.model.layers.0.attention.query_key_value.weight"]
    assert list(qkv.shape) == [(llm["num_attention_heads"] + 2 * llm["num_key_value_heads"]) * llm["hidden_size"] // llm["num_attention_heads"], llm["hidden_size"]]


@pytest.mark.parametrize("damage", ["missing", "unexpected", "misshapen"])
def test_a_damaged_checkpoint_is_one_line_naming_tensor_and_file(tiny_dir: Path, tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    shard = folder / "model-00002-of-00002.safetensors"
    state = load_file(str(shard))
    key = next(k for k in state if k.startswith("model.model.layers.1.mlp.experts"))
    if damage == "missing":
        del state[key]
    elif damage == "unexpected":
        state["model.model.layers.1.mlp.extra.weight"] = torch.zeros(2)
        key = "model.model.layers.1.mlp.extra.weight"
    else:
        state[key] = torch.zeros(3, 3, dtype=torch.bfloat16)
    save_file(state, str(shard))
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k in state or v != shard.name}
    index["weight_map"].update({k: shard.name for k in state})
    (folder / INDEX).write_text(json.dumps(index))
    with pytest.raises(StageError) as err:
        load_model(folder)
    message = str(err.value)
    words = {"missing": "missing tensor", "unexpected": "unexpected tensor", "misshapen": "has shape [3, 3]"}[damage]
    assert "\n" not in message and key in message and words in message and str(folder) in message


def test_a_bad_config_field_is_one_line_naming_it(tiny_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["llm_config"]["num_experts_per_tok"] = "six"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(StageError, match=r"config.json: llm_config.num_experts_per_tok must be a int"):
        load_model(folder)


def test_export_writes_the_release_layout_back_bit_for_bit_and_keeps_the_talker(tiny_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "with-talker"
    shutil.copytree(tiny_dir, folder)
    # a talker's tensors (out of scope: not built) in the last shard, and its subfolder
    shard = folder / "model-00002-of-00002.safetensors"
    state = load_file(str(shard))
    talker = {"talker.model.embed_tokens.weight": torch.randn(5, 3).to(torch.bfloat16), "talker.lm_head.weight": torch.randn(4, 3)}
    save_file({**state, **talker}, str(shard), metadata={"format": "pt"})
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"].update({k: shard.name for k in talker})
    (folder / INDEX).write_text(json.dumps(index))
    (folder / "talker").mkdir()
    (folder / "talker" / "config.json").write_text("{}")

    model = load_model(folder)
    out = export(model, folder, tmp_path / "out")
    before, after = _all(folder), _all(out)
    assert list(before) == list(after)
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype and torch.equal(after[key], tensor), key
    assert json.loads((out / INDEX).read_text()) == json.loads((folder / INDEX).read_text())
    assert (out / "talker" / "config.json").is_file() and (out / "tokenizer.json").is_file()

    with torch.no_grad():  # a trained weight is what export writes, in the file's dtype
        model.model.lm_head.weight.add_(1.0)
    again = _all(export(model, folder, tmp_path / "out2"))
    assert torch.equal(again["model.lm_head.weight"], model.model.lm_head.weight.to(torch.bfloat16))
    assert torch.equal(again["talker.lm_head.weight"], talker["talker.lm_head.weight"])


def test_download_of_a_local_release_folder_checks_its_layout_in_one_line(mm, tiny_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "release"
    shutil.copytree(tiny_dir, folder)
    ok = mm("download", "--pack", "ming", "--preset", "tiny", "--run-dir", "good", f"model.source={folder}", check=False)
    assert ok.returncode == 0 and "release layout checked: 113 tensors in 2 file(s)" in ok.stdout, ok.stderr[-2000:]
    shard = folder / "model-00001-of-00002.safetensors"
    state = load_file(str(shard))
    key = sorted(state)[0]
    state[key] = state[key][:1].contiguous()
    save_file(state, str(shard))
    bad = mm("download", "--pack", "ming", "--preset", "tiny", "--run-dir", "bad", f"model.source={folder}", check=False)
    lines = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode != 0 and len(lines) == 1 and key in lines[0] and str(shard) in lines[0], bad.stderr[-2000:]
