"""The prepared accelerator check of ``parallel.backend: megatron`` (< 5 minutes on one GPU): what
megatron-core does only on CUDA, next to what mmcore's engine does, on the same model and batches
in the same run. Not yet run on a device (no session has been lent one since it was written).

    python bench/gpu_megatron.py [--layers 28] [--tokens 4096] [--micro 4] [--steps 8]
    python bench/gpu_megatron.py --tiny      # CPU dry run: a tiny shape, way A only

The model: Qwen2-VL-2B's language model (hidden 1536, 12 heads, 2 KV groups, SwiGLU 8960,
vocab 151936, tied), random weights, as mmcore builds it (``mmcore.backends.megatron.gpt.gpt_model``, the
local layer spec); text batches of ``--micro`` micro-batches of one ``--tokens`` row.

* **A, mmcore's engine step**: fp32 weights, ``mmcore.backends.megatron.train.forward_backward`` (the
  per-token loss over the step's tokens), the model-wide clip (1.0), torch AdamW; run twice:
  fp32 compute, and bf16 compute (``mmcore.backends.megatron.precision.Bf16Compute``, what
  ``training.precision: bf16`` does on this backend).
* **B, Megatron's own**: bf16 weights (``Float16Module``), its ``DistributedDataParallel``
  with fp32 gradient buffers, its distributed optimizer (fp32 main weights, Adam), its gradient
  clipping (``OptimizerConfig.clip_grad`` 1.0), ``finalize_model_grads`` dividing by the step's
  tokens.

Prints per way: the losses, step time, tokens/s, TFLOP/s, MFU (FLOPs from ``mmcore.train.flops``;
the device's bf16 peak from ``mmcore.framework.accelerator``) and peak memory; then each bf16 way's losses
against the fp32 one's (they should agree to ~1e-2 relative) and the speed and memory ratios
of mmcore's bf16 against Megatron's. The Transformer
Engine layer spec is measured only where ``transformer_engine`` imports (it is printed as
skipped otherwise: the H200 image has none).
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace
from typing import Any


def text_config(tiny: bool, layers: int) -> Any:
    if tiny:
        return SimpleNamespace(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            vocab_size=512,
            max_position_embeddings=4096,
            rope_theta=1e6,
            hidden_act="silu",
        )
    return SimpleNamespace(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=layers,
        num_attention_heads=12,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
        hidden_act="silu",
    )


def build(config: Any, device: Any, dtype: Any) -> Any:
    """The rank's GPTModel (TP = PP = 1), the same random weights for every way (seeded)."""
    import torch

    from mmcore.backends.megatron.gpt import gpt_model

    model = gpt_model(config, 1, tied=True, qkv_bias=True, dtype=dtype, parallel_output=True)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            value = torch.ones(parameter.shape) if "layernorm" in name else torch.randn(parameter.shape, generator=generator) * 0.02
            parameter.copy_(value.to(parameter.dtype))
    return model.to(device)


def batches(config: Any, args: argparse.Namespace, device: Any) -> list[list[dict[str, Any]]]:
    import torch

    generator = torch.Generator().manual_seed(1)
    steps = []
    for _ in range(args.steps):
        micro = []
        for _ in range(args.micro):
            ids = torch.randint(0, config.vocab_size, (1, args.tokens), generator=generator)
            micro.append({"input_ids": ids.to(device), "position_ids": torch.arange(args.tokens)[None].to(device), "labels": ids.to(device), "num_loss_tokens": args.tokens - 1})
        steps.append(micro)
    return steps


def step_flops(model: Any, config: Any, args: argparse.Namespace) -> float:
    from mmcore.train.flops import attention_flops, dense_flops, parameter_counts

    tokens = args.tokens * args.micro
    return dense_flops(parameter_counts(model), tokens) + attention_flops(config.num_hidden_layers, config.hidden_size, [args.tokens] * args.micro)


def way_a(config: Any, args: argparse.Namespace, device: Any, accelerator: Any, bf16: bool) -> dict[str, Any]:
    """mmcore's engine step: fp32 weights, fp32 or bf16 compute."""
    import torch

    from mmcore.backends.megatron.precision import Bf16Compute
    from mmcore.backends.megatron.train import clip_gradients, forward_backward, reduce_gradients, vocab_parallel_loss_sum

    model = build(config, device, torch.float32).train()
    precision = Bf16Compute(model.parameters(), enabled=bf16)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=device.type == "cuda")

    def loss_sum(logits: Any, batch: dict[str, Any]) -> Any:
        return vocab_parallel_loss_sum(logits, batch["labels"], config.vocab_size)

    def step(micro: list[dict[str, Any]]) -> float:
        total = float(sum(b["num_loss_tokens"] for b in micro))
        with precision.step():
            summed = forward_backward([model], [{k: v for k, v in b.items() if k != "num_loss_tokens"} | {"attention_mask": None} for b in micro], loss_sum, total)
        reduce_gradients(params)
        clip_gradients(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return summed / total

    return measure(f"A: mmcore engine, {'bf16' if bf16 else 'fp32'} compute", model, config, args, accelerator, step, batches(config, args, device))


def way_b(config: Any, args: argparse.Namespace, device: Any, accelerator: Any) -> dict[str, Any]:
    """Megatron's bf16 path: Float16Module, DDP, the distributed optimizer and its clip."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module

    from mmcore.backends.megatron.train import vocab_parallel_loss_sum

    gpt = build(config, device, torch.bfloat16)
    gpt.config.bf16 = True
    model = DistributedDataParallel(config=gpt.config, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True), module=Float16Module(gpt.config, gpt))
    model.train()
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, weight_decay=0.01, bf16=True, params_dtype=torch.bfloat16, use_distributed_optimizer=True, clip_grad=1.0), [model])
    cfg = gpt.config
    cfg.calculate_per_token_loss = True  # loss sums; finalize_model_grads divides by the step's tokens
    cfg.finalize_model_grads_func, cfg.no_sync_func, cfg.grad_scale_func = finalize_model_grads, model.no_sync, optimizer.scale_loss

    def step(micro: list[dict[str, Any]]) -> float:
        feed = iter(micro)

        def forward_step(data: Any, module: Any) -> Any:
            batch = next(data)

            def loss_func(logits: Any) -> Any:
                summed = vocab_parallel_loss_sum(logits, batch["labels"], config.vocab_size)
                return summed, torch.tensor(batch["num_loss_tokens"], dtype=torch.int, device=device), {"loss_sum": summed.detach()}

            return module(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=None), loss_func

        model.zero_grad_buffer()
        optimizer.zero_grad()
        results = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=[feed], model=[model], num_microbatches=len(micro), seq_length=args.tokens, micro_batch_size=1, forward_only=False
        )
        optimizer.step()
        return sum(float(r["loss_sum"]) for r in results) / sum(b["num_loss_tokens"] for b in micro)

    return measure("B: megatron bf16 + distributed optimizer", gpt, config, args, accelerator, step, batches(config, args, device))


def measure(way: str, model: Any, config: Any, args: argparse.Namespace, accelerator: Any, step: Any, steps: list[list[dict[str, Any]]]) -> dict[str, Any]:
    flops = step_flops(model, config, args)
    losses, times = [], []
    accelerator.reset_peak_memory()
    for micro in steps:
        accelerator.synchronize()
        t0 = time.perf_counter()
        losses.append(step(micro))
        accelerator.synchronize()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[2:] or times)[len(times[2:] or times) // 2]  # the median after two warm-up steps
    peak = accelerator.peak_flops()
    tokens = args.tokens * args.micro
    return {
        "way": way,
        "losses": [round(x, 5) for x in losses],
        "step_s": round(steady, 4),
        "tokens_per_s": round(tokens / steady),
        "tflops": round(flops / steady / 1e12, 2),
        "mfu": round(flops / steady / peak, 4) if peak else None,
        "peak_memory_gib": round(accelerator.peak_memory_bytes() / 2**30, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="a tiny shape on whatever device is there (a dry run)")
    args = parser.parse_args()
    if args.tiny:
        args.tokens, args.micro, args.steps = min(args.tokens, 64), min(args.micro, 2), min(args.steps, 3)
    import importlib.util

    import torch.distributed as dist

    from mmcore.backends.megatron.gpt import init_model_parallel
    from mmcore.framework.plugins import Plugins

    accelerator = Plugins.load().registry.accelerator("auto")
    accelerator.set_device(0)
    device = accelerator.device(0)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    init_model_parallel(1, 1, seed=0)
    config = text_config(args.tiny, args.layers)
    print(json.dumps({"device": accelerator.describe(), "tokens_per_step": args.tokens * args.micro, "layers": config.num_hidden_layers}), flush=True)
    results = [way_a(config, args, device, accelerator, bf16=False), way_a(config, args, device, accelerator, bf16=True)]
    if device.type == "cuda":
        results.append(way_b(config, args, device, accelerator))
    else:
        print(json.dumps({"way": "B", "skipped": "Megatron's DistributedDataParallel and distributed optimizer need CUDA"}), flush=True)
    if importlib.util.find_spec("transformer_engine") is None:
        print(json.dumps({"way": "Transformer Engine spec", "skipped": "transformer_engine is not installed here"}), flush=True)
    for result in results:
        print(json.dumps(result), flush=True)
    fp32 = results[0]
    for bf16 in results[1:]:
        worst = max(abs(x - y) / abs(x) for x, y in zip(fp32["losses"], bf16["losses"]))
        print(f"{bf16['way']}: losses against fp32 compute's: max relative difference {worst:.2e}", flush=True)
    if len(results) == 3:
        ours, theirs = results[1], results[2]
        print(
            f"mmcore bf16 / Megatron bf16: tokens/s {ours['tokens_per_s'] / theirs['tokens_per_s']:.3f}, peak memory {ours['peak_memory_gib'] / max(theirs['peak_memory_gib'], 1e-9):.3f}", flush=True
        )


if __name__ == "__main__":
    main()
