"""Does a pack's demo keep its promise on any machine? Run it over seeds x CPU math x threads.

    python tools/demo_matrix.py --pack qwen2.5omni            # 3 seeds x 2 ISAs x 1 and 2 threads
    python tools/demo_matrix.py --pack wan --seeds 0 --isa native
    python tools/demo_matrix.py --pack qwen2vl --preset lora      # the LoRA demo

Each run is ``mmcore run --pack P --preset demo run.seed=S`` in a fresh run directory, with
evaluation every 5 % of the steps. A machine of another kind is stood in for by forcing
another instruction set on the same one (``--isa avx2``: ATen, oneDNN and MKL all dispatch to
AVX2 kernels instead of AVX-512/AMX), since that is what changes the float results between
machines; thread counts change the order of reductions. The demo *holds* when every run
reaches the promised figure by ``--by`` (default 60 %) of its steps and keeps it to the end:
the remaining 40 % of steps are the margin for machines not tried here.

Prints one line per run and a verdict; ``--out FILE`` also writes every curve as JSON.
Exit status 0 when the demo holds, 1 when it does not.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ISAS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}

#: What each demo promises (the pack READMEs and demo tests state the same figures):
#: (metric, "max" or "min" is better, the figure), or a list of them, all to hold. ``loss_ratio``
#: is the mean of the last 10 losses up to a step over the mean of the first 10; a metric
#: ``evaluate/NAME`` is the evaluate stage's figure (one, at the end: no "by" step).
#: ``eval_reward_gain`` is a GRPO run's held-out ``eval/reward`` against its value where the
#: supervised warm-up ended (``training.grpo.warmup_sft_steps``), over the GRPO steps only, and
#: its "by" step is that fraction of the GRPO steps. ``eval_reward_headroom`` is that gain as a
#: share of the headroom the warm-up left, ``gain / (1 - reward at the warm-up's end)``, for a
#: reward whose best is 1: a run whose warm-up ended at 0.9 cannot gain what one at 0.7 can.
PROMISES = {
    "qwen2vl": ("eval/accuracy", "max", 1.0),
    "qwen3vl": ("eval/accuracy", "max", 1.0),
    "qwen3_5": ("eval/accuracy", "max", 1.0),
    "deepseek-ocr2": ("eval/accuracy", "max", 1.0),
    "deepseek-ocr": ("eval/accuracy", "max", 1.0),
    "deepseek-vl2": ("eval/accuracy", "max", 1.0),
    "kimi-k2.5": ("eval/accuracy", "max", 1.0),
    "janus": ("eval/accuracy", "max", 1.0),
    # both directions: held-out "What colour is the <shape>?" over a picture, answered by the export, and the pictures it
    # draws for the held-out captions, read from the pixels: their colour (chance 0.25), and colour and shape both (chance
    # 1/12; the right colour in one fixed shape scores about 1/3). 8/8 (seeds 0-3 native, 8-11 AVX2, one thread):
    # colour 1.0 in all, caption 0.46-0.67, so that bar's margin is thin; packs/vlm/bagel/README.md
    "bagel": [("evaluate/image_accuracy", "max", 1.0), ("evaluate/colour_agreement", "max", 0.8), ("evaluate/caption_agreement", "max", 0.4)],
    # text -> picture: the colour of the held-out captions' drawn pictures, read from their codes (no VQ decoder in transformers).
    # 12/12 (seeds 0-3 native, 8-11 AVX2, one thread; 4-7 native, two threads): 1.0 in 11, 0.979 in one;
    # packs/vlm/lumina_mgpt/README.md
    "lumina-mgpt": ("evaluate/colour_agreement", "max", 0.8),
    "internvl": ("eval/accuracy", "max", 1.0),
    "glm4v": ("eval/accuracy", "max", 1.0),
    "qwen2.5omni": ("eval/accuracy", "max", 1.0),
    "qwen3omni": ("eval/accuracy", "max", 1.0),
    # picture + tone questions, towers and projectors frozen (the reference recipe); packs/omni/ming/README.md
    "ming": ("eval/accuracy", "max", 1.0),
    "whisper": ("eval/wer", "min", 0.1),
    # the export's greedy WER on 640 held-out clips. 12 runs (seeds 0-3 native, 8-11 AVX2, one thread; 0-3 native,
    # two threads): 9 at 0-0.011, seed 3 native 0.124 (0.104 at two threads) and seed 11 AVX2 0.116 (each merged one
    # pair of neighbouring pitches), so 0.15, not whisper's 0.1; packs/audio/funasr/README.md
    "funasr": ("evaluate/wer", "min", 0.15),
    # text -> speech: the LM's held-out teacher-forced speech-token accuracy (chance 1/16 of the
    # demo tokenizer's codes), and the spoken held-out texts' WER by the fixed pitch checker
    # (evaluate/wer, voiced by Griffin-Lim). 12/12 (seeds 0-3 native, 8-11 AVX2, one thread; 4-7 native, two
    # threads): WER 0.583-0.776, so the margin is thin; the flow's mel is what is left (packs/audio/cosyvoice3/README.md)
    "cosyvoice3": [("eval/speech_token_accuracy", "max", 0.55), ("evaluate/wer", "min", 0.85)],
    # text -> codes -> speech: the talker's held-out teacher-forced codebook-0 accuracy, and the
    # fixed pitch checker's WER on the speech of 50 held-out texts (none a training text), voiced
    # by Griffin-Lim over the demo codec's code spectra (a silent STFT frame on the end: without
    # it AVX2 seed 8 missed at 0.30, a click at the end silencing 13 texts). With it 12/12 (AVX2
    # seeds 8-11, native 0-3 one thread, native 4-7 two threads): WER 0.107, 0.040, 0.121, 0.033, 0.06, 0.193, 0.160,
    # 0.080, 0.013, 0.047, 0.167, 0.073; accuracy 0.9 by step 450 in every run; packs/audio/qwen3tts/README.md
    "qwen3tts": [("eval/codebook0_accuracy", "max", 0.9), ("evaluate/wer", "min", 0.25)],
    "wan": [("eval_loss_ratio", "min", 0.6), ("eval/caption_sensitivity", "max", 1.5), ("evaluate/caption_agreement", "max", 0.8)],
    # FLUX: the pictures' colour is the caption's; their shape is not yet (35 % measured)
    "flux": [("eval_loss_ratio", "min", 0.6), ("eval/caption_sensitivity", "max", 1.5), ("evaluate/colour_agreement", "max", 0.8)],
    # image-to-video: the first frame decides the clip (shape, colour, the edge it leaves), so the
    # caption adds little; what it must read is the frame
    "wan-i2v": [("eval_loss_ratio", "min", 0.6), ("eval/condition_sensitivity", "max", 2.0), ("evaluate/caption_agreement", "max", 0.8)],
    "cogvideox": [("eval_loss_ratio", "min", 0.6), ("eval/caption_sensitivity", "max", 1.5), ("evaluate/caption_agreement", "max", 0.8)],
    "hunyuanvideo": [("eval_loss_ratio", "min", 0.6), ("eval/caption_sensitivity", "max", 1.5), ("evaluate/caption_agreement", "max", 0.8)],
    "hunyuanvideo1.5": ("eval_loss_ratio", "min", 0.6),
    # video and sound from one caption, its VAEs trained at init:demo (the vocoder random): the
    # sound of the held-out captions' samples (the pitch of the generated log-mel) is the
    # caption's colour's. Their frames' colour is not promised: 0.35-1.0 over the 600-step runs
    # measured (green drawn blue); packs/generative/ltx2/README.md
    "ltx2": [("eval_loss_ratio", "min", 0.6), ("eval/caption_sensitivity", "max", 2.0), ("evaluate/sound_agreement", "max", 0.8)],
    # the demo VAE refitted below 19 dB on the shapes' pixels: 12/12 (seeds 0-3 native, 8-11 AVX2, one thread; 4-7
    # native, two threads): agreement 1.0 in 11, 0.95 in seed 3 (0.8 on the 16 dB floor, its VAE drawing blue green);
    # packs/generative/opensoraplan/README.md
    "opensoraplan": [("eval_loss_ratio", "min", 0.6), ("eval/caption_sensitivity", "max", 1.5), ("evaluate/caption_agreement", "max", 0.8)],
    # 3000 steps, the demo VAE refitted below 19 dB on the shapes' pixels: 12/12 (seeds 0-3 native, 8-11 AVX2, one
    # thread; 4-7 native, two threads): agreement 1.0 in 11, 0.9 in seed 4 at two threads; sensitivity 5.37, 3.13,
    # 3.44, 4.84, 4.18, 4.42, 4.20, 4.84, 3.91, 3.67, 4.11, 6.94. At 1500
    # steps with no floor 2/5 (seeds 0-3 native, 8 AVX2): agreement 0.95, 0.65, 0.9, 0.75, 0.65;
    # packs/generative/stepvideo/README.md
    "stepvideo": [("eval_loss_ratio", "min", 0.6), ("eval/caption_sensitivity", "max", 1.5), ("evaluate/caption_agreement", "max", 0.8)],
    # other presets, as "pack:preset"
    "qwen2vl:lora": ("eval/accuracy", "max", 0.9),  # with --by 0.85: the slowest seed tried passes 0.9 near step 96 of 120
    "qwen2vl:dpo": ("eval/rewards/accuracy", "max", 0.9),
    "qwen2vl:grpo": ("eval/rewards/accuracy", "max", 0.9),
    "wan:dpo": ("eval/implicit_accuracy", "max", 0.75),
    # what GRPO adds to the supervised warm-up's pictures, on held-out captions: at least half
    # the way from the warm-up's reward to a perfect one, at the end (REACHED_BY): 12 of the 12 runs
    # at lr 3e-4 holding (0.58-0.87; 7 of 8 at 5e-4)
    "flux:grpo": ("eval_reward_headroom", "max", 0.5),
}


#: demos whose promise is checked later than 60 % of the steps (``--by``'s default): a fraction
#: of the steps (of the GRPO steps for ``GRPO_GAINS``); 1.0 is the run's last evaluation.
#: flux:grpo: a colour reward rises in every run, but not monotonically (seed 2 at lr 3e-4: 0.75
#: at the warm-up's end, 0.84, 0.91, 0.87, 0.95 every 25 steps), so the promise is the end's
REACHED_BY = {"flux:grpo": 1.0}

#: the metrics measured over a GRPO run's steps after its supervised warm-up
GRPO_GAINS = ("eval_reward_gain", "eval_reward_headroom")


def demo_steps(pack: str, preset: str = "demo") -> int:
    from mmcore.testing import make_config, plugins_with

    plugins = plugins_with(installed_packs=True)
    return int(make_config(plugins, pack, preset=preset).training.steps)


def curve(run: Path, metric: str) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines() if line.strip()]
    if metric == "eval_loss_ratio":  # the held-out loss at fixed noise against its value before training
        points = {int(r["step"]): float(r["eval/loss"]) for r in rows if "eval/loss" in r}
        return {step: value / points[min(points)] for step, value in points.items()}
    if metric in GRPO_GAINS:
        start = warmup_steps(run)
        points = {int(r["step"]): float(r["eval/reward"]) for r in rows if "eval/reward" in r}
        base = points[max(s for s in points if s <= start)]
        scale = 1.0 if metric == "eval_reward_gain" else max(1.0 - base, 1e-6)
        return {step: (value - base) / scale for step, value in points.items() if step > start}
    if metric != "loss_ratio":
        return {int(r["step"]): float(r[metric]) for r in rows if metric in r}
    losses = [(int(r["step"]), float(r["loss"])) for r in rows if "loss" in r]
    first = sum(loss for _, loss in losses[:10]) / 10
    return {step: sum(loss for _, loss in losses[max(0, i - 9) : i + 1]) / len(losses[max(0, i - 9) : i + 1]) / first for i, (step, _) in enumerate(losses) if i >= 9}


def warmup_steps(run: Path) -> int:
    """The run's supervised warm-up before GRPO (``training.grpo.warmup_sft_steps``)."""
    import yaml

    return int(yaml.safe_load((run / "config.yaml").read_text())["training"]["grpo"]["warmup_sft_steps"])


def promises_of(key: str) -> list[tuple[str, str, float]]:
    """The demo's promises, a list (one for most demos)."""
    promised = PROMISES.get(key, ("eval/accuracy", "max", 0.95))
    return [promised] if isinstance(promised, tuple) else list(promised)  # type: ignore[list-item]


def final_figure(run: Path, metric: str) -> float:
    """An ``evaluate/NAME`` metric of the run's evaluate stage (NaN when it has none)."""
    metrics = json.loads((run / "evaluate/manifest.json").read_text())["metrics"]
    return float(metrics.get(metric.split("/", 1)[1], float("nan")))


def evaluate_metrics(run: Path) -> dict[str, float]:
    """Every numeric metric of the run's evaluate stage (none when it has no evaluate stage), kept
    for every run whether promised or not: a figure only reported is still a measurement."""
    path = run / "evaluate/manifest.json"
    if not path.is_file():
        return {}
    metrics = json.loads(path.read_text())["metrics"]
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def reached(points: dict[int, float], better: str, figure: float) -> int | None:
    """The first step from which every later point keeps the figure, or None."""
    ok = (lambda v: v >= figure) if better == "max" else (lambda v: v <= figure)
    first = None
    for step in sorted(points):
        if ok(points[step]):
            first = step if first is None else first
        else:
            first = None
    return first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", required=True)
    parser.add_argument("--preset", default="demo", help="the demo preset (qwen2vl: demo, or lora for the LoRA demo)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--isa", nargs="+", default=list(ISAS), choices=list(ISAS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--by", type=float, help="fraction of the steps by which the figure must be reached (default 0.6, or the demo's in REACHED_BY)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the run directories under this folder")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides, e.g. training.steps=300")
    args = parser.parse_args()

    # a pack generated by `mmcore new-pack` (VLM kit): 95 % held-out accuracy (chance: 25 %);
    # measured: 20 of 20 runs (5 seeds x 2 ISAs x 1, 2 threads) >= 96.9 % from step 40 of 200
    key = args.pack if args.preset == "demo" else f"{args.pack}:{args.preset}"
    args.by = args.by if args.by is not None else REACHED_BY.get(key, 0.6)
    promised = promises_of(key)
    steps = demo_steps(args.pack, args.preset)
    for override in args.overrides:
        if override.startswith("training.steps="):
            steps = int(override.split("=", 1)[1])
    deadline = math.floor(steps * args.by)
    every = max(1, steps // 20)
    root = args.keep or Path(tempfile.mkdtemp(prefix="demo-matrix-"))
    results = []
    for metric, better, figure in promised:
        when = "" if metric.startswith("evaluate/") else f" by step {deadline} of {steps}"
        when = f" by {args.by:.0%} of the GRPO steps after the warm-up" if metric in GRPO_GAINS else when
        print(f"{args.pack}: {metric} {'>=' if better == 'max' else '<='} {figure}{when}", flush=True)
    for seed, isa, threads in itertools.product(args.seeds, args.isa, args.threads):
        name = f"seed{seed}-{isa}-t{threads}"
        env = {**os.environ, **ISAS[isa], "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        run = root / args.pack / name
        cmd = [
            sys.executable,
            "-m",
            "mmcore",
            "run",
            "--pack",
            args.pack,
            "--preset",
            args.preset,
            "--run-dir",
            str(run),
            "--force",
            f"run.seed={seed}",
            f"training.eval_every={every}",
            *args.overrides,
        ]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"  {name:22s} FAILED (exit {proc.returncode}): {tail}", flush=True)
            results.append({"run": name, "error": tail, "holds": False})
            continue
        row: dict = {"run": name, "seed": seed, "isa": isa, "threads": threads, "seconds": round(seconds, 1), "holds": True, "promises": []}
        for metric, better, figure in promised:
            if metric.startswith("evaluate/"):
                value = final_figure(run, metric)
                holds = value >= figure if better == "max" else value <= figure
                print(f"  {name:22s} {'ok  ' if holds else 'MISS'} {metric} {value:.4g} (promised {figure}), {seconds:.0f} s", flush=True)
                row["promises"].append({"metric": metric, "final": value, "holds": holds})
                row["holds"] &= holds
                continue
            points = curve(run, metric)
            at = reached(points, better, figure)
            by = deadline
            if metric in GRPO_GAINS:  # a fraction of the GRPO steps
                start = warmup_steps(run)
                by = start + math.floor((steps - start) * args.by)
            holds = at is not None and at <= by
            final = points[max(points)] if points else float("nan")
            shown = " ".join(f"{points[s]:.3g}" for s in sorted(points)[:: max(1, len(points) // 10)])
            print(f"  {name:22s} {'ok  ' if holds else 'MISS'} {metric} reached at {at}, final {final:.4g}, {seconds:.0f} s | {shown}", flush=True)
            row["promises"].append({"metric": metric, "reached_at": at, "final": final, "holds": holds, "curve": points})
            row["holds"] &= holds
        row["evaluate"] = evaluate_metrics(run)
        if row["evaluate"]:
            print(f"  {name:22s} evaluate: " + ", ".join(f"{k} {v:.4g}" for k, v in row["evaluate"].items()), flush=True)
        results.append(row)
    held = all(r["holds"] for r in results)
    print(f"{args.pack}: {'HOLDS' if held else 'DOES NOT HOLD'} ({sum(r['holds'] for r in results)}/{len(results)} runs keep every promise; the curves' by step {deadline})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"pack": args.pack, "promises": promised, "steps": steps, "deadline": deadline, "runs": results}, indent=1))
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
