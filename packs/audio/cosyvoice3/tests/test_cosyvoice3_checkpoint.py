"""The public checkpoint layout: the yaml read as the reference reads it, strict loading, one-line
errors on a bad folder, and the convert round trip (pt -> safetensors -> DCP -> safetensors -> pt)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from mm_pack_cosyvoice3.config import parse_config, read_hyperpyyaml
from mm_pack_cosyvoice3.model import CheckpointError, load_pretrained, pt_to_safetensors, safetensors_to_pt


def test_yaml_fields_and_references_resolve(tiny_dir: Path) -> None:
    raw = read_hyperpyyaml(tiny_dir / "cosyvoice3.yaml")
    assert raw["llm"]["__tag__"] == "!new:cosyvoice.llm.llm.CosyVoice3LM"
    cfg = parse_config(tiny_dir / "cosyvoice3.yaml")
    assert cfg.flow.static_chunk_size == 50  # !ref <chunk_size> * <token_mel_ratio>
    assert cfg.lm.llm_input_size == 32 and cfg.lm.speech_token_size == 64 and cfg.lm.top_k == 25
    assert (cfg.hift.sampling_rate, cfg.hift.hop_size, cfg.hift.f0_cond_channels) == (24000, 480, 16)


def test_public_layout_loads_strictly(tiny_dir: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    for part in ("llm", "flow", "hift"):
        saved = torch.load(tiny_dir / f"{part}.pt", weights_only=True)
        assert set(saved) == set(getattr(tiny_model, part).state_dict())
    keys = set(torch.load(tiny_dir / "flow.pt", weights_only=True))
    assert "decoder.estimator.rotary_embed.inv_freq" in keys  # x-transformers stores it
    assert "llm.model.lm_head.weight" in torch.load(tiny_dir / "llm.pt", weights_only=True)
    assert any(k.endswith("parametrizations.weight.original0") for k in torch.load(tiny_dir / "hift.pt", weights_only=True))


def test_hift_generator_prefix_and_old_weight_norm_names_load(tiny_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    state = torch.load(folder / "hift.pt", weights_only=True)
    renamed = {"generator." + k.replace("parametrizations.weight.original0", "weight_g").replace("parametrizations.weight.original1", "weight_v"): v for k, v in state.items()}
    torch.save(renamed, folder / "hift.pt")
    model = load_pretrained(folder)
    assert torch.equal(model.hift.conv_pre.parametrizations.weight.original1, state["conv_pre.parametrizations.weight.original1"])


@pytest.mark.parametrize("damage", ["missing_key", "extra_key", "shape", "not_a_state_dict", "no_yaml"])
def test_bad_checkpoint_fails_in_one_line(tiny_dir: Path, tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    flow = torch.load(folder / "flow.pt", weights_only=True)
    if damage == "missing_key":
        flow.pop("input_embedding.weight")
    elif damage == "extra_key":
        flow["decoder.estimator.extra.weight"] = torch.zeros(1)
    elif damage == "shape":
        flow["input_embedding.weight"] = torch.zeros(3, 80)
    elif damage == "not_a_state_dict":
        flow = [1, 2]
    if damage == "no_yaml":
        (folder / "cosyvoice3.yaml").unlink()
    else:
        torch.save(flow, folder / "flow.pt")
    with pytest.raises(CheckpointError) as info:
        load_pretrained(folder)
    message = str(info.value)
    assert "\n" not in message and str(folder) in message
    expected = {
        "missing_key": "1 missing (first input_embedding.weight)",
        "extra_key": "1 unexpected",
        "shape": "(3, 80) in the checkpoint",
        "not_a_state_dict": "holds a list",
        "no_yaml": "no cosyvoice3.yaml",
    }
    assert expected[damage] in message


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def test_an_untied_lm_head_goes_through_the_round_trip_as_its_own_tensor(tmp_path: Path) -> None:
    from mmcore.engines import dcp_to_hf, hf_to_dcp

    from mm_pack_cosyvoice3.adapter import ADAPTER
    from mm_pack_cosyvoice3.tiny import build_tiny_checkpoint

    folder = build_tiny_checkpoint(tmp_path / "untied", seed=1, tie_word_embeddings=False)
    pt_to_safetensors(folder, tmp_path / "st")
    hf_to_dcp(tmp_path / "st", tmp_path / "dcp", ADAPTER)
    dcp_to_hf(tmp_path / "dcp", tmp_path / "st2", ADAPTER)
    safetensors_to_pt(tmp_path / "st2", tmp_path / "pt")
    a, b = (torch.load(f / "llm.pt", weights_only=True) for f in (folder, tmp_path / "pt"))
    head, embed = "llm.model.lm_head.weight", "llm.model.model.embed_tokens.weight"
    assert not torch.equal(a[head], a[embed]) and _bits(a[head]) == _bits(b[head]) and _bits(a[embed]) == _bits(b[embed])


def test_convert_round_trip_is_bit_identical(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.engines import RenameAdapter, dcp_to_hf, hf_to_dcp
    from mmcore.engines.coverage import coverage_problems, expected_tensors

    from mm_pack_cosyvoice3.adapter import ADAPTER
    from mm_pack_cosyvoice3.model import build_model

    assert isinstance(ADAPTER, RenameAdapter)
    st, dcp, back_st, back = tmp_path / "st", tmp_path / "dcp", tmp_path / "st2", tmp_path / "pt"
    pt_to_safetensors(tiny_dir, st)
    with torch.device("meta"):
        meta = build_model(st)
    from safetensors import safe_open

    with safe_open(str(st / "model.safetensors"), "pt") as f:
        planned = {k: r.info for k, r in ADAPTER.to_mm({k: _info(f.get_slice(k)) for k in f.keys()}).items()}
    assert coverage_problems(planned, *expected_tensors(meta)) == []
    hf_to_dcp(st, dcp, ADAPTER)
    dcp_to_hf(dcp, back_st, ADAPTER)
    safetensors_to_pt(back_st, back)
    for part in ("llm", "flow", "hift"):
        a = torch.load(tiny_dir / f"{part}.pt", weights_only=True)
        b = torch.load(back / f"{part}.pt", weights_only=True)
        assert list(a) == sorted(a, key=list(a).index) and set(a) == set(b), part
        for key in a:
            assert (a[key].dtype, a[key].shape) == (b[key].dtype, b[key].shape), key
            assert _bits(a[key]) == _bits(b[key]), key
    llm = torch.load(back / "llm.pt", weights_only=True)
    assert llm["llm.model.lm_head.weight"].data_ptr() == llm["llm.model.model.embed_tokens.weight"].data_ptr()  # tied again
    # and the DCP loads into the training model with the same weights as the public files
    from mm_pack_cosyvoice3.model import load_pretrained

    reference = load_pretrained(tiny_dir).state_dict()
    converted = build_model(st, checkpoint=dcp).state_dict()
    assert all(_bits(reference[k]) == _bits(converted[k]) for k in reference)


def _info(piece):  # type: ignore[no-untyped-def]
    from mmcore.engines import TensorInfo

    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}
    return TensorInfo(tuple(piece.get_shape()), dtypes[piece.get_dtype()])
