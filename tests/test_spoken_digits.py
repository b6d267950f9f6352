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


def test_griffin_lim_voices_a_clips_magnitudes_so_the_checker_hears_it() -> None:
    """Only the STFT magnitudes of spoken-digit clips (no phase), voiced by Griffin-Lim: the
    checker still hears every digit; a phase-less start alone (no rounds) is not the clip."""
    import torch

    from mmcore.data import griffin_lim

    rng = np.random.default_rng(5)
    refs, hyps = [], []
    for _ in range(8):
        digits = [int(d) for d in rng.integers(0, 10, size=3)]
        clip = digits_clip(digits, rng, pace="speech", rate=24000)
        window = torch.hann_window(960, dtype=torch.float64)
        magnitude = torch.stft(torch.from_numpy(clip), 1024, 240, 960, window=window, center=True, return_complex=True).abs()
        wav = griffin_lim(magnitude, 1024, 240, 960, length=len(clip))
        assert wav.shape == (len(clip),) and wav.dtype == torch.float32 and float(wav.abs().max()) == pytest.approx(0.5)
        refs.append(" ".join(DIGIT_WORDS[d] for d in digits))
        hyps.append(transcribe_digits(wav.numpy(), 24000))
    assert digits_wer(refs, hyps) <= 0.1, list(zip(refs, hyps))
    again = griffin_lim(magnitude, 1024, 240, 960, length=len(clip))
    assert torch.equal(again, wav)  # deterministic: zero phase to start


@pytest.mark.parametrize("n_fft,hop,win", [(1920, 480, 1920), (1024, 256, 1024), (400, 160, 400)])  # CosyVoice3's mel, common vocoders', whisper's
def test_griffin_lim_ends_a_clip_that_sounds_to_its_last_frame_without_a_click(n_fft: int, hop: int, win: int) -> None:
    """A steady band to the last frame: its waveform's peak is in the body, and the body keeps
    its level. Voiced as it is (no silent frame after it), the last samples became a click at
    the peak, the body at 0.06-0.3 of it (the peak normalisation's 0.5)."""
    import torch

    from mmcore.data import griffin_lim

    frames = 60
    magnitude = torch.rand(n_fft // 2 + 1, frames, generator=torch.Generator().manual_seed(0)) * 0.1
    magnitude[40:60] += 5.0
    wav = griffin_lim(magnitude, n_fft, hop, win, iterations=16)
    assert wav.shape == (frames * hop,)
    body, end = float(wav[:-hop].abs().max()), float(wav[-hop:].abs().max())
    assert body == pytest.approx(0.5) and end < body, (body, end)


def test_kmeans_codebook_finds_separated_clusters_and_is_seeded() -> None:
    import torch

    from mmcore.engines import kmeans_codebook

    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    points = torch.cat([c + 0.1 * torch.randn(50, 2, generator=g) for c in centres])
    book = kmeans_codebook(points, 4, seed=3)
    assert book.shape == (4, 2)
    nearest = torch.cdist(centres, book).min(dim=1).values
    assert float(nearest.max()) < 0.1  # each true centre has a centroid on it
    assert torch.equal(book, kmeans_codebook(points, 4, seed=3))
