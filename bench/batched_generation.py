"""Batched generation (the evaluate stage's and `mmcore infer`'s path) vs one request at a time,
same process, same model: the qwen2vl demo's export after a short training; and Whisper's
KV-cached greedy decoding vs decoding without a cache (what the held-out WER did before).

    python bench/batched_generation.py [--quick] [--requests 100] [--batch 16] [--reps 5]

Each repetition decodes the same ``--requests`` held-out prompts (an image and a question each)
greedily with ``mmcore.engines.generation.generate_tokens``: in batches of ``--batch`` (left-padded,
longest first, KV cache) and one by one (batch 1: no padding), order alternating. The figure is
the median of (one-by-one seconds per request) / (batched seconds per request). Goal (issue
16): >= 3. Both sides must produce the same tokens (checked).

Whisper (random weights at whisper-base sizes, 8 clips of 30 s, 64 tokens (quick: 32) for every row, 3 repetitions):
``mm_pack_whisper.generate.greedy_decode`` against the same greedy loop re-running the decoder
over the whole prefix at every token. Figure: uncached / cached seconds; a record (no goal).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

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
    from mmcore.engines.generation import generate_tokens

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        model, prompts, ids, end = demo_export_prompts(Path(tmp), args.requests)

        def decode(batch_size: int) -> tuple[float, list[list[int]]]:
            t0 = time.perf_counter()
            tokens = generate_tokens(
                model,
                prompts,
                lambda chosen: FAMILY.generation_inputs(model, chosen, ids),
                length=lambda q: len(q["input_ids"]),
                end_ids=[end],
                pad_id=ids["pad_id"],
                max_new_tokens=args.max_new_tokens,
                batch_size=batch_size,
            )
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
        emit(
            figure(
                "generation/qwen2vl-batched",
                f"qwen2vl demo export: greedy answers to {args.requests} image questions, batch {args.batch} vs one by one",
                "s/request",
                times[args.batch],
                times[1],
                baseline_name="one request at a time",
                ratio_is="baseline/mmcore",
                goal=(">=", 3.0),
                how=f"mmcore.engines.generation.generate_tokens, left-padded batches longest first with the KV cache vs batch 1; the demo trained 40 steps; "
                f"max_new_tokens {args.max_new_tokens}; same tokens both ways; {reps} repetitions alternating, {args.threads} threads",
            )
        )
    whisper_cache(args, min(reps, 3))  # the uncached side is slow (quadratic), and its spread small


def demo_export_prompts(folder: Path, count: int) -> tuple[Any, list[dict[str, Any]], dict[str, Any], int]:
    """The qwen2vl demo trained 40 steps and exported under ``folder`` (short, sure answers, as a
    trained model's are): (the export's model, ``count`` held-out prompts cut before their
    answers, the data's token ids, the end-of-turn token's id)."""
    from transformers import AutoTokenizer

    from mm_pack_qwen2vl.family import FAMILY
    from mmcore.data.shards import ShardDataset
    from mmcore.train.causal_lm import answer_span

    trained = run(folder, "qwen2vl", "demo", 40, [], until="export")
    data = ShardDataset(trained / "preprocess/dataset")
    held_out, ids = data.split("eval"), FAMILY.token_ids(data)
    model = FAMILY.load_exported(trained / "export/hf").eval()
    prompts = []
    for i in range(count):
        sample = held_out[i % len(held_out)]
        start, _ = answer_span(sample)
        prompts.append({k: v for k, v in sample.items() if k != "labels"} | {"input_ids": sample["input_ids"][:start]})
    end = AutoTokenizer.from_pretrained(trained / "export/hf").convert_tokens_to_ids(FAMILY.end_token)
    return model, prompts, ids, end


def whisper_cache(args, reps: int) -> None:  # type: ignore[no-untyped-def]
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.modeling_outputs import BaseModelOutput

    from mm_pack_whisper.generate import greedy_decode

    config = WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, num_mel_bins=80)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    features, steps = torch.randn(8, 80, 3000), 32 if args.quick else 64
    prefix = torch.full((8, 4), config.decoder_start_token_id)
    with torch.no_grad():
        states = model.model.encoder(features).last_hidden_state

    def uncached() -> list[list[int]]:  # the former held-out decoder: the whole prefix again at every token
        ids = prefix
        with torch.no_grad():
            for _ in range(steps):
                logits = model(encoder_outputs=BaseModelOutput(last_hidden_state=states), decoder_input_ids=ids, use_cache=False).logits
                ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids[:, prefix.shape[1] :].tolist()

    def timed(cached: bool) -> tuple[float, list[list[int]]]:
        t0 = time.perf_counter()
        out = greedy_decode(model, {"encoder_states": states}, prefix, steps, eos_id=-1, fixed_steps=True) if cached else uncached()
        return time.perf_counter() - t0, out

    timed(True)
    timed(False)
    times: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, list[list[int]]] = {}
    for rep in range(reps):
        for cached in (True, False) if rep % 2 == 0 else (False, True):
            seconds, tokens[cached] = timed(cached)
            times[cached].append(seconds)
    # random weights leave near ties that the two kernels' rounding may break apart: count, don't demand
    same = sum(a == b for x, y in zip(tokens[True], tokens[False]) for a, b in zip(x, y)) / sum(map(len, tokens[False]))
    assert same >= 0.9, f"cached and uncached decoding agree on only {same:.0%} of tokens"
    emit(
        figure(
            "generation/whisper-kv-cache",
            f"whisper-base greedy decoding of {steps} tokens x 8 clips: KV cache vs none",
            "s/batch",
            times[True],
            times[False],
            baseline_name="decoder over the whole prefix every token",
            ratio_is="baseline/mmcore",
            goal=None,
            how=f"random weights at openai/whisper-base sizes, encoder outputs given, {steps} tokens forced for every row; {reps} repetitions alternating, {args.threads} threads",
            same_tokens=round(same, 4),
        )
    )


if __name__ == "__main__":
    main()
