"""The demo's codec (``init:demo``): the public layout kept, loaded strictly; a digit's codes set
by it and the digit before it only; the code spectra voiced by Griffin-Lim heard by the fixed
checker.
All in ``make test-matrix``; the whole demo (minutes) also in ``tools/demo_matrix.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mmcore.testing import stage_manifest


# building init:demo takes about 50 s on one idle core (the encoder's fit), past the pack's share
# of make test: these run in make test-matrix with the whole demo
pytestmark = pytest.mark.matrix


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_qwen3tts.demo import build_demo_checkpoint

    return build_demo_checkpoint(tmp_path_factory.mktemp("q3demo") / "model", seed=0)


def test_the_demo_codec_keeps_the_public_layout_and_loads_strictly(demo_dir: Path, tiny_dir: Path) -> None:
    from safetensors import safe_open

    from mm_pack_qwen3tts.demo import SPECTRA, load_spectra
    from mm_pack_qwen3tts.model import load_codec, load_speech_encoder

    with safe_open(str(tiny_dir / "speech_tokenizer/model.safetensors"), "pt") as a, safe_open(str(demo_dir / "speech_tokenizer/model.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())
        assert all(a.get_slice(k).get_shape() == b.get_slice(k).get_shape() for k in a.keys())
        fitted = [k for k in a.keys() if not torch.equal(a.get_tensor(k), b.get_tensor(k))]
    assert fitted and all(k.startswith("encoder.") for k in fitted)  # the decoder as built; the encoder fitted
    encoder = load_speech_encoder(demo_dir)  # strict, the public 4.57 names
    load_codec(demo_dir)
    # zeroed before the fit, which then trains them a little (8e-5 ... 0.047 measured): the
    # transformer stays near pass-through; what that buys is the next test's property
    scales = [p for n, p in encoder.named_parameters() if n.endswith("layer_scale.scale")]
    assert scales and all(float(p.detach().abs().max()) < 0.1 for p in scales)
    tables = load_spectra(demo_dir)
    assert tables["spectra"].shape == (32, 4, 513) and tables["pairs"].shape[1] == 2 and len(tables["pair_spectra"]) == len(tables["pairs"])
    assert (demo_dir / "speech_tokenizer" / SPECTRA).is_file()


def test_a_digits_codes_depend_on_it_and_the_digit_before_only(demo_dir: Path) -> None:
    """What lets the talker compose a text it never saw: a digit's codes (every codebook) are set
    by that digit and the one right before it (the encoder's transformer passes its input
    through; its convolutions reach one digit back), and digits alone differ."""
    from mm_pack_qwen3tts.demo import digits_wave
    from mm_pack_qwen3tts.model import load_speech_encoder

    encoder = load_speech_encoder(demo_dir)

    def codes(digits: list[int]) -> torch.Tensor:
        return encoder.encode(torch.from_numpy(digits_wave(digits)))

    assert len({tuple(codes([d])[:2, 0].tolist()) for d in range(10)}) == 10
    for before, d in ((0, 2), (4, 7), (9, 9)):
        same = codes([0, before, d])[6:]
        assert all(torch.equal(codes([first, before, d])[6:], same) for first in range(1, 10)), (before, d)


def test_the_demo_voice_speaks_a_clips_codes_so_the_checker_hears_them(demo_dir: Path) -> None:
    from mmcore.data import digits_wer, transcribe_digits

    from mm_pack_qwen3tts.data import WORDS
    from mm_pack_qwen3tts.demo import FRAME, digits_wave, load_spectra, random_digits, voice
    from mm_pack_qwen3tts.model import load_speech_encoder

    encoder, spectra = load_speech_encoder(demo_dir), load_spectra(demo_dir)
    rng = np.random.default_rng(99)
    refs, heard = [], []
    for _ in range(12):
        digits = random_digits(rng)
        codes = encoder.encode(torch.from_numpy(digits_wave(digits)))
        wav = voice(codes, spectra)
        assert wav.shape == (len(codes) * FRAME,)
        refs.append(" ".join(WORDS[d] for d in digits))
        heard.append(transcribe_digits(wav.numpy(), 24000))
    assert digits_wer(refs, heard) <= 0.1, list(zip(refs, heard))  # 0.009 on 60 clips (README)


def test_init_demo_is_a_source_and_an_unknown_init_is_one_line(tmp_path: Path) -> None:
    from mmcore import StageError

    from mm_pack_qwen3tts.tiny import build_init_checkpoint

    with pytest.raises(StageError, match="init:tiny and init:demo"):
        build_init_checkpoint("large", tmp_path / "x", seed=0)


@pytest.mark.compares_runs  # the whole demo (minutes): tools/demo_matrix.py runs it over seeds
def test_the_demo_speaks_held_out_texts_the_checker_understands(tmp_path: Path) -> None:
    """The demo preset as ``mmcore run --pack qwen3tts`` runs it: the promise of the README (the
    fixed checker's WER on the held-out texts, none of them a training text), then ``mmcore
    infer`` speaks a prompt into a wav and says what the checker heard."""
    from mm_pack_qwen3tts.demo import WER_PROMISE
    from mmcore.testing import StageCLI

    cli = StageCLI(tmp_path, timeout=1800)
    cli("run", "--pack", "qwen3tts", "--run-dir", "demo")
    evaluate = stage_manifest(tmp_path / "demo", "evaluate")["metrics"]
    assert evaluate["items"] == 50 and evaluate["wer"] <= WER_PROMISE, evaluate
    said = cli("infer", "--run-dir", "demo", "--prompt", "seven one zero")
    wav = Path(said.stdout.split("audio: ")[1].split(",")[0])
    assert wav.is_file() and "heard: " in said.stdout
