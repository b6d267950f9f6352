"""Step-LLM, Step-Video's text encoder: a folder in the release's ``step_llm/`` layout loads
strictly and round-trips bit for bit (one file or shards), its tokens are the reference wrapper's
shape, a prompt's states do not depend on the padding after it, a file that does not fit is one
line, and the pack's pipeline reads its captions through it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mm_pack_stepvideo.stepllm import StepLLM, alibi_slopes
from mm_pack_stepvideo.stepllm_io import TOKENIZER, check_pipeline_parts, check_stepllm_folder, load_stepllm
from mm_pack_stepvideo.tiny import build_init_checkpoint, tiny_stepllm


@pytest.fixture(scope="module")
def model() -> StepLLM:
    torch.manual_seed(0)
    m = tiny_stepllm()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # no norm the identity
    return m


@pytest.fixture
def folder(model: StepLLM, tmp_path: Path) -> Path:
    model.save_pretrained(tmp_path / "step_llm")
    return tmp_path / "step_llm"


def test_the_release_layout_round_trips_bit_for_bit(model: StepLLM, folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", TOKENIZER]
    config = json.loads((folder / "config.json").read_text())
    assert config["num_attention_groups"] == 2 and config["padded_vocab_size"] == 64
    stored = load_file(folder / "model.safetensors")
    assert "tok_embeddings.word_embeddings.weight" in stored and "transformer.layers.1.attention.wqkv.weight" in stored
    assert stored["transformer.layers.0.feed_forward.w1.weight"].shape == (2 * 256, 48)  # 64 rounded up to 256, gate and up
    loaded = StepLLM.from_pretrained(folder.parent, subfolder=folder.name)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    ids, mask = model.tokenize(["a red square moves left"], 16)
    assert torch.equal(loaded.tokenize(["a red square moves left"], 16)[0], ids)
    with torch.no_grad():
        assert torch.equal(loaded(ids).last_hidden_state, model(ids).last_hidden_state)


def test_sharded_weights_load_as_one_file(model: StepLLM, folder: Path) -> None:
    """The release's shards and index (transformers' ``model.safetensors.index.json``)."""
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, part in halves.items():
        save_file({n: tensors[n] for n in part}, folder / shard)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: s for s, part in halves.items() for n in part}}))
    check_stepllm_folder(folder)
    loaded = load_stepllm(folder)
    assert all(torch.equal(loaded.state_dict()[n], tensors[n]) for n in names)


def test_tokens_are_the_wrappers_and_states_ignore_the_padding(model: StepLLM) -> None:
    ids, mask = model.tokenize(["a red square moves left", ""], 24)
    length = int(mask[0].sum())
    assert ids[0, 0] == 1 and ids[0, length - 1] == 2 and (ids[0, length:] == 2).all()
    assert ids[1, :2].tolist() == [1, 2] and mask[1].sum() == 2
    long_ids, _ = model.tokenize(["a red square moves left"], 40)
    with torch.no_grad():
        short = model(ids[:1]).last_hidden_state[0, :length]
        long = model(long_ids).last_hidden_state[0, :length]
    assert torch.allclose(short, long, atol=1e-6)  # causal: what follows a prompt never reaches it (only the matmul sizes differ)
    cut, _ = model.tokenize(["a red square moves left " * 10], 12)
    assert cut.shape == (1, 12) and cut[0, -1] == 2  # cut to max_length - 2 pieces, EOS kept


def test_alibi_slopes_are_the_standard_ones() -> None:
    slopes = alibi_slopes(48)  # Step-LLM's 48 heads: 32 of 2^(-8k/32), then 16 odd steps of 2^(-4/32)
    assert slopes.shape == (48,)
    assert torch.allclose(slopes[:32], torch.tensor([2.0 ** (-8 * k / 32) for k in range(1, 33)]))
    assert torch.allclose(slopes[32:], torch.tensor([2.0 ** (-4 * k / 32) for k in range(1, 32, 2)]))


def test_a_folder_that_does_not_fit_is_one_line(folder: Path) -> None:
    tensors = load_file(folder / "model.safetensors")
    tensors["transformer.layers.0.attention.wo.weight"] = tensors["transformer.layers.0.attention.wo.weight"][:, :40].contiguous()
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors: the weights do not fit the Step-LLM .* 1 of another shape \(first transformer\.layers\.0\.attention\.wo\.weight"):
        check_stepllm_folder(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["num_attention_groups"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: Step-LLM's config needs num_attention_groups") as exc:
        load_stepllm(folder)
    assert "\n" not in str(exc.value)


def test_the_pipeline_reads_captions_through_it(tmp_path: Path) -> None:
    from mm_pack_stepvideo.pipeline import StepVideoPipeline

    out = tmp_path / "pipe"
    build_init_checkpoint("tiny", out, seed=0)
    assert (out / "text_encoder" / TOKENIZER).is_file() and not (out / "tokenizer").exists()
    check_pipeline_parts(out)
    pipe = StepVideoPipeline.from_pretrained(out)
    assert isinstance(pipe.text_encoder, StepLLM) and pipe.tokenizer is None
    states, mask, clip = pipe.encode_prompt(["a red square moves left"], max_sequence_length=20, device="cpu")
    ids, want_mask = pipe.text_encoder.tokenize(["a red square moves left"], 20)
    with torch.no_grad():
        assert torch.equal(states, pipe.text_encoder(ids).last_hidden_state) and torch.equal(mask, want_mask)
    shutil.rmtree(out / "text_encoder")
    shutil.copytree(out / "text_encoder_2", out / "text_encoder")  # a transformers encoder in Step-LLM's place, and no tokenizer/
    with pytest.raises(ValueError, match=r"missing tokenizer/: its text_encoder/ is not Step-LLM's"):
        check_pipeline_parts(out)
