"""HunyuanVideo 1.5 text-to-video as the diffusion kit sees it (pack ``hunyuanvideo1.5``): the
frozen VAE, Qwen2.5-VL text model and ByT5 used exactly as ``HunyuanVideo15Pipeline`` uses them,
the denoiser's call.

1.5 reads a caption as two masked sequences: the Qwen model's states at its third-last layer
after the chat prompt's system part is cropped (``encoder_hidden_states``, a fixed 1000 tokens),
and ByT5's states of the quoted text in the caption, for glyphs (``encoder_hidden_states_2``,
256 tokens; all masked when nothing is quoted) — cached as one tensor
(:class:`mm_pack_hunyuanvideo.caption.Layout`). The denoiser is not guidance-distilled (the
pipeline's guider runs classifier-free guidance). For text-to-video its input is the noisy
latents with zero condition latents and a zero mask on the channel axis, and zero image tokens
(the model then masks them out), as the pipeline passes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from mmcore.config import RunConfig
from mmcore import StageContext
from mmcore.data import write_moving_squares
from mmcore import StageError
from mmcore.kits import DiffusionFamily, FlowMatchingTraining, SampleExport, denoiser_flops

from mm_pack_hunyuanvideo.caption import Layout, caption_start
from mm_pack_hunyuanvideo.family import ADAPTER, HunyuanVideoData

#: HunyuanVideo15Pipeline's fixed text lengths (Qwen, ByT5) and image tokens (checked in Encoders)
TEXT_TOKENS, GLYPH_TOKENS, IMAGE_TOKENS = 1000, 256, 729


class V15Training(FlowMatchingTraining):
    flow_shift: float = Field(5.0, gt=0, description="Timestep shift of the flow-matching schedule (the 480p release: 5).")


class V15Config(RunConfig):
    data: HunyuanVideoData = Field(default_factory=HunyuanVideoData)
    training: V15Training = Field(default_factory=V15Training)
    export: SampleExport = Field(default_factory=SampleExport)


FREEZE_GROUPS = {
    "blocks": ["transformer_blocks.*"],
    "embeddings": ["x_embedder.*", "context_embedder.*", "context_embedder_2.*", "image_embedder.*", "time_embed.*", "cond_type_embed.*"],
    "head": ["norm_out.*", "proj_out.*"],
}


def layout(config: Any) -> Layout:
    """A cached caption: Qwen's and ByT5's states, then their masks."""
    return Layout(sequences=[(TEXT_TOKENS, config.text_embed_dim), (GLYPH_TOKENS, config.text_embed_2_dim)], vectors=[TEXT_TOKENS, GLYPH_TOKENS])


class Encoders:
    """The frozen VAE, Qwen text model and ByT5 of a HunyuanVideo 1.5 checkpoint, used exactly as
    ``HunyuanVideo15Pipeline`` uses them."""

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        from diffusers import HunyuanVideo15Pipeline
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import format_text_input

        pipe = self.pipe = HunyuanVideo15Pipeline.from_pretrained(model_dir, transformer=None)
        for part in (pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
            part.eval()
        lengths = (pipe.tokenizer_max_length, pipe.tokenizer_2_max_length, pipe.vision_num_semantic_tokens)
        if lengths != (TEXT_TOKENS, GLYPH_TOKENS, IMAGE_TOKENS):
            raise StageError(
                f"this diffusers' HunyuanVideo15Pipeline reads (Qwen, ByT5, image) tokens {lengths}; this pack was written for "
                f"{(TEXT_TOKENS, GLYPH_TOKENS, IMAGE_TOKENS)}: install the diffusers version the pack pins"
            )

        def ids(caption: str) -> list[int]:
            return pipe.tokenizer.apply_chat_template(format_text_input([caption], pipe.system_message), add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"][0]

        starts, crop = caption_start(ids), pipe.prompt_template_encode_start_idx
        if starts != crop:
            raise StageError(
                f"{model_dir / 'tokenizer'}: its chat template puts the caption at token {starts}, but HunyuanVideo15Pipeline "
                f"crops {crop}: captions would lose or keep system-prompt tokens; use the release's tokenizer"
            )
        self.scale = pipe.vae.config.scaling_factor
        self.layout = Layout(sequences=[(TEXT_TOKENS, pipe.text_encoder.config.hidden_size), (GLYPH_TOKENS, pipe.text_encoder_2.config.d_model)], vectors=[TEXT_TOKENS, GLYPH_TOKENS])

    def latents(self, frames: Any) -> Any:
        """uint8 (F, H, W, 3) -> latents (C, F', H', W'), the posterior's mode times ``scaling_factor``."""
        import torch

        with torch.no_grad():
            video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
            return (self.pipe.vae.encode(video).latent_dist.mode() * self.scale)[0]

    def text(self, caption: str) -> Any:
        import torch

        with torch.no_grad():
            states, mask, glyphs, glyph_mask = self.pipe.encode_prompt(caption, device=torch.device("cpu"), dtype=torch.float32)
        return self.layout.join([states[0], glyphs[0]], [mask[0], glyph_mask[0]])


def denoiser_inputs(model: Any, noisy: Any, timestep: Any, text: Any) -> dict[str, Any]:
    """The transformer's keyword inputs, as the text-to-video pipeline builds them."""
    import torch

    (states, glyphs), (mask, glyph_mask) = layout(model.config).split(text.to(noisy.dtype))
    batch, channels, frames, height, width = noisy.shape
    condition = torch.zeros(batch, channels + 1, frames, height, width, dtype=noisy.dtype, device=noisy.device)  # zero latents, zero mask
    return {
        "hidden_states": torch.cat([noisy, condition], dim=1),
        "timestep": timestep,
        "encoder_hidden_states": states,
        "encoder_attention_mask": mask,
        "encoder_hidden_states_2": glyphs,
        "encoder_attention_mask_2": glyph_mask,
        "image_embeds": torch.zeros(batch, IMAGE_TOKENS, model.config.image_embed_dim, dtype=noisy.dtype, device=noisy.device),
    }


def predict(model: Any, noisy: Any, sigma: Any, text: Any) -> Any:
    """The velocity for latents [B, C, F, H, W] at noise levels ``sigma`` (the pipeline's ``timestep / 1000``)."""
    return model(**denoiser_inputs(model, noisy, sigma * 1000, text), return_dict=False)[0]


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small denoiser call's inputs (random latents and caption states, the first 8 tokens real)."""
    import torch

    config, lay = model.config, layout(model.config)
    states = [torch.randn(tokens, width, generator=generator) for tokens, width in lay.sequences]
    masks = [torch.arange(tokens) < 8 for tokens, _ in lay.sequences]
    text = lay.join(states, masks)[None]
    return denoiser_inputs(model, torch.randn(1, config.out_channels, 2, 4, 4, generator=generator), torch.tensor([500.0]), text)


def sample(pipe: Any, ctx: StageContext, prompt: str, generator: Any) -> Any:
    height, width, frames = ctx.config.data.buckets[0]
    pipe.guider = pipe.guider.new(guidance_scale=ctx.config.export.guidance_scale)
    return pipe(
        prompt, height=height, width=width, num_frames=frames, num_inference_steps=ctx.config.export.sample_steps, generator=generator, output_type="np", **ctx.config.export.call_options(pipe)
    ).frames[0]


FAMILY = DiffusionFamily(
    transformer_class="HunyuanVideo15Transformer3DModel",
    pipeline_class="HunyuanVideo15Pipeline",
    adapter=ADAPTER,
    encoders=Encoders,
    predict=predict,
    probe=probe,
    sample=sample,
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("transformer_blocks",),
    demo=write_moving_squares,
    # caption and video tokens in one sequence; the masks' rows are no tokens
    flops=lambda: denoiser_flops(joint_text=True, side_rows=lambda model, rows: rows - TEXT_TOKENS - GLYPH_TOKENS),
)
