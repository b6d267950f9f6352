"""Peers: the same tiny training job through mmcore and the frameworks a user would pick instead,
on the same machine in the same run, each side a fresh command.

* ``qwen2vl``: SFT of the qwen2vl pack's ``demo`` model (random weights, written once with
  ``save_pretrained``: config, weights, tokenizer, image processor; one folder every side loads)
  on one data file in LLaMA-Factory's MLLM format (``messages`` + ``images``, with
  ``dataset_info.json``): coloured shapes on 112 x 112 images ("What colour is the shape?" ->
  "The shape is red."), a held-out file beside it. Peers: LLaMA-Factory and a transformers
  ``Trainer`` script.
* ``whisper``: fine-tuning the whisper pack's ``demo`` model on its demo data (synthetic spoken
  digits, wav + transcript JSONL). Peer: a transformers ``Seq2SeqTrainer`` script.
* ``wan``: text-to-video fine-tuning of the wan pack's ``demo`` pipeline (random transformer,
  the demo's fitted VAE) on captioned moving shapes (mp4 + caption JSON). Peer: a plain
  diffusers script (``bench/peers_diffusers.py``; its docstring says why not diffusers' or
  finetrainers' own).

The same steps, micro-batch, cut-off length, image pixels, learning rate (constant, no warm-up),
AdamW (no weight decay, clip 1.0), fp32, seed and threads on every side; every parameter trained.

* mmcore: ``mmcore run --pack <case> --preset demo --model DIR --data FILE ...`` (download,
  convert, preprocess, train, export; evaluate off: the held-out loss is measured below).
* llamafactory: LLaMA-Factory from the package registry (pinned) in its own uv environment the
  bench creates once under ``--env-cache`` (torch pinned to the same local CPU wheel first),
  run through ``bench/peers_llamafactory.py`` (its ``run_exp``, as ``llamafactory-cli train``
  does, plus a step log); a row saying why where it does not install.
* trainer: ``bench/peers_trainer.py`` / ``bench/peers_whisper.py``, plain transformers
  scripts in mmcore's environment; diffusers: ``bench/peers_diffusers.py``, likewise.

Per side and repetition (the sides' order rotating): **time to first step** (launch to the end of
optimizer step 1, wall clock), **steady throughput** (qwen2vl: non-pad input tokens/s; whisper
and wan: samples/s; over the steps after the warm-up, step end to step end), **peak RSS** (the command's
largest process, ``wait4``) and the **held-out loss** of the saved model after the last step (one
evaluation code path for every side). Ratios are mmcore/peer per repetition, their median and IQR.

    python bench/peers.py [--quick] [--reps 5] [--cases qwen2vl,whisper,wan] [--peers llamafactory,trainer,diffusers]
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit, figure, parser

HERE = Path(__file__).resolve().parent
#: BENCHMARKS.md's "Peers" section (bench/suite.py writes it under the table when peers rows are there)
NOTES = """
Each side a fresh command, on the same machine in the same run, the order rotating per repetition; the same model folder,
data files, steps, micro-batch, cut-off, learning rate (constant), AdamW, clipping, fp32, seed and threads; every parameter trained.

- **mmcore**: `mmcore run --pack <qwen2vl|whisper> --preset demo --model DIR --data FILE` plus the job's overrides: download (the
  model folder), convert (to DCP), preprocess, train, export (to HF, reloaded and compared); `evaluate.enabled=false`.
- **LLaMA-Factory** (`peers/qwen2vl-*-vs-llamafactory`): `llamafactory==0.9.5` from PyPI in a uv environment the bench makes once
  (`~/.cache/mmcore-bench`): torch 2.13.0 from the same local CPU wheel first, then its declared requirements except torchvision
  and torchaudio, since no build of either loads beside this CPU torch. It runs as `llamafactory-cli train` does (`run_exp`,
  `stage: sft`, `template: qwen2_vl`, `finetuning_type: full`, vision tower and projector not frozen) through
  `bench/peers_llamafactory.py`, with two shims: an empty `torchaudio` module (imported at the top of its mm_plugin, used for audio
  only) and the Qwen2-VL processor built without its torchvision video processor (the image processor stands in where
  LLaMA-Factory checks for one; the data has no videos). Versions are in the rows' baseline column.
- **transformers Trainer / Seq2SeqTrainer**: `bench/peers_trainer.py` (qwen2vl) and `bench/peers_whisper.py` (whisper), scripts
  as a user writes them, in mmcore's environment. No ms-swift row.
- **diffusers script** (`peers/wan-*-vs-diffusers`): `bench/peers_diffusers.py`, a Wan fine-tuning loop from diffusers' parts as
  its examples write one (the VAE and UMT5 encode each batch every step; logit-normal levels, shift 3). diffusers has no Wan
  training example, and finetrainers (Hugging Face's video trainer, which has one) does not run on a CPU: without an accelerator
  its device falls back to "cuda", and its 0.2.0 wheel lacks a package its `__init__` imports. mmcore encodes the clips once
  (its extract stage) and trains from the cache.
- **Held-out loss**: one evaluation code path for every side's saved model, over the tokens every side trains on. LLaMA-Factory's
  `qwen2_vl` template (and the Trainer script, which follows it) also trains on the `\n` after each answer's `<|im_end|>`; mmcore
  does not, so that token is left out. **Throughput**: qwen2vl counts non-pad input tokens (the peers' `num_input_tokens_seen`;
  mmcore's preprocessed lengths: the same 60-61 tokens a sample), whisper counts samples. **Peak RSS**: `wait4`'s `ru_maxrss`,
  which counts memory-mapped file pages too.

Where mmcore is behind, profiled on 2026-12-05 (AMD EPYC, 1 thread, the full job: 800 samples, 100 steps; `/proc/PID/status`):

- **Peak RSS**: qwen2vl `mmcore run` 886 MiB = 528 anonymous + 359 file-backed; the train stage alone in its own process 678 =
  322 + 356; the Trainer script 670 = 551 + 121. mmcore held less private memory than the script (which keeps every sample's
  pixels in memory) but read its preprocessed shards (231 MB) through mmap, and a mapping's pages count as resident once an epoch
  touches them (clean page cache, not private memory); and `mmcore run` runs the stages in one process, where preprocess left
  ~200 MiB of freed-but-held heap. Both are fixed: `gc.collect()` + `malloc_trim(0)` after each stage (768 -> 609 MiB at 30 steps),
  and since 2026-12-07 shards and feature caches are read by offset (one `pread` per tensor, `mmcore.data.shards.ShardFile`), not
  mapped: the quick job (240 samples, 30 steps, 1 thread, a loaded 2-core Xeon) peaked at 524 MiB mapped and 459 MiB read by offset
  (the Trainer script 505), the held-out loss the same to the bit. Whisper, quick, read by offset: `mmcore run` 470 MiB (325
  anonymous + 145 file-backed, the peak at export, which holds the trained and the reloaded model) vs the script's 425 (305 + 120).
  LLaMA-Factory (617 MiB) keeps images as paths and runs the image processor in its collator at every step, which is why its
  throughput is lower.
- **Time to first step**: `mmcore run` runs download (2.0 s), convert to DCP (4.4 s, most of it importing torch and transformers)
  and preprocess (qwen2vl 3.4 s, whisper 6.5 s: PyAV decoding and log-mel features of 800 clips, written as shards) before the
  first step, 0.25-0.4 s after train starts; the scripts encode in memory and start training. LLaMA-Factory spends ~19 s importing
  its stack before it logs anything.
- **Throughput vs the Trainer scripts**: at one thread within this machine's run-to-run noise (2026-12-05: 70.3 vs 67.7 ms a
  qwen2vl step). At two threads (2026-12-07) mmcore fell to 0.535 of the Trainer script: its prefetch thread's collation
  (`training.prefetch`) ran its torch ops (the batch's pixel `torch.cat`) on a second OpenMP team beside the step's, on the same
  2 cores, and a step took 44-60 ms against 25-26 (28-35 with the prefetch off; the collation it hides takes 1.2 ms). The prefetch
  thread now runs its torch ops on one thread where the step computes on the CPU: 25.0-26.3 ms against the script's 25.8-26.5 in a
  quick pair. The qwen2vl row moves with this machine: 1.06 (2026-12-07 12:03), 0.979 (15:42; IQR 0.894-1.14, the sides' medians
  1.52e4 against 1.44e4 tokens/s, mmcore's the higher): the same code path and the loop's cost measured apart at 1-2 % of a step
  (`engine_overhead`), so a 2 % miss is inside one row's spread, not a cost found. Whisper was 0.92 until 2026-12-07: PyAV's decoder
  (+19 MiB, its import and per-file setup) read each wav, where the script uses the `wave` module; a 16-bit PCM wav at the
  model's rate is now read with the standard library (the same float32 bits): 1.01. Against LLaMA-Factory mmcore is ahead (its
  collator runs the image processor every step).
"""
LLAMAFACTORY = "llamafactory==0.9.5"
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40)}
SHAPES = ("square", "circle", "triangle")
SIZE = 112  # pixels a side: 8 x 8 patches of 14, 16 merged image tokens
QUESTION = "<image>What colour is the shape?"


def write_data(root: Path, n_train: int, n_eval: int, seed: int = 0) -> None:
    """``train.json`` and ``eval.json`` in LLaMA-Factory's MLLM format, their images under
    ``images/``, and the ``dataset_info.json`` that names them ``peers_train``/``peers_eval``."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("eval", n_eval)):
        records = []
        for i in range(n):
            colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
            image = Image.new("RGB", (SIZE, SIZE), (128, 128, 128))
            x, y, r = rng.randint(30, SIZE - 30), rng.randint(30, SIZE - 30), rng.randint(14, 26)
            draw = ImageDraw.Draw(image)
            box = (x - r, y - r, x + r, y + r)
            if shape == "square":
                draw.rectangle(box, fill=COLOURS[colour])
            elif shape == "circle":
                draw.ellipse(box, fill=COLOURS[colour])
            else:
                draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=COLOURS[colour])
            path = f"images/{split}-{i}.png"
            image.save(root / path)
            records.append({"messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": f"The shape is {colour}."}], "images": [path]})
        (root / f"{split}.json").write_text(json.dumps(records, indent=1))
    (root / "dataset_info.json").write_text(json.dumps(dataset_info(), indent=1))


def dataset_info() -> dict:
    """LLaMA-Factory's entries for the two files (its ``mllm_demo`` layout)."""
    columns = {"messages": "messages", "images": "images"}
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    return {f"peers_{split}": {"file_name": f"{split}.json", "formatting": "sharegpt", "columns": columns, "tags": tags} for split in ("train", "eval")}


def llamafactory_env(cache: Path) -> tuple[Path | None, str]:
    """A uv environment with torch (the local CPU wheel) and LLaMA-Factory, made once per cache:
    (its python, what it holds) or (None, why not). Its torchvision and torchaudio requirements
    are left out: no build of either loads beside this CPU torch (peers_llamafactory.py says how
    it runs without them)."""
    env = cache / LLAMAFACTORY.replace("==", "-")
    python = env / "bin/python"
    if (env / ".ready").exists():
        return python, (env / ".ready").read_text()
    shutil.rmtree(env, ignore_errors=True)  # an attempt cut short
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        return None, "uv is not installed in mmcore's environment"
    links = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True).stdout.strip()
    find = ["--find-links", links] if links else []
    torch_pin = "torch==" + __import__("torch").__version__.split("+")[0]

    def run(*cmd: str) -> str | None:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1][:300]

    error = run(str(uv), "venv", "-q", "--python", sys.executable, str(env))
    error = error or run(str(uv), "pip", "install", "-q", "--python", str(python), *find, torch_pin)
    error = error or run(str(uv), "pip", "install", "-q", "--python", str(python), "--no-deps", LLAMAFACTORY)
    if error is None:
        requires = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print('\\n'.join(r for r in m.requires('llamafactory') if 'extra ==' not in r))"], capture_output=True, text=True
        ).stdout.split("\n")
        keep = [r for r in requires if r.strip() and r.split(";")[0].replace(" ", "").split("<")[0].split(">")[0].split("=")[0].split("!")[0] not in ("torch", "torchvision", "torchaudio")]
        error = run(str(uv), "pip", "install", "-q", "--python", str(python), *find, *keep, torch_pin)
    if error is not None:
        return None, f"{LLAMAFACTORY} did not install: {error}"
    versions = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in ('llamafactory', 'transformers', 'torch', 'peft', 'trl', 'datasets')))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    (env / ".ready").write_text(versions)
    return python, versions


def launch(cmd: list[str], log: Path, env: dict[str, str]) -> tuple[float, int]:
    """Run ``cmd``: (its start, wall clock; the peak RSS in KiB of its largest process, from
    ``wait4``: the command and every process it waited for)."""
    with open(log, "w") as out:
        start = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=HERE)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exit {proc.returncode}; last lines of {log}:\n{tail}")
    return start, usage.ru_maxrss


class Job:
    """One case's job every side runs, and where its files lie."""

    def __init__(self, root: Path, case: str, quick: bool, threads: int) -> None:
        self.root, self.case, self.threads = root, case, threads
        self.steps, self.warm, self.samples = (30, 5, 240) if quick else (100, 10, 800)
        self.batch, self.lr, self.cutoff, self.pixels, self.seed, self.held_out = 8, 1e-3, 128, SIZE * SIZE, 0, 64
        self.model, self.data = root / "model", root / "data"
        self.env = {
            **os.environ,
            **{name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(root / "hf-home"),
            "PYTHONUNBUFFERED": "1",
        }

    def write(self) -> None:
        if self.case == "qwen2vl":
            from mm_pack_qwen2vl.tiny import build_init_checkpoint

            write_data(self.data, self.samples, self.held_out)
        elif self.case == "wan":
            from mm_pack_wan.tiny import build_init_checkpoint

            from mmcore.data.synthetic import write_moving_shapes

            records = json.loads(write_moving_shapes(self.data, self.samples + self.held_out, seed=0).read_text())
            (self.data / "train.json").write_text(json.dumps(records[: self.samples]))
            (self.data / "eval.json").write_text(json.dumps(records[self.samples :]))
        else:
            from mm_pack_whisper.demo import write_demo_dataset
            from mm_pack_whisper.tiny import build_init_checkpoint

            write_demo_dataset(self.data, self.samples + self.held_out, seed=0, eval_fraction=self.held_out / (self.samples + self.held_out))
        build_init_checkpoint("demo", self.model, seed=0)  # the pack's demo model, random weights

    def args(self) -> list[str]:
        """The options of the peers' scripts."""
        return [
            "--model",
            str(self.model),
            "--data",
            str(self.data),
            "--steps",
            str(self.steps),
            "--batch",
            str(self.batch),
            "--lr",
            str(self.lr),
            "--cutoff",
            str(self.cutoff),
            "--seed",
            str(self.seed),
        ]

    def held_out_loss(self, saved: str) -> float:
        """Mean token loss of a side's saved model on the held-out file: one code path for every side."""
        if self.case == "qwen2vl":
            from peers_trainer import held_out_loss

            return held_out_loss(self.model, saved, self.data / "eval.json", self.cutoff, self.batch)
        if self.case == "wan":
            from peers_diffusers import held_out_loss

            return held_out_loss(self.model, saved, self.data / "eval.json", self.batch, WAN_TEXT_TOKENS)
        from peers_whisper import held_out_loss

        return held_out_loss(self.model, saved, self.data / "eval.jsonl", self.batch)


def steady(times: dict[int, float], amount: dict[int, float], warm: int, last: int) -> float:
    """Tokens (or samples) per second over the steps after ``warm``: their wall time, step end to step end."""
    return (amount[last] - amount[warm]) / (times[last] - times[warm])


def run_mmcore(job: Job, out: Path) -> dict[str, float]:
    run = out / "run"
    overrides = [
        f"training.steps={job.steps}",
        f"training.micro_batch_size={job.batch}",
        f"training.lr={job.lr}",
        "training.lr_schedule=constant",
        "training.warmup_steps=0",
        "training.weight_decay=0",
        "training.max_grad_norm=1.0",
        "training.precision=fp32",
        "training.checkpoint_every=0",
        "training.eval_every=0",
        f"run.seed={job.seed}",
        "convert.verify=false",
        "evaluate.enabled=false",
        *([f"data.cutoff_len={job.cutoff}", f"data.image_max_pixels={job.pixels}"] if job.case == "qwen2vl" else []),
        # every clip trained, every caption read (the script drops none), levels as the script draws them
        *(
            ["data.eval_fraction=0", f"data.max_sequence_length={WAN_TEXT_TOKENS}", "training.caption_dropout=0", "training.timestep_sampling=logit_normal", "training.flow_shift=3.0"]
            if job.case == "wan"
            else []
        ),
    ]
    train = job.data / ("train.jsonl" if job.case == "whisper" else "train.json")
    cmd = [sys.executable, "-m", "mmcore", "run", "--pack", job.case, "--preset", "demo", "--model", str(job.model), "--data", str(train), "--run-dir", str(run), "--offline", *overrides]
    start, rss = launch(cmd, out / "log.txt", job.env)
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in rows if "loss" in r}  # written at each step's end
    per_step = float(job.batch)
    if job.case == "qwen2vl":  # the preprocessed samples' lengths (60-61 tokens): micro-batches drawn evenly from them
        lengths = [s["length"] for s in json.loads((run / "preprocess/dataset/index.json").read_text())["samples"] if s["split"] == "train"]
        per_step *= sum(lengths) / len(lengths)
    amount = {step: step * per_step for step in times}
    saved = run / ("export/pipeline" if job.case == "wan" else "export/hf")
    return {"first": times[1] - start, "speed": steady(times, amount, job.warm, job.steps), "rss": rss / 1024, "saved": str(saved)}


def run_peer(job: Job, out: Path, python: Path, script: str) -> dict[str, float]:
    steplog, saved = out / "steps.jsonl", out / "model"
    start, rss = launch([str(python), str(HERE / script), *job.args(), "--out", str(saved), "--steplog", str(steplog)], out / "log.txt", job.env)
    rows = [json.loads(line) for line in steplog.read_text().splitlines()]
    times = {r["step"]: r["t"] for r in rows if "t" in r}
    amount = {r["step"]: (r["tokens"] if job.case == "qwen2vl" else r["step"] * job.batch) for r in rows if "t" in r}
    own = [r["eval_loss"] for r in rows if "eval_loss" in r]
    return {"first": times[1] - start, "speed": steady(times, amount, job.warm, job.steps), "rss": rss / 1024, "saved": str(saved), "own_eval_loss": own[-1] if own else float("nan")}


CASES = {  # case: {peer: its script}, what the job is, the unit of its speed
    "qwen2vl": ({"llamafactory": "peers_llamafactory.py", "trainer": "peers_trainer.py"}, "qwen2vl SFT", "tokens/s"),
    "whisper": ({"trainer": "peers_whisper.py"}, "whisper fine-tuning", "samples/s"),
    "wan": ({"diffusers": "peers_diffusers.py"}, "wan text-to-video fine-tuning", "samples/s"),
}
WAN_TEXT_TOKENS = 16  # the wan demo's data.max_sequence_length
FIGURES = (  # (key, id part, what, unit (None: the case's speed unit), goal)
    ("first", "first-step", "time to first step (launch to the end of step 1)", "s", None),
    ("speed", "speed", "steady throughput", None, (">=", 1.0)),
    ("rss", "peak-rss", "peak RSS of the command's largest process", "MiB", ("<=", 1.0)),
    ("loss", "held-out-loss", "held-out loss after the last step (one evaluation for every side)", "loss", None),
)


def measure(job: Job, reps: int, pythons: dict[str, Path], names: dict[str, str]) -> None:
    scripts, job_name, speed_unit = CASES[job.case]
    sides = ["mmcore", *[peer for peer in scripts if peer in pythons]]
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for rep in range(reps):
        for side in sides[rep % len(sides) :] + sides[: rep % len(sides)]:  # the order rotates
            out = job.root / f"{side}-{rep}"
            out.mkdir()
            got = run_mmcore(job, out) if side == "mmcore" else run_peer(job, out, pythons[side], scripts[side])
            got["loss"] = job.held_out_loss(got["saved"])
            results[side].append(got)
            print(
                f"# {job.case} rep {rep} {side}: first step {got['first']:.2f} s, {got['speed']:.0f} {speed_unit}, {got['rss']:.0f} MiB, held-out loss {got['loss']:.4f}", file=sys.stderr, flush=True
            )
    data = {
        "qwen2vl": "112x112 coloured shapes, LLaMA-Factory MLLM JSON",
        "whisper": "the whisper demo's synthetic spoken digits (wav + transcript JSONL)",
        "wan": "32x32 9-frame moving shapes (mp4 + caption JSON)",
    }[job.case]
    how = (
        f"{job.case} pack's demo model (random weights), {job.samples} samples of {data}, {job.steps} steps of {job.batch}"
        + (f", cut-off {job.cutoff}" if job.case == "qwen2vl" else "")
        + f", lr {job.lr} constant, AdamW, clip 1.0, fp32, all parameters trained, {job.threads} thread(s); each side a fresh command, {reps} repetitions, "
        f"order rotating; throughput over steps {job.warm + 1}-{job.steps}; held-out loss on {job.held_out} samples"
    )
    for peer in sides[1:]:
        for key, name, what, unit, goal in FIGURES:
            mm, them = [r[key] for r in results["mmcore"]], [r[key] for r in results[peer]]
            extra = {"own_eval_loss": round(results[peer][-1]["own_eval_loss"], 4)} if key == "loss" else {}
            emit(figure(f"peers/{job.case}-{name}-vs-{peer}", f"{job_name}: {what}", unit or speed_unit, mm, them, baseline_name=names[peer], goal=goal, how=how, **extra))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: qwen2vl, whisper, wan")
    p.add_argument("--peers", default="llamafactory,trainer,diffusers", help="comma-separated: llamafactory, trainer, diffusers")
    p.add_argument("--env-cache", default=str(Path.home() / ".cache/mmcore-bench"), help="where LLaMA-Factory's environment is made once and kept")
    args = p.parse_args()
    reps = args.reps or (2 if args.quick else 5)
    wanted = [name for name in args.peers.split(",") if name]
    import diffusers
    import transformers

    pythons = {"trainer": Path(sys.executable), "diffusers": Path(sys.executable)}
    names = {
        "trainer": f"transformers {transformers.__version__} Trainer script",
        "llamafactory": "LLaMA-Factory",
        "diffusers": f"diffusers {diffusers.__version__} script (no Wan example in diffusers; finetrainers does not run on a CPU)",
    }
    if "llamafactory" in wanted and "qwen2vl" in args.cases:
        python, said = llamafactory_env(Path(args.env_cache))
        if python is None:  # the row says why, with mmcore's own figure beside it
            print(f"# peers/qwen2vl-speed-vs-llamafactory: not run, {said}", file=sys.stderr)
            emit(figure("peers/qwen2vl-speed-vs-llamafactory", f"qwen2vl SFT vs LLaMA-Factory: not run ({said})", "tokens/s", [float("nan")], None, baseline_name="LLaMA-Factory", how=said))
        else:
            pythons["llamafactory"], names["llamafactory"] = python, f"LLaMA-Factory run_exp; {said}"
    pythons = {name: path for name, path in pythons.items() if name in wanted}
    for case in args.cases.split(","):
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            job = Job(Path(tmp), case, args.quick, args.threads)
            job.write()
            measure(job, reps, pythons, names)


if __name__ == "__main__":
    main()
