"""Synthetic data for the packs' demos: one coloured shape on white, drawn with PIL (and, for
the omni demo, a tone beside it).

A demo must learn on any machine, so what it asks of the model is made easy to see: the shape
is big (a radius of 16-24 px in a 56 px image, so every 28 px merged vision token holds some
of its colour) and the colours are far apart. With the earlier 10-18 px shapes a token often
held only a sliver of colour, and whether green and blue ever came apart depended on the seed
(measured with ``tools/demo_matrix.py``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 60, 220), "yellow": (235, 210, 20)}
SHAPES = ("triangle", "square", "circle")


def shape_image(shape: str, colour: tuple[int, int, int], rng: random.Random, size: int = 56, radius: tuple[int, int] = (16, 24)) -> Any:
    """A PIL image of ``shape`` filled with ``colour``, of a random radius and place inside it."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    r = rng.randint(*radius)
    cx, cy = rng.randint(r + 2, size - r - 2), rng.randint(r + 2, size - r - 2)
    if shape == "square":
        pen.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "circle":
        pen.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "triangle":
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    else:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    return image


def write_shape_questions(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    """The VLM demo's data: "What colour is the <shape>?" over generated PNGs, as MLLM JSON.

    Writes ``train.json``, ``eval.json`` and their images under ``folder``; returns both files,
    so the demo exercises exactly the path a user's dataset takes."""
    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(samples):
        shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
        name = f"images/{i:05d}.png"
        shape_image(shape, COLOURS[colour], rng).save(folder / name)
        records.append({"messages": [{"role": "user", "content": f"<image>What colour is the {shape}?"}, {"role": "assistant", "content": colour}], "images": [name]})
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[:cut], indent=1))
    held_out.write_text(json.dumps(records[cut:], indent=1))
    return train, held_out


def write_shape_preferences(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    """The VLM DPO demo's data: "What colour is the <shape>?" over generated PNGs, the right
    colour chosen and another rejected, in LLaMA-Factory's ranking format (ShareGPT
    ``conversations`` + ``chosen``/``rejected`` messages). Returns the train and held-out files."""
    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(samples):
        shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
        wrong = rng.choice([c for c in sorted(COLOURS) if c != colour])
        name = f"images/{i:05d}.png"
        shape_image(shape, COLOURS[colour], rng).save(folder / name)
        records.append(
            {
                "conversations": [{"from": "human", "value": f"<image>What colour is the {shape}?"}],
                "chosen": {"from": "gpt", "value": f"The {shape} is {colour}."},
                "rejected": {"from": "gpt", "value": f"The {shape} is {wrong}."},
                "images": [name],
            }
        )
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[:cut], indent=1))
    held_out.write_text(json.dumps(records[cut:], indent=1))
    return train, held_out


#: the omni demo's tones, an octave apart
PITCHES = {"low": 220.0, "middle": 440.0, "high": 880.0}
SHAPE_TONE_QUESTION = "<image><audio>What colour is the shape, and is the tone low, middle or high?"
TONE_RATE = 16000


def tone_clip(hz: float, rng: Any) -> Any:
    """About half a second of a sine near ``hz`` (±2 %), random loudness, 20 ms fades and faint
    noise, at :data:`TONE_RATE` (numpy float64; ``rng`` a numpy Generator)."""
    import numpy as np

    n = int(TONE_RATE * rng.uniform(0.4, 0.6))
    t = np.arange(n) / TONE_RATE
    envelope = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.02)
    return rng.uniform(0.3, 0.9) * envelope * np.sin(2 * np.pi * hz * rng.uniform(0.98, 1.02) * t) + rng.normal(0, 0.01, n)


def write_shape_tone_questions(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    """The omni demo's data: a coloured shape (PNG) and a tone (wav) per question, the answer
    needing both: "What colour is the shape, and is the tone low, middle or high?" -> "blue high"
    (12 answers). Writes ``train.json``, ``eval.json``, their images and clips under ``folder``
    as MLLM JSON; returns both files."""
    import numpy as np

    from mmcore.data.audio import write_audio

    rng, pictures = np.random.default_rng(seed), random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(samples):
        colour = sorted(COLOURS)[int(rng.integers(0, len(COLOURS)))]
        pitch = list(PITCHES)[int(rng.integers(0, len(PITCHES)))]
        image, clip = f"images/{i:05d}.png", f"clips/{i:05d}.wav"
        shape_image(pictures.choice(SHAPES), COLOURS[colour], pictures).save(folder / image)
        write_audio(folder / clip, tone_clip(PITCHES[pitch], rng), TONE_RATE)
        records.append({"messages": [{"role": "user", "content": SHAPE_TONE_QUESTION}, {"role": "assistant", "content": f"{colour} {pitch}"}], "images": [image], "audios": [clip]})
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[:cut], indent=1))
    held_out.write_text(json.dumps(records[cut:], indent=1))
    return train, held_out


#: token counts of a long-tailed VLM mix: (share, fewest, most) for text-only turns, one
#: image, several images, a video
VLM_MIX = ((0.45, 20, 200), (0.35, 200, 700), (0.15, 700, 2000), (0.05, 2000, 6000))


def vlm_mix_lengths(n: int = 2000, seed: int = 0) -> list[int]:
    """``n`` sample lengths drawn from :data:`VLM_MIX` (for packing tests and benchmarks)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r, acc = rng.random(), 0.0
        for share, low, high in VLM_MIX:
            acc += share
            if r <= acc:
                out.append(rng.randint(low, high))
                break
        else:
            low, high = VLM_MIX[0][1:]
            out.append(rng.randint(low, high))
    return out


def vlm_mix_work(n: int = 2000, seed: int = 0) -> tuple[list[int], list[int]]:
    """(lengths, tower tokens) of ``n`` samples of :data:`VLM_MIX`: text-only turns run no
    tower; a sample with media has 20-120 text tokens, and its media tokens are 2x2-merged
    vision patches (4 patches through the tower per token, as Qwen-VL's)."""
    lengths = vlm_mix_lengths(n, seed)
    rng = random.Random(seed + 1)
    text_only = VLM_MIX[0][2]
    towers = [0 if length <= text_only and rng.random() < 0.9 else 4 * max(16, length - rng.randint(20, 120)) for length in lengths]
    return lengths, towers


# -- moving squares: the video packs' demo

SQUARE_COLOURS = {"red": (220, 30, 30), "blue": (40, 60, 220)}
MOVES = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
SQUARE_SIZE, SQUARE_FRAMES, SQUARE_FPS = 32, 9, 8


def moving_square(colour: tuple[int, int, int], move: tuple[int, int], rng: random.Random):  # type: ignore[no-untyped-def]
    import numpy as np

    frames = np.full((SQUARE_FRAMES, SQUARE_SIZE, SQUARE_SIZE, 3), 255, dtype=np.uint8)
    side, speed = 8, 2
    x = rng.randint(side, SQUARE_SIZE - side) if move[0] == 0 else (SQUARE_SIZE - side - 2 if move[0] < 0 else 2)
    y = rng.randint(side, SQUARE_SIZE - side) if move[1] == 0 else (SQUARE_SIZE - side - 2 if move[1] < 0 else 2)
    for t in range(SQUARE_FRAMES):
        cx, cy = x + move[0] * speed * t, y + move[1] * speed * t
        frames[t, max(cy, 0) : cy + side, max(cx, 0) : cx + side] = colour
    return frames


def write_moving_squares(folder: Path, samples: int, seed: int) -> Path:
    """Videos of a red or blue square moving left, right, up or down, captioned with which way
    ("a red square moves left"): real H.264 mp4 files plus caption JSON, the layout
    MindSpeed-MM users already have (the video packs' demo)."""
    from mmcore.data.video import write_mp4

    rng = random.Random(seed)
    records = []
    for i in range(samples):
        colour, move = rng.choice(sorted(SQUARE_COLOURS)), rng.choice(sorted(MOVES))
        name = f"videos/{i:05d}.mp4"
        write_mp4(folder / name, moving_square(SQUARE_COLOURS[colour], MOVES[move], rng), SQUARE_FPS)
        records.append({"path": name, "cap": f"a {colour} square moves {move}", "num_frames": SQUARE_FRAMES, "fps": SQUARE_FPS, "resolution": {"height": SQUARE_SIZE, "width": SQUARE_SIZE}})
    out = folder / "train.json"
    out.write_text(json.dumps(records, indent=1))
    return out


def write_moving_square_preferences(folder: Path, samples: int, seed: int) -> Path:
    """The DPO demo's pairs: for "a square moves <way>", the clip with a red square is chosen
    and the same clip with a blue one rejected: the model comes to prefer red squares (a
    preference no caption states, as aesthetic preferences are)."""
    from mmcore.data.video import write_mp4

    rng = random.Random(seed)
    records = []
    for i in range(samples):
        move = rng.choice(sorted(MOVES))
        start = rng.getstate()
        chosen, rejected = f"videos/{i:05d}-red.mp4", f"videos/{i:05d}-blue.mp4"
        write_mp4(folder / chosen, moving_square(SQUARE_COLOURS["red"], MOVES[move], rng), SQUARE_FPS)
        rng.setstate(start)  # the same square in the same place: only the colour differs
        write_mp4(folder / rejected, moving_square(SQUARE_COLOURS["blue"], MOVES[move], rng), SQUARE_FPS)
        records.append({"cap": f"a square moves {move}", "chosen": chosen, "rejected": rejected})
    out = folder / "pairs.json"
    out.write_text(json.dumps(records, indent=1))
    return out


# -- moving shapes: the video demos, where the caption decides what is drawn

SHAPE_COLOURS = {name: COLOURS[name] for name in ("red", "green", "blue")}
MOVING_SHAPES = ("square", "circle")


def moving_shape(shape: str, colour: tuple[int, int, int], move: tuple[int, int], rng: random.Random, size: int = 32, frames: int = 9, side: int = 12, speed: int = 2, jitter: int = 2):  # type: ignore[no-untyped-def]
    """uint8 [frames, size, size, 3]: a ``shape`` (square or circle) ``side`` px across on white,
    ``speed`` px a frame the way ``move`` points, starting at the edge it moves away from, the
    other coordinate ``jitter`` px either side of the middle at most (drawn from ``rng``): the
    caption decides nearly all of the clip."""
    import numpy as np

    if shape not in MOVING_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(MOVING_SHAPES)}")
    video = np.full((frames, size, size, 3), 255, dtype=np.uint8)
    far, middle = size - side - 2, (size - side) // 2
    x = middle + rng.randint(-jitter, jitter) if move[0] == 0 else (far if move[0] < 0 else 2)
    y = middle + rng.randint(-jitter, jitter) if move[1] == 0 else (far if move[1] < 0 else 2)
    grid = np.arange(size)
    r = side / 2
    for t in range(frames):
        left, top = x + move[0] * speed * t, y + move[1] * speed * t
        if shape == "square":
            mask = ((grid[None, :] >= left) & (grid[None, :] < left + side)) & ((grid[:, None] >= top) & (grid[:, None] < top + side))
        else:
            mask = (grid[None, :] + 0.5 - left - r) ** 2 + (grid[:, None] + 0.5 - top - r) ** 2 <= r * r
        video[t][mask] = colour
    return video


def moving_shape_clips(count: int, seed: int, size: int = 32, frames: int = 9) -> list[Any]:
    """``count`` clips as :func:`write_moving_shapes` draws them (uint8 arrays, no files): what a
    demo VAE learns to reconstruct (:func:`mmcore.engines.train_demo_vae`)."""
    rng = random.Random(seed)
    clips = []
    for _ in range(count):
        colour, shape, move = rng.choice(sorted(SHAPE_COLOURS)), rng.choice(MOVING_SHAPES), rng.choice(sorted(MOVES))
        clips.append(moving_shape(shape, SHAPE_COLOURS[colour], MOVES[move], rng, size=size, frames=frames))
    return clips


def write_moving_shapes(folder: Path, samples: int, seed: int, size: int = 32, frames: int = 9) -> Path:
    """Videos of a red, green or blue square or circle moving left, right, up or down, captioned
    with all three ("a green circle moves up", 24 captions): real H.264 mp4 files plus caption
    JSON (the video packs' demo). No clip is right for every caption, so the mean clip cannot
    win: a denoiser must read its caption (:func:`caption_agreement` checks what it drew)."""
    from mmcore.data.video import write_mp4

    rng = random.Random(seed)
    records = []
    for i in range(samples):
        colour, shape, move = rng.choice(sorted(SHAPE_COLOURS)), rng.choice(MOVING_SHAPES), rng.choice(sorted(MOVES))
        name = f"videos/{i:05d}.mp4"
        write_mp4(folder / name, moving_shape(shape, SHAPE_COLOURS[colour], MOVES[move], rng, size=size, frames=frames), SQUARE_FPS)
        records.append({"path": name, "cap": f"a {colour} {shape} moves {move}", "num_frames": frames, "fps": SQUARE_FPS, "resolution": {"height": size, "width": size}})
    out = folder / "train.json"
    out.write_text(json.dumps(records, indent=1))
    return out
