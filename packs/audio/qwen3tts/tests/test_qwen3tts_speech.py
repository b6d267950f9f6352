"""Codes -> waveform: the speech tokenizer's decoder loads strictly, gives 1920 samples per
frame causally, and text -> codes -> wav writes a 24 kHz 16-bit file of that length."""

from __future__ import annotations

import copy
import shutil
import wave
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mm_pack_qwen3tts.config import CheckpointError
from mm_pack_qwen3tts.model import load_codec
from mm_pack_qwen3tts.synth import synthesize

TEXT = [280, 7, 8, 11, 12, 13, 14]


@pytest.fixture(scope="module")
def codec(tiny_dir: Path):  # type: ignore[no-untyped-def]
    return load_codec(tiny_dir)


def test_the_decoder_loads_strictly_and_the_encoder_tensors_are_left(tiny_dir: Path, tmp_path: Path, codec) -> None:  # type: ignore[no-untyped-def]
    saved = load_file(str(tiny_dir / "speech_tokenizer/model.safetensors"))
    assert set(codec.state_dict()) == {k for k in saved if k.startswith("decoder.")}
    for key in (
        "decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum",
        "decoder.quantizer.rvq_rest.output_proj.weight",
        "decoder.pre_transformer.layers.1.self_attn_layer_scale.scale",
        "decoder.upsample.1.1.pwconv2.weight",
        "decoder.decoder.4.block.4.conv2.conv.weight",
        "decoder.decoder.5.alpha",
    ):
        assert key in saved, key
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    state = {**saved, "encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum": torch.zeros(2, 2)}  # misshapen
    save_file(state, str(folder / "speech_tokenizer/model.safetensors"))
    load_codec(folder)  # the encoder's tensors are not the decoder's business
    state.pop("decoder.pre_conv.conv.weight")
    save_file(state, str(folder / "speech_tokenizer/model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 missing \(first decoder.pre_conv.conv.weight\)"):
        load_codec(folder)


def test_codes_decode_causally_to_1920_samples_per_frame(codec) -> None:  # type: ignore[no-untyped-def]
    codes = torch.randint(0, 32, (9, 4), generator=torch.Generator().manual_seed(0))
    wav = codec.decode(codes)
    assert wav.shape == (9 * 1920,) and wav.abs().max() <= 1 and wav.std() > 0
    exact = copy.deepcopy(codec).double()  # in float32 the random stack amplifies rounding to ~1e-3
    # Not bit for bit: the convolutions' kernels block 5 and 9 frames differently on some CPUs
    # (1.1e-12 measured on an AMD EPYC). A decoder that looked ahead would move the first 5
    # frames' samples (peak 1.0) by far more than the 1e-9 allowed.
    torch.testing.assert_close(exact.decode(codes[:5]), exact.decode(codes)[: 5 * 1920], rtol=0, atol=1e-9)


def test_text_to_codes_to_a_wav_file_of_the_right_length(tiny_model, codec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    speech = synthesize(tiny_model, codec, TEXT, speaker="tiny", language="English", max_frames=4)
    frames = len(speech.codes)
    assert 2 <= frames <= 4 and speech.wav.shape == (frames * 1920,)
    path = speech.write(tmp_path / "speech.wav")
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getnframes()) == (24000, 2, 1, frames * 1920)
    with pytest.raises(ValueError, match="speaker 'nobody' is not one of this checkpoint's: tiny"):
        synthesize(tiny_model, codec, TEXT, speaker="nobody")


def test_the_demo_voice_keeps_a_clip_that_sounds_to_its_last_frame() -> None:
    """Griffin-Lim over the code spectra (``speech.vocoder: griffin_lim``) when the last frame
    carries sound: the tail is not a click louder than the syllable (which the peak normalisation
    made the rest silent beside: a seed-8 AVX2 demo codec whose silent frames after a three or a
    seven shared codes with sounding frames was heard saying nothing for 13 of 50 texts), and the
    fixed checker hears the digit."""
    from mm_pack_qwen3tts.demo import HOP, N_FFT, digits_wave, spectrogram, voice
    from mmcore.data import transcribe_digits

    syllable = spectrogram(digits_wave([4]))[:, 4:8].T.float()  # the digit's second frame, 4 STFT frames
    tables = {"spectra": torch.stack([torch.zeros_like(syllable), syllable]), "pairs": torch.zeros(0, 2, dtype=torch.long), "pair_spectra": torch.zeros(0, 4, N_FFT // 2 + 1)}
    wav = voice(torch.tensor([[0, 0], [1, 0], [1, 0]]), tables)
    assert wav.shape == (3 * 4 * HOP,)
    middle = float(wav[4 * HOP : 8 * HOP].abs().max())
    assert float(wav[-HOP // 4 :].abs().max()) <= middle, (float(wav[-HOP // 4 :].abs().max()), middle)
    assert transcribe_digits(wav.numpy(), 24000) == "four"
