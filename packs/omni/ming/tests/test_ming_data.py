"""Preprocessing in the release's token layout, and packed rows of mixed media training as the
padded batch does (no attention, position or routing leaks between packed samples)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from mmcore.data import lfr_features, load_audio, read_samples
from mmcore.testing.media import tone, write_image
from mmcore.testing.packing import each_sample_equals_it_alone, encoded, packed_equals_padded
from mm_pack_ming.family import FAMILY, MingRunConfig


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmcore.data.audio import write_audio

    root = tmp_path_factory.mktemp("mixed")
    write_image(root / "a.png", (255, 0, 0), size=(40, 32))
    write_audio(root / "t.wav", tone(0.5, 440), 16000)
    records = [
        {"messages": [{"role": "user", "content": "<image><audio>What colour, which tone?"}, {"role": "assistant", "content": "red, high"}], "images": ["a.png"], "audios": ["t.wav"]},
        {"messages": [{"role": "user", "content": "<audio>Which tone?"}, {"role": "assistant", "content": "high"}], "audios": ["t.wav"]},
        {"messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}], "images": ["a.png"]},
        {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
    ]
    (root / "data.json").write_text(json.dumps(records))
    return root


def _encoder(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from mm_pack_ming.config import load_config
    from mm_pack_ming.data import Encoder

    cfg = MingRunConfig.model_validate({"data": {"image_min_pixels": 1024, "image_max_pixels": 1024}}).data
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    return tok, cfg, Encoder(tok, tiny_dir, cfg, load_config(tiny_dir).vision)


def test_a_sample_is_the_reference_processors_token_layout(tiny_dir: Path, mixed: Path) -> None:
    tok, cfg, encoder = _encoder(tiny_dir)
    sample = next(iter(read_samples(mixed / "data.json", cfg)))
    enc = encoder.encode(sample)
    grid = enc.tensors["image_grid_thw"][0].tolist()
    rows = int(lfr_features(load_audio(mixed / "t.wav", 16000), {}).shape[0])
    assert rows == int(enc.tensors["audio_feats_lengths"][0]) and tuple(enc.tensors["audio_feats"].shape) == (rows, 560)
    picture = "<image>" + "<imagePatch>" * (grid[1] * grid[2] // 4) + "</image>\n"
    clip = "<audio>" + "<audioPatch>" * rows + "</audio>"
    want = tok("<role>HUMAN</role>" + picture + clip + "What colour, which tone?<role>ASSISTANT</role>red, high<|endoftext|>")["input_ids"]
    assert enc.input_ids == want
    answer = tok("red, high<|endoftext|>")["input_ids"]
    supervised = [t for t, label in zip(enc.input_ids, enc.labels) if label != -100]
    assert supervised == answer


def test_packed_mixed_media_trains_as_padded_and_each_sample_as_alone(tiny_dir: Path, mixed: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    tok, cfg, encoder = _encoder(tiny_dir)
    data = encoded(encoder, read_samples(mixed / "data.json", cfg))
    ids = FAMILY.token_ids_of(tok)
    model = copy.deepcopy(tiny_model).train()
    packed_net = copy.deepcopy(model)
    grads = packed_equals_padded(FAMILY, model, data, ids, packed_net=packed_net)
    assert any(k.endswith("image_gate.weight") for k in grads) and any(k.endswith("audio_gate.weight") for k in grads)
    each_sample_equals_it_alone(FAMILY, model.eval(), packed_net.eval(), data, ids)


def test_generation_treats_media_tokens_it_writes_as_text(tiny_dir: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    patch = tok.convert_tokens_to_ids("<audioPatch>")
    prompt = torch.tensor([tok("<role>HUMAN</role><audio>" + "<audioPatch>" * 4 + "</audio>Which?<role>ASSISTANT</role>")["input_ids"]])
    clip = {"audio_feats": torch.randn(1, 4, 560), "audio_feats_lengths": torch.tensor([4]), "audio_token_id": torch.tensor(patch)}
    written = torch.cat([prompt, torch.tensor([[patch]])], 1)  # the model wrote an <audioPatch> after the prompt
    with torch.no_grad():
        with pytest.raises(ValueError, match="5 <audioPatch> tokens for 4 audio frames"):
            tiny_model.eval()(written, **clip)
        out = tiny_model(written, media_span=prompt.shape[1], **clip)
        alone = tiny_model(prompt, **clip)
    assert torch.allclose(out.logits[:, : prompt.shape[1]], alone.logits, atol=1e-5)
    assert tiny_model.generate(prompt, max_new_tokens=3, eos_token_id=[], pad_token_id=0, **clip).shape == (1, prompt.shape[1] + 3)


def test_the_releases_cmvn_file_is_read_and_applied(tiny_dir: Path, mixed: Path, tmp_path: Path) -> None:
    import shutil

    from mm_pack_ming.data import read_cmvn

    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    shift, scale = [-float(i % 7) for i in range(560)], [0.5 + (i % 3) / 10 for i in range(560)]
    text = "<Nnet>\n<Splice> 560 560\n[ 0 ]\n<AddShift> 560 560\n<LearnRateCoef> 0 [ " + " ".join(map(str, shift)) + " ]\n"
    text += "<Rescale> 560 560\n<LearnRateCoef> 0 [ " + " ".join(map(str, scale)) + " ]\n</Nnet>\n"
    (folder / "am.mvn").write_text(text)
    got_shift, got_scale = read_cmvn(folder / "am.mvn")
    assert got_shift.tolist() == pytest.approx(shift) and got_scale.tolist() == pytest.approx(scale)
    _, cfg, plain = _encoder(tiny_dir)
    _, _, with_cmvn = _encoder(folder)
    sample = list(read_samples(mixed / "data.json", cfg))[1]
    raw, normed = plain.encode(sample).tensors["audio_feats"], with_cmvn.encode(sample).tensors["audio_feats"]
    assert torch.allclose(normed, (raw + got_shift) * got_scale, atol=1e-4)
    # the release's WavFrontend works on 16-bit-range samples: log energies 30 ln 2 above the [-1, 1] clip's
    unscaled = lfr_features(load_audio(mixed / "t.wav", 16000), {})
    assert torch.allclose(raw - unscaled, torch.full_like(raw, 30 * 0.6931471805599453), atol=1e-3)


def test_a_sample_with_a_video_is_refused_in_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.data import MediaError
    from mmcore.testing.media import write_wild_omni

    _, cfg, encoder = _encoder(tiny_dir)
    with_video = next(s for s in read_samples(write_wild_omni(tmp_path / "wild"), cfg) if s.videos)
    with pytest.raises(MediaError, match=r"this model takes no videos \(it takes images, audios\)") as err:
        encoder.encode(with_video)
    assert "\n" not in str(err.value) and str(with_video.videos[0]) in str(err.value)
