"""Peers: the same tiny Qwen2-VL SFT job through mmcore, LLaMA-Factory and a plain transformers
``Trainer`` script, on the same machine in the same run, each a fresh command.

The job: the qwen2vl pack's ``demo`` model (random weights, written once with
``save_pretrained``: config, weights, tokenizer, image processor) in one folder every side loads;
one data file in LLaMA-Factory's format (``messages`` + ``images``, with ``dataset_info.json``)
of coloured shapes on 112 x 112 images ("What colour is the shape?" -> "The shape is red."), a
held-out file beside it; the same steps, micro-batch, cut-off length, image pixels, learning rate
(constant, no warm-up), AdamW (no weight decay, clip 1.0), fp32, seed, threads; every parameter
trained (vision tower included) on every side.

* mmcore: ``mmcore train --pack qwen2vl --model DIR --data train.json ...`` (the stages before
  train run first: model link, preprocess), the held-out file as ``data.eval_datasets``.
* llamafactory: LLaMA-Factory from the package registry (pinned) in its own uv environment the
  bench creates beside a cache (torch pinned to the same local CPU wheel first), run through
  ``bench/peers_llamafactory.py`` (its ``run_exp``, as ``llamafactory-cli train`` does, plus a
  step log); skipped with the reason where it does not install.
* trainer: ``bench/peers_trainer.py``, a plain ``transformers.Trainer`` script, in mmcore's env.

Per side and repetition (the sides' order rotating): **time to first step** (launch to the end of
optimizer step 1), **steady tokens/s** (non-pad input tokens of the steps after the warm-up over
their wall time), **peak RSS** (largest process of the command's tree, ``wait4``) and the
**held-out loss** after the last step (mean token loss on the held-out file). Ratios are
mmcore/peer per repetition, their median and IQR.

    python bench/peers.py [--quick] [--reps 3] [--peers llamafactory,trainer] [--env-cache DIR]
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import emit, figure, parser, reps_of

HERE = Path(__file__).resolve().parent
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


def write_model(out: Path) -> None:
    """The qwen2vl pack's ``demo`` model with random weights: the folder all three sides load."""
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    build_init_checkpoint("demo", out, seed=0)


def llamafactory_env(cache: Path) -> tuple[Path | None, str]:
    """A uv environment with torch (the local CPU wheel) and LLaMA-Factory, made once per cache:
    (its python, what it holds) or (None, why not). Its torchvision and torchaudio requirements
    are left out: no build of either loads beside this CPU torch (peers_llamafactory.py says how
    it runs without them)."""
    env = cache / LLAMAFACTORY.replace("==", "-")
    python = env / "bin/python"
    if (env / ".ready").exists():
        return python, (env / ".ready").read_text()
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


def launch(cmd: list[str], log: Path, env: dict[str, str], watch: Path | None = None) -> tuple[float, int, float | None]:
    """Run ``cmd``: (start time, peak RSS in KiB of its largest process, when ``watch`` first
    held a line: mmcore's metrics file, polled every 5 ms)."""
    seen: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set() and not seen:
            if watch is not None and watch.exists() and any('"loss"' in line and '"eval/' not in line for line in watch.read_text().splitlines()):
                seen.append(time.time())
            time.sleep(0.005)

    thread = threading.Thread(target=poll, daemon=True)
    with open(log, "w") as out:
        start = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=HERE)
        if watch is not None:
            thread.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"{cmd[:4]} exit {proc.returncode}; last lines of {log}:\n{tail}")
    return start, usage.ru_maxrss, (seen[0] if seen else None)


class Job:
    """The one job every side runs, and where its files lie."""

    def __init__(self, root: Path, quick: bool, threads: int) -> None:
        self.root, self.threads = root, threads
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

    def args(self) -> list[str]:
        """The shared options of the two transformers-based peers' scripts."""
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


def steady(times: dict[int, float], tokens: dict[int, float], warm: int, last: int) -> float:
    """Tokens per second over the steps after ``warm``, their wall time (step ends)."""
    return (tokens[last] - tokens[warm]) / (times[last] - times[warm])


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
        f"data.cutoff_len={job.cutoff}",
        f"data.image_max_pixels={job.pixels}",
        f"run.seed={job.seed}",
        "convert.verify=false",
        "evaluate.enabled=false",
    ]
    cmd = [
        sys.executable,
        "-m",
        "mmcore",
        "run",
        "--pack",
        "qwen2vl",
        "--preset",
        "demo",
        "--model",
        str(job.model),
        "--data",
        str(job.data / "train.json"),
        "--run-dir",
        str(run),
        "--offline",
        *overrides,
    ]
    start, rss, _ = launch(cmd, out / "log.txt", job.env)
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in rows if "loss" in r}
    index = json.loads((run / "preprocess/dataset/index.json").read_text())
    lengths = [s["length"] for s in index["samples"] if s["split"] == "train"]
    per_step = job.batch * sum(lengths) / len(lengths)  # micro-batches drawn evenly from samples of 60-61 tokens
    tokens = {step: step * per_step for step in times}
    return {"first": times[1] - start, "tps": steady(times, tokens, job.warm, job.steps), "rss": rss / 1024, "saved": str(run / "export/hf")}


def run_peer(job: Job, out: Path, python: Path, script: str) -> dict[str, float]:
    steplog, saved = out / "steps.jsonl", out / "model"
    cmd = [str(python), str(HERE / script), *job.args(), "--out", str(saved), "--steplog", str(steplog)]
    start, rss, _ = launch(cmd, out / "log.txt", job.env)
    rows = [json.loads(line) for line in steplog.read_text().splitlines()]
    times = {r["step"]: r["t"] for r in rows if "t" in r}
    tokens = {r["step"]: r["tokens"] for r in rows if "t" in r}
    own = [r["eval_loss"] for r in rows if "eval_loss" in r]
    return {"first": times[1] - start, "tps": steady(times, tokens, job.warm, job.steps), "rss": rss / 1024, "saved": str(saved), "own_eval_loss": own[-1] if own else float("nan")}


def held_out_loss(job: Job, saved: str) -> float:
    """Mean token loss on ``eval.json`` of a side's saved model: one code path for every side
    (peers_trainer.Encoding with the shared tokenizer and image processor), over the tokens every
    side trains on: the answer and its ``<|im_end|>`` (LLaMA-Factory's template also trains on the
    ``\n`` after it, mmcore's chat-template encoder does not: a token one side never learns)."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    from peers_trainer import Encoding

    encoding = Encoding(job.model, job.cutoff, newline_label=False)
    items = encoding.file(job.data / "eval.json")
    model = Qwen2VLForConditionalGeneration.from_pretrained(saved, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(items), job.batch):
            batch = encoding.collate(items[i : i + job.batch])
            labels = batch.pop("labels")
            logits = model(**batch).logits[:, :-1]
            target = labels[:, 1:]
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum"))
            count += int((target != -100).sum())
    return total / count


SCRIPTS = {"llamafactory": "peers_llamafactory.py", "trainer": "peers_trainer.py"}
FIGURES = (  # (key, name, what, unit, goal)
    ("first", "first-step", "time to first step (launch to the end of step 1)", "s", None),
    ("tps", "tokens-per-s", "steady tokens/s (non-pad input tokens)", "tokens/s", (">=", 1.0)),
    ("rss", "peak-rss", "peak RSS of the command's largest process", "MiB", ("<=", 1.0)),
    ("loss", "held-out-loss", "held-out loss after the last step (the same evaluation for every side)", "loss", None),
)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--peers", default="llamafactory,trainer", help="comma-separated: llamafactory, trainer")
    p.add_argument("--env-cache", default=str(Path.home() / ".cache/mmcore-bench"), help="where LLaMA-Factory's environment is made once and kept")
    args = p.parse_args()
    reps = reps_of(args)
    wanted = [name for name in args.peers.split(",") if name]
    import transformers

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        job = Job(Path(tmp), args.quick, args.threads)
        write_data(job.data, job.samples, job.held_out)
        write_model(job.model)
        pythons = {"trainer": Path(sys.executable)}
        names = {"trainer": f"transformers {transformers.__version__} Trainer script", "llamafactory": "LLaMA-Factory"}
        skipped = {}
        if "llamafactory" in wanted:
            python, said = llamafactory_env(Path(args.env_cache))
            if python is None:
                skipped["llamafactory"] = said
            else:
                pythons["llamafactory"], names["llamafactory"] = python, f"LLaMA-Factory run_exp; {said}"
        sides = ["mmcore", *[name for name in wanted if name in pythons]]
        results: dict[str, list[dict]] = {side: [] for side in sides}
        for rep in range(reps):
            for side in sides[rep % len(sides) :] + sides[: rep % len(sides)]:  # the order rotates
                out = job.root / f"{side}-{rep}"
                out.mkdir()
                got = run_mmcore(job, out) if side == "mmcore" else run_peer(job, out, pythons[side], SCRIPTS[side])
                got["loss"] = held_out_loss(job, got["saved"])
                results[side].append(got)
                print(f"# rep {rep} {side}: first step {got['first']:.2f} s, {got['tps']:.0f} tokens/s, {got['rss']:.0f} MiB, held-out loss {got['loss']:.4f}", file=sys.stderr, flush=True)
        how = (
            f"tiny Qwen2-VL (qwen2vl demo model, random weights), {job.samples} samples of 112x112 shapes, {job.steps} steps of {job.batch}, cut-off {job.cutoff}, "
            f"lr {job.lr} constant, AdamW, clip 1.0, fp32, all parameters trained, {args.threads} thread(s); each side a fresh command, {reps} repetitions, "
            f"order rotating; steady = steps {job.warm + 1}-{job.steps}; held-out loss on {job.held_out} samples"
        )
        for peer in sides[1:]:
            for key, name, what, unit, goal in FIGURES:
                mm, them = [r[key] for r in results["mmcore"]], [r[key] for r in results[peer]]
                extra = {"own_eval_loss": round(results[peer][-1]["own_eval_loss"], 4)} if key == "loss" else {}
                emit(figure(f"peers/qwen2vl-{name}-vs-{peer}", f"qwen2vl SFT: {what}", unit, mm, them, baseline_name=names[peer], goal=goal, how=how, **extra))
        for peer, why in skipped.items():
            mm = [r["tps"] for r in results["mmcore"]]
            emit(figure(f"peers/qwen2vl-tokens-per-s-vs-{peer}", f"qwen2vl SFT vs {names[peer]}: not run ({why})", "tokens/s", mm, None, baseline_name=names[peer], how=how))


if __name__ == "__main__":
    main()
