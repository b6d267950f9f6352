"""Equivalence of the pack with the reference (QwenLM/Qwen3-TTS), on the pack's tiny checkpoint.

Two runs, two interpreters (the reference pins transformers 4.57.3; the pack runs on 5.25)::

    .venv/bin/python tools/reference_equivalence.py pack OUT
    /tmp/q3ref/bin/python tools/reference_equivalence.py reference OUT REFERENCE_CHECKOUT

``pack`` writes the tiny checkpoint and the pack's outputs under OUT; ``reference`` imports the
reference's modules from a checkout (not copied; ``librosa`` and the inference tokenizer, which
the compared code never calls, stubbed), loads the same safetensors ``strict=True`` and prints
the largest differences. fp32, CPU, one thread.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch

TEXT = [280, 7, 8, 11, 12, 13, 14]  # role (3) + text; the reference also reads 5 template ids after
TAIL = [281, 9, 280, 10, 9]


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0  # left padding, as the reference batches
    return {
        "embeds": torch.randn(2, 10, 32, generator=g),
        "mask": mask,
        "text_ids": torch.randint(0, 300, (1, 6), generator=g),
        "hidden": torch.randn(5, 32, generator=g),
        "codes": torch.randint(0, 32, (5, 4), generator=g),
        "frames": torch.randint(0, 32, (1, 4, 9), generator=g),
        "mel": torch.randn(2, 40, 16, generator=g),
        "clips": clips(),
    }


def clips() -> list[torch.Tensor]:
    """Two 24 kHz clips of different lengths (a chord with a little noise; 1.3 s and 0.7 s + 77 samples)."""
    g = torch.Generator().manual_seed(3)
    out = []
    for n, base in ((31200, 220.0), (16877, 330.0)):
        t = torch.arange(n) / 24000
        wave = sum(torch.sin(2 * torch.pi * base * k * t) for k in (1, 1.25, 1.5)) / 4
        out.append(wave + 0.01 * torch.randn(n, generator=g))
    return out


def run_pack(out: Path) -> None:
    from mm_pack_qwen3tts.model import load_codec, load_pretrained, load_speech_encoder
    from mm_pack_qwen3tts.speech import generate_codes
    from mm_pack_qwen3tts.tiny import build_tiny_checkpoint

    build_tiny_checkpoint(out / "model", seed=0)
    build_tiny_checkpoint(out / "base", seed=1, kind="base")
    model, codec, base = load_pretrained(out / "model"), load_codec(out / "model"), load_pretrained(out / "base")
    talker, x = model.talker, inputs()
    with torch.no_grad():
        res = {
            "logits": talker.codec_head(talker.hidden(x["embeds"], x["mask"])),
            "text": talker.text_embed(x["text_ids"]),
            "sub": talker.code_predictor.teacher_forced_logits(x["hidden"], x["codes"], talker.model.codec_embedding(x["codes"][:, 0])),
            "greedy": generate_codes(talker, model.ids, TEXT, speaker=36, language=34, max_frames=8),
            "streaming": generate_codes(talker, model.ids, TEXT, speaker=36, max_frames=8, streaming=True),
            "wav": codec.decoder(x["frames"]),
            "wav64": codec.decoder.double()(x["frames"]),
            "speaker": base.speaker_encoder(x["mel"]),
        }
    encoder = load_speech_encoder(out / "model")
    res.update({f"codes{i}": encoder.encode(clip) for i, clip in enumerate(x["clips"])})
    with torch.no_grad():
        res["latents"] = encoder.encoder(x["clips"][0][None, None]).latents
    torch.save(res, out / "pack.pt")
    print({k: tuple(v.shape) for k, v in res.items()})


def load_reference(checkout: Path):  # type: ignore[no-untyped-def]
    import transformers  # noqa: F401  (before the librosa stub: transformers probes for librosa)

    librosa = types.ModuleType("librosa")
    librosa.filters = types.SimpleNamespace(mel=None)  # type: ignore[attr-defined]
    sys.modules.update({"librosa": librosa, "librosa.filters": librosa.filters})  # type: ignore[dict-item]
    tok = types.ModuleType("qwen_tts.inference.qwen3_tts_tokenizer")
    tok.Qwen3TTSTokenizer = None  # type: ignore[attr-defined]
    for name in ("qwen_tts", "qwen_tts.core", "qwen_tts.core.models", "qwen_tts.core.tokenizer_12hz", "qwen_tts.inference"):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(checkout / name.replace(".", "/"))]  # type: ignore[attr-defined]
        sys.modules[name] = pkg
    sys.modules[tok.__name__] = tok
    mods = {}
    for name in (
        "core.models.configuration_qwen3_tts",
        "core.models.modeling_qwen3_tts",
        "core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2",
        "core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2",
    ):
        full = f"qwen_tts.{name}"
        spec = importlib.util.spec_from_file_location(full, checkout / "qwen_tts" / (name.replace(".", "/") + ".py"))
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[full] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        mods[name.rsplit(".", 1)[1]] = module
    return mods


def run_reference(out: Path, checkout: Path) -> None:
    import json

    from safetensors.torch import load_file

    mods = load_reference(checkout)
    cfg = json.loads((out / "model/config.json").read_text())
    model = mods["modeling_qwen3_tts"].Qwen3TTSForConditionalGeneration(mods["configuration_qwen3_tts"].Qwen3TTSConfig(**cfg)).eval()
    model.talker.load_state_dict({k.removeprefix("talker."): v for k, v in load_file(str(out / "model/model.safetensors")).items()}, strict=True)
    dcfg = json.loads((out / "model/speech_tokenizer/config.json").read_text())["decoder_config"]
    mv2, cv2 = mods["modeling_qwen3_tts_tokenizer_v2"], mods["configuration_qwen3_tts_tokenizer_v2"]
    decoder = mv2.Qwen3TTSTokenizerV2Decoder(cv2.Qwen3TTSTokenizerV2DecoderConfig(**dcfg)).eval()
    decoder.load_state_dict({k.removeprefix("decoder."): v for k, v in load_file(str(out / "model/speech_tokenizer/model.safetensors")).items() if k.startswith("decoder.")}, strict=True)
    pack, x, talker = torch.load(out / "pack.pt", weights_only=True), inputs(), model.talker
    with torch.no_grad():
        logits = talker(inputs_embeds=x["embeds"], attention_mask=x["mask"]).logits
        keep = x["mask"].bool()
        print("talker logits, unpadded positions: max |diff|", (logits[keep] - pack["logits"][keep]).abs().max().item(), "of max |logit|", logits[keep].abs().max().item())
        # what the reference's training loss compares (sft_12hz.py passes labels already shifted)
        labels = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(2)).masked_fill(~keep, -100)
        ref_loss = talker(inputs_embeds=x["embeds"], attention_mask=x["mask"], labels=labels).loss
        flat = torch.nn.functional.cross_entropy
        same_position = flat(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        next_position = flat(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        print(f"reference talker loss with labels {ref_loss.item():.6f}: CE(logits[t], labels[t]) {same_position.item():.6f}, CE(logits[t], labels[t+1]) {next_position.item():.6f}")
        text = talker.text_projection(talker.get_text_embeddings()(x["text_ids"]))
        print("text projection: max |diff|", (text - pack["text"]).abs().max().item())
        sub, _ = talker.forward_sub_talker_finetune(x["codes"], x["hidden"])
        print("code predictor teacher-forced logits: max |diff|", (sub - pack["sub"]).abs().max().item())
        codes, _ = model.generate(
            input_ids=[torch.tensor([TEXT + TAIL])], languages=["english"], speakers=["tiny"], non_streaming_mode=True, do_sample=False, subtalker_dosample=False, max_new_tokens=8
        )
        print("greedy codes equal:", torch.equal(codes[0], pack["greedy"]), tuple(codes[0].shape), tuple(pack["greedy"].shape))
        if not torch.equal(codes[0], pack["greedy"]):
            print("reference", codes[0].tolist(), "\npack     ", pack["greedy"].tolist())
        codes, _ = model.generate(input_ids=[torch.tensor([TEXT + TAIL])], languages=["auto"], speakers=["tiny"], non_streaming_mode=False, do_sample=False, subtalker_dosample=False, max_new_tokens=8)
        # without eos, the reference returns max_new_tokens - 1 frames: the last codebook-0 id is
        # drawn but never reaches the code predictor (that runs in the next forward)
        n = len(codes[0])
        print(
            f"greedy codes, streaming layout, language auto: reference {n} frames, equal to the pack's first {n}:", torch.equal(codes[0], pack["streaming"][:n]), "pack frames:", len(pack["streaming"])
        )
        wav = decoder(x["frames"])
        print("codec decoder waveform: max |diff|", (wav - pack["wav"]).abs().max().item(), "samples", wav.shape[-1])
        wav64 = decoder.double()(x["frames"])
        print("codec decoder waveform in float64: max |diff|", (wav64 - pack["wav64"]).abs().max().item())
        base_cfg = json.loads((out / "base/config.json").read_text())
        base = mods["modeling_qwen3_tts"].Qwen3TTSForConditionalGeneration(mods["configuration_qwen3_tts"].Qwen3TTSConfig(**base_cfg)).eval()
        base.load_state_dict(load_file(str(out / "base/model.safetensors")), strict=True)
        speaker = base.speaker_encoder(x["mel"])
        print("speaker encoder embedding (Base): max |diff|", (speaker - pack["speaker"]).abs().max().item(), tuple(speaker.shape))
        # the whole speech tokenizer (encoder.* and decoder.*) loaded strict=True into the reference's model
        tok = mv2.Qwen3TTSTokenizerV2Model(cv2.Qwen3TTSTokenizerV2Config(**json.loads((out / "model/speech_tokenizer/config.json").read_text()))).eval()
        tok.load_state_dict(load_file(str(out / "model/speech_tokenizer/model.safetensors")), strict=True)
        mimi = tok.encoder  # transformers 4.57: encoder (SEANet), encoder_transformer, downsample
        hidden = mimi.encoder_transformer(mimi.encoder(x["clips"][0][None, None]).transpose(1, 2))[0]
        latents = mimi.downsample(hidden.transpose(1, 2))
        print("encoder latents before quantization: max |diff|", (latents - pack["latents"]).abs().max().item(), "of max", latents.abs().max().item(), tuple(latents.shape))
        longest = max(len(c) for c in x["clips"])
        wavs = torch.stack([torch.nn.functional.pad(c, (0, longest - len(c))) for c in x["clips"]])
        mask = torch.stack([torch.arange(longest) < len(c) for c in x["clips"]]).long()
        codes = tok.encode(wavs, padding_mask=mask).audio_codes  # the reference's padded batch
        for i, ref in enumerate(codes):
            same = torch.equal(ref, pack[f"codes{i}"])
            alone = tok.encode(x["clips"][i][None], padding_mask=torch.ones(1, len(x["clips"][i]), dtype=torch.long)).audio_codes[0]
            differ = (ref != pack[f"codes{i}"]).any(-1).nonzero().flatten().tolist()
            print(
                f"encoder codes, clip {i} ({len(x['clips'][i])} samples): alone equal {torch.equal(alone, pack[f'codes{i}'])} {tuple(alone.shape)};"
                f" in the reference's right-padded batch of 2 equal {same} (frames differing: {differ}); distinct ids per codebook {[len(set(col.tolist())) for col in ref.T]}"
            )


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "pack":
        run_pack(Path(sys.argv[2]))
    else:
        run_reference(Path(sys.argv[2]), Path(sys.argv[3]))
