"""Text -> speech tokens (the LM) -> mel (the flow) -> waveform (HiFT), and a 16-bit PCM wav."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mm_pack_cosyvoice3.model import CosyVoice3


@dataclass
class Speech:
    tokens: list[int]
    mel: torch.Tensor  # 1 x 80 x frames
    wav: torch.Tensor  # samples, float in [-1, 1]
    sample_rate: int


@torch.inference_mode()
def synthesize(
    model: CosyVoice3,
    text_ids: list[int],
    *,
    speaker_embedding: torch.Tensor | None = None,
    prompt_speech: list[int] | None = None,
    prompt_feat: torch.Tensor | None = None,
    sampling: str = "greedy",
    generator: torch.Generator | None = None,
    n_timesteps: int = 10,
    vocoder: str = "hift",
    cfg_rate: float | None = None,
    max_token_text_ratio: float = 20.0,
    min_token_text_ratio: float = 2.0,
) -> Speech:
    """Speak ``text_ids`` (the tokenizer's ids, CosyVoice3's ``<|endofprompt|>`` convention left to
    the caller). Without a prompt the speaker embedding is zeros and the mel has no prompt frames;
    ``cfg_rate`` None: the yaml's ``inference_cfg_rate``."""
    model.eval()
    text = torch.tensor([text_ids], dtype=torch.long)
    prompt = torch.tensor([prompt_speech or []], dtype=torch.long)
    tokens = list(model.llm.generate(text, prompt, sampling=sampling, generator=generator, min_token_text_ratio=min_token_text_ratio, max_token_text_ratio=max_token_text_ratio))
    if not tokens:
        raise ValueError("the LM stopped before the first speech token")
    flow = model.cfg.flow
    spk = speaker_embedding if speaker_embedding is not None else torch.zeros(1, flow.spk_embed_dim)
    feat = prompt_feat if prompt_feat is not None else torch.zeros(1, 0, flow.output_size)
    mel = model.flow.inference(torch.tensor([tokens]), prompt, feat, spk, n_timesteps=n_timesteps, cfg_rate=cfg_rate)
    if vocoder == "griffin_lim":
        from mm_pack_cosyvoice3.features import griffin_lim

        wav = griffin_lim(mel[0].float(), model.cfg.mel)[None]
    else:
        wav, _ = model.hift(mel)
    return Speech(tokens=tokens, mel=mel, wav=wav[0], sample_rate=model.cfg.sample_rate)


def write_wav(path: Path, wav: torch.Tensor, sample_rate: int) -> Path:
    """Mono 16-bit PCM (:func:`mmcore.data.write_audio`)."""
    from mmcore.data import write_audio

    return write_audio(Path(path), wav.detach().float().reshape(-1).numpy(), sample_rate)
