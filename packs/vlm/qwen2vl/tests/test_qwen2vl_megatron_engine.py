"""``mmcore run`` on ``parallel.backend: megatron``: the user's path end to end. Training at
TP=2, killed, resumed at TP=1 x PP=2, follows the plain (FSDP2, one process) run's losses and
held-out accuracy; sequence parallelism, virtual pipeline stages and recompute too, bf16 to its
precision; the export of its
gathered weights reproduces them;
what the backend does not do is a one-line error.

The model ties its output layer to the embedding (as Qwen2-VL-2B does): at PP=2 the last stage
holds a copy whose gradient is summed with the embedding's, the case an untied model skips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.backends.megatron import status

USABLE, WHY = status()
# Two micro-batches of one sample a step: samples differ in length, so pipeline stages send
# activations of changing shapes and sequence parallelism pads odd lengths.
TINY = [
    "--pack",
    "qwen2vl",
    "--preset",
    "tiny",
    "--model",
    "./tied",
    "data.demo_samples=40",
    "convert.verify=false",
    "training.steps=6",
    "training.micro_batch_size=1",
    "training.grad_accum_steps=2",
    "training.eval_every=3",
]
MEGATRON = ["--nproc-per-node", "2", "parallel.backend=megatron", "training.checkpoint_every=2"]


def tied_checkpoint(out: Path, layers: int = 2) -> None:
    """The tiny Qwen2-VL with ``tie_word_embeddings``, as a hub folder stores it (no lm_head);
    ``layers``: language-model layers (the preset's 2, or more, drawn from the same seed)."""
    from safetensors.torch import load_file, save_file

    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint("tiny", out, seed=0)
    config = json.loads((out / "config.json").read_text())
    config["tie_word_embeddings"] = config["text_config"]["tie_word_embeddings"] = True
    if layers != config["text_config"]["num_hidden_layers"]:
        import torch
        from transformers import AutoConfig, Qwen2VLForConditionalGeneration

        config["text_config"]["num_hidden_layers"] = layers
        config["text_config"].pop("layer_types", None)
        (out / "config.json").write_text(json.dumps(config, indent=2))
        torch.manual_seed(0)
        Qwen2VLForConditionalGeneration(AutoConfig.from_pretrained(out)).save_pretrained(out)
        config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = load_file(out / "model.safetensors")
    weights.pop("lm_head.weight", None)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}  # a resumed run repeats steps: keep the last


def accuracies(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}


def manifest(run: Path, stage: str) -> dict:  # type: ignore[type-arg]
    return json.loads((run / stage / "manifest.json").read_text())


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.compares_runs
def test_megatron_run_killed_at_tp2_resumes_at_pp2_on_the_plain_runs_losses_and_exports(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tied_checkpoint(tmp_path / "tied", layers=4)  # 4 layers: 2 per stage, or 1 per chunk of 2 virtual stages
    # Both keep a moving average of the weights (training.ema), which export writes.
    mm("run", *TINY, "training.ema=0.9", "--run-dir", "plain")
    # TP=2 (DP=1: the same global batches as one process), a checkpoint every 2 steps, killed
    # (kill -9, every rank) after step 3: the step-2 checkpoint is what survives.
    killed = mm("run", *TINY, "training.ema=0.9", "--run-dir", "mg", *MEGATRON, "parallel.tensor_parallel=2", check=False, MMCORE_TEST_KILL="train-step:3")
    assert killed.returncode != 0
    assert "was killed by SIGKILL (the kernel's out-of-memory killer sends it, as does kill -9)" in killed.stderr, killed.stderr[-2000:]  # which rank, how
    assert sorted(p.name for p in (tmp_path / "mg/train/checkpoints").glob("step-*")) == ["step-00000002"]
    # The same run at another layout: TP/PP are not the stage's plan, so it resumes, resharding.
    resumed = mm("run", *TINY, "training.ema=0.9", "--run-dir", "mg", *MEGATRON, "parallel.pipeline_parallel=2")
    assert "resumed from step 2 (saved at TP=2 x PP=1, resharded)" in resumed.stdout, resumed.stdout
    plain, megatron = losses(tmp_path / "plain"), losses(tmp_path / "mg")
    assert list(plain) == list(megatron) == [1, 2, 3, 4, 5, 6]
    for step in plain:  # fp32, the same batches; TP and PP only change the order of sums (measured ~1e-7)
        assert megatron[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, megatron)
    assert plain[6] < plain[1]
    # Held-out accuracy during training (steps 0, 3 and 6; the killed run logged 0 and 3), from
    # each rank's slice of the vocabulary: the plain run's (exact match on 8 samples).
    assert accuracies(tmp_path / "mg") == accuracies(tmp_path / "plain") and list(accuracies(tmp_path / "plain")) == [0, 3, 6]
    train = manifest(tmp_path / "mg", "train")["metrics"]
    assert (train["backend"], train["tensor_parallel"], train["pipeline_parallel"], train["data_parallel"]) == ("megatron", 1, 2, 1)
    # The average, resharded with the rest and gathered through the table, exports like any
    # run's: the export reproduces it, and it is the plain run's to within what six AdamW steps
    # make of reordered sums.
    assert manifest(tmp_path / "mg", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    from safetensors.torch import load_file

    ours, theirs = load_file(tmp_path / "mg/export/hf/model.safetensors"), load_file(tmp_path / "plain/export/hf/model.safetensors")
    assert ours.keys() == theirs.keys() - {"lm_head.weight"}  # the table leaves a tied output layer out; plain exports keep the copy
    worst = max(float((ours[k].float() - theirs[k].float()).abs().max()) for k in ours)
    # measured 2.9e-5: Adam's update divides by the gradient's own scale, so reordered sums in
    # near-zero gradients move a weight by up to ~lr (1e-3) a step; a wrong or misplaced shard
    # differs by the weights' scale (~2e-2)
    assert worst < 5e-4, worst

    # Sequence parallelism (TP=2): the same losses; a norm's weight sees half the sequence on each
    # rank, and unless its gradient is summed over both the two copies drift apart, which the
    # gather at the end refuses ("a replicated tensor differs between tensor-parallel ranks").
    # With selective recompute, which recomputes the same ops (measured: bit-equal losses).
    mm("train", *TINY, "--run-dir", "mg", *MEGATRON, "parallel.tensor_parallel=2", "parallel.sequence_parallel=true", "training.recompute=selective", "--force")
    sequence_parallel = losses(tmp_path / "mg")
    for step in plain:
        assert sequence_parallel[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, sequence_parallel)
    assert (manifest(tmp_path / "mg", "train")["metrics"]["sequence_parallel"], manifest(tmp_path / "mg", "train")["metrics"]["recompute"]) == (True, "selective")
    # Virtual pipeline stages (Megatron's interleaved 1F1B, 2 chunks of one layer per stage),
    # with full recompute: the same losses.
    mm("train", *TINY, "--run-dir", "mg", *MEGATRON, "parallel.pipeline_parallel=2", "parallel.virtual_pipeline=2", "training.recompute=full", "--force")
    interleaved = losses(tmp_path / "mg")
    for step in plain:
        assert interleaved[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, interleaved)
    assert manifest(tmp_path / "mg", "train")["metrics"]["virtual_pipeline"] == 2
    # bf16 compute at PP=2 (fp32 weights; bf16 activations between the stages): the fp32 run's
    # losses to bf16's precision (measured 1.4e-4 relative at most; 8 significant bits make ~4e-3
    # a weight), and not equal to them (fp32 layouts agree to ~1e-7: bf16 is really on).
    mm("train", *TINY, "--run-dir", "mg", *MEGATRON, "parallel.pipeline_parallel=2", "training.precision=bf16", "--force")
    bf16 = losses(tmp_path / "mg")
    differences = [abs(bf16[step] - plain[step]) / plain[step] for step in plain]
    assert max(differences) < 2e-3 and max(differences) > 1e-6, (plain, bf16)
    assert manifest(tmp_path / "mg", "train")["metrics"]["bf16"] is True

    # What this backend does not do is refused in one line, before any work (one process: the
    # checks are the same on every rank, and torchrun's start is the slow part).
    for overrides, message in [
        (["parallel.tensor_parallel=3"], "parallel.tensor_parallel=3 x parallel.pipeline_parallel=1 does not divide the 1 process(es)"),
        (["parallel.sequence_parallel=true"], "parallel.sequence_parallel splits the sequence over the tensor-parallel ranks: set parallel.tensor_parallel > 1 too"),
        (["parallel.virtual_pipeline=2"], "parallel.virtual_pipeline interleaves model chunks over pipeline stages: set parallel.pipeline_parallel > 1 too"),
    ]:
        proc = mm("train", *TINY, "--run-dir", "plain", "parallel.backend=megatron", *overrides, "--force", check=False)
        assert proc.returncode != 0 and message in proc.stderr + proc.stdout, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    proc = mm("train", *TINY, "--run-dir", "plain", "parallel.tensor_parallel=2", "--force", check=False)
    assert proc.returncode != 0 and "split the model on parallel.backend: megatron; this run's backend is fsdp2" in proc.stderr + proc.stdout
    proc = mm("train", *TINY, "--run-dir", "plain", "parallel.context_parallel=2", "--force", check=False)
    assert proc.returncode != 0 and "this run's backend is fsdp2 (for sequences split over processes there: parallel.ulysses)" in proc.stderr + proc.stdout


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.matrix  # make test: the LoRA run below freezes through the same engine path
@pytest.mark.compares_runs
def test_megatron_freezes_what_fsdp2_freezes(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """training.freeze names training tensors; on megatron they map onto the Megatron tensors
    they make up (the vision tower as it is, the decoder's fused, layer-stacked ones). A frozen
    vision tower's features come from the extract stage's cache on both backends."""
    tied_checkpoint(tmp_path / "tied", layers=4)
    frozen = ["training.freeze=[vision,model.language_model.layers.*.mlp.*]"]
    mm("run", *TINY, "--run-dir", "plain", *frozen)
    mm("run", *TINY, "--run-dir", "mg", *MEGATRON, "parallel.pipeline_parallel=2", *frozen)
    assert manifest(tmp_path / "mg", "extract")["status"] == "finished"  # the samples carry cached block outputs
    plain, megatron = losses(tmp_path / "plain"), losses(tmp_path / "mg")
    for step in plain:  # fp32, the same batches (as the test above)
        assert megatron[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, megatron)
    train = manifest(tmp_path / "mg", "train")["metrics"]
    assert train["frozen_parameters"] == manifest(tmp_path / "plain", "train")["metrics"]["frozen_parameters"] == 25 + 4 * 3
    from safetensors.torch import load_file

    before, after = load_file(tmp_path / "tied/model.safetensors"), load_file(tmp_path / "mg/export/hf/model.safetensors")
    vision = [k for k in before if k.startswith(("visual.blocks.", "visual.patch_embed."))]  # the hub's names, export's too
    mlp = [k for k in before if k.startswith("model.layers.") and ".mlp." in k]
    attention = [k for k in before if k.endswith(".self_attn.q_proj.weight")]
    assert vision and mlp and attention
    assert all(torch_equal(before[k], after[k]) for k in vision + mlp)  # frozen: exported as they came in
    assert not any(torch_equal(before[k], after[k]) for k in attention)  # trained
    # The language model frozen: the last stage trains nothing, the first the vision tower.
    mm("train", *TINY, "--run-dir", "mg", *MEGATRON, "parallel.pipeline_parallel=2", "extract.enabled=false", "training.freeze=[llm]", "training.steps=2", "--force")
    assert manifest(tmp_path / "mg", "train")["metrics"]["frozen_parameters"] == 2 + 4 * 12  # embedding, final norm, 12 a layer
    for overrides, message in [
        (["training.freeze=[model.language_model.layers.0.*]"], "a layer's tensor is frozen in every layer or in none"),
        (
            ["training.freeze=[model.language_model.layers.*.self_attn.q_proj.weight]"],
            "is frozen but not model.language_model.layers.0.self_attn.k_proj.weight; on parallel.backend: megatron they are one tensor",
        ),
    ]:
        proc = mm("train", *TINY, "--run-dir", "mg", "parallel.backend=megatron", "extract.enabled=false", *overrides, "--force", check=False)
        assert proc.returncode != 0 and message in proc.stderr + proc.stdout, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.matrix  # 2 min; LoRA on megatron's parallel layers, merged and loaded by peft, is make test's test_lora_on_the_parallel_layers_exports_what_peft_loads
def test_megatron_lora_adapts_the_chosen_linears_only(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """training.lora.target_modules on megatron picks training modules as on FSDP2 (globs typed
    as a user types them); they must make up whole Megatron linears, the same in every layer.
    At TP=2, with a moving average (training.ema): PEFT's folder holds adapters for the chosen
    modules only; export (export.merge_lora) writes the averaged weights merged and, beside them,
    the averaged adapters (not the last step's), which peft loads on the base to the export's
    logits; the linears left out are exported as they came in.
    training.lora.dropout draws each mask whole from a stream the TP ranks share: the TP=2
    run's losses are one process's (which recomputes its layers: the same masks again)."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    tied_checkpoint(tmp_path / "tied")
    lora = [
        "training.lora.r=4",
        "training.lr=1e-2",
        "training.lora.target_modules=[*.q_proj, *.k_proj, *.v_proj, *.down_proj]",
        "training.steps=3",
        "training.lora.modules_to_save=[*.embed_tokens, model.visual.merger.*]",
    ]
    mm("run", *TINY, *lora, "training.lora.dropout=0.3", "--run-dir", "mg", *MEGATRON, "parallel.tensor_parallel=2", "training.ema=0.9", "export.merge_lora=true")
    mm("run", *TINY, *lora, "training.lora.dropout=0.3", "--run-dir", "one", "parallel.backend=megatron", "training.recompute=full")
    tp2, one = losses(tmp_path / "mg"), losses(tmp_path / "one")
    mm("train", *TINY, *lora, "--run-dir", "one", "parallel.backend=megatron")  # no dropout
    undropped = losses(tmp_path / "one")
    assert list(tp2) == list(one) == [1, 2, 3]
    for step in one:  # fp32, the same masks and batches; TP reorders sums (~1e-7)
        assert tp2[step] == pytest.approx(one[step], rel=1e-5), (step, one, tp2)
    assert abs(one[2] - undropped[2]) > 1e-4 and one[1] == undropped[1], (one, undropped)  # dropout was on (B starts at 0: step 1 alike)
    config = json.loads((tmp_path / "mg/train/checkpoints/adapter/adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ["down_proj", "k_proj", "q_proj", "v_proj"] and config["lora_dropout"] == 0.3
    # trained whole, saved whole; the tied output layer with the embedding (peft loads each module to save as its own copy)
    assert config["modules_to_save"] and sorted(config["modules_to_save"]) == [
        "lm_head",
        "model.language_model.embed_tokens",
        "model.visual.merger.ln_q",
        "model.visual.merger.mlp.0",
        "model.visual.merger.mlp.2",
    ]
    assert manifest(tmp_path / "mg", "export")["outputs"] == {"model": "hf", "adapter": "adapter"}
    adapter = load_file(tmp_path / "mg/export/adapter/adapter_model.safetensors")
    last = load_file(tmp_path / "mg/train/checkpoints/adapter/adapter_model.safetensors")
    assert (tmp_path / "mg/export/adapter/adapter_model.safetensors").read_bytes() == (tmp_path / "mg/train/checkpoints/ema_adapter/adapter_model.safetensors").read_bytes()
    assert adapter.keys() == last.keys() and all(not torch_equal(adapter[k], last[k]) for k in adapter)  # the average, not the last step's
    assert {key.split(".")[-3] for key in adapter if ".lora_" in key} == {"down_proj", "k_proj", "q_proj", "v_proj"}
    before, after = load_file(tmp_path / "tied/model.safetensors"), load_file(tmp_path / "mg/export/hf/model.safetensors")
    for hub, peft_name in [("visual.merger.mlp.0.weight", "model.visual.merger.mlp.0.weight"), ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight")]:
        assert torch_equal(adapter[f"base_model.model.{peft_name}"], after[hub]) and not torch_equal(before[hub], after[hub]), hub
    left_out = [k for k in before if k.startswith("model.layers.") and k.endswith(("o_proj.weight", "gate_proj.weight", "up_proj.weight"))]
    chosen = [k for k in before if k.startswith("model.layers.") and k.endswith(("q_proj.weight", "down_proj.weight"))]
    assert left_out and chosen and all(torch_equal(before[k], after[k]) for k in left_out) and not any(torch_equal(before[k], after[k]) for k in chosen)
    export = AutoModelForImageTextToText.from_pretrained(tmp_path / "mg/export/hf").eval()
    adapted = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(tmp_path / "tied"), str(tmp_path / "mg/export/adapter")).eval()
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float((export(input_ids=ids).logits - adapted(input_ids=ids).logits).abs().max()) < 1e-4  # fp32 sums in another order
    assert manifest(tmp_path / "mg", "export")["metrics"]["adapter_logits_max_abs_diff"] < 1e-4  # export's own check, on its probe (images too)
    for targets, message in [
        ("[*.down_proj] training.lora.modules_to_save=[*.down_proj]", "is both a LoRA target and in modules_to_save"),
        ("[*.q_proj]", "they are one linear (decoder.layers.0.self_attention.linear_qkv.weight): adapt all of them or none"),
        ("[model.language_model.layers.0.*]", "a layer's tensor is adapted in every layer or in none"),
        ("[vision]", "is not a linear of the language model's layers; LoRA on parallel.backend: megatron adapts only those"),
    ]:
        proc = mm("train", *TINY, "--run-dir", "mg", "parallel.backend=megatron", "training.lora.r=4", *f"training.lora.target_modules={targets}".split(" "), "--force", check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.matrix  # make test: the kill-at-TP2-resume-at-PP2 run (dropout 0)
def test_megatron_sequence_parallel_dropout_resumes_bit_for_bit(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Under sequence parallelism Megatron's transformer block draws from its model-parallel
    random stream (each TP rank its own), LoRA's dropout masks included: checkpoints hold those
    streams, so a run killed (kill -9) after step 3 and resumed from step 2 on the same layout
    gives the uninterrupted run's losses and export, bit for bit (it did not: step 3 5.3853 vs 5.3697).
    The export is the adapter, as after LoRA on FSDP2 (no merged model unless export.merge_lora),
    which the evaluate stage then answers with."""
    tied_checkpoint(tmp_path / "tied")
    run = [
        *TINY,
        "training.steps=4",
        "training.eval_every=0",
        "training.lora.r=4",
        "training.lr=1e-2",
        "training.lora.dropout=0.3",
        *MEGATRON,
        "parallel.tensor_parallel=2",
        "parallel.sequence_parallel=true",
    ]
    mm("run", *run, "--run-dir", "whole")
    assert mm("run", *run, "--run-dir", "again", check=False, MMCORE_TEST_KILL="train-step:3").returncode != 0
    assert "resumed from step 2" in mm("run", *run, "--run-dir", "again").stdout
    assert losses(tmp_path / "whole") == losses(tmp_path / "again")
    assert manifest(tmp_path / "whole", "export")["outputs"] == {"model": "adapter", "adapter": "adapter"} and not (tmp_path / "whole/export/hf").exists()
    assert manifest(tmp_path / "whole", "evaluate")["metrics"]["items"] > 0  # it answered with the adapter on the base
    for name in ("export/adapter/adapter_model.safetensors", "export/adapter/adapter_config.json"):
        whole, again = (tmp_path / "whole" / name).read_bytes(), (tmp_path / "again" / name).read_bytes()
        assert whole.replace(str(tmp_path / "whole").encode(), b"") == again.replace(str(tmp_path / "again").encode(), b""), name


def torch_equal(a, b) -> bool:  # type: ignore[no-untyped-def]
    import torch

    return bool(torch.equal(a, b))


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.matrix  # a resume variant; the kill-at-TP2-resume-at-PP2 run stays in make test
def test_megatron_moving_average_is_what_export_writes_and_resumes_bit_for_bit(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """training.ema on megatron: every checkpoint holds the average (sharded as its weights: the
    resharded resume is the first test's), a run killed and resumed writes the uninterrupted
    run's average bit for bit (one process computes the same sums again), and export writes the
    average unless asked for the last weights."""
    from safetensors.torch import load_file

    tied_checkpoint(tmp_path / "tied")
    ema = ["parallel.backend=megatron", "training.ema=0.9", "training.checkpoint_every=2", "training.eval_every=0"]
    mm("run", *TINY, *ema, "--run-dir", "whole")
    killed = mm("run", *TINY, *ema, "--run-dir", "again", check=False, MMCORE_TEST_KILL="train-step:3")
    assert killed.returncode != 0
    assert "resumed from step 2" in mm("run", *TINY, *ema, "--run-dir", "again").stdout
    assert losses(tmp_path / "whole") == losses(tmp_path / "again")
    whole, again = load_file(tmp_path / "whole/export/hf/model.safetensors"), load_file(tmp_path / "again/export/hf/model.safetensors")
    assert whole.keys() == again.keys() and all(torch_equal(whole[k], again[k]) for k in whole)
    assert manifest(tmp_path / "whole", "train")["metrics"]["ema"] == 0.9
    mm("export", *TINY, *ema, "--run-dir", "whole", "export.weights=last", "--force")
    last = load_file(tmp_path / "whole/export/hf/model.safetensors")
    moved = [k for k in whole if not torch_equal(whole[k], last[k])]
    assert "model.embed_tokens.weight" in moved and any(".mlp.down_proj." in k for k in moved), moved  # the average is not the last step's weights


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.compares_runs
def test_megatron_over_two_nodes_is_the_one_node_run(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """TP=2 across two simulated nodes (one process each, one rendezvous, one run directory on a
    shared file system): the whole pipeline, each node's local rank 0 managing the checkpoint
    and trained-weight folders beside the other's, gives the one-node TP=2 run's losses and its
    export byte for byte (the same ranks doing the same sums)."""
    from mmcore.testing import run_nodes

    tied_checkpoint(tmp_path / "tied")
    run = [*TINY, "training.steps=4", "training.eval_every=0", "parallel.backend=megatron", "parallel.tensor_parallel=2", "training.checkpoint_every=2"]
    mm("run", *run, "--run-dir", "one", "--nproc-per-node", "2")
    nodes = run_nodes(tmp_path, ["run", *run, "--run-dir", "two"])
    assert [p.returncode for p in nodes] == [0, 0], [p.stderr[-2000:] for p in nodes]
    assert losses(tmp_path / "two") == losses(tmp_path / "one")
    assert (tmp_path / "two/export/hf/model.safetensors").read_bytes() == (tmp_path / "one/export/hf/model.safetensors").read_bytes()
    assert not list((tmp_path / "two/train/checkpoints").glob("*.incomplete"))


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # make test runs TP=2 and PP=2 through the engine; this, its data-parallel group
def test_megatron_data_parallel_run_follows_the_plain_run(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two processes at TP=1 x PP=1 are two data-parallel replicas: each takes one sample of each
    global micro-batch of two (the sampler, token counts and gradient sum over the DP group),
    so the losses are the one-process run's with both samples in one micro-batch."""
    tied_checkpoint(tmp_path / "tied")
    mm("run", *[a for a in TINY if a != "training.micro_batch_size=1"], "training.micro_batch_size=2", "--run-dir", "plain")
    mm("run", *TINY, "--run-dir", "dp2", *MEGATRON)
    assert manifest(tmp_path / "dp2", "train")["metrics"]["data_parallel"] == 2
    plain, megatron = losses(tmp_path / "plain"), losses(tmp_path / "dp2")
    assert list(plain) == list(megatron) == [1, 2, 3, 4, 5, 6]
    for step in plain:
        assert megatron[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, megatron)


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.compares_runs
def test_megatron_data_parallel_on_mixed_media_follows_the_plain_run(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Real SFT data across data-parallel replicas: text-only samples beside images and videos,
    so in most steps one replica's sample runs the vision merger and the other's does not. Every
    replica reduces the same gradients (zeros where it has none), so training with the frozen
    tower's features cached, and the mixed held-out split, give the plain run's figures."""
    from mmcore.testing.media import write_mixed_mllm

    data = write_mixed_mllm(tmp_path / "mixed", ("image", "video"))
    run = [
        "--pack",
        "qwen2vl",
        "--preset",
        "tiny",
        "--data",
        str(data),
        "convert.verify=false",
        "training.steps=4",
        "training.freeze=[vision]",
        "data.eval_fraction=0.25",
        "training.eval_every=2",
        "training.balance_towers=false",
        "evaluate.enabled=false",
    ]
    mm("run", *run, "training.micro_batch_size=2", "--run-dir", "plain")
    mm("run", *run, "training.micro_batch_size=1", "--run-dir", "dp2", "--nproc-per-node", "2", "parallel.backend=megatron")
    assert manifest(tmp_path / "dp2", "extract")["status"] == "finished" and manifest(tmp_path / "dp2", "train")["metrics"]["data_parallel"] == 2
    plain, megatron = losses(tmp_path / "plain"), losses(tmp_path / "dp2")
    assert list(plain) == list(megatron) == [1, 2, 3, 4]
    for step in plain:
        assert megatron[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, megatron)
    assert accuracies(tmp_path / "dp2") == accuracies(tmp_path / "plain")


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # 2-process megatron runs; make test runs the data-parallel mixed-media run above and the CP attention alone
def test_megatron_context_parallel_on_mixed_media_follows_the_plain_run(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Context parallelism on real SFT data: text-only samples beside images and videos in the
    same micro-batch, so each rank's chunks hold some samples' media tokens and not others', with
    the videos' 3-D M-RoPE positions cut per rank. CP=2 on two processes gives the plain
    one-process run's losses and held-out figures."""
    from mmcore.testing.media import write_mixed_mllm

    data = write_mixed_mllm(tmp_path / "mixed", ("image", "video"))
    run = [
        "--pack",
        "qwen2vl",
        "--preset",
        "tiny",
        "--data",
        str(data),
        "convert.verify=false",
        "training.steps=4",
        "training.micro_batch_size=2",
        "data.eval_fraction=0.25",
        "training.eval_every=2",
        "evaluate.enabled=false",
    ]
    mm("run", *run, "--run-dir", "plain")
    mm("run", *run, "--run-dir", "cp", "--nproc-per-node", "2", "parallel.backend=megatron", "parallel.context_parallel=2")
    assert manifest(tmp_path / "cp", "train")["metrics"]["context_parallel"] == 2
    plain, ours = losses(tmp_path / "plain"), losses(tmp_path / "cp")
    assert list(plain) == list(ours) == [1, 2, 3, 4]
    for step in plain:  # fp32, the attention and the loss summed in another order
        assert ours[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, ours)
    assert accuracies(tmp_path / "cp") == accuracies(tmp_path / "plain")


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # 2-process megatron runs; make test checks the attention alone (tests/test_megatron_context.py) and the refusal below
def test_megatron_context_parallel_killed_resumes_at_tp2_on_the_plain_runs_losses(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """parallel.context_parallel=2: both processes take every sample (DP=1: the one-process run's
    global batches), each running the whole model on its two chunks of the (padded) sequence,
    images included; the losses, summed over the pair, are the plain run's. Killed (kill -9)
    after step 3, it resumes at TP=2 x CP=1 (the weights are the same on every CP rank: the
    checkpoint holds nothing of the split) to the same losses; the held-out accuracy is the
    plain run's and the gathered export reproduces the trained model."""
    tied_checkpoint(tmp_path / "tied")
    mm("run", *TINY, "--run-dir", "plain")
    killed = mm("run", *TINY, "--run-dir", "cp", *MEGATRON, "parallel.context_parallel=2", check=False, MMCORE_TEST_KILL="train-step:3")
    assert killed.returncode != 0 and "megatron-core: TP=1 x PP=1 x CP=2 x DP=1 over 2 process(es)" in killed.stdout, killed.stdout[-2000:]
    resumed = mm("run", *TINY, "--run-dir", "cp", *MEGATRON, "parallel.tensor_parallel=2")
    assert "resumed from step 2 (saved at TP=1 x PP=1 x CP=2, resharded)" in resumed.stdout, resumed.stdout
    plain, ours = losses(tmp_path / "plain"), losses(tmp_path / "cp")
    assert list(plain) == list(ours) == [1, 2, 3, 4, 5, 6]
    for step in plain:  # fp32; measured rel <= 1e-7 (the attention and the loss summed in another order)
        assert ours[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, ours)
    assert accuracies(tmp_path / "cp") == accuracies(tmp_path / "plain")
    assert manifest(tmp_path / "cp", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    # and the other way: a run at CP=2 from the start, on the plain run's losses too
    mm("train", *TINY, "--run-dir", "cp", *MEGATRON, "parallel.context_parallel=2", "--force")
    again = losses(tmp_path / "cp")
    for step in plain:
        assert again[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, again)
    assert manifest(tmp_path / "cp", "train")["metrics"]["context_parallel"] == 2


def test_each_pipeline_stage_reads_only_its_part_of_the_checkpoint(tmp_path: Path) -> None:
    """At PP=2 a rank reads the tensors of its own stage: the first its layer, the embedding and
    the vision tower; the last its layer (renumbered from 0), the final norm and, the output
    layer being tied, the embedding it copies; a layer's tensors are read together, apart from
    any other's; with virtual stages, each chunk its interleaved layer. (From the names alone:
    no process group.)"""
    from safetensors import safe_open

    from mmcore.backends.megatron.engine import Layout, rank_sources
    from mm_pack_qwen2vl.megatron import megatron_family

    tied_checkpoint(tmp_path / "tied")
    family = megatron_family(tmp_path / "tied")
    with safe_open(tmp_path / "tied/model.safetensors", "pt") as f:
        hub = list(f.keys())
    (first, first_whole), (last, last_whole) = (rank_sources(family, hub, Layout(2, 2, 1, 0, stage, 0)) for stage in (0, 1))
    read = [{part for _, parts in mine.values() for part in parts} for mine in (first, last)]
    assert "model.layers.0.self_attn.q_proj.weight" in read[0] and not any(".layers.1." in name for name in read[0])
    assert "model.layers.1.self_attn.q_proj.weight" in read[1] and not any(".layers.0." in name for name in read[1])
    assert first["text_decoder.decoder.layers.0.self_attention.linear_qkv.weight"][1][0] == "model.layers.0.self_attn.q_proj.weight"
    assert last["text_decoder.decoder.layers.0.self_attention.linear_qkv.weight"][1][0] == "model.layers.1.self_attn.q_proj.weight"
    assert "model.norm.weight" in read[1] and "model.norm.weight" not in read[0]
    assert last["text_decoder.output_layer.weight"][1] == ("model.embed_tokens.weight",)  # the tied copy
    assert first_whole and all(name.startswith("visual.") for name in first_whole) and last_whole == []
    assert len(read[0] | set(first_whole)) + len(read[1]) < len(hub) + 2  # only the embedding is read twice
    # ... and one layer at a time (a rank holds its shard and one layer's whole tensors)
    from mmcore.backends.megatron.engine import _by_layer

    whole_model, _ = rank_sources(family, hub, Layout(1, 1, 1, 0, 0, 0))
    groups = {tuple(sorted({name.split(".")[3] if ".layers." in name else name for name in group})) for group in _by_layer(whole_model)}
    assert groups == {("0",), ("1",), ("text_decoder.embedding.word_embeddings.weight",), ("text_decoder.decoder.final_layernorm.weight",)}
    assert sum(len(group) for group in _by_layer(whole_model)) == len(whole_model)

    # Virtual stages (PP=2 x 2 chunks, 4 layers): chunk v of stage s holds layer 2v + s, the
    # vision tower and embedding on stage 0's first chunk, the norm and tied copy on stage 1's last.
    tied_checkpoint(tmp_path / "tied4", layers=4)
    with safe_open(tmp_path / "tied4/model.safetensors", "pt") as f:
        hub4 = list(f.keys())
    family4 = megatron_family(tmp_path / "tied4")
    for stage, chunk, layer in [(0, 0, 0), (1, 0, 1), (0, 1, 2), (1, 1, 3)]:
        mine, whole = rank_sources(family4, hub4, Layout(1, 2, 1, 0, stage, 0, virtual=2, chunk=chunk))
        sources = {part for _, parts in mine.values() for part in parts}
        assert {name.split(".")[2] for name in sources if name.startswith("model.layers.")} == {str(layer)}, (stage, chunk, sorted(sources))
        assert ("model.embed_tokens.weight" in sources) == ((stage, chunk) in [(0, 0), (1, 1)]) and bool(whole) == ((stage, chunk) == (0, 0))
        assert ("model.norm.weight" in sources) == ((stage, chunk) == (1, 1))


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # make test: the engine's resume at another layout above, and test_qwen2vl_megatron.py's TP=2 LoRA export loaded by peft
def test_megatron_lora_trains_the_same_adapters_at_any_layout_and_peft_loads_them(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """LoRA (r=4 on every linear of the language model) on megatron-core: one process, and two
    at TP=2 (sequence-parallel) killed after step 3 and resumed at PP=2, train the same adapters (each drawn whole
    from the seed and its module's name, then split) to the same losses; the adapters written in
    PEFT's format, on the base model, give the export's logits (the trained weights with them
    merged)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    tied_checkpoint(tmp_path / "tied")
    lora = ["training.lora.r=4", "training.lr=1e-2", "training.checkpoint_every=2"]
    mm("run", *TINY, *lora, "--run-dir", "one", "parallel.backend=megatron")
    killed = mm("run", *TINY, *lora, "--run-dir", "two", *MEGATRON, "parallel.tensor_parallel=2", "parallel.sequence_parallel=true", check=False, MMCORE_TEST_KILL="train-step:3")
    assert killed.returncode != 0
    resumed = mm("run", *TINY, *lora, "--run-dir", "two", *MEGATRON, "parallel.pipeline_parallel=2", "export.merge_lora=true")
    assert "resumed from step 2 (saved at TP=2 x PP=1, resharded)" in resumed.stdout, resumed.stdout
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(one) == list(two) == [1, 2, 3, 4, 5, 6]
    for step in one:  # fp32, the same adapters and batches; the layouts reorder sums (measured ~1e-7)
        assert two[step] == pytest.approx(one[step], rel=1e-5), (step, one, two)
    assert one[6] < one[1] - 0.1, one  # the adapters learn

    export = AutoModelForImageTextToText.from_pretrained(tmp_path / "two/export/hf").eval()
    base = AutoModelForImageTextToText.from_pretrained(tmp_path / "tied").eval()
    adapted = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(tmp_path / "tied"), str(tmp_path / "two/train/checkpoints/adapter")).eval()
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        merged, unmerged, plain = export(input_ids=ids).logits, adapted(input_ids=ids).logits, base(input_ids=ids).logits
    assert float((merged - plain).abs().max()) > 1e-2  # the adapters changed the model ...
    assert float((merged - unmerged).abs().max()) < 1e-4  # ... and peft's unmerged adapters are the same change (fp32 sums in another order)


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
def test_megatron_stops_at_the_first_nonfinite_step_on_every_stage(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """At PP=2 the loss exists on the last stage only: both stages stop at the same step (no
    rank left waiting in a collective), and the checkpoint before it is the one kept."""
    # step 1 moves every weight by about lr: step 2's logits overflow
    proc = mm(
        "run",
        "--pack",
        "qwen2vl",
        "--preset",
        "tiny",
        "data.demo_samples=40",
        "convert.verify=false",
        "--run-dir",
        "nan",
        "--nproc-per-node",
        "2",
        "parallel.backend=megatron",
        "parallel.pipeline_parallel=2",
        "training.lr=1e30",
        "training.steps=4",
        "training.checkpoint_every=1",
        "training.eval_every=0",
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    kept = tmp_path / "nan/train/checkpoints/step-00000001"
    stopped = [line for line in proc.stderr.splitlines() if "training stopped" in line]
    # both stages stopped alike: one line, from the launching command, naming both ranks
    assert len(stopped) == 1 and stopped[0].startswith(f"error: training stopped at step 2: the loss is nan; no update was made and the last checkpoint, {kept}, is kept (ranks 0, 1 of 2)"), (
        proc.stderr
    )
    assert sorted(p.name for p in kept.parent.glob("step-*")) == [kept.name] and not (tmp_path / "nan/train/manifest.json").exists()


@pytest.mark.skipif(not USABLE, reason=WHY)
def test_megatron_refuses_a_lora_rank_wider_than_its_layers(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mm(
        "run",
        "--pack",
        "qwen2vl",
        "--preset",
        "tiny",
        "data.demo_samples=40",
        "convert.verify=false",
        "--run-dir",
        "wide",
        "parallel.backend=megatron",
        "training.lora.r=100000",
        "training.steps=1",
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "error: training.lora.r: 100000 is more than layer decoder.layers.0.self_attention.linear_proj is wide (64 inputs, 64 outputs): "
        "use at most 64, or leave that layer out of training.lora.target_modules"
    ), proc.stderr


@pytest.mark.skipif(not USABLE, reason=WHY)
def test_a_layout_the_model_cannot_take_is_refused_once_before_download(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Checked by the launching process against the tiny preset's config (init:tiny: 2 layers, 4
    heads, 2 key-value heads): one line, exit 2, no stage run; it used to surface at train, after
    download, convert and preprocess, once per rank (PP=3: megatron-core's own ValueError)."""
    for overrides, message in [
        (["--nproc-per-node", "3", "parallel.pipeline_parallel=3"], "parallel.pipeline_parallel=3 is more pipeline stages than the model's 2 layers (init:tiny)"),
        (["--nproc-per-node", "4", "parallel.tensor_parallel=4"], "parallel.tensor_parallel=4 does not divide the model's 2 key-value heads (init:tiny)"),
        (["--nproc-per-node", "2", "parallel.tensor_parallel=3"], "parallel.tensor_parallel=3 x parallel.pipeline_parallel=1 does not divide the 2 process(es) (--nproc-per-node x nodes)"),
        (
            ["--nproc-per-node", "2", "parallel.tensor_parallel=2", "parallel.context_parallel=2"],
            "parallel.tensor_parallel=2 x parallel.pipeline_parallel=1 x parallel.context_parallel=2 does not divide the 2 process(es) (--nproc-per-node x nodes)",
        ),
    ]:
        proc = mm("run", "--pack", "qwen2vl", "--preset", "tiny", "--run-dir", "layout", "parallel.backend=megatron", *overrides, check=False)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"error: {message}"], proc.stderr
        assert not (tmp_path / "layout" / "download").exists()


@pytest.mark.skipif(not USABLE, reason=WHY)
@pytest.mark.slow
@pytest.mark.matrix  # a resume variant; the kill-at-TP2-resume-at-PP2 run stays in make test
def test_megatron_sgd_with_momentum_over_epochs_resumes_bit_for_bit(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """training.optimizer and training.epochs on megatron (the optimizer FSDP2 builds, from
    mmcore.train.optim): SGD's momentum buffers are sharded as their parameters at TP=2, so a run killed
    after step 3 and resumed from step 2 gives the uninterrupted run's losses; two epochs are the
    steps the sampler's plan makes, each logged with its epoch."""
    tied_checkpoint(tmp_path / "tied")
    run = [
        *(a for a in TINY if not a.startswith("training.steps=")),
        "data.demo_samples=12",
        "training.epochs=2",
        "training.optimizer=sgd",
        "training.momentum=0.9",
        "training.lr=0.05",
        "training.eval_every=0",
        "evaluate.enabled=false",
        *MEGATRON,
        "parallel.tensor_parallel=2",
    ]
    mm("run", *run, "--run-dir", "whole")
    assert mm("run", *run, "--run-dir", "again", check=False, MMCORE_TEST_KILL="train-step:3").returncode != 0
    assert "resumed from step 2" in mm("run", *run, "--run-dir", "again").stdout
    assert losses(tmp_path / "whole") == losses(tmp_path / "again")
    rows = [json.loads(line) for line in (tmp_path / "whole/train/metrics.jsonl").read_text().splitlines() if "loss" in line]
    steps = manifest(tmp_path / "whole", "train")["metrics"]["steps"]
    # each step draws grad_accum_steps=2 of the epoch's micro-batches; the last step ends the second epoch
    assert len(rows) == steps >= 4 and rows[-1]["epoch"] == 2.0 and rows[0]["epoch"] * steps == pytest.approx(2.0)
