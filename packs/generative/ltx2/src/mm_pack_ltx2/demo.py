"""The ltx2 demo's synthetic clips with sound: the video demos' moving shapes ("a green circle
moves up", 24 captions), each with a tone whose pitch its colour decides (red 220 Hz, green
440 Hz, blue 880 Hz), muxed into the mp4 as an AAC sound track: a denoiser must read the
caption to get both the picture and the pitch right.

:func:`pitch_agreement` reads the pitch of what a sample sounds like: the loudest band of the
log-mel spectrogram the audio VAE decoded (the vocoder's input) and, for the record, the
loudest frequency of the waveform."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from mmcore.data import MOVES, MOVING_SHAPES, SHAPE_COLOURS, moving_shape, write_mp4

#: the tone each colour sounds
PITCH = {"red": 220.0, "green": 440.0, "blue": 880.0}
RATE, FPS = 16000, 8
#: a demo caption's colour ("a green circle moves up")
CAPTION_COLOUR = re.compile(r"^an? (?P<colour>[a-z]+) [a-z]+(?: moves [a-z]+)?$")


def tone(hz: float, seconds: float, rng: random.Random):  # type: ignore[no-untyped-def]
    """A sine at ``hz`` (±2 %) over the clip, random loudness, 20 ms fades: float32 at :data:`RATE`."""
    import numpy as np

    t = np.arange(round(seconds * RATE)) / RATE
    fade = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.02)
    return (rng.uniform(0.4, 0.8) * fade * np.sin(2 * np.pi * hz * rng.uniform(0.98, 1.02) * t)).astype(np.float32)


def write_shapes_with_tones(folder: Path, samples: int, seed: int, size: int = 32, frames: int = 9) -> Path:
    """``samples`` captioned mp4 clips with sound and their caption JSON (MindSpeed-MM's format)."""
    rng = random.Random(seed)
    records = []
    for i in range(samples):
        colour, shape, move = rng.choice(sorted(SHAPE_COLOURS)), rng.choice(MOVING_SHAPES), rng.choice(sorted(MOVES))
        name = f"videos/{i:05d}.mp4"
        video = moving_shape(shape, SHAPE_COLOURS[colour], MOVES[move], rng, size=size, frames=frames)
        write_mp4(folder / name, video, FPS, audio=(tone(PITCH[colour], frames / FPS, rng), RATE))
        records.append({"path": name, "cap": f"a {colour} {shape} moves {move}", "num_frames": frames, "fps": FPS, "resolution": {"height": size, "width": size}})
    out = folder / "train.json"
    out.write_text(json.dumps(records, indent=1))
    return out


def nearest_pitch(hz: float) -> str:
    """The demo colour whose tone is nearest ``hz`` in octaves."""
    import math

    return min(PITCH, key=lambda colour: abs(math.log2(max(hz, 1.0) / PITCH[colour])))


def band_centres(bins: int, rate: int, n_fft: int = 1024) -> Any:
    """Centre frequencies (Hz) of the log-mel bands :func:`mm_pack_ltx2.sound.log_mel` makes."""
    import numpy as np
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=bins, min_frequency=0.0, max_frequency=rate / 2, sampling_rate=rate, norm="slaney", mel_scale="slaney")
    freqs = np.fft.rfftfreq(n_fft, 1.0 / rate)
    return (bank * freqs[:, None]).sum(0) / bank.sum(0)


def loudest_frequency(samples: Any, rate: int, low: float = 50.0, high: float = 4000.0) -> float:
    """The frequency (Hz) of a waveform's largest Hann-windowed FFT magnitude between ``low`` and ``high``."""
    import numpy as np

    wave = np.asarray(samples, dtype=np.float64).reshape(-1)
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave))))
    freqs = np.fft.rfftfreq(len(wave), 1.0 / rate)
    band = (freqs >= low) & (freqs <= high)
    return float(freqs[band][spectrum[band].argmax()])


def pitch_agreement(sound: dict, caption: str) -> dict | None:  # type: ignore[type-arg]
    """Whether a sample's sound has its caption's pitch (red 220 Hz, green 440, blue 880): the
    loudest band of the generated log-mel (``sound["mel"]`` [T, bins] at ``sound["mel_rate"]``,
    averaged over time), its centre frequency nearest the caption colour's tone in octaves. The
    waveform's loudest frequency is reported beside (``wav_hz``), not judged: the demo's
    vocoder is random. None for a caption that is not a demo caption, or a sound without a mel."""
    import numpy as np

    said = CAPTION_COLOUR.match(" ".join(caption.lower().split()))
    if said is None or said["colour"] not in PITCH or sound.get("mel") is None:
        return None
    mel = np.asarray(sound["mel"], dtype=np.float64)
    centres = band_centres(mel.shape[-1], int(sound.get("mel_rate", RATE)))
    band = int(mel.mean(0).argmax())
    heard = {"colour": nearest_pitch(float(centres[band])), "band_hz": round(float(centres[band]), 1), "wav_hz": round(loudest_frequency(sound["audio"], int(sound["audio_rate"])), 1)}
    return {"agrees": heard["colour"] == said["colour"], "heard": heard}
