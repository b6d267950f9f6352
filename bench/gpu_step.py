"""One prepared accelerator check (< 5 minutes on one GPU): a Qwen2-VL-2B-shaped bf16 packed
training step with random weights, through mmcore's engine pieces (meta build, FSDP2 bf16 policy,
packed attention through the device's varlen kernel, selective recompute off) next to plain
transformers + FSDP2 (SDPA with its block-diagonal mask) on the same model, the same batch, in
the same run. Prints tokens/s, TFLOP/s, MFU (mmcore.train.flops; peak from mmcore.framework.accelerator) and peak
memory of each, and their ratio.

    python bench/gpu_step.py [--tokens 16384] [--steps 6] [--layers 28]
    python bench/gpu_step.py --tiny      # the same code on a CPU with a tiny shape (a dry run)

The batch is text only: one packed row of samples of 256..2048 tokens (the vision tower's
cost is the same on both sides).
"""

from __future__ import annotations

import argparse
import json
import time


def shape(tiny: bool, layers: int) -> dict:
    if tiny:
        return dict(
            text_config=dict(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
            ),
            vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2),
            tie_word_embeddings=True,
        )
    return dict(
        text_config=dict(
            vocab_size=151936,
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=layers,
            num_attention_heads=12,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
        ),
        vision_config=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4),
        tie_word_embeddings=True,
    )


def lengths_for(total: int, seed: int = 0) -> list[int]:
    import random

    rng = random.Random(seed)
    out: list[int] = []
    low, high = (max(8, total // 64), max(16, total // 8))
    while sum(out) < total:
        out.append(min(rng.randint(low, high), total - sum(out)))
    return out


def run(way: str, args: argparse.Namespace, device: object, accelerator: object) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from mmcore.train.attention import use_packed_attention
    from mmcore.train.flops import attention_flops, dense_flops, parameter_counts
    from mmcore.checkpoint.sharded_load import materialise, parameters_on_meta

    if not dist.is_initialized():
        dist.init_process_group("gloo" if device.type == "cpu" else "cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    config = Qwen2VLConfig(**shape(args.tiny, args.layers))
    config._attn_implementation = "sdpa"
    with parameters_on_meta():
        model = Qwen2VLForConditionalGeneration(config)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in [*model.model.visual.blocks, *model.model.language_model.layers]:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    materialise(model, device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    if way == "mmcore":
        from mmcore.framework.plugins import Plugins

        kernel = Plugins.load().registry.kernel("varlen_attention", accelerator.name)
        use_packed_attention(model, kernel)
    lengths = lengths_for(args.tokens)
    ids = torch.randint(0, config.text_config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(1)).to(device)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    text = model.config.get_text_config()
    counts = parameter_counts(model.model.language_model)
    head = parameter_counts(model.lm_head)
    flops = dense_flops((counts[0] + head[0], counts[1] + head[1]), args.tokens)
    flops += attention_flops(text.num_hidden_layers, text.hidden_size, lengths)
    times = []
    accelerator.reset_peak_memory()
    for step in range(args.steps):
        accelerator.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        accelerator.synchronize()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[2:] or times)[len(times[2:] or times) // 2]  # median after two warm-up steps
    peak = accelerator.peak_flops()
    return {
        "way": way,
        "tokens": args.tokens,
        "samples": len(lengths),
        "step_s": round(steady, 4),
        "tokens_per_s": round(args.tokens / steady),
        "tflops": round(flops / steady / 1e12, 2),
        "mfu": round(flops / steady / peak, 4) if peak else None,
        "peak_memory_gib": round(accelerator.peak_memory_bytes() / 2**30, 2),
        "loss": round(loss.item(), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tiny", action="store_true", help="tiny shape on whatever device is there (a dry run)")
    args = parser.parse_args()
    if args.tiny:
        args.tokens, args.steps = min(args.tokens, 1024), min(args.steps, 3)
    from mmcore.framework.plugins import Plugins

    registry = Plugins.load().registry
    accelerator = registry.accelerator("auto")
    accelerator.set_device(0)
    device = accelerator.device(0)
    spec = registry.kernel_spec("varlen_attention", accelerator.name)
    print(json.dumps({"device": accelerator.describe(), "varlen_attention": spec.impl}), flush=True)
    results = [run(way, args, device, accelerator) for way in ("transformers", "mmcore")]
    for r in results:
        print(json.dumps(r), flush=True)
    base, ours = results
    print(f"mmcore / transformers: tokens/s {ours['tokens_per_s'] / base['tokens_per_s']:.3f}, peak memory {ours['peak_memory_gib'] / max(base['peak_memory_gib'], 1e-9):.3f}")


if __name__ == "__main__":
    main()
