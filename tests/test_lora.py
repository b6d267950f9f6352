"""LoRA through peft (mmcore.train.lora): which layers get adapters, how they start, what a checkpoint
and an export hold. The whole path through every pack (train, resume after SIGKILL, export
loaded by peft / diffusers) is the conformance suite's; 2 processes == 1 is qwen2vl's."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft", reason="LoRA trains through peft")

from mmcore.config import LoraSection  # noqa: E402
from mmcore.errors import StageError  # noqa: E402
from mmcore.train.lora import (  # noqa: E402
    LoraPlan,
    base_key,
    init_adapters,
    inject,
    is_adapter,
    load_adapter_folder,
    merged_state,
    plan_lora,
    trained_names,
    write_peft_adapter,
)

GROUPS = {"attention": ["model.layers.*.self_attn.*"], "head": ["lm_head"]}


def tiny_lm(seed: int = 0, tied: bool = False):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(config).eval()


def plan(model, groups=GROUPS, default=(), frozen=(), **lora):  # type: ignore[no-untyped-def]
    return plan_lora(model, LoraSection(r=4, **lora), groups=groups, default_targets=default, blocks=list(model.model.layers), frozen=list(frozen))


def test_targets_default_to_the_blocks_linear_layers_and_follow_groups_globs_and_freezing() -> None:
    model = tiny_lm()
    every = plan(model).targets
    assert len(every) == 2 * 7 and all(name.startswith("model.layers.") for name in every)  # q k v o gate up down; never lm_head
    assert plan(model, default=("attention",)).targets == [n for n in every if ".self_attn." in n]
    assert plan(model, target_modules=["*.q_proj", "head"]).targets == ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj", "lm_head"]
    # training.freeze composes: a frozen part gets no adapters
    assert plan(model, frozen=["model.layers.0.*"]).targets == [n for n in every if n.startswith("model.layers.1.")]
    with pytest.raises(StageError, match=r"training.lora.target_modules: 'vision' matches no linear, conv or embedding layer and is no group \(groups: attention, head\)"):
        plan(model, target_modules=["vision"])
    with pytest.raises(StageError, match="both a LoRA target and in modules_to_save"):
        plan(model, target_modules=["head"], modules_to_save=["lm_head"])
    with pytest.raises(StageError, match="no layer to adapt"):
        plan(model, frozen=["model.*"])


def test_adapters_start_at_the_base_model_the_same_way_for_a_seed() -> None:
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    base = tiny_lm()
    with torch.no_grad():
        expected = base(ids).logits
    a, b = tiny_lm(), tiny_lm()
    the_plan = plan(a, modules_to_save=["lm_head"])
    for model, seed in ((a, 3), (b, 3)):
        inject(model, the_plan)
        init_adapters(model, the_plan, seed)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # however the process's global RNG stands
    with torch.no_grad():
        assert torch.equal(a(ids).logits, expected)  # B = 0: the model starts as the base, bit for bit
    c = tiny_lm()
    inject(c, the_plan)
    init_adapters(c, the_plan, 4)
    assert not torch.equal(c.state_dict()["model.layers.0.self_attn.q_proj.lora_A.default.weight"], sa["model.layers.0.self_attn.q_proj.lora_A.default.weight"])
    # only adapters and modules_to_save train; every state key maps back to the base's
    trainable = {n for n, p in a.named_parameters() if p.requires_grad}
    assert trainable == set(trained_names(a, the_plan)) and "lm_head.weight" in trainable
    assert {base_key(k) for k in sa if not is_adapter(k)} == set(base.state_dict())


def trained_copy(the_plan: LoraPlan, tied: bool = False):  # type: ignore[no-untyped-def]
    """The base with adapters whose B is no longer zero (as after training)."""
    model = tiny_lm(tied=tied)
    inject(model, the_plan)
    init_adapters(model, the_plan, 0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return model


def test_peft_adapter_export_loads_in_peft_and_transformers_with_identical_logits(tmp_path: Path) -> None:
    base_dir = tmp_path / "base"
    tiny_lm().save_pretrained(base_dir)
    the_plan = plan(tiny_lm(), alpha=8.0, modules_to_save=["lm_head"])
    trained = trained_copy(the_plan)
    with torch.no_grad():
        trained.lm_head.weight.add_(0.01)  # a module to save that trained too
    stats = write_peft_adapter(trained, the_plan, tmp_path / "adapter", base_model=base_dir)
    assert stats["adapter_tensors"] == 2 * len(the_plan.targets) + 1
    ids = torch.tensor([[1, 5, 9, 3, 7], [2, 2, 8, 4, 6]])
    with torch.no_grad():
        want = trained(ids).logits
        base = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
        assert not torch.allclose(base(ids).logits, want)  # the adapters matter
        loaded = load_adapter_folder(transformers.AutoModelForCausalLM.from_pretrained, tmp_path / "adapter").eval()
        assert torch.equal(loaded(ids).logits, want)  # peft's layers on the same base: the same computation
        # transformers' own adapter loading (from_pretrained on the adapter folder) agrees
        direct = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "adapter").eval()
        assert torch.equal(direct(ids).logits, want)


def test_a_tied_module_to_save_is_saved_with_its_partner_and_loads_equal(tmp_path: Path) -> None:
    """peft loads each module to save as its own copy: an embedding tied to the output layer
    must bring the output layer along, or the loaded model keeps the old output weights."""
    base_dir = tmp_path / "base"
    tiny_lm(tied=True).save_pretrained(base_dir)
    the_plan = plan(tiny_lm(tied=True), modules_to_save=["model.embed_tokens"])
    assert the_plan.modules_to_save == ["model.embed_tokens", "lm_head"]
    trained = trained_copy(the_plan, tied=True)
    with torch.no_grad():
        trained.model.embed_tokens.weight.mul_(1.5)  # the tied pair trains as one
    write_peft_adapter(trained, the_plan, tmp_path / "adapter", base_model=base_dir)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        loaded = load_adapter_folder(transformers.AutoModelForCausalLM.from_pretrained, tmp_path / "adapter").eval()
        assert torch.equal(loaded(ids).logits, trained(ids).logits)


def test_merging_adds_the_scaled_product_to_the_targets_and_nothing_else() -> None:
    the_plan = plan(tiny_lm(), alpha=8.0)
    trained = trained_copy(the_plan)
    state = trained.state_dict()
    base = tiny_lm().state_dict()
    merged = merged_state(trained)
    assert set(merged) == set(base)
    name = "model.layers.1.mlp.down_proj"
    delta = state[f"{name}.lora_B.default.weight"] @ state[f"{name}.lora_A.default.weight"] * (8.0 / 4)
    torch.testing.assert_close(merged[f"{name}.weight"], base[f"{name}.weight"] + delta, rtol=0, atol=1e-6)  # fp32 rounding of one add
    untouched = [k for k in base if not any(k.startswith(t + ".") for t in the_plan.targets)]
    assert untouched and all(torch.equal(merged[k], base[k]) for k in untouched)


def test_resuming_against_another_base_or_other_adapters_refuses(tmp_path: Path) -> None:
    from mmcore.train.loop import _check_same_adapters

    saved = LoraPlan(r=4, alpha=8.0, dropout=0.0, init="default", targets=["a.q"], base="../../../convert/dcp", base_fingerprint="f" * 32)
    (tmp_path / "step-00000002").mkdir()
    saved.save(tmp_path / "step-00000002")
    same = LoraPlan(**{**saved.__dict__})
    _check_same_adapters(tmp_path / "step-00000002", same)
    with pytest.raises(StageError, match="trained on another base checkpoint"):
        _check_same_adapters(tmp_path / "step-00000002", LoraPlan(**{**saved.__dict__, "base_fingerprint": "0" * 32}))
    with pytest.raises(StageError, match=r"saved with another training.lora \(r differs\)"):
        _check_same_adapters(tmp_path / "step-00000002", LoraPlan(**{**saved.__dict__, "r": 8}))
    (tmp_path / "full").mkdir()
    with pytest.raises(StageError, match="a full fine-tuning checkpoint"):
        _check_same_adapters(tmp_path / "full", same)


def test_adapter_config_is_the_same_file_whatever_the_string_hashing(tmp_path: Path) -> None:
    """peft lists target_modules (a set) in the order of the process's string hashing; the same
    adapter written by two processes is one file, as a resumed run's export must be the
    uninterrupted one's (hash seeds 1 and 2: peft lists these names in two orders under them)."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import sys; from pathlib import Path; from peft import LoraConfig; from mmcore.train.lora_export import save_peft_config; "
        "save_peft_config(LoraConfig(r=4, target_modules=['q_proj', 'k_proj', 'v_proj', 'up_proj', 'down_proj']), Path(sys.argv[1]))"
    )
    written = []
    for seed in ("1", "2"):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / seed)], check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        written.append((tmp_path / seed / "adapter_config.json").read_bytes())
    assert written[0] == written[1]
    assert json.loads(written[0])["target_modules"] == ["down_proj", "k_proj", "q_proj", "up_proj", "v_proj"]


def test_a_rank_wider_than_a_target_layer_is_refused_naming_it() -> None:
    from mmcore.errors import ConfigError
    from mmcore.train.guards import lora_size_warning

    model = tiny_lm()  # k_proj and v_proj: 32 inputs, 16 outputs (2 KV heads of 8)

    def ranked(r: int, **lora):  # type: ignore[no-untyped-def]
        return plan_lora(model, LoraSection(r=r, **lora), groups=GROUPS, default_targets=(), blocks=list(model.model.layers), frozen=[])

    assert ranked(16).r == 16
    with pytest.raises(ConfigError, match=r"^training.lora.r: 17 is more than layer model.layers.0.self_attn.k_proj is wide \(32 inputs, 16 outputs\): use at most 16"):
        ranked(17)
    assert ranked(32, target_modules=["*.q_proj"]).r == 32  # only the targets count
    # a rank that fits can still make adapters (with their AdamW moments) outweigh the base: said before training
    assert lora_size_warning(16, 10 << 20, 20 << 20) is None
    assert lora_size_warning(16, 30 << 20, 20 << 20) == (
        "warning: training.lora.r=16: each checkpoint will be about 0.0293 GiB, more than the 0.0195 GiB of base weights it adapts; a smaller rank trains faster and saves less"
    )
