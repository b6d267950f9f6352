"""The shared spoken-digit clips and the fixed checker that hears them (mmcore.data.spoken_digits)."""

from __future__ import annotations

import numpy as np
import pytest

from mmcore.data import DIGIT_WORDS, digits_clip, digits_wer, load_audio, transcribe_digits, write_spoken_digit_clips


@pytest.mark.parametrize("pace", ["fast", "speech"])
@pytest.mark.parametrize("rate", [16000, 24000])
def test_the_checker_hears_clean_synthesis_exactly(pace: str, rate: int) -> None:
    rng = np.random.default_rng(7)
    refs, hyps = [], []
    for _ in range(40):
        digits = [int(d) for d in rng.integers(0, 10, size=int(rng.integers(1, 5)))]
        refs.append(" ".join(DIGIT_WORDS[d] for d in digits))
        hyps.append(transcribe_digits(digits_clip(digits, rng, pace=pace, rate=rate), rate))
    assert digits_wer(refs, hyps) == 0.0, list(zip(refs, hyps))


def test_the_checker_reads_the_written_wav_files(tmp_path) -> None:
    clips = write_spoken_digit_clips(tmp_path, 12, seed=3, pace="speech", rate=24000)
    hyps = [transcribe_digits(load_audio(tmp_path / name, 24000), 24000) for name, _ in clips]
    assert digits_wer([text for _, text in clips], hyps) == 0.0


def test_the_checker_fails_a_wrong_clip() -> None:
    rng = np.random.default_rng(1)
    said = transcribe_digits(digits_clip([3, 1, 4], rng, pace="speech", rate=24000), 24000)
    assert said == "three one four"
    assert digits_wer(["three one five"], [said]) == pytest.approx(1 / 3)
    assert digits_wer(["three one"], [said]) == pytest.approx(1 / 2)  # an inserted word
    assert transcribe_digits(np.zeros(24000), 24000) == ""  # silence says nothing
    assert digits_wer(["seven"], [transcribe_digits(rng.normal(0, 0.3, 24000), 24000)]) > 0  # noise is no digit


def test_pitch_segments_find_each_syllable_at_its_pitch() -> None:
    from mmcore.data import digit_pitch, pitch_segments

    spans = pitch_segments(digits_clip([0, 9], np.random.default_rng(2), pace="speech", rate=24000), 24000)
    assert len(spans) == 2 and spans[0][1] < spans[1][0]
    for (_, _, f0), digit in zip(spans, [0, 9]):
        assert abs(np.log2(f0 / digit_pitch(digit))) < 0.05
