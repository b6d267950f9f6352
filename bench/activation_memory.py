"""Activation memory on CPU, each measurement in a fresh process (peak RSS above the process's
peak after building the model), step time beside it:

* recompute: ``training.recompute`` none / full / selective on a Qwen2-style decoder
  (hidden 1024, 8 layers, one 4096-token row), forward + backward; the same on the megatron
  backend's ``GPTModel`` of that shape (TP = PP = 1, the engine's ``forward_backward``);
* packed attention: a packed row of 4k, 8k and 16k tokens (512-token samples) through a 2-layer
  decoder, transformers' SDPA with its block-diagonal mask vs the varlen kernel path
  (``mmcore.train.attention``): the mask is T x T, so that path's memory grows with T^2;
* Ulysses' split vision tower: the bytes autograd saves on each of 2 ranks of a sequence group
  for a 16-frame clip through a Qwen2-VL tower (width 1280 as the released one's, 4 blocks),
  the frames split between the ranks (``mmcore.backends.ulysses_towers``) vs each rank running
  them all, as before the split.

    python bench/activation_memory.py [--only recompute|megatron|attention]

Figures go into notes, never tests.
"""

from __future__ import annotations

import json
import resource
import time

from common import emit, figure, parser


def peak_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited from the parent that spawned it)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def megatron_text_config(layers: int, max_positions: int) -> object:
    """The Qwen2-style decoder shape the megatron cases build (hidden 1024, 16 heads, 4 KV heads)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        rms_norm_eps=1e-6,
        vocab_size=1024,
        max_position_embeddings=max_positions,
        rope_theta=1e6,
        hidden_act="silu",
    )


def decoder(hidden: int, layers: int, max_positions: int) -> object:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256),
        max_position_embeddings=max_positions,
    )
    config._attn_implementation = "sdpa"
    return transformers.Qwen2ForCausalLM(config).train()


def recompute_case(mode: str, queue: object) -> None:
    import torch

    from mmcore.train.recompute import apply_recompute

    torch.set_num_threads(2)
    model = decoder(1024, 8, 4096)
    apply_recompute(list(model.model.layers), mode)
    ids = torch.randint(0, 1024, (1, 4096), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids[:, :64], labels=ids[:, :64], use_cache=False).loss.backward()  # warm-up
    model.zero_grad(set_to_none=False)
    base = peak_mib()
    t0 = time.perf_counter()
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    queue.put({"case": "recompute", "mode": mode, "activation_peak_mib": round(peak_mib() - base), "step_s": round(time.perf_counter() - t0, 2)})


def megatron_recompute_case(mode: str, queue: object) -> None:
    """The engine's wrapping of a megatron-core GPTModel's layers (its ``kept_ops`` for selective)."""

    import torch
    import torch.distributed as dist

    from mmcore.backends.megatron.engine import RECOMPUTE_KEPT_OPS
    from mmcore.backends.megatron.gpt import gpt_model, init_model_parallel
    from mmcore.backends.megatron.train import forward_backward, vocab_parallel_loss_sum
    from mmcore.train.recompute import apply_recompute

    torch.set_num_threads(2)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    init_model_parallel(1, 1, seed=0)
    config = megatron_text_config(layers=8, max_positions=4096)
    model = gpt_model(config, 1, qkv_bias=True, parallel_output=True)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(torch.ones(parameter.shape) if "layernorm" in name else torch.randn(parameter.shape, generator=generator) * 0.02)
    apply_recompute(list(model.decoder.layers), mode, kept_ops=RECOMPUTE_KEPT_OPS)
    model.train()
    ids = torch.randint(0, 1024, (1, 4096), generator=torch.Generator().manual_seed(0))

    def step(length: int) -> None:
        batch = {"input_ids": ids[:, :length], "position_ids": torch.arange(length)[None], "attention_mask": None, "labels": ids[:, :length]}
        forward_backward([model], [batch], lambda logits, b: vocab_parallel_loss_sum(logits, b["labels"], 1024), float(length - 1))

    step(64)  # warm-up
    model.zero_grad(set_to_none=False)
    base = peak_mib()
    t0 = time.perf_counter()
    step(4096)
    queue.put({"case": "megatron recompute", "mode": mode, "activation_peak_mib": round(peak_mib() - base), "step_s": round(time.perf_counter() - t0, 2)})


def attention_case(path: str, tokens: int, queue: object) -> None:
    import torch

    from mmcore.train.attention import use_packed_attention, varlen_attention

    torch.set_num_threads(2)
    model = decoder(256, 2, tokens)
    if path == "varlen":
        use_packed_attention(model, varlen_attention)
    ids = torch.randint(0, 1024, (1, tokens), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(tokens).remainder(512)[None]
    base = peak_mib()
    t0 = time.perf_counter()
    model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss.backward()
    queue.put({"case": "packed attention", "path": path, "tokens": tokens, "activation_peak_mib": round(peak_mib() - base), "step_s": round(time.perf_counter() - t0, 2)})


def tower_split_case(rank: int, init: str, queue: object) -> None:
    """One rank of two: the tower's saved bytes on the whole clip, then on this rank's frames."""
    import torch
    import torch.distributed as dist
    import transformers
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    from mmcore.backends.ulysses import SequenceGroup, sharded
    from mmcore.backends.ulysses_towers import split_tower_frames
    from mmcore.plan.measure import saved_activation_bytes

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(0)
    config = transformers.Qwen2VLVisionConfig(depth=4, embed_dim=1280, hidden_size=1536, num_heads=16, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    config._attn_implementation = "sdpa"
    tower = Qwen2VisionTransformerPretrainedModel(config).train()
    grid = torch.tensor([[8, 16, 16]])  # 16 frames at 224 x 224: 8 temporal patches of 16 x 16
    pixels = torch.randn(int(grid.prod()), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(1))
    _, whole = saved_activation_bytes(tower, lambda: tower(pixels, grid_thw=grid).pooler_output.sum())
    split_tower_frames(tower, 2)
    with sharded(SequenceGroup(2, rank, dist.group.WORLD)):
        _, split = saved_activation_bytes(tower, lambda: tower(pixels, grid_thw=grid).pooler_output.sum())
    gathered = [None, None]
    dist.all_gather_object(gathered, (whole, split))
    if rank == 0:
        queue.put({"case": "ulysses tower", "whole_mib": [w / 2**20 for w, _ in gathered], "split_mib": [s / 2**20 for _, s in gathered]})
    dist.destroy_process_group()


def context_parallel_case(rank: int, world: int, init: str, queue: object, same_attention: bool = False) -> None:
    """One rank of ``world`` at parallel.context_parallel = world: the bytes autograd saves for a
    megatron-core GPTModel (M-RoPE, the engine's spec) on this rank's chunks of one row;
    ``same_attention`` (world 1): with the context-parallel attention module in place of
    megatron-core's local one (which saves the fp32 scores and probabilities whole)."""

    import torch
    import torch.distributed as dist

    from mmcore.backends.megatron.context import to_context_rank
    from mmcore.backends.megatron.gpt import gpt_model, init_model_parallel
    from mmcore.plan.measure import saved_activation_bytes

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    init_model_parallel(1, 1, seed=0, context_parallel=world)
    text = megatron_text_config(layers=4, max_positions=8192)
    model = gpt_model(text, 1, qkv_bias=True, parallel_output=True, mrope_section=[8, 12, 12], context_parallel=world)
    if same_attention:
        from mmcore.backends.megatron.context import attention_class

        for layer in model.decoder.layers:
            old = layer.self_attention.core_attention
            layer.self_attention.core_attention = attention_class()(old.config, old.layer_number, old.attn_mask_type, old.attention_type)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.02)
    model.train()
    tokens = 4096
    ids = torch.randint(0, 1024, (1, tokens), generator=torch.Generator().manual_seed(0))
    positions = to_context_rank(torch.arange(tokens).expand(3, 1, tokens), dim=2)
    embeds = to_context_rank(model.embedding(input_ids=ids, position_ids=None), dim=0).detach().requires_grad_(True)

    def forward() -> object:
        return model(input_ids=None, position_ids=positions, attention_mask=None, decoder_input=embeds).float().sum()

    _, saved = saved_activation_bytes(model, forward)
    gathered = [None] * world
    dist.all_gather_object(gathered, saved)
    if rank == 0:
        queue.put({"case": f"context parallel {world}" + (" (its attention)" if same_attention else ""), "saved_mib": [b / 2**20 for b in gathered]})
    dist.destroy_process_group()


def run_context_parallel(world: int, same_attention: bool = False) -> dict:
    import multiprocessing as mp
    import tempfile

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as scratch:
        procs = [ctx.Process(target=context_parallel_case, args=(rank, world, f"file://{scratch}/rendezvous", queue, same_attention)) for rank in range(world)]
        for proc in procs:
            proc.start()
        result = queue.get()
        for proc in procs:
            proc.join()
    print(json.dumps(result), flush=True)
    return result


def run_tower_split() -> dict:
    import multiprocessing as mp
    import tempfile

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as scratch:
        procs = [ctx.Process(target=tower_split_case, args=(rank, f"file://{scratch}/rendezvous", queue)) for rank in range(2)]
        for proc in procs:
            proc.start()
        result = queue.get()
        for proc in procs:
            proc.join()
    print(json.dumps(result), flush=True)
    return result


def run(target: object, *args: object) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--only", choices=["recompute", "megatron", "attention", "ulysses-tower", "context-parallel"])
    args = p.parse_args()
    # Peak memory of one step is deterministic: one measurement per case (reps apply to time only).
    if args.only in (None, "recompute"):
        rows = {mode: run(recompute_case, mode) for mode in ("none", "full", "selective")}
        for mode in ("full", "selective"):
            emit(
                figure(
                    f"recompute/{mode}-activation-memory",
                    f"activation memory, training.recompute: {mode} vs none",
                    "MiB",
                    [rows[mode]["activation_peak_mib"]],
                    [rows["none"]["activation_peak_mib"]],
                    baseline_name="recompute: none",
                    how="Qwen2-style decoder, hidden 1024, 8 layers, one 4096-token row, forward + backward, peak RSS above the built model, one fresh process per case, 2 threads",
                    step_time_ratio=round(rows[mode]["step_s"] / rows["none"]["step_s"], 2),
                )
            )
    if args.only in (None, "megatron"):
        rows = {mode: run(megatron_recompute_case, mode) for mode in ("none", "full", "selective")}
        for mode in ("full", "selective"):
            emit(
                figure(
                    f"recompute/megatron-{mode}-activation-memory",
                    f"activation memory on parallel.backend: megatron, training.recompute: {mode} vs none",
                    "MiB",
                    [rows[mode]["activation_peak_mib"]],
                    [rows["none"]["activation_peak_mib"]],
                    baseline_name="recompute: none",
                    how="megatron-core GPTModel (local spec), hidden 1024, 8 layers, one 4096-token row, the engine's forward_backward at "
                    "TP = PP = 1, peak RSS above the built model, one fresh process per case, 2 threads",
                    step_time_ratio=round(rows[mode]["step_s"] / rows["none"]["step_s"], 2),
                )
            )
    if args.only in (None, "attention"):
        lengths = (4096, 8192) if args.quick else (4096, 8192, 16384)
        for tokens in lengths:
            mask, varlen = run(attention_case, "transformers-mask", tokens), run(attention_case, "varlen", tokens)
            emit(
                figure(
                    f"packed_attention/{tokens // 1024}k-memory",
                    f"packed row of {tokens} tokens: varlen attention vs SDPA with a block-diagonal mask",
                    "MiB",
                    [varlen["activation_peak_mib"]],
                    [mask["activation_peak_mib"]],
                    baseline_name="transformers SDPA + mask",
                    how="2-layer decoder (hidden 256), 512-token samples packed in one row, forward + backward, peak RSS, one fresh process per case, 2 threads",
                    step_time_ratio=round(varlen["step_s"] / mask["step_s"], 2),
                )
            )

    if args.only in (None, "ulysses-tower"):
        rows = run_tower_split()
        emit(
            figure(
                "ulysses/tower-activation-memory",
                "parallel.ulysses=2: the vision tower's saved activations on a rank, frames split vs each rank running them all",
                "MiB",
                [max(rows["split_mib"])],
                [max(rows["whole_mib"])],
                baseline_name="the whole clip on every rank (before the split)",
                how="Qwen2-VL tower, width 1280, 4 blocks, one 16-frame 224x224 clip (2048 patch rows), 2 gloo processes, bytes autograd saves (mmcore.plan.measure), the busier rank",
                goal=("<=", 0.6),
            )
        )

    if args.only in (None, "context-parallel"):
        one, two = run_context_parallel(1, same_attention=True), run_context_parallel(2)
        local = run_context_parallel(1)
        emit(
            figure(
                "context_parallel/megatron-activation-memory",
                "parallel.context_parallel=2 on megatron: the decoder's saved activations on a rank vs one process with the whole row (the same attention module)",
                "MiB",
                [max(two["saved_mib"])],
                [one["saved_mib"][0]],
                baseline_name="parallel.context_parallel=1 with the context-parallel attention",
                local_attention_mib=round(local["saved_mib"][0]),
                how="megatron-core GPTModel (M-RoPE, local spec with mmcore's context-parallel attention), hidden 1024, 4 layers, one 4096-token row, "
                "gloo processes, bytes autograd saves (mmcore.plan.measure), the busier rank",
                goal=("<=", 0.6),
            )
        )


if __name__ == "__main__":
    main()
