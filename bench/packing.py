"""Token-budget packing vs pad-to-longest on a long-tailed VLM mix: real-token fraction and
training tokens/s, measured in the same process on the same tiny decoder (CPU).

The mix (token counts): 45 % text-only turns (20-200), 35 % one image (200-700), 15 % several
images (700-2000), 5 % a video (2000-6000). Packed: rows of ``--budget`` tokens from
``TokenBudgetSampler`` (varlen attention). Padded: micro-batches of ``--batch`` samples padded to
their longest (what packing replaces). Real-token fraction = real tokens / tokens computed.

    python bench/packing.py [--quick] [--budget 8192] [--batch 4] [--steps 6] [--reps 5]

Goal (issue 20): real-token fraction >= 0.97 packed. Tokens/s: each repetition times both
ways (order alternating) after a warm-up step; the figure is the median ratio.
"""

from __future__ import annotations

import random
import time

from common import emit, figure, parser, pin_threads, reps_of


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--budget", type=int, default=8192)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    if args.quick:
        args.steps = min(args.steps, 3)
    pin_threads(args.threads)
    reps = reps_of(args)
    import torch
    import transformers

    from mmcore.train.attention import use_packed_attention, varlen_attention
    from mmcore.data.synthetic import vlm_mix_lengths
    from mmcore.train.sampler import TokenBudgetSampler

    lengths = vlm_mix_lengths(2000)
    sampler = TokenBudgetSampler(lengths, args.budget, seed=0, rank=0, world=1)
    order = list(range(len(lengths)))
    random.Random(0).shuffle(order)
    batches = [order[i : i + args.batch] for i in range(0, len(order) - args.batch + 1, args.batch)]
    padded_fraction = sum(lengths[i] for b in batches for i in b) / sum(len(b) * max(lengths[i] for i in b) for b in batches)
    emit(
        figure(
            "packing/real-token-fraction",
            "real tokens / tokens computed on a long-tailed VLM mix",
            "fraction",
            [sampler.fill()],
            [padded_fraction],
            baseline_name=f"pad to longest, batches of {args.batch}",
            ratio_is="mmcore/baseline",
            goal=(">=", 0.97),
            goal_of="mmcore",
            how=f"2000 samples of mmcore.data.synthetic.vlm_mix_lengths, TokenBudgetSampler rows of {args.budget} tokens (an exact count, no repetitions)",
        )
    )

    config = transformers.Qwen2Config(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).train()
    use_packed_attention(model, varlen_attention)  # padded rows keep SDPA with their mask

    def rate(make_batches: list[dict], real: list[int]) -> float:
        t0 = time.perf_counter()
        for batch in make_batches:
            model(**batch, use_cache=False).loss.backward()
        return sum(real) / (time.perf_counter() - t0)

    g = torch.Generator().manual_seed(0)
    packed, packed_real = [], []
    for _ in range(args.steps):
        rows = sampler.next_batch()[0]
        n = sum(lengths[i] for i in rows)
        ids = torch.randint(0, 1024, (1, n), generator=g)
        packed.append({"input_ids": ids, "labels": ids, "position_ids": torch.cat([torch.arange(lengths[i]) for i in rows])[None]})
        packed_real.append(n)
    padded, padded_real = [], []
    for b in batches:
        if sum(padded_real) >= sum(packed_real):
            break
        longest = max(lengths[i] for i in b)
        ids = torch.randint(0, 1024, (len(b), longest), generator=g)
        mask = torch.tensor([[1] * lengths[i] + [0] * (longest - lengths[i]) for i in b])
        padded.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
        padded_real.append(sum(lengths[i] for i in b))
    model(**packed[0], use_cache=False).loss.backward()  # warm-up, both paths
    model(**padded[0], use_cache=False).loss.backward()
    rates: dict[str, list[float]] = {"packed": [], "padded": []}
    for rep in range(reps):
        for way in ("packed", "padded") if rep % 2 == 0 else ("padded", "packed"):
            rates[way].append(rate(packed, packed_real) if way == "packed" else rate(padded, padded_real))
    emit(
        figure(
            "packing/real-tokens-per-s",
            "training throughput in real tokens/s on the same mix",
            "tokens/s",
            rates["packed"],
            rates["padded"],
            baseline_name="pad to longest",
            ratio_is="mmcore/baseline",
            how=f"Qwen2-style decoder (hidden 256, 2 layers), forward + backward, {args.steps} packed rows vs as many real tokens padded, {reps} repetitions alternating, {args.threads} threads",
        )
    )


if __name__ == "__main__":
    main()
