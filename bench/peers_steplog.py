"""What both transformers-based peers of ``bench/peers.py`` record, in their own environments:
the wall-clock time and the non-pad input tokens seen at the end of every optimizer step
(``include_num_input_tokens_seen="non_padding"``), one JSON line each, and the held-out loss.
Imports only what those environments have (transformers, through the Trainer)."""

from __future__ import annotations

import json
import time
from pathlib import Path

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
