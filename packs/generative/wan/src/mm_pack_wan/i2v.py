"""Wan image-to-video (``--pack wan-i2v``) as the diffusion kit sees it: ``WanImageToVideoPipeline``.

The denoiser reads the noisy latents with 20 more channels on the channel axis, as the pipeline
builds them from the first frame: a mask (4 channels: the first frame's latent is given, the
rest is not) and the VAE latents of the first frame followed by black frames; Wan2.1's I2V
models also cross-attend to the first frame's CLIP image features (``image_dim``; Wan2.2's I2V
models have none). Both are made by the pipeline's own ``prepare_latents`` and ``encode_image``
and cached per clip (:attr:`DiffusionFamily.conditions`); the caption drops for guidance, the
first frame does not (the pipeline keeps it in its unconditional pass too).

Wan2.2 TI2V-5B (``expand_timesteps`` in ``model_index.json``) conditions differently, as its
pipeline does: the first frame's latents replace the first latent frame (clean, timestep 0 for
its tokens, a timestep per token), nothing is added on the channel axis, and the loss leaves out
the frame the pipeline does not generate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore import StageContext, StageError
from mmcore.data import caption_agreement, write_moving_shapes
from mmcore.kits import DiffusionFamily

from mm_pack_wan.adapter import ADAPTER
from mm_pack_wan.family import FREEZE_GROUPS, Encoders, checkpoint_options, token_timesteps

CONDITIONS = ("condition", "image_embeds")


class ImageEncoders(Encoders):
    """The text and video encoders of the t2v family, plus the first frame's conditions."""

    pipeline_class = "WanImageToVideoPipeline"

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        import json

        config = model_dir / "transformer" / "config.json"
        if json.loads(config.read_text()).get("image_dim") and not (model_dir / "image_encoder").is_dir():
            raise StageError(f"{config}: the transformer reads CLIP image features (image_dim), but {model_dir} has no image_encoder/ to make them")
        super().__init__(model_dir, max_sequence_length)

    def conditions(self, frames: Any) -> dict[str, Any]:
        """uint8 (F, H, W, 3) -> ``condition`` [4 + 16, F', H', W'] (mask and first-frame latents,
        the pipeline's ``prepare_latents``) and ``image_embeds`` [tokens, D] (CLIP's penultimate
        states, ``encode_image``; empty for a model without image features)."""
        import torch
        from PIL import Image

        count, height, width, _ = frames.shape
        first = frames[0].permute(2, 0, 1)[None].float() / 127.5 - 1.0  # the pipeline's preprocess at the clip's size
        latent_shape = (
            1,
            self.pipe.vae.config.z_dim,
            (count - 1) // self.pipe.vae_scale_factor_temporal + 1,
            height // self.pipe.vae_scale_factor_spatial,
            width // self.pipe.vae_scale_factor_spatial,
        )
        with torch.no_grad():
            # given latents: the pipeline draws no noise here, it only builds the condition
            # (Wan2.2 TI2V: the first frame's latents alone, which replace the first latent frame)
            condition = self.pipe.prepare_latents(first, 1, latent_shape[1], height, width, count, torch.float32, torch.device("cpu"), latents=torch.zeros(latent_shape))[1]
            image = torch.zeros(0)
            if self.pipe.image_encoder is not None:
                image = self.pipe.encode_image(Image.fromarray(frames[0].numpy()), torch.device("cpu"))[0]
        return {"condition": condition[0], "image_embeds": image}


def predict(model: Any, noisy: Any, sigma: Any, text: Any, condition: Any, image_embeds: Any, expand_timesteps: bool = False) -> Any:
    image = image_embeds if image_embeds.numel() else None
    if expand_timesteps:
        return first_frame_given(model, noisy, sigma, text, condition, image)
    return model(hidden_states=with_condition(noisy, condition), timestep=sigma * 1000, encoder_hidden_states=text, encoder_hidden_states_image=image, return_dict=False)[0]


def first_frame_given(model: Any, noisy: Any, sigma: Any, text: Any, condition: Any, image: Any) -> tuple[Any, Any]:
    """Wan2.2 TI2V (``expand_timesteps``) as its image-to-video pipeline runs it: the first latent
    frame is the image's latents (``condition``), clean, at timestep 0; the rest is noisy, at
    the sample's. (prediction, generated): the pipeline keeps the given frame, so its error
    does not count."""
    import torch

    generated = torch.ones_like(noisy[:, :1], dtype=torch.float32)
    generated[:, :, 0] = 0
    inputs = ((1 - generated) * condition + generated * noisy).to(noisy.dtype)
    prediction = model(hidden_states=inputs, timestep=token_timesteps(model, generated, sigma * 1000), encoder_hidden_states=text, encoder_hidden_states_image=image, return_dict=False)[0]
    return prediction, generated


def with_condition(noisy: Any, condition: Any) -> Any:
    import torch

    return torch.cat([noisy, condition.to(noisy.dtype)], dim=1)


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small denoiser call's inputs (random latents, condition, text and image states)."""
    import torch

    image = torch.randn(1, 5, model.config.image_dim, generator=generator) if model.config.image_dim else None
    return {
        "hidden_states": torch.randn(1, model.config.in_channels, 3, 4, 4, generator=generator),
        "timestep": torch.tensor([500.0]),
        "encoder_hidden_states": torch.randn(1, ctx.config.data.max_sequence_length, model.config.text_dim, generator=generator),
        "encoder_hidden_states_image": image,
    }


def sample(pipe: Any, ctx: StageContext, prompt: str, generator: Any, image: Any = None) -> Any:
    height, width, frames = ctx.config.data.buckets[0]
    return pipe(
        image=image,
        prompt=prompt,
        height=height,
        width=width,
        num_frames=frames,
        num_inference_steps=ctx.config.export.sample_steps,
        guidance_scale=ctx.config.export.guidance_scale,
        max_sequence_length=ctx.config.data.max_sequence_length,
        generator=generator,
        output_type="np",
        **ctx.config.export.call_options(pipe),  # export.pipeline_options
    ).frames[0]


FAMILY = DiffusionFamily(
    transformer_class="WanTransformer3DModel",
    pipeline_class="WanImageToVideoPipeline",
    adapter=ADAPTER,
    encoders=ImageEncoders,
    predict=predict,
    probe=probe,
    checkpoint_options=checkpoint_options,
    sample=sample,
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("blocks",),
    demo=write_moving_shapes,
    demo_checker=caption_agreement,
    conditions=CONDITIONS,
)
