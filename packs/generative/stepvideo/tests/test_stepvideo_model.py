"""The pack's own Step-Video-T2V DiT: its 3D RoPE is the rotation it stands for, the parameter
names and count are the released 30B model's, masked text is ignored, save / load is exact, and
the released transformer folder reads strictly and writes back bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mm_pack_stepvideo.transformer import StepVideoTransformer3DModel, apply_rope_3d

TINY = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=2, patch_size=2, caption_channels=[12, 8], rope_split=[8, 4, 4])


def test_rope_3d_rotates_each_band_by_its_axis_position() -> None:
    """Restated: in each band of width d (frame, row, column), channel pair (i, i + d/2) turns by
    position x 10000^(-2i/d), the position the token's frame, row or column in (F, H, W) order."""
    torch.manual_seed(0)
    f, h, w, split = 2, 3, 4, (8, 4, 4)
    x = torch.randn(2, f * h * w, 3, sum(split), dtype=torch.float64)
    got = apply_rope_3d(x, (f, h, w), split)
    want = torch.empty_like(x)
    start = 0
    for axis, d in enumerate(split):
        for token in range(f * h * w):
            pos = (token // (h * w), token // w % h, token % w)[axis]
            for i in range(d // 2):
                angle = torch.tensor(pos * 10000.0 ** (-2 * i / d), dtype=torch.float64)
                a, b = x[:, token, :, start + i], x[:, token, :, start + i + d // 2]
                want[:, token, :, start + i] = a * angle.cos() - b * angle.sin()
                want[:, token, :, start + i + d // 2] = b * angle.cos() + a * angle.sin()
        start += d
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)  # the frequencies are float32, as the reference computes them


def released_names(layers: int) -> set[str]:
    """The tensor names of the released transformer (the reference's StepVideoModel)."""
    block = ["norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "scale_shift_table", "ff.net.0.proj.weight", "ff.net.2.weight"]
    block += [f"attn1.{n}" for n in ("wqkv.weight", "wo.weight", "q_norm.weight", "k_norm.weight")]
    block += [f"attn2.{n}" for n in ("wq.weight", "wkv.weight", "wo.weight", "q_norm.weight", "k_norm.weight")]
    top = ["pos_embed.proj.weight", "pos_embed.proj.bias", "scale_shift_table", "proj_out.weight", "proj_out.bias", "adaln_single.linear.weight", "adaln_single.linear.bias"]
    top += [f"adaln_single.emb.timestep_embedder.linear_{i}.{p}" for i in (1, 2) for p in ("weight", "bias")]
    top += [f"caption_projection.linear_{i}.{p}" for i in (1, 2) for p in ("weight", "bias")] + ["clip_projection.weight", "clip_projection.bias"]
    return set(top) | {f"transformer_blocks.{i}.{n}" for i in range(layers) for n in block}


def test_the_30b_config_has_the_released_names_and_size() -> None:
    with torch.device("meta"):
        model = StepVideoTransformer3DModel()
    state = model.state_dict()
    assert set(state) == released_names(48)
    assert state["transformer_blocks.0.attn1.wqkv.weight"].shape == (3 * 6144, 6144)
    assert state["caption_projection.linear_1.weight"].shape == (6144, 6144) and state["clip_projection.weight"].shape == (6144, 1024)
    assert state["proj_out.weight"].shape == (64, 6144) and state["adaln_single.linear.weight"].shape == (6 * 6144, 6144)
    count = sum(p.numel() for p in model.parameters())
    assert count == 29_342_478_400  # "30B": 28.99B in the 48 blocks


def test_masked_text_is_ignored_and_save_load_is_exact(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = StepVideoTransformer3DModel(**TINY).eval()
    x, t = torch.randn(2, 4, 3, 4, 6), torch.tensor([0.2, 0.9])
    llm, clip = torch.randn(2, 5, 12), torch.randn(2, 3, 8)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 3 + 2 :] = False
    with torch.no_grad():
        out = model(x, t, llm, clip, mask, return_dict=False)[0]
        other = llm.clone()
        other[1, 2:] = torch.randn(3, 12)  # only the masked tokens of sample 1 change
        again = model(x, t, other, clip, mask, return_dict=False)[0]
    assert out.shape == x.shape and torch.equal(out, again)
    model.save_pretrained(tmp_path / "m")
    loaded = StepVideoTransformer3DModel.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.equal(loaded(x, t, llm, clip, mask, return_dict=False)[0], out)


def test_the_released_transformer_folder_reads_strictly_and_writes_back_bit_for_bit(tmp_path: Path) -> None:
    """A release-style transformer/ (the reference's config.json, its class name, sharded bf16
    safetensors) imports into this model with equal outputs, exports to the same names, shapes,
    dtypes and bits; one that does not fit is one line."""
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    from mmcore import StageError

    from mm_pack_stepvideo.public import export_public, import_public

    fields = {**TINY, "rope_split": None, "attention_head_dim": 128, "num_attention_heads": 1}
    torch.manual_seed(0)
    model = StepVideoTransformer3DModel(**fields).to(torch.bfloat16).eval()
    release = tmp_path / "release"
    release.mkdir()
    save_torch_state_dict(model.state_dict(), release, filename_pattern="diffusion_pytorch_model{suffix}.safetensors", max_shard_size="100KB")
    assert len(list(release.glob("*.safetensors"))) > 1
    config = {"_class_name": "StepVideoModel", "_diffusers_version": "0.31.0", **{k: v for k, v in fields.items() if k != "rope_split"}, "attention_type": "parallel"}
    (release / "config.json").write_text(json.dumps(config))
    imported = import_public(release, tmp_path / "ours")
    loaded = StepVideoTransformer3DModel.from_pretrained(tmp_path / "ours", torch_dtype=torch.bfloat16).eval()
    inputs = (torch.randn(1, 4, 2, 4, 4), torch.tensor([0.5]), torch.randn(1, 3, 12), torch.randn(1, 2, 8), torch.ones(1, 5))
    with torch.no_grad():
        want = model(*inputs, return_dict=False)[0]
        assert torch.equal(imported.eval()(*inputs, return_dict=False)[0], want) and torch.equal(loaded(*inputs, return_dict=False)[0], want)
    export_public(tmp_path / "ours", tmp_path / "back")
    read = {k: v for f in (tmp_path / "back").glob("*.safetensors") for k, v in load_file(f).items()}
    original = model.state_dict()
    assert set(read) == set(original) and all(torch.equal(read[k], v) and read[k].dtype == v.dtype for k, v in original.items())
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["_class_name"] == "StepVideoModel" and back["caption_channels"] == [12, 8] and "rope_split" not in back
    (release / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    with pytest.raises(StageError, match=r"release: the weights do not fit the Step-Video transformer its config\.json describes: \d+ missing \(first transformer_blocks\.2\.") as err:
        import_public(release, tmp_path / "other")
    assert "\n" not in str(err.value)
