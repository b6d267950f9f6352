"""The demo's data: spoken digits (``mmcore.data.spoken_digits``, "fast" pace, 16 kHz), as
transcript JSONL.

Each digit is a chord at a pitch of its own (0.4 of an octave apart); a clip holds one to four of
them at a nearly regular pace and its transcript names them ("seven one zero"). With the earlier
random pauses and two to five digits, whether the tiny model found the alignment within the demo's
steps depended on the seed (tools/demo_matrix.py). Written as real 16-bit wav files plus
transcript JSONL, so the demo takes exactly the path a user's dataset takes.
"""

from __future__ import annotations

import json
from pathlib import Path

from mmcore.data import DIGIT_RATE as RATE, DIGIT_WORDS as WORDS

__all__ = ["RATE", "WORDS", "write_demo_dataset"]


def write_demo_dataset(folder: Path, samples: int, seed: int, eval_fraction: float = 0.1) -> tuple[Path, Path]:
    """Write ``train.jsonl``, ``eval.jsonl`` and their wav files under ``folder``; return both files."""
    from mmcore.data import write_spoken_digit_clips

    records = [{"audio": name, "text": text, "language": "en"} for name, text in write_spoken_digit_clips(folder, samples, seed, pace="fast", rate=RATE)]
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records[:cut]))
    held_out.write_text("".join(json.dumps(r) + "\n" for r in records[cut:]))
    return train, held_out
