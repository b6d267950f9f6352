"""Qwen2-VL / Qwen2.5-VL on megatron-core (CPU, gloo): the language model as a ``GPTModel``
loaded through the pack's table, the vision tower as transformers has it; its logits equal the
transformers model's, with images, at tensor-parallel sizes 1 and 2.

Run as a script under torchrun, this file is the worker: it builds both models on every rank
and writes rank 0's largest logit difference to a JSON file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mmcore.backends.megatron import status

USABLE, WHY = status()
needs_megatron = pytest.mark.skipif(not USABLE, reason=WHY)


@needs_megatron
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", pytest.param("tiny-2.5", marks=pytest.mark.matrix)])  # the same language model; its vision tower and rope index in make test-matrix
def test_megatron_logits_equal_transformers_with_images(preset: str, tmp_path: Path) -> None:
    """A batch of two rows with an image each (4 merged vision tokens between
    vision_start/vision_end): megatron-core's logits equal transformers' to 1e-5 (fp32; measured
    ~2e-7: the attention and row-parallel sums run in another order), at TP=1 and TP=2, and at
    TP=2 with sequence parallelism on an odd length; the held-out exact match from each rank's
    slice of the vocabulary is the whole logits'."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint(preset, tmp_path / "model", seed=0)
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp), __file__, str(tmp_path / "model"), str(out)], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(out.read_text())
        assert result["shape"] == [2, 20, 391] and result["max_logit"] > 0.1
        assert result["max_abs_diff"] <= 1e-5, result
        assert result["exact_match"] == result["exact_match_whole"] == [True, False], result
        if tp > 1:  # 19 tokens padded to 20 for the split, cut back; transformers' first 19 (causal)
            assert result["sequence_parallel"]["shape"] == [2, 19, 391] and result["sequence_parallel"]["max_abs_diff"] <= 1e-5, result


@needs_megatron
@pytest.mark.slow
@pytest.mark.matrix  # make test reshards model and optimizer through `mmcore run` (test_qwen2vl_megatron_engine.py)
@pytest.mark.parametrize("saved_at,loaded_at", [(2, 1), (1, 2)])
def test_a_megatron_checkpoint_saved_at_one_tp_size_loads_at_another(saved_at: int, loaded_at: int, tmp_path: Path) -> None:
    """Reshard on load: the model converted at TP=2 into megatron-core's dist_checkpointing
    format loads at TP=1 (and one saved at TP=1 loads at TP=2) with every parameter equal to
    the table's own split and the logits still equal to transformers'."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint("tiny", tmp_path / "model", seed=0)
    checkpoint = tmp_path / f"saved-tp{saved_at}"
    for tp, mode in ((saved_at, "save"), (loaded_at, "load")):
        out = tmp_path / f"{mode}-{saved_at}-{loaded_at}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp), __file__, str(tmp_path / "model"), str(out), mode, str(checkpoint)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["parameters_differing"] == [] and result["parameters"] > 20, result
    assert result["max_abs_diff"] <= 1e-5, result


@needs_megatron
@pytest.mark.slow
def test_each_tp_rank_writes_its_pieces_of_the_trained_weights(tmp_path: Path) -> None:
    """The end of a run at TP=2: each rank writes the pieces of the hub tensors its shards make
    (no rank gathers the model), and the checkpoint is convert's, tensor for tensor, bit for bit
    (the model is the converted one, loaded and written back: the vocabulary's padding row
    stripped, q/k/v and gate/up cut back out of the fused shards). Rank 0's gathering (what a
    family whose adapter combines tensors still gets) writes the same. A tensor replicated over
    TP whose copies differ is named, not written from one rank."""
    from mm_pack_qwen2vl.adapter import ADAPTER
    from mm_pack_qwen2vl.tiny import build_init_checkpoint
    from mmcore.engines.convert import hf_to_dcp

    build_init_checkpoint("tiny", tmp_path / "model", seed=0)
    hf_to_dcp(tmp_path / "model", tmp_path / "converted", ADAPTER)
    out = tmp_path / "write.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, str(tmp_path / "model"), str(out), "write", str(tmp_path / "converted")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["tensors"] > 20 and result["differing"] == {"pieces": [], "gathered": []}, result
    # written in pieces: the embedding's rows by both ranks, a norm (replicated) by one
    assert result["pieces_of"] == {"embed_tokens": 2, "q_proj": 2, "o_proj": 2, "norm": 1, "vision": 1}, result
    assert result["drifted"] == "text_decoder.decoder.final_layernorm.weight: a replicated tensor differs between tensor-parallel ranks", result


@needs_megatron
@pytest.mark.slow
@pytest.mark.matrix  # make test runs the pipeline through ten training steps (test_training_steps_follow_transformers); this names the gradients
@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 2)])
def test_the_pipeline_schedule_gives_transformers_loss_and_gradients(tp: int, pp: int, tmp_path: Path) -> None:
    """The vision tower and first layers on stage 0, the rest and the output layer on stage 1,
    run through Megatron's 1F1B schedule (forward and backward, one micro-batch): the summed
    next-token loss equals transformers' and so do the gradients of the embedding, the vision
    tower's patch embedding (stage 0) and the final norm (the last stage), to 1e-5 relative."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint("tiny", tmp_path / "model", seed=0)
    out = tmp_path / "pipeline.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp * pp), __file__, str(tmp_path / "model"), str(out), "pipeline", str(tp), str(pp)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert abs(result["loss"] - result["expected_loss"]) <= 1e-5 * abs(result["expected_loss"]), result
    assert set(result["gradients"]) == {"embedding", "patch_embed", "final_norm"}, result
    for name, (difference, scale) in result["gradients"].items():
        assert scale > 0 and difference <= 1e-5 * scale, (name, difference, scale)


def _pipeline(model_dir: Path, out: Path, tp: int, pp: int) -> None:
    """A forward and backward step through Megatron's schedule, compared with transformers."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from transformers import AutoModelForImageTextToText

    from mmcore.backends.megatron.gpt import init_model_parallel
    from mm_pack_qwen2vl.megatron import load_megatron_model

    dist.init_process_group("gloo")
    init_model_parallel(tensor_parallel=tp, pipeline_parallel=pp)
    stage, tp_rank = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()
    model = load_megatron_model(model_dir, tp, tp_rank, pp, stage).train()
    batch, labels = _batch(model_dir)

    def loss_func(logits: Any) -> Any:
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum")
        return loss, {"loss": loss.detach()}

    def forward_step(data: Any, module: Any) -> Any:
        return module(**next(data)), loss_func

    model.config.deallocate_pipeline_outputs = False
    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter([batch]),
        model=[model],
        num_microbatches=1,
        seq_length=batch["input_ids"].shape[1],
        micro_batch_size=batch["input_ids"].shape[0],
        forward_only=False,
    )
    reference = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="eager").train()
    expected, _ = loss_func(reference(**batch).logits)
    expected.backward()
    vocab = reference.config.get_text_config().vocab_size
    per_rank = -(-vocab // tp)  # this rank's vocabulary rows: the vocabulary padded to a multiple of TP, cut in TP parts
    start, real = tp_rank * per_rank, min(per_rank, vocab - tp_rank * per_rank)
    pairs = {
        "embedding": (lambda: model.language_model.embedding.word_embeddings.weight.grad[:real], lambda: reference.model.language_model.embed_tokens.weight.grad[start : start + real]),
        "patch_embed": (lambda: model.visual.patch_embed.proj.weight.grad, lambda: reference.model.visual.patch_embed.proj.weight.grad),
        "final_norm": (lambda: model.language_model.decoder.final_layernorm.weight.grad, lambda: reference.model.language_model.norm.weight.grad),
    }
    mine = {name: [float((ours() - theirs()).abs().max()), float(theirs().abs().max())] for name, (ours, theirs) in pairs.items() if (name == "final_norm") == parallel_state.is_pipeline_last_stage()}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"gradients": mine, "loss": float(losses[0]["loss"]) if losses else None})
    if dist.get_rank() == 0:
        gradients = {name: max(g["gradients"][name] for g in gathered if name in g["gradients"]) for name in pairs}
        loss = next(g["loss"] for g in gathered if g["loss"] is not None)
        out.write_text(json.dumps({"loss": loss, "expected_loss": float(expected), "gradients": gradients}))
    dist.barrier()
    dist.destroy_process_group()


@needs_megatron
@pytest.mark.slow
# make test: TP=2 here; PP=2 (a tied model) through `mmcore run` in test_qwen2vl_megatron_engine.py
@pytest.mark.parametrize("tp,pp,dp", [(2, 1, 1), pytest.param(1, 2, 1, marks=pytest.mark.matrix), pytest.param(1, 1, 2, marks=pytest.mark.matrix), pytest.param(2, 1, 2, marks=pytest.mark.matrix)])
def test_training_steps_follow_transformers(tp: int, pp: int, dp: int, tmp_path: Path) -> None:
    """Ten AdamW steps with clipping (max norm 1.0, which the first steps hit) on two batches of
    two image rows each: the loss at every step equals that of the transformers model trained
    the plain single-process way, at TP=2, PP=2 (and DP=2, TP=2 x DP=2 in the matrix)."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint("tiny", tmp_path / "model", seed=0)
    out = tmp_path / "train.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp * pp * dp), __file__, str(tmp_path / "model"), str(out), "train", str(tp), str(pp)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    ours, theirs = result["losses"], result["expected"]
    assert len(ours) == len(theirs) == 10 and theirs[-1] < 0.9 * theirs[0], result  # it learns
    assert result["clipped_steps"] >= 1, result
    for step, (a, b) in enumerate(zip(ours, theirs), start=1):
        assert abs(a - b) <= 1e-5 * abs(b), (step, a, b)


@needs_megatron
@pytest.mark.slow
@pytest.mark.matrix  # make test resumes TP=2 at PP=2 through `mmcore run` (test_qwen2vl_megatron_engine.py)
def test_saved_at_tp2_resumes_at_pp2_to_the_same_losses(tmp_path: Path) -> None:
    """Four steps at TP=2, saved (model, AdamW's moments and step) in megatron-core's
    checkpoint; resumed at TP=1 x PP=2 for steps 5-10: every loss equals the uninterrupted
    transformers run's to 1e-5 relative (so the resharded optimizer state is right too: a lost
    moment would move the next update)."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint("tiny", tmp_path / "model", seed=0)
    checkpoint = tmp_path / "step4"
    runs = (("first", 2, 1, ["--stop", "4", "--save", str(checkpoint)]), ("resumed", 1, 2, ["--resume", str(checkpoint)]))
    results = {}
    for name, tp, pp, more in runs:
        out = tmp_path / f"{name}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp * pp), __file__, str(tmp_path / "model"), str(out), "train", str(tp), str(pp), *more],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads(out.read_text())
    first, resumed = results["first"], results["resumed"]
    assert len(first["losses"]) == 4 and len(resumed["losses"]) == 6
    for step, (a, b) in enumerate(zip(first["losses"] + resumed["losses"], resumed["expected"]), start=1):
        assert abs(a - b) <= 1e-5 * abs(b), (step, a, b)


@needs_megatron
@pytest.mark.slow
def test_lora_on_the_parallel_layers_exports_what_peft_loads(tmp_path: Path) -> None:
    """LoRA (r=4) on every linear of the language model at TP=2, its B given random values (as
    after training): the adapter merged from both ranks and written in PEFT's format loads with
    PeftModel.from_pretrained on the transformers model, and the logits equal Megatron's to 1e-5."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint("tiny", tmp_path / "model", seed=0)
    out = tmp_path / "lora.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, str(tmp_path / "model"), str(out), "lora", str(tmp_path / "adapter")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["adapter_tensors"] == 2 * 7 * 2, result  # 2 layers x (q, k, v, o, gate, up, down) x (A, B)
    assert result["lora_effect"] > 1e-3, result  # the adapters change the logits ...
    assert result["max_abs_diff"] <= 1e-5, result  # ... and peft reproduces the change


def _lora(model_dir: Path, out: Path, adapter: Path) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from mmcore.backends.megatron.gpt import init_model_parallel
    from mmcore.backends.megatron.lora import add_adapters, adapter_shards, peft_state, write_peft
    from mm_pack_qwen2vl.adapter import ADAPTER
    from mm_pack_qwen2vl.megatron import load_megatron_model, of_checkpoint

    dist.init_process_group("gloo")
    init_model_parallel(tensor_parallel=2)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    model = load_megatron_model(model_dir, 2, tp_rank)
    batch, _ = _batch(model_dir)
    with torch.no_grad():
        before = model(**batch)
    add_adapters(model.language_model, r=4, alpha=8)
    torch.manual_seed(100 + tp_rank)  # B differs per rank where it is a shard; replicated B must agree, so broadcast them
    for module in model.language_model.modules():
        if hasattr(module, "lora_B"):
            with torch.no_grad():
                module.lora_B.normal_(0, 0.05)
                if not module.column:
                    dist.broadcast(module.lora_B, src=0)
                else:
                    dist.broadcast(module.lora_A, src=0)
    with torch.no_grad():
        ours = model(**batch)
    shards: list[Any] = [None, None]
    dist.all_gather_object(shards, adapter_shards(model.language_model, prefix="text_decoder."))
    if dist.get_rank() == 0:
        tensors = peft_state(of_checkpoint(model_dir), shards, ADAPTER.model_name)
        write_peft(adapter, tensors, r=4, alpha=8, base_model=model_dir)
        base = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="eager").eval()
        loaded = PeftModel.from_pretrained(base, str(adapter)).eval()
        with torch.no_grad():
            theirs = loaded(**batch).logits
        out.write_text(json.dumps({"adapter_tensors": len(tensors), "max_abs_diff": float((ours - theirs).abs().max()), "lora_effect": float((ours - before).abs().max())}))
    dist.barrier()
    dist.destroy_process_group()


def _train(model_dir: Path, out: Path, tp: int, pp: int, *options: str) -> None:
    """Ten steps on Megatron (this rank's share) and, on rank 0, ten on transformers. Options:
    ``--stop N`` (train steps 1..N), ``--save DIR`` (then save there), ``--resume DIR`` (load
    there and train the steps after the saved one)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from transformers import AutoModelForImageTextToText

    from mmcore.backends.megatron import checkpoint as megatron_checkpoint
    from mmcore.backends.megatron.gpt import init_model_parallel
    from mmcore.backends.megatron.train import clip_gradients, forward_backward, reduce_gradients
    from mm_pack_qwen2vl.megatron import load_megatron_model

    dist.init_process_group("gloo")
    init_model_parallel(tensor_parallel=tp, pipeline_parallel=pp)
    stage, tp_rank = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    model = load_megatron_model(model_dir, tp, tp_rank, pp, stage).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=False)
    steps = [_batch(model_dir, seed) for seed in (0, 1)] * 5
    option = dict(zip(options[::2], options[1::2]))
    start, stop = 0, int(option.get("--stop", len(steps)))
    if "--resume" in option:
        start = megatron_checkpoint.load(model, Path(option["--resume"]), optimizer)["step"]

    def loss_sum(logits: Any, batch: dict) -> Any:  # type: ignore[type-arg]
        labels = batch["labels"]
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum")

    losses, clipped = [], 0
    for batch, labels in steps[start:stop]:
        tokens = float((labels[:, 1:] != -100).sum())
        mine = _rows(batch, labels, dp_rank, dp)
        loss = forward_backward(model, [mine], loss_sum, tokens)
        reduce_gradients(params)
        clipped += clip_gradients(params, 1.0) > 1.0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        summed = torch.tensor([loss])
        dist.all_reduce(summed, group=parallel_state.get_data_parallel_group())
        losses.append(float(summed) / tokens)
    if "--save" in option:
        megatron_checkpoint.save(model, Path(option["--save"]), optimizer, common={"step": stop})
    if dist.get_rank() == 0:
        reference = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="eager").train()
        ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01, foreach=False)
        expected = []
        for batch, labels in steps:
            tokens = float((labels[:, 1:] != -100).sum())
            summed = loss_sum(reference(**batch).logits, {"labels": labels})
            (summed / tokens).backward()
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0, foreach=False)
            ref_optimizer.step()
            ref_optimizer.zero_grad(set_to_none=True)
            expected.append(float(summed) / tokens)
        out.write_text(json.dumps({"losses": losses, "expected": expected, "clipped_steps": int(clipped)}))
    dist.barrier()
    dist.destroy_process_group()


def _rows(batch: dict, labels: Any, rank: int, ranks: int) -> dict:  # type: ignore[type-arg]
    """This data-parallel rank's rows of a batch (each row has one image of 16 patches)."""
    rows = list(range(rank, batch["input_ids"].shape[0], ranks))
    patches = [slice(16 * r, 16 * (r + 1)) for r in rows]
    import torch

    return {
        "input_ids": batch["input_ids"][rows],
        "mm_token_type_ids": batch["mm_token_type_ids"][rows],
        "pixel_values": torch.cat([batch["pixel_values"][p] for p in patches]),
        "image_grid_thw": batch["image_grid_thw"][rows],
        "labels": labels[rows],
    }


def _batch(model_dir: Path, seed: int = 0) -> tuple[dict, Any]:  # type: ignore[type-arg]
    """Two rows with an image each (4 merged vision tokens between vision_start/vision_end), and
    labels on the text after the image."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 380, (2, 20), generator=generator)
    ids[:, 3], ids[:, 4:8], ids[:, 8] = config.vision_start_token_id, config.image_token_id, config.vision_end_token_id
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]])  # 16 patches of 14x14 (x2 frames) each, merged 2x2 into 4 tokens
    pixels = torch.randn(32, 3 * 2 * 14 * 14, generator=generator)
    labels = ids.clone()
    labels[:, :9] = -100
    return {"input_ids": ids, "mm_token_type_ids": (ids == config.image_token_id).long(), "pixel_values": pixels, "image_grid_thw": grid}, labels


def _worker(model_dir: Path, out: Path, mode: str = "compare", checkpoint: Path | None = None) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForImageTextToText

    from mmcore.backends.megatron import checkpoint as megatron_checkpoint
    from mmcore.backends.megatron.gpt import init_model_parallel
    from mm_pack_qwen2vl.megatron import MegatronQwen2VL, load_megatron_model

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    init_model_parallel(tensor_parallel=world)
    config = AutoConfig.from_pretrained(model_dir)
    ours = load_megatron_model(model_dir, world, rank)
    differing: list[str] = []
    if mode == "save":  # convert: the table's split into megatron-core's checkpoint
        megatron_checkpoint.save(ours, checkpoint)
        dist.barrier()
        dist.destroy_process_group()
        return
    if mode == "write":  # the trained-weights writers, of the loaded model, against convert's checkpoint
        out.write_text(json.dumps(_write_back(ours, model_dir, checkpoint))) if rank == 0 else _write_back(ours, model_dir, checkpoint)
        dist.barrier()
        dist.destroy_process_group()
        return
    if mode == "load":  # a model at this TP size, uninitialised, filled from a checkpoint of another
        reference, ours = ours, MegatronQwen2VL(config, world)
        megatron_checkpoint.load(ours, checkpoint)
        ours.eval()
        mine = reference.state_dict()
        differing = [k for k, v in ours.state_dict().items() if isinstance(v, torch.Tensor) and not torch.equal(v, mine[k])]
    theirs = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 380, (2, 20), generator=generator)
    ids[:, 3], ids[:, 4:8], ids[:, 8] = config.vision_start_token_id, config.image_token_id, config.vision_end_token_id
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]])  # 16 patches of 14x14 (x2 frames) each, merged 2x2 into 4 tokens
    pixels = torch.randn(32, 3 * 2 * 14 * 14, generator=generator)
    types = (ids == config.image_token_id).long()
    with torch.no_grad():
        expected = theirs(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=types).logits
        got = ours(ids, types, pixel_values=pixels, image_grid_thw=grid)
    result = {
        "shape": list(got.shape),
        "max_abs_diff": float((got - expected).abs().max()),
        "max_logit": float(expected.abs().max()),
        "parameters_differing": differing,
        "parameters": len(ours.state_dict()),
    }
    if mode == "compare":
        result.update(_parallel_figures(ours, config, expected, ids, types, pixels, grid, rank, world))
    if rank == 0:
        out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _write_back(ours: Any, model_dir: Path, converted: Path) -> dict[str, Any]:
    """Rank 0: the tensors of the pieces' checkpoint and of the gathered one that differ from
    ``converted``'s, and how many pieces some tensors were written in."""
    import torch
    import torch.distributed as dist

    from mm_pack_qwen2vl.megatron import megatron_family
    from mmcore import safe_dcp
    from mmcore.framework.context import WorldInfo
    from mmcore.engines.convert import dcp_index, load_dcp_tensors
    from mmcore.errors import StageError
    from mmcore.backends.megatron.engine import INCOMPLETE, Layout, _write_gathered, write_trained

    family, layout = megatron_family(model_dir), Layout.current()
    index = dcp_index(converted)
    rank, world = dist.get_rank(), dist.get_world_size()
    write_trained(converted.parent / "pieces", [ours], family, layout, WorldInfo(rank, world, rank, world), index)
    _write_gathered(converted.parent / f"gathered{INCOMPLETE}", [ours], family, layout)
    dist.barrier()
    norm = dict(ours.named_parameters())["language_model.decoder.final_layernorm.weight"]
    with torch.no_grad():
        norm.add_(1e-3 * rank)  # replicas that drifted apart: one rank would write its copy for all
    try:
        write_trained(converted.parent / "drifted", [ours], family, layout, WorldInfo(rank, world, rank, world), index)
        drifted = "written"
    except StageError as exc:
        drifted = str(exc)
    if rank:
        return {}
    expected = load_dcp_tensors(converted, index, index)
    differing = {}
    for way, folder in (("pieces", "pieces"), ("gathered", f"gathered{INCOMPLETE}")):
        got = load_dcp_tensors(converted.parent / folder, index, dcp_index(converted.parent / folder))
        differing[way] = [name for name in index if not torch.equal(got[name], expected[name])]
    chunks = {key: len(meta.chunks) for key, meta in safe_dcp.read_metadata(converted.parent / "pieces").state_dict_metadata.items()}

    def pieces_of(part: str) -> int:
        return chunks[next(key for key in sorted(chunks) if part in key)]

    return {
        "tensors": len(index),
        "differing": differing,
        "drifted": drifted,
        "pieces_of": {
            "embed_tokens": pieces_of("embed_tokens"),
            "q_proj": pieces_of("q_proj.weight"),
            "o_proj": pieces_of("o_proj"),
            "norm": pieces_of("language_model.norm"),
            "vision": pieces_of("visual.blocks.0.attn.qkv.weight"),
        },
    }


def _parallel_figures(ours: Any, config: Any, expected: Any, ids: Any, types: Any, pixels: Any, grid: Any, rank: int, world: int) -> dict[str, Any]:
    """What the engine computes from a rank's slice of the vocabulary and, at TP > 1, a
    sequence-parallel model: the held-out exact match (against the whole logits' own), and the
    logits of 19 tokens (padded to 20 for the split) against transformers' first 19."""
    import torch

    from mmcore.train.causal_lm import exact_match
    from mmcore.backends.megatron.train import vocab_parallel_exact_match
    from mm_pack_qwen2vl.megatron import MegatronQwen2VL

    vocab = expected.shape[-1]
    labels = torch.cat([torch.full((2, 1), -100), expected[:, :-1].argmax(-1)], dim=1)  # the greedy answer: a hit ...
    labels[:, :9] = -100
    labels[1, 15] = (labels[1, 15] + 1) % vocab  # ... but one token of row 1
    width = -(-vocab // world)
    padded = torch.cat([expected, torch.full((2, 20, width * world - vocab), 1e4)], dim=-1)  # a padding column must not win
    hits = vocab_parallel_exact_match(padded[..., rank * width : (rank + 1) * width], labels, vocab)
    figures = {"exact_match": hits.tolist(), "exact_match_whole": exact_match(expected, labels).tolist()}
    if world > 1:
        sequence_parallel = MegatronQwen2VL(config, world, sequence_parallel=True)
        sequence_parallel.load_state_dict(ours.state_dict())
        with torch.no_grad():
            got = sequence_parallel.eval()(ids[:, :19], types[:, :19], pixel_values=pixels, image_grid_thw=grid)
        figures["sequence_parallel"] = {"shape": list(got.shape), "max_abs_diff": float((got - expected[:, :19]).abs().max())}
    return figures


if __name__ == "__main__":
    if sys.argv[3:4] == ["pipeline"]:
        _pipeline(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[3:4] == ["lora"]:
        _lora(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[4]))
    elif sys.argv[3:4] == ["train"]:
        _train(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:])
    else:
        _worker(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:4], *(Path(a) for a in sys.argv[4:5]))
