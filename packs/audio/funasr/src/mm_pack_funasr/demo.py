"""The demo's data: "spoken" digits (``mmcore.data.spoken_digits``, "speech" pace, 16 kHz), as
LLaMA-Factory audio conversations.

The sound is the whisper pack's demo's, spoken at about the pace of real speech (0.20-0.26 s a
digit, 0.08-0.12 s pauses; about 3 digits a second): Fun-ASR's front end gives one feature row per
60 ms (LFR: 7 stacked 10 ms frames, stride 6), a third of Whisper's rate, so at whisper's pace
(0.10-0.14 s digits, 0.04-0.06 s pauses: ten a second) a digit was two rows and the pause under
one, and the tiny model's held-out WER depended on the seed (0.027-0.261 over 8 runs,
tools/demo_matrix.py). Each sample is MLLM JSON as a user writes it: ``{"messages": [{"role":
"user", "content": "<audio>"}, {"role": "assistant", "content": "seven one zero"}], "audios":
["clips/00001.wav"]}``, with real 16-bit wav files, so the demo takes exactly the path a user's
dataset takes (the template makes the user turn ``语音转写：<audio>``, Fun-ASR's transcription
request).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmcore.data import DIGIT_RATE as RATE, DIGIT_WORDS as WORDS

__all__ = ["RATE", "WORDS", "digits_clip", "write_spoken_digits"]


def digits_clip(digits: list[int], rng: Any) -> Any:
    """16 kHz samples (numpy float64) of ``digits`` "spoken" one after another at speech pace."""
    from mmcore.data import digits_clip as clip

    return clip(digits, rng, pace="speech", rate=RATE)


def write_spoken_digits(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    """Write ``train.json``, ``eval.json`` and their wav files under ``folder``; return both files."""
    from mmcore.data import write_spoken_digit_clips

    records = [
        {"messages": [{"role": "user", "content": "<audio>"}, {"role": "assistant", "content": text}], "audios": [name]}
        for name, text in write_spoken_digit_clips(folder, samples, seed, pace="speech", rate=RATE)
    ]
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[:cut], indent=1))
    held_out.write_text(json.dumps(records[cut:], indent=1))
    return train, held_out
