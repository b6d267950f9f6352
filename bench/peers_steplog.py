"""What both transformers-based peers of ``bench/peers.py`` record, in their own environments:
the wall-clock time and the non-pad input tokens seen at the end of every optimizer step
(``include_num_input_tokens_seen="non_padding"``), one JSON line each, and the held-out loss.
Imports only what those environments have (transformers, through the Trainer)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback


class StepLog(TrainerCallback):
    """Appends ``{"step", "t", "tokens"}`` to ``path`` at each step's end (flushed: the bench
    reads it after the run), ``{"eval_loss"}`` after each evaluation."""

    def __init__(self, path: str | Path) -> None:
        self.file = open(path, "a", encoding="utf-8")

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.file.write(json.dumps({"step": state.global_step, "t": time.time(), "tokens": int(state.num_input_tokens_seen)}) + "\n")
        self.file.flush()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):  # type: ignore[no-untyped-def]
        if metrics and "eval_loss" in metrics:
            self.file.write(json.dumps({"step": state.global_step, "eval_loss": float(metrics["eval_loss"])}) + "\n")
            self.file.flush()


def peer_arguments(doc: str | None, data_help: str, cutoff: int = 128) -> argparse.ArgumentParser:
    """The options every peer script takes from ``bench/peers.py`` (the same job on every side)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help=data_help)
    p.add_argument("--out", required=True)
    p.add_argument("--steplog", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--cutoff", type=int, default=cutoff, help="the longest sequence in tokens (unused by the whisper peer)")
    p.add_argument("--seed", type=int, default=0)
    return p


def trainer_options(args: argparse.Namespace) -> dict[str, Any]:
    """The (Seq2Seq)TrainingArguments both transformers scripts share: constant lr, no decay,
    clip 1.0, fp32 on the CPU, no saving, no logging elsewhere."""
    return {
        "output_dir": args.out,
        "max_steps": args.steps,
        "per_device_train_batch_size": args.batch,
        "per_device_eval_batch_size": args.batch,
        "learning_rate": args.lr,
        "lr_scheduler_type": "constant",
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "seed": args.seed,
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
        "disable_tqdm": True,
    }
