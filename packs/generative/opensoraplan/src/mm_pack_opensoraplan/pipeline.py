"""``OpenSoraPlanPipeline``: text-to-video with Open-Sora Plan v1.5's denoiser, as a diffusers
pipeline folder (``model_index.json``; ``transformer/``, ``vae/``, ``text_encoder/`` + ``tokenizer/``
(T5), ``text_encoder_2/`` + ``tokenizer_2/`` (CLIP with projection), ``scheduler/``).

Sampling is the reference's (MindSpeed-MM ``OpenSoraPlanScheduler.sample``): noise levels
``linspace(1, 0, steps + 1)`` shifted by ``shift * s / (1 + (shift - 1) s)``, timesteps
``1000 s``, Euler steps of the predicted velocity, classifier-free guidance against the negative
prompt with the guidance rescale (0.7). Text: T5's sequence with its attention mask, CLIP's
projected pooled vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput

from mmcore.kits import VideoLatents

import mm_pack_opensoraplan.transformer  # noqa: F401  (diffusers loads a pack's class only once its module is imported)
import mm_pack_opensoraplan.wfvae  # noqa: F401  (likewise the WF-VAE, a vae/ of the released model)


@dataclass
class OpenSoraPlanPipelineOutput(BaseOutput):
    frames: Any


def rescale_noise_cfg(guided: torch.Tensor, text: torch.Tensor, rescale: float) -> torch.Tensor:
    """The guided velocity's per-sample std brought toward the conditional one's (by ``rescale``)."""
    dims = list(range(1, text.ndim))
    rescaled = guided * (text.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return rescale * rescaled + (1 - rescale) * guided


class OpenSoraPlanPipeline(VideoLatents, DiffusionPipeline):
    model_cpu_offload_seq = "text_encoder->text_encoder_2->transformer->vae"

    def __init__(self, transformer: Any, vae: Any, text_encoder: Any, tokenizer: Any, text_encoder_2: Any, tokenizer_2: Any, scheduler: Any) -> None:
        super().__init__()
        self.register_modules(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, scheduler=scheduler)

    # -- the frozen parts, as training caches them -----------------------------------------

    @torch.no_grad()
    def encode_prompt(self, prompt: str | list[str], max_sequence_length: int = 512, device: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(T5 states [B, L, D], their mask [B, L], CLIP's pooled projection [B, P]), padded to
        ``max_sequence_length`` and CLIP's 77 (or its tokenizer's length) as the reference does."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        device = device or self._execution_device
        ids = self.tokenizer(prompts, padding="max_length", max_length=max_sequence_length, truncation=True, add_special_tokens=True, return_tensors="pt")
        mask = ids.attention_mask.to(device)
        states = self.text_encoder(ids.input_ids.to(device), attention_mask=mask).last_hidden_state
        length = min(self.tokenizer_2.model_max_length, self.text_encoder_2.config.max_position_embeddings)
        ids_2 = self.tokenizer_2(prompts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
        pooled = self.text_encoder_2(ids_2.input_ids.to(device)).text_embeds
        return states, mask, pooled

    # -- sampling ------------------------------------------------------------------------------

    def velocity(self, latents: torch.Tensor, sigma: float, text: tuple[torch.Tensor, ...]) -> torch.Tensor:
        states, mask, pooled = text
        batch = states.shape[0]
        model_in = latents.expand(batch, *latents.shape[1:]).to(self.transformer.dtype)
        timestep = torch.full((batch,), sigma * 1000.0, device=latents.device)
        return self.transformer(model_in, timestep, states, pooled, encoder_attention_mask=mask, return_dict=False)[0].float()

    @torch.no_grad()
    def __call__(
        self,
        prompt: str,
        negative_prompt: str = "",
        height: int = 576,
        width: int = 1024,
        num_frames: int = 121,
        num_inference_steps: int = 50,
        guidance_scale: float = 7.0,
        guidance_rescale: float = 0.7,
        max_sequence_length: int = 512,
        generator: Any = None,
        latents: torch.Tensor | None = None,
        output_type: str = "np",
    ) -> OpenSoraPlanPipelineOutput:
        cfg = guidance_scale > 1.0
        text = self.encode_prompt([negative_prompt, prompt] if cfg else [prompt], max_sequence_length, self._execution_device)
        text = tuple(t.to(self.transformer.dtype) if t.is_floating_point() else t for t in text)

        def guided(x: torch.Tensor, sigma: float) -> torch.Tensor:
            v = self.velocity(x, sigma, text)
            if not cfg:
                return v
            uncond, cond = v.chunk(2)
            v = uncond + guidance_scale * (cond - uncond)
            return rescale_noise_cfg(v, cond, guidance_rescale) if guidance_rescale > 0 else v

        latents = self.initial_latents(num_frames, height, width, generator, latents)
        latents = self.euler(latents, self.shifted_sigmas(num_inference_steps), guided, toward_noise=True)  # the velocity is noise - data
        return OpenSoraPlanPipelineOutput(frames=latents if output_type == "latent" else self.video_frames(latents))
