"""Token-budget packing vs pad-to-longest on a long-tailed VLM mix: real-token fraction and
training tokens/s, measured in the same process on the same tiny decoder (CPU).

The mix (token counts): 45 % text-only turns (20-200), 35 % one image (200-700), 15 % several
images (700-2000), 5 % a video (2000-6000). Packed: rows of ``--budget`` tokens from
``TokenBudgetSampler`` (varlen attention). Padded: micro-batches of ``--batch`` samples padded to
their longest (what packing replaces). Real-token fraction = real tokens / tokens computed.

    python bench/packing.py [--budget 8192] [--batch 4] [--steps 6]

Figures go into notes, never tests.
"""

from __future__ import annotations

import argparse
import json
import random
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    import torch
    import transformers

    from mmcore.attention import use_packed_attention, varlen_attention
    from mmcore.data.synthetic import vlm_mix_lengths
    from mmcore.sampler import TokenBudgetSampler

    torch.set_num_threads(2)
    lengths = vlm_mix_lengths(2000)
    sampler = TokenBudgetSampler(lengths, args.budget, seed=0, rank=0, world=1)
    order = list(range(len(lengths)))
    random.Random(0).shuffle(order)
    batches = [order[i : i + args.batch] for i in range(0, len(order) - args.batch + 1, args.batch)]
    padded_fraction = sum(lengths[i] for b in batches for i in b) / sum(len(b) * max(lengths[i] for i in b) for b in batches)
    print(json.dumps({"real_token_fraction": {"packed": round(sampler.fill(), 4), "pad_to_longest": round(padded_fraction, 4)}}), flush=True)

    config = transformers.Qwen2Config(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=8192)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).train()
    use_packed_attention(model, varlen_attention)  # padded rows keep SDPA with their mask

    def rate(make_batches: list[dict], real: list[int]) -> float:
        make = make_batches[0]
        model(**make, use_cache=False).loss.backward()  # warm-up
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
    packed_rate, padded_rate = rate(packed, packed_real), rate(padded, padded_real)
    print(json.dumps({"real_tokens_per_s": {"packed": round(packed_rate), "pad_to_longest": round(padded_rate)},
                      "ratio": round(packed_rate / padded_rate, 2)}), flush=True)


if __name__ == "__main__":
    main()
