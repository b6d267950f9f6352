"""The ltx2 pack against diffusers' own LTX2Pipeline: its denoiser call and caption streams, the
clips' sound through preprocess, the cache against encoding afresh, samples with sound."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcore.data import write_mp4

TINY = ["--pack", "ltx2", "--preset", "tiny"]
#: the demo's promised held-out caption sensitivity (tools/demo_matrix.py PROMISES["ltx2"], the README)
CAPTION_SENSITIVITY = 2.0


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):  # type: ignore[no-untyped-def]
    from mm_pack_ltx2.tiny import build_init_checkpoint

    folder = tmp_path_factory.mktemp("ltx2") / "pipeline"
    build_init_checkpoint("tiny", folder, seed=0)
    return folder


def test_predict_and_text_are_what_ltx2pipeline_feeds_its_transformer(pipeline: Path) -> None:
    """One denoising step of diffusers' LTX2Pipeline, its transformer call captured: the pack's
    caption tensor holds exactly the connectors' streams and mask the pipeline passes, and the
    pack's ``predict`` on the same noisy latents gives exactly the pipeline's velocities."""
    import torch
    from diffusers import LTX2Pipeline

    from mm_pack_ltx2.family import Encoders, caption_widths, predict
    from mm_pack_ltx2.sound import unpack_audio
    from mmcore.kits import unpack_latents

    pipe = LTX2Pipeline.from_pretrained(pipeline)
    pipe.set_progress_bar_config(disable=True)
    seen: list = []
    forward = pipe.transformer.forward

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = forward(*args, **kwargs)
        seen.append((kwargs, out))
        return out

    pipe.transformer.forward = spy
    prompt = "a red square moves left"
    pipe(prompt, height=32, width=32, num_frames=9, frame_rate=8.0, num_inference_steps=1, guidance_scale=1.0, audio_guidance_scale=1.0, stg_scale=0.0, audio_stg_scale=0.0,
         modality_scale=1.0, audio_modality_scale=1.0, max_sequence_length=16, output_type="latent", return_dict=False)  # fmt: skip
    ((call, (video_out, audio_out)),) = seen
    model = pipe.transformer.eval()
    text = Encoders(pipeline, 16).text(prompt)[None]
    dv, da = caption_widths(model)
    assert torch.equal(text[..., :dv], call["encoder_hidden_states"]) and torch.equal(text[..., dv : dv + da], call["audio_encoder_hidden_states"])
    assert torch.equal(text[..., -1], call["encoder_attention_mask"].to(text.dtype))
    frames, height, width, mel = call["num_frames"], call["height"], call["width"], 4
    noisy = {"video": unpack_latents(call["hidden_states"], frames, height, width), "audio": unpack_audio(call["audio_hidden_states"], mel)}
    with torch.no_grad():
        ours = predict(model, noisy, call["timestep"] / 1000, text, frame_rate=8.0)
    assert torch.allclose(ours["video"], unpack_latents(video_out, frames, height, width), atol=1e-6, rtol=0)
    assert torch.allclose(ours["audio"], unpack_audio(audio_out, mel), atol=1e-6, rtol=0)
    assert call["audio_num_frames"] == ours["audio"].shape[2] == 28  # 9 frames at 8 fps: 1.125 s of 16 kHz, hop 160, 4x


def test_audio_latents_have_the_pipelines_length_and_a_tone_sets_them(pipeline: Path) -> None:
    """A clip's sound encodes to as many audio latents as the pipeline generates for its
    duration, and different tones give different latents (the audio VAE sees the pitch)."""
    import torch

    from mm_pack_ltx2.family import Encoders

    encoders = Encoders(pipeline, 16)
    frames = torch.full((9, 32, 32, 3), 255, dtype=torch.uint8)
    t = np.arange(18000) / 16000
    low, high = (encoders.latents(frames, torch.from_numpy((0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32))) for hz in (220, 880))
    assert low["audio"].shape == (4, 28, 4) and low["video"].shape == (16, 3, 4, 4)
    assert torch.equal(low["video"], high["video"]) and (low["audio"] - high["audio"]).abs().max() > 1e-3
    with pytest.raises(Exception, match="data.audio_rate"):
        encoders.latents(frames)


def test_sound_tracks_are_cut_padded_or_silent(tmp_path: Path) -> None:
    """Preprocess keeps the frames' time span of a clip's sound: a longer track is cut, a shorter
    one padded with silence, a video without a track is silence."""
    from mmcore.data.clips import sound_track

    frames = np.full((16, 32, 32, 3), 200, dtype=np.uint8)
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(32000) / 16000)).astype(np.float32)
    write_mp4(tmp_path / "long.mp4", frames, 8, audio=(tone, 16000))
    write_mp4(tmp_path / "short.mp4", frames, 8, audio=(tone[:4000], 16000))
    write_mp4(tmp_path / "mute.mp4", frames, 8)
    long, short, mute = (sound_track(tmp_path / f"{name}.mp4", 16000, 9 / 8) for name in ("long", "short", "mute"))
    assert len(long) == len(short) == len(mute) == 18000
    assert np.abs(long).max() > 0.4 and np.abs(long[-2000:]).max() > 0.4  # a tone all through (AAC-coded)
    assert np.abs(short[6000:]).max() == 0.0 and np.abs(short[1000:3000]).max() > 0.4
    assert not mute.any()


@pytest.mark.compares_runs
def test_training_from_the_cache_equals_encoding_on_the_fly_and_samples_carry_sound(ltx2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Both latents and both caption streams from the feature cache train exactly as encoding
    each batch afresh; evaluate's samples are mp4 files with an AAC sound track and a .wav beside."""
    import av

    common = [*TINY, "data.demo_samples=6", "training.steps=3"]
    ltx2("run", *common, "--run-dir", "cached")
    proc = ltx2("run", *common, "--run-dir", "fresh", "extract.enabled=false", "evaluate.enabled=false")
    assert "[extract] skipped: disabled by extract.enabled=false" in proc.stdout
    cached, fresh = losses(tmp_path / "cached"), losses(tmp_path / "fresh")
    assert list(cached) == [1, 2, 3] and fresh == cached
    samples = tmp_path / "cached/evaluate/samples"
    with av.open(str(samples / "sample-0.mp4")) as container:
        assert sorted(s.type for s in container.streams) == ["audio", "video"]
        assert container.streams.audio[0].codec_context.name == "aac" and container.streams.audio[0].rate == 16000
    assert (samples / "sample-0.wav").stat().st_size > 30000  # ~1.1 s of 16-bit mono at 16 kHz
    # the pitch check read each sample's sound (random VAEs here: what it heard is not judged)
    rows = [json.loads(line) for line in (tmp_path / "cached/evaluate/results.jsonl").read_text().splitlines()]
    assert rows and all("sound_agrees" in r and set(r["heard"]) == {"colour", "band_hz", "wav_hz"} for r in rows), rows


def test_the_pitch_check_hears_each_colours_tone(pipeline: Path) -> None:
    """The demo's pitch check, on the log-mel the audio VAE's front end makes of each colour's
    tone (what a perfect audio VAE would decode): the caption's colour, and no other, agrees;
    a caption that is not a demo caption is not judged."""
    import random

    from mm_pack_ltx2.demo import PITCH, RATE, pitch_agreement, tone
    from mm_pack_ltx2.family import Encoders
    from mm_pack_ltx2.sound import log_mel

    audio_vae = Encoders(pipeline, 16).pipe.audio_vae
    rng = random.Random(0)
    for colour, hz in PITCH.items():
        wave = tone(hz, 9 / 8, rng)
        sound = {"audio": wave, "audio_rate": RATE, "mel": log_mel(wave, audio_vae)[0].mean(0).numpy(), "mel_rate": RATE}
        for other in PITCH:
            check = pitch_agreement(sound, f"a {other} circle moves up")
            assert check is not None and check["agrees"] == (other == colour), (colour, other, check)
        assert abs(check["heard"]["wav_hz"] - hz) < 0.03 * hz  # the waveform's own pitch, for the record
    assert pitch_agreement(sound, "video of a cat") is None


@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.matrix  # the full demo (3.3 min on one idle thread, 8-20 min on a loaded one); make test runs its path with the tiny preset above
def test_demo_keeps_its_promise_and_the_export_generates_video_and_sound_in_plain_diffusers(ltx2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The README's promise (tools/demo_matrix.py PROMISES["ltx2"]; the matrix holds the "by 60 %
    # of the steps" part): the held-out error over both streams at fixed noise levels and noise
    # below 0.6x its start, the held-out caption sensitivity at least CAPTION_SENSITIVITY, and
    # at least 80 % of the samples for the held-out captions whose decoded log-mel has the
    # pitch the caption's colour sets (sound_agreement). The frames' colour is reported
    # (colour_agreement), not promised: 0.35-1.0 over the seeds measured.
    from diffusers import LTX2Pipeline

    from mmcore.testing import diffusion_demo_holds

    run = diffusion_demo_holds(ltx2, tmp_path, "ltx2", sensitivity=CAPTION_SENSITIVITY)
    evaluate = json.loads((run / "evaluate/manifest.json").read_text())["metrics"]
    assert evaluate["sound_agreement"] >= 0.8 and "colour_agreement" in evaluate, evaluate
    assert (run / "download/model/demo_vae.json").is_file() and evaluate["reconstruction_psnr"] > 12, evaluate
    pipe = LTX2Pipeline.from_pretrained(run / "export/pipeline")
    video, audio = pipe(
        "a red square moves right",
        height=32,
        width=32,
        num_frames=9,
        frame_rate=8.0,
        num_inference_steps=2,
        stg_scale=0.0,
        audio_stg_scale=0.0,
        max_sequence_length=16,
        output_type="np",
        return_dict=False,
    )
    assert video.shape == (1, 9, 32, 32, 3) and np.isfinite(video).all() and audio.shape[:2] == (1, 2) and audio.shape[2] > 16000
