"""``StepVideoPipeline``: text-to-video with Step-Video-T2V's DiT as a diffusers pipeline folder
(``model_index.json``; ``transformer/``, ``vae/``, ``text_encoder/`` (Step-LLM: the release's
``step_llm/`` with its own SentencePiece model; a transformers decoder in its place needs a
``tokenizer/``), ``text_encoder_2/`` + ``tokenizer_2/`` (HunyuanCLIP: a transformers ``BertModel``),
``scheduler/`` (its ``shift``)).

Text, as the reference's caption server makes it: Step-LLM's last hidden states over the prompt
padded to ``max_sequence_length`` (320 there) with their mask; HunyuanCLIP's last hidden states
over all its positions (77 there), every one attended: the transformer's text mask is CLIP's ones
then Step-LLM's mask.

Sampling, as the reference's ``FlowMatchDiscreteScheduler`` (not reversed, its default): noise
levels ``s = linspace(1, 0, steps + 1)`` shifted by ``shift * s / (1 + (shift - 1) s)`` (13 in its
README), the transformer called at time ``1 - s`` (0 = noise), Euler steps along its velocity
(data - noise), classifier-free guidance against the negative prompt (no rescale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput

from mmcore.kits import VideoLatents

import mm_pack_stepvideo.stepllm  # noqa: F401  (likewise Step-LLM, a text_encoder/ of the released model)
import mm_pack_stepvideo.stepvae  # noqa: F401  (likewise the Video-VAE, a vae/ of the released model)
import mm_pack_stepvideo.transformer  # noqa: F401  (diffusers loads a pack's class only once its module is imported)


@dataclass
class StepVideoPipelineOutput(BaseOutput):
    frames: Any


class StepVideoPipeline(VideoLatents, DiffusionPipeline):
    model_cpu_offload_seq = "text_encoder->text_encoder_2->transformer->vae"
    _optional_components = ["tokenizer"]  # Step-LLM tokenizes with its own SentencePiece model

    def __init__(self, transformer: Any, vae: Any, text_encoder: Any, tokenizer: Any, text_encoder_2: Any, tokenizer_2: Any, scheduler: Any) -> None:
        super().__init__()
        self.register_modules(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, scheduler=scheduler)

    # -- the frozen parts, as training caches them -----------------------------------------

    def clip_length(self) -> int:
        return min(self.tokenizer_2.model_max_length, self.text_encoder_2.config.max_position_embeddings)

    @torch.no_grad()
    def encode_prompt(self, prompt: str | list[str], max_sequence_length: int = 320, device: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Step-LLM's states [B, L, D], their mask [B, L], HunyuanCLIP's states [B, L2, D2])."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        device = device or self._execution_device
        if hasattr(self.text_encoder, "tokenize"):  # Step-LLM carries its SentencePiece model, as the reference's STEP1TextEncoder
            input_ids, mask = self.text_encoder.tokenize(prompts, max_sequence_length)
        else:
            ids = self.tokenizer(prompts, padding="max_length", max_length=max_sequence_length, truncation=True, return_tensors="pt")
            input_ids, mask = ids.input_ids, ids.attention_mask
        mask = mask.to(device)
        states = self.text_encoder(input_ids.to(device), attention_mask=mask).last_hidden_state
        ids_2 = self.tokenizer_2(prompts, padding="max_length", max_length=self.clip_length(), truncation=True, return_tensors="pt")
        clip = self.text_encoder_2(ids_2.input_ids.to(device), attention_mask=ids_2.attention_mask.to(device)).last_hidden_state
        return states, mask, clip

    # -- sampling ------------------------------------------------------------------------------

    def initial_latents(self, num_frames: int, height: int, width: int, generator: Any, latents: torch.Tensor | None = None) -> torch.Tensor:
        """As the kit's, but with Step-Video's VAE the latent frames are its groups': 3 per 17 frames
        (the reference's ``prepare_latents``: ``num_frames // 17 * 3``), not one per 8 after the first."""
        frames_of = getattr(self.vae, "latent_frames", None)
        if latents is None and frames_of is not None:
            if num_frames % self.vae.config.frame_len:
                raise ValueError(f"num_frames {num_frames}: Step-Video's VAE decodes groups of {self.vae.config.frame_len} frames")
            s_scale = self.vae_scales()[1]
            shape = (1, self.transformer.config.in_channels, frames_of(num_frames), height // s_scale, width // s_scale)
            latents = torch.randn(shape, generator=generator, dtype=torch.float32).to(self._execution_device)
        return super().initial_latents(num_frames, height, width, generator, latents)

    def velocity(self, latents: torch.Tensor, sigma: float, text: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The transformer's velocity (data - noise) at noise level ``sigma`` (its time ``1 - sigma``)."""
        states, mask, clip = text
        batch = states.shape[0]
        model_in = latents.expand(batch, *latents.shape[1:]).to(self.transformer.dtype)
        timestep = torch.full((batch,), 1.0 - sigma, device=latents.device, dtype=self.transformer.dtype)
        full_mask = torch.cat([torch.ones(batch, clip.shape[1], dtype=mask.dtype, device=mask.device), mask], dim=1)
        return self.transformer(model_in, timestep, states, clip, full_mask, return_dict=False)[0].float()

    @torch.no_grad()
    def __call__(
        self,
        prompt: str,
        negative_prompt: str = "",
        height: int = 544,
        width: int = 992,
        num_frames: int = 204,
        num_inference_steps: int = 50,
        guidance_scale: float = 9.0,
        max_sequence_length: int = 320,
        generator: Any = None,
        latents: torch.Tensor | None = None,
        output_type: str = "np",
    ) -> StepVideoPipelineOutput:
        cfg = guidance_scale > 1.0
        text = self.encode_prompt([prompt, negative_prompt] if cfg else [prompt], max_sequence_length, self._execution_device)
        text = tuple(t.to(self.transformer.dtype) if t.is_floating_point() else t for t in text)

        def guided(x: torch.Tensor, sigma: float) -> torch.Tensor:
            v = self.velocity(x, sigma, text)
            if not cfg:
                return v
            cond, uncond = v.chunk(2)
            return uncond + guidance_scale * (cond - uncond)

        latents = self.initial_latents(num_frames, height, width, generator, latents)
        latents = self.euler(latents, self.shifted_sigmas(num_inference_steps), guided, toward_noise=False)  # the velocity is data - noise
        return StepVideoPipelineOutput(frames=latents if output_type == "latent" else self.video_frames(latents))
