"""Batched generation (the evaluate stage's and `mmcore infer`'s path) vs one request at a time,
same process, same model: the qwen2vl demo's export after a short training.

    python bench/batched_generation.py [--quick] [--requests 100] [--batch 16] [--reps 5]

Each repetition decodes the same ``--requests`` held-out prompts (an image and a question each)
greedily with ``mmcore.generation.generate_tokens``: in batches of ``--batch`` (left-padded,
longest first, KV cache) and one by one (batch 1: no padding), order alternating. The figure is
the median of (one-by-one seconds per request) / (batched seconds per request). Goal (issue
16): >= 3. Both sides must produce the same tokens (checked).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from caches import run
from common import emit, figure, parser, pin_threads, reps_of


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=16)
    args = p.parse_args()
    if args.quick:
        args.requests = 48
    pin_threads(args.threads)
    reps = reps_of(args)

    from mm_pack_qwen2vl.family import FAMILY
    from mmcore.causal_lm import answer_span
    from mmcore.data.shards import ShardDataset
    from mmcore.generation import generate_tokens

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        # a short training, so that answers are short and sure, as a trained model's are
        folder = run(Path(tmp), "qwen2vl", "demo", 40, [], until="export")
        data = ShardDataset(folder / "preprocess/dataset")
        held_out, ids = data.split("eval"), FAMILY.token_ids(data)
        model = FAMILY.load_exported(folder / "export/hf").eval()
        prompts = []
        for i in range(args.requests):
            sample = held_out[i % len(held_out)]
            start, _ = answer_span(sample)
            prompts.append({k: v for k, v in sample.items() if k != "labels"} | {"input_ids": sample["input_ids"][:start]})
        from transformers import AutoTokenizer

        end = AutoTokenizer.from_pretrained(folder / "export/hf").convert_tokens_to_ids(FAMILY.end_token)

        def decode(batch_size: int) -> tuple[float, list[list[int]]]:
            t0 = time.perf_counter()
            tokens = generate_tokens(model, prompts, lambda chosen: FAMILY.generation_inputs(model, chosen, ids), length=lambda q: len(q["input_ids"]),
                                     end_ids=[end], pad_id=ids["pad_id"], max_new_tokens=args.max_new_tokens,
                                     batch_size=batch_size)
            return (time.perf_counter() - t0) / len(prompts), tokens

        decode(args.batch)  # warm-up, both paths
        decode(1)
        times: dict[int, list[float]] = {1: [], args.batch: []}
        answers: dict[int, list[list[int]]] = {}
        for rep in range(reps):
            for size in (1, args.batch) if rep % 2 == 0 else (args.batch, 1):
                seconds, answers[size] = decode(size)
                times[size].append(seconds)
        same = sum(a == b for a, b in zip(answers[1], answers[args.batch]))
        assert same == len(prompts), f"batched and one-by-one answers differ for {len(prompts) - same} of {len(prompts)} prompts"
        emit(figure("generation/qwen2vl-batched", f"qwen2vl demo export: greedy answers to {args.requests} image questions, batch {args.batch} vs one by one",
                    "s/request", times[args.batch], times[1], baseline_name="one request at a time", ratio_is="baseline/mmcore", goal=(">=", 3.0),
                    how=f"mmcore.generation.generate_tokens, left-padded batches longest first with the KV cache vs batch 1; the demo trained 40 steps; "
                        f"max_new_tokens {args.max_new_tokens}; same tokens both ways; {reps} repetitions alternating, {args.threads} threads"))


if __name__ == "__main__":
    main()
