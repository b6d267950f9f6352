"""The release layout: strict load (one line naming the tensor and the file), export back bit
for bit, and FLUX's autoencoder in BFL's names through diffusers' own conversion."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mm_pack_bagel.checkpoint import export, load_model
from mmcore.errors import StageError


def test_the_tiny_folder_has_the_release_files_and_names(tiny_dir: Path) -> None:
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"llm_config.json", "vit_config.json", "config.json", "ema.safetensors", "ae.safetensors", "tokenizer.json"} <= names
    with safe_open(tiny_dir / "ema.safetensors", "pt") as f:
        keys = set(f.keys())
        assert f.get_slice("language_model.model.embed_tokens.weight").get_dtype() == "BF16"
    for key in (
        "language_model.model.layers.0.self_attn.q_proj_moe_gen.bias",
        "language_model.model.layers.1.self_attn.k_norm_moe_gen.weight",
        "language_model.model.layers.0.mlp_moe_gen.down_proj.weight",
        "language_model.model.norm_moe_gen.weight",
        "language_model.lm_head.weight",
        "vit_model.vision_model.embeddings.patch_embedding.weight",
        "vit_model.vision_model.embeddings.position_embedding.weight",
        "vit_model.vision_model.encoder.layers.1.self_attn.out_proj.weight",
        "vit_model.vision_model.post_layernorm.bias",
        "connector.fc2.weight",
        "vit_pos_embed.pos_embed",
        "time_embedder.mlp.2.weight",
        "vae2llm.weight",
        "llm2vae.bias",
        "latent_pos_embed.pos_embed",
    ):
        assert key in keys, key
    assert not any("rotary" in k or "inv_freq" in k for k in keys)
    vit = json.loads((tiny_dir / "vit_config.json").read_text())
    assert not any(k.startswith(f"vit_model.vision_model.encoder.layers.{vit['num_hidden_layers'] - 1}.") for k in keys)  # the last layer is dropped
    with safe_open(tiny_dir / "ema.safetensors", "pt") as f:
        patch = f.get_slice("vit_model.vision_model.embeddings.patch_embedding.weight").get_shape()
    assert patch == [vit["hidden_size"], 3 * vit["patch_size"] ** 2]  # the patch convolution as a linear layer


@pytest.mark.parametrize("damage", ["missing", "unexpected", "misshapen"])
def test_a_damaged_checkpoint_is_one_line_naming_tensor_and_file(tiny_dir: Path, tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    state = load_file(str(folder / "ema.safetensors"))
    key = "language_model.model.layers.1.mlp_moe_gen.up_proj.weight"
    if damage == "missing":
        del state[key]
    elif damage == "unexpected":
        state["language_model.model.layers.1.mlp_moe_gen.extra.weight"] = torch.zeros(2)
        key = "language_model.model.layers.1.mlp_moe_gen.extra.weight"
    else:
        state[key] = state[key][:-1].clone()
    save_file(state, str(folder / "ema.safetensors"))
    with pytest.raises(StageError) as err:
        load_model(folder)
    message = str(err.value)
    assert "\n" not in message and key in message and str(folder / "ema.safetensors") in message and damage.replace("misshapen", "shape") in message


def test_bad_config_field_is_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "latent_patch_size": "two"}))
    with pytest.raises(StageError, match=r"config\.json: latent_patch_size must be a int"):
        load_model(folder)
    (folder / "config.json").unlink()
    with pytest.raises(StageError, match=r"config\.json: missing"):
        load_model(folder)


def test_export_writes_the_release_layout_back_bit_for_bit(tiny_dir: Path, tmp_path: Path) -> None:
    model = load_model(tiny_dir)
    out = export(model, tiny_dir, tmp_path / "out")
    with safe_open(tiny_dir / "ema.safetensors", "pt") as a, safe_open(out / "ema.safetensors", "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():
            x, y = a.get_tensor(key), b.get_tensor(key)
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.int16) if x.dtype == torch.bfloat16 else x, y.view(torch.int16) if y.dtype == torch.bfloat16 else y), key
    for name in ("llm_config.json", "vit_config.json", "config.json", "ae.safetensors", "tokenizer.json"):
        assert (out / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    # a trained model exports its new values under the same names
    with torch.no_grad():
        model.llm2vae.bias.add_(1.0)
    export(model, tiny_dir, tmp_path / "trained")
    again = load_model(tmp_path / "trained")
    assert torch.equal(again.llm2vae.bias, model.llm2vae.bias.to(torch.bfloat16).float())


def test_flux_autoencoder_round_trips_through_diffusers_conversion(tiny_dir: Path) -> None:
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    from mm_pack_bagel.vae import diffusers_config, load_vae, shape_from_weights, to_bfl

    bfl = load_file(str(tiny_dir / "ae.safetensors"))
    assert any(k.startswith("decoder.mid.attn_1.q.") for k in bfl) and bfl["decoder.mid.attn_1.q.weight"].ndim == 4
    vae = load_vae(tiny_dir / "ae.safetensors")
    back = to_bfl(vae.state_dict(), len(vae.config.up_block_types))
    assert set(back) == set(bfl)
    assert all(torch.equal(back[k], bfl[k]) for k in bfl)
    config = diffusers_config(shape_from_weights(tiny_dir / "ae.safetensors"))
    forward = convert_ldm_vae_checkpoint(back, config)
    assert all(torch.equal(forward[k], v) for k, v in vae.state_dict().items())


def test_autoencoder_with_a_foreign_tensor_is_rejected(tiny_dir: Path, tmp_path: Path) -> None:
    from mm_pack_bagel.vae import load_vae

    bfl = load_file(str(tiny_dir / "ae.safetensors"))
    del bfl["decoder.conv_out.bias"]
    save_file(bfl, str(tmp_path / "ae.safetensors"))
    with pytest.raises(StageError, match=r"ae\.safetensors: does not match FLUX's autoencoder layout \(missing decoder\.conv_out\.bias\)"):
        load_vae(tmp_path / "ae.safetensors")
