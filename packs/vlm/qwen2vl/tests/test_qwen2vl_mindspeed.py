"""MindSpeed-MM interop: the Megatron layout MindSpeed-MM's mm-convert writes and its training
saves, written at any TP/PP and read back from any, bit-exact; each tensor where Megatron's
layers read it; the export and convert stages use it."""

from __future__ import annotations

import argparse
import copy
import json
import re
from pathlib import Path

import pytest
import torch

from mmcore.errors import StageError
from mmcore.backends.megatron.mindspeed_mm import FILE, LATEST, read_checkpoint, read_stages, write_checkpoint

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]


@pytest.fixture(scope="module", params=["tiny", "tiny-2.5"])
def hub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """(config, hub-named state dict) of a tiny Qwen2-VL / Qwen2.5-VL checkpoint."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    folder = tmp_path_factory.mktemp(request.param) / "model"
    build_init_checkpoint(request.param, folder, seed=0)
    return AutoConfig.from_pretrained(folder), load_file(folder / "model.safetensors")


def test_each_tensor_is_where_megatrons_layers_read_it(hub) -> None:  # type: ignore[no-untyped-def]
    """Written out from MindSpeed-MM's layout (the issue's formulas), independently of the
    table: the LLM's linear_qkv is W.view(groups, (q_per_group + 2) * head_dim, hidden) holding
    [q; k; v] of each group; the ViT's qkv is reshape(3, heads, head_dim, in).transpose(0, 1);
    at TP=2 rank r holds the r-th half of every query group range, [gate_r; up_r] of fc1, the
    r-th column half of linear_proj and fc2, and a copy of every norm."""
    from mm_pack_qwen2vl.megatron import parallel_map

    config, hf = hub
    text, vision = config.get_text_config(), config.vision_config
    pmap = parallel_map(config)
    whole = pmap.to_megatron(hf)
    head_dim, groups = text.hidden_size // text.num_attention_heads, text.num_key_value_heads
    per_group = text.num_attention_heads // groups
    layer = "model.layers.0.self_attn."
    qkv = whole["text_decoder.decoder.layers.0.self_attention.linear_qkv.weight"].view(groups, (per_group + 2) * head_dim, -1)
    q, k, v = qkv.split([per_group * head_dim, head_dim, head_dim], dim=1)
    assert torch.equal(q.reshape(-1, text.hidden_size), hf[layer + "q_proj.weight"])
    assert torch.equal(k.reshape(-1, text.hidden_size), hf[layer + "k_proj.weight"])
    assert torch.equal(v.reshape(-1, text.hidden_size), hf[layer + "v_proj.weight"])
    width = getattr(vision, "embed_dim", None) or vision.hidden_size
    vit = hf["visual.blocks.0.attn.qkv.weight"]
    expected = vit.reshape(3, vision.num_heads, width // vision.num_heads, width).transpose(0, 1).reshape(vit.shape)
    assert torch.equal(whole["image_encoder.encoder.blocks.layers.0.self_attention.linear_qkv.weight"], expected)
    gate_up = whole["text_decoder.decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(gate_up, torch.cat([hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]]))

    ranks = pmap.split_tp(whole, 2)
    name = "text_decoder.decoder.layers.0."
    for r, shard in enumerate(ranks):
        assert torch.equal(shard[name + "self_attention.linear_qkv.weight"], qkv[r * groups // 2 : (r + 1) * groups // 2].reshape(-1, text.hidden_size))
        gate, up = hf["model.layers.0.mlp.gate_proj.weight"].chunk(2)[r], hf["model.layers.0.mlp.up_proj.weight"].chunk(2)[r]
        assert torch.equal(shard[name + "mlp.linear_fc1.weight"], torch.cat([gate, up]))
        assert torch.equal(shard[name + "self_attention.linear_proj.weight"], hf[layer + "o_proj.weight"].chunk(2, dim=1)[r])
        assert torch.equal(shard[name + "mlp.linear_fc2.weight"], hf["model.layers.0.mlp.down_proj.weight"].chunk(2, dim=1)[r])
        assert torch.equal(shard[name + "input_layernorm.weight"], hf["model.layers.0.input_layernorm.weight"])
        # the vocabulary (391 tokens in the tiny tokenizer) padded with one zero row to split in two
        embedding = shard["text_decoder.embedding.word_embeddings.weight"]
        assert embedding.shape[0] == 196 and torch.equal(embedding[: 196 - r], hf["model.embed_tokens.weight"][r * 196 : (r + 1) * 196])
    assert not ranks[1]["text_decoder.embedding.word_embeddings.weight"][-1].any()


@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_mindspeed_layout_round_trips_bit_exact(hub, tmp_path: Path, tp: int, pp: int) -> None:  # type: ignore[no-untyped-def]
    from mm_pack_qwen2vl.megatron import TEXT, VISION, parallel_map

    config, hf = hub
    pmap = parallel_map(config)
    placement = write_checkpoint(tmp_path, pmap, hf, tp=tp, pp=pp)
    assert (tmp_path / LATEST).read_text() == "release"
    names = sorted(p.parent.name for p in (tmp_path / "release").glob(f"*/{FILE}"))
    assert names == sorted(f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") for t in range(tp) for p in range(pp))
    saved = torch.load(tmp_path / "release" / names[0] / FILE, weights_only=True)
    assert saved["checkpoint_version"] == 3.0 and set(saved) == {"model", "checkpoint_version"}
    if pp == 2:  # the vision tower and embedding first, the LLM's layers split, numbered from 0 on each stage
        assert placement["layers"] == {VISION: [2, 0], TEXT: [1, 1]}
        first, last = (torch.load(tmp_path / "release" / f"mp_rank_00_{p:03d}" / FILE, weights_only=True)["model"] for p in (0, 1))
        assert "image_encoder.encoder.patch_embed.proj.weight" in first and "text_decoder.embedding.word_embeddings.weight" in first
        assert "text_decoder.output_layer.weight" in last and "text_decoder.decoder.layers.0.input_layernorm.weight" in last
        assert not any(k.startswith("image_encoder") for k in last) and "text_decoder.decoder.layers.1.input_layernorm.weight" not in last
    back, found = read_checkpoint(tmp_path, pmap)
    assert found == {"iteration": "release", "tensor_parallel": tp, "pipeline_parallel": pp, "virtual_pipeline": 1}
    assert set(back) == set(hf)
    assert all(torch.equal(back[k], hf[k]) and back[k].dtype == hf[k].dtype for k in hf)


def test_a_tied_output_layer_is_kept_on_the_last_stage_only_when_it_is_apart(hub, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Qwen2-VL-2B ties lm_head to the embedding (the hub file has no lm_head): Megatron has no
    output layer at PP=1 and a copy of the embedding on the last stage at PP=2."""
    from mm_pack_qwen2vl.megatron import parallel_map

    config, hf = copy.deepcopy(hub)
    config.tie_word_embeddings = True
    tied = {k: v for k, v in hf.items() if k != "lm_head.weight"}
    pmap = parallel_map(config)
    write_checkpoint(tmp_path / "pp1", pmap, tied, tp=2, pp=1)
    assert "text_decoder.output_layer.weight" not in torch.load(tmp_path / "pp1/release/mp_rank_01" / FILE, weights_only=True)["model"]
    write_checkpoint(tmp_path / "pp2", pmap, tied, tp=2, pp=2)
    last = torch.load(tmp_path / "pp2/release/mp_rank_01_001" / FILE, weights_only=True)["model"]
    first = torch.load(tmp_path / "pp2/release/mp_rank_01_000" / FILE, weights_only=True)["model"]
    assert torch.equal(last["text_decoder.output_layer.weight"], first["text_decoder.embedding.word_embeddings.weight"])
    for folder in ("pp1", "pp2"):
        back, _ = read_checkpoint(tmp_path / folder, pmap)
        assert set(back) == set(tied) and all(torch.equal(back[k], tied[k]) for k in tied)


def test_a_trained_checkpoint_reads_and_bad_ones_say_why(hub, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint MindSpeed-MM's training saved (iteration folder, the run's arguments as an
    argparse.Namespace, optimizer state beside the model) reads; a missing rank, a pickle that
    would run code, an unknown tensor are one-line errors naming the file or tensor."""
    from mm_pack_qwen2vl.megatron import parallel_map

    config, hf = hub
    pmap = parallel_map(config)
    write_checkpoint(tmp_path / "run", pmap, hf, tp=2, pp=1, iteration="iter_0000010")
    (tmp_path / "run" / LATEST).write_text("10")
    for rank in (0, 1):
        path = tmp_path / f"run/iter_0000010/mp_rank_{rank:02d}" / FILE
        saved = torch.load(path, weights_only=True)
        saved.update(args=argparse.Namespace(tensor_model_parallel_size=2, lr=1e-5), iteration=10, optimizer={"step": torch.tensor(10)})
        torch.save(saved, path)
    back, found = read_checkpoint(tmp_path / "run", pmap)
    assert found["iteration"] == "10" and all(torch.equal(back[k], hf[k]) for k in hf)

    (tmp_path / "run/iter_0000010/mp_rank_01" / FILE).unlink()
    (tmp_path / "run/iter_0000010/mp_rank_01").rmdir()
    (tmp_path / "run/iter_0000010/mp_rank_02").mkdir()
    with pytest.raises(StageError, match=r"mp_rank_01 is missing \(the checkpoint has 3 tensor-parallel ranks"):
        read_stages(tmp_path / "run")

    write_checkpoint(tmp_path / "evil", pmap, hf)
    torch.save({"model": {}, "payload": Path("/etc/passwd")}, tmp_path / "evil/release/mp_rank_00" / FILE)
    with pytest.raises(StageError, match=r"mp_rank_00/model_optim_rng.pt: refused to unpickle \(weights_only\)"):
        read_stages(tmp_path / "evil")
    with pytest.raises(StageError, match=r"no latest_checkpointed_iteration.txt"):
        read_stages(tmp_path)
    with pytest.raises(StageError, match=r"checkpoint tensor model.layers.0.self_attn.extra.weight has no Megatron counterpart"):
        pmap.to_megatron({**hf, "model.layers.0.self_attn.extra.weight": torch.zeros(1)})


def test_export_writes_the_mindspeed_layout_and_convert_imports_it(mmcore_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The user's path both ways: a run exports its trained model for MindSpeed-MM at TP=2 x
    PP=2 (checked by reading it back); a second run's convert imports that checkpoint (the
    first run's download giving config and tokenizer) and holds the trained weights bit for bit."""
    from safetensors.torch import load_file

    from mmcore.engines.convert import dcp_to_hf
    from mm_pack_qwen2vl.adapter import ADAPTER

    mmcore_cli(
        "run",
        "--pack",
        "qwen2vl",
        "--preset",
        "tiny",
        "data.demo_samples=8",
        "evaluate.enabled=false",
        "--run-dir",
        "first",
        "export.format=mindspeed-mm",
        "export.tensor_parallel=2",
        "export.pipeline_parallel=2",
    )
    export = json.loads((tmp_path / "first/export/manifest.json").read_text())
    assert export["outputs"]["mindspeed_mm"] == "mindspeed-mm"
    assert any("MindSpeed-MM" in note and "bit-identical" in note for note in export["notes"])
    folder = tmp_path / "first/export/mindspeed-mm"
    assert sorted(p.name for p in (folder / "release").iterdir()) == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]

    second = ["--pack", "qwen2vl", "--preset", "tiny", "--run-dir", "second", f"model.source={tmp_path / 'first/download/model'}"]
    mmcore_cli("download", *second)
    mmcore_cli("convert", *second, f"convert.mindspeed_mm={folder}")
    dcp_to_hf(tmp_path / "second/convert/dcp", tmp_path / "imported", ADAPTER)
    imported, trained = load_file(tmp_path / "imported/model.safetensors"), load_file(tmp_path / "first/export/hf/model.safetensors")
    assert set(imported) == set(trained) and all(torch.equal(imported[k], trained[k]) for k in trained)
    assert "MindSpeed-MM" in json.loads((tmp_path / "second/convert/manifest.json").read_text())["notes"][0]


def test_a_bad_tensor_in_one_rank_file_is_an_error_naming_that_file(hub, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Missing, extra or nan in one rank's file: the error names the file (it used to say only
    'rank 1 and rank 0 hold different tensors', or blame a replicated tensor for a nan)."""
    from mm_pack_qwen2vl.megatron import parallel_map

    config, hf = hub
    pmap = parallel_map(config)
    name = "text_decoder.decoder.layers.0.self_attention.linear_proj.weight"

    def damaged(case: str, ranks: tuple[int, ...], edit) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
        write_checkpoint(tmp_path / case, pmap, hf, tp=2, pp=1)
        files = [tmp_path / case / f"release/mp_rank_{r:02d}" / FILE for r in (0, 1)]
        for rank in ranks:
            saved = torch.load(files[rank], weights_only=True)
            edit(saved["model"])
            torch.save(saved, files[rank])
        return files[0], files[1]

    zero, one = damaged("missing", (1,), lambda m: m.pop(name))
    with pytest.raises(StageError, match=rf"^{re.escape(str(one))}: lacks tensor {name}, which {re.escape(str(zero))} \(tensor-parallel rank 0 of the same stage\) holds$"):
        read_checkpoint(tmp_path / "missing", pmap)
    zero, one = damaged("nan", (1,), lambda m: m[name].fill_(float("nan")))
    with pytest.raises(StageError, match=rf"^{re.escape(str(one))}: tensor {name} holds nan or inf values"):
        read_checkpoint(tmp_path / "nan", pmap)
    extra = "text_decoder.decoder.layers.0.self_attention.extra.weight"
    zero, one = damaged("extra", (0, 1), lambda m: m.__setitem__(extra, torch.zeros(2)))
    with pytest.raises(StageError, match=rf"^{re.escape(str(zero))}: Megatron tensor {extra} has no rule in the table$"):
        read_checkpoint(tmp_path / "extra", pmap)
