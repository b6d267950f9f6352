"""GRPO rollouts (issue 44): a prompt's group of answers sampled in one ``generate()`` call (what
``VLMGRPORecipe`` does) vs one answer at a time, same process, same model; and the rollout's
share of a GRPO step in the qwen2vl ``grpo`` preset.

    python bench/grpo_rollouts.py [--quick] [--prompts 8] [--group 8] [--reps 5]

Rollouts: the qwen2vl demo's export after a short training; for each of ``--prompts`` held-out
image questions, ``--group`` answers sampled as the preset samples them (temperature 1, top-k 4,
4 new tokens at most, placeholders suppressed): one call of ``--group`` rows, or ``--group``
calls of one row. Both draw from the same distribution but not the same random streams, so the
answers are not compared token for token. Figure: seconds per answer, one by one / grouped.

Rollout share: ``mmcore run --pack qwen2vl --preset grpo`` for 40 steps (24 supervised, 16 GRPO);
the median of ``rollout_share`` (sampling's seconds over the step's) over the GRPO steps. A record.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from batched_generation import demo_export_prompts
from common import emit, figure, parser, pin_threads, reps_of


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    args = p.parse_args()
    pin_threads(args.threads)
    reps = reps_of(args)

    import torch

    from mm_pack_qwen2vl.family import FAMILY

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        model, prompts, ids, end = demo_export_prompts(Path(tmp), args.prompts)
        suppressed = sorted({int(v) for v in ids.values()} - {end})

        def sample(prompt: dict, rows: int, seed: int) -> None:  # type: ignore[type-arg]
            inputs = FAMILY.generation_inputs(model, [prompt] * rows, ids)
            torch.manual_seed(seed)
            with torch.no_grad():
                model.generate(**inputs, do_sample=True, temperature=1.0, top_k=4, max_new_tokens=4, eos_token_id=[end], pad_token_id=ids["pad_id"], suppress_tokens=suppressed)

        def rollout(grouped: bool) -> float:
            t0 = time.perf_counter()
            for k, prompt in enumerate(prompts):
                if grouped:
                    sample(prompt, args.group, k)
                else:
                    for j in range(args.group):
                        sample(prompt, 1, k * args.group + j)
            return (time.perf_counter() - t0) / (len(prompts) * args.group)

        rollout(True)  # warm-up, both paths
        rollout(False)
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(reps):
            for grouped in (True, False) if rep % 2 == 0 else (False, True):
                times[grouped].append(rollout(grouped))
        emit(
            figure(
                "grpo/qwen2vl-rollout-grouped",
                f"qwen2vl demo export: {args.group} sampled answers to each of {args.prompts} image questions, one generate() per group vs one per answer",
                "s/answer",
                times[True],
                times[False],
                baseline_name="one answer at a time",
                ratio_is="baseline/mmcore",
                how=f"transformers generate() as VLMGRPORecipe.sample_answers calls it (temperature 1, top-k 4, max_new_tokens 4, KV cache); "
                f"the demo trained 40 steps; {reps} repetitions alternating, {args.threads} threads",
            )
        )
        share(Path(tmp), args.threads)


def share(folder: Path, threads: int) -> None:
    steps = 40
    cmd = [sys.executable, "-m", "mmcore", "run", "--pack", "qwen2vl", "--preset", "grpo", "--run-dir", "grpo", f"training.steps={steps}", "training.eval_every=0", "evaluate.enabled=false"]
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"qwen2vl grpo failed:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    rows = [json.loads(line) for line in (folder / "grpo/train/metrics.jsonl").read_text().splitlines()]
    shares = [r["rollout_share"] for r in rows if "rollout_share" in r]
    times = [r["step_time_s"] for r in rows if "rollout_share" in r]
    emit(
        figure(
            "grpo/qwen2vl-rollout-share",
            "qwen2vl grpo preset: sampling's share of a GRPO step (8 prompts x 8 answers, then the update on the 64 answers)",
            "share",
            shares,
            None,
            baseline_name="",
            how=f"metrics.jsonl rollout_share over the {len(shares)} GRPO steps of a {steps}-step run (median step {statistics.median(times):.3g} s), {threads} threads",
        )
    )


if __name__ == "__main__":
    main()
