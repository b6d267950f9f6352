"""LTX-2 as the diffusion kit sees it: one transformer denoising a clip's video and audio latents
together (named latents ``{"video": [C, F', H', W'], "audio": [C', L, M']}``), the frozen VAEs,
Gemma-3 and its connectors used exactly as ``LTX2Pipeline`` uses them, the denoiser's call.

**The loss.** Flow matching at one noise level per clip shared by both streams (the pipeline
denoises both on one schedule); each stream's squared velocity error is averaged over its own
latent elements and the two are summed with weight 1 each (:data:`LATENT_WEIGHTS`). Averaging per
stream keeps each modality's share independent of its size (a 32x32x9 clip has 48 video tokens
of 16 features and 28 audio tokens of 16; a real 768x512x121 clip ~6,000 video tokens of 128
beside ~120 audio tokens): a mean over the concatenation would make the sound a rounding error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore import StageContext, StageError
from mmcore.data import caption_agreement
from mmcore.engines import RenameAdapter
from mmcore.kits import DiffusionFamily, FlowMatching, PipelineEncoders, pack_latents, unpack_latents, vae_latents

from mm_pack_ltx2.demo import pitch_agreement, write_shapes_with_tones
from mm_pack_ltx2.sound import audio_latents, pack_audio, unpack_audio

ADAPTER = RenameAdapter(rules=[])  # diffusers' own names: the transformer trains as it is stored

#: how the two streams' errors add up (each already a mean over its own elements)
LATENT_WEIGHTS = {"video": 1.0, "audio": 1.0}

FREEZE_GROUPS = {
    "video": ["transformer_blocks.*.attn1.*", "transformer_blocks.*.attn2.*", "transformer_blocks.*.ff.*", "proj_in.*", "proj_out.*", "caption_projection.*"],
    "audio": ["transformer_blocks.*.audio_attn1.*", "transformer_blocks.*.audio_attn2.*", "transformer_blocks.*.audio_ff.*", "audio_proj_in.*", "audio_proj_out.*", "audio_caption_projection.*"],
    "cross_modal": ["transformer_blocks.*.audio_to_video_attn.*", "transformer_blocks.*.video_to_audio_attn.*"],
}


class Encoders(PipelineEncoders):
    """The frozen video VAE, audio VAE, Gemma-3 and connectors of an LTX-2 pipeline folder."""

    pipeline_class = "LTX2Pipeline"
    latent_names = ("audio", "video")

    def latents(self, frames: Any, audio: Any = None) -> Any:
        """uint8 [F, H, W, 3] and mono samples [N] -> ``{"video", "audio"}`` normalised latents."""
        if audio is None:
            raise StageError("ltx2 generates a clip's sound with its frames: preprocess the clips with data.audio_rate set (the audio VAE's sample_rate)")
        return {"video": vae_latents(self.pipe.vae, frames), "audio": audio_latents(self.pipe.audio_vae, audio)}

    def text(self, caption: str) -> Any:
        """The caption as the transformer reads it: the connectors' video and audio streams and
        their attention mask as one more column, [L, Dv + Da + 1]."""
        import torch

        embeds, mask = self.prompt(caption)[:2]
        with torch.no_grad():
            video, audio, connected = self.pipe.connectors(embeds, mask, padding_side=self.pipe.tokenizer.padding_side)
        return torch.cat([video[0], audio[0], connected.reshape(1, -1, 1)[0].to(video.dtype)], dim=-1)


def caption_widths(model: Any) -> tuple[int, int]:
    """(video, audio) widths of the caption streams the transformer reads: the connectors'
    ``caption_channels`` both (LTX-2.0, projected inside), else its own widths (LTX-2.3)."""
    cfg = model.config
    if cfg.use_prompt_embeddings:
        return cfg.caption_channels, cfg.caption_channels
    return cfg.num_attention_heads * cfg.attention_head_dim, cfg.audio_num_attention_heads * cfg.audio_attention_head_dim


def call_inputs(model: Any, video: Any, audio: Any, timestep: Any, text: Any, frame_rate: float) -> dict[str, Any]:
    """The keyword arguments of one transformer call as ``LTX2Pipeline``'s denoising loop makes
    them: packed video tokens and audio tokens, both caption streams with the mask, the timestep
    (``1000 * sigma``, also as ``sigma``), latent sizes, the frame rate of the rope positions."""
    _, _, frames, height, width = video.shape
    dv, da = caption_widths(model)
    mask = text[..., -1]
    return {
        "hidden_states": pack_latents(video, model.config.patch_size, model.config.patch_size_t),
        "audio_hidden_states": pack_audio(audio),
        "encoder_hidden_states": text[..., :dv],
        "audio_encoder_hidden_states": text[..., dv : dv + da],
        "timestep": timestep,
        "sigma": timestep,
        "encoder_attention_mask": mask,
        "audio_encoder_attention_mask": mask,
        "num_frames": frames,
        "height": height,
        "width": width,
        "fps": frame_rate,
        "audio_num_frames": audio.shape[2],
        "use_cross_timestep": True,  # LTX2Pipeline's default
    }


def predict(model: Any, noisy: Any, sigma: Any, text: Any, frame_rate: float = 24.0) -> dict[str, Any]:
    """Both streams' velocities, in the kit's layouts."""
    video, audio = noisy["video"], noisy["audio"]
    out_video, out_audio = model(**call_inputs(model, video, audio, sigma * 1000, text, frame_rate), return_dict=False)
    _, _, frames, height, width = video.shape
    return {"video": unpack_latents(out_video, frames, height, width, model.config.patch_size, model.config.patch_size_t), "audio": unpack_audio(out_audio, audio.shape[3])}


def predict_options(ctx: StageContext) -> dict[str, Any]:
    """The rope's frame rate: the clips' (``data.fps``), as ``sample`` generates them."""
    return {"frame_rate": float(ctx.config.export.pipeline_options.get("frame_rate", ctx.config.data.fps))}


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small joint call's inputs (random latents and caption streams)."""
    import torch

    dv, da = caption_widths(model)
    length = ctx.config.data.max_sequence_length
    video = torch.randn(1, model.config.in_channels, 3, 4, 4, generator=generator)
    audio = torch.randn(1, model.config.audio_in_channels // 4, 7, 4, generator=generator)
    text = torch.cat([torch.randn(1, length, dv + da, generator=generator), torch.ones(1, length, 1)], dim=-1)
    return call_inputs(model, video, audio, torch.tensor([500.0]), text, float(ctx.config.data.fps))


def sample(pipe: Any, ctx: StageContext, prompt: str, generator: Any) -> dict[str, Any]:
    """A clip and its sound from ``LTX2Pipeline``: the first bucket's size, the export's steps and
    guidance (video and audio alike), ``data.fps`` as the frame rate; spatio-temporal and modality
    guidance off unless ``export.pipeline_options`` turns them on (their defaults name block 28).
    Beside the frames and the waveform, the log-mel the vocoder was given (``mel``): what the
    demo's pitch check reads (:func:`mm_pack_ltx2.demo.pitch_agreement`)."""
    height, width, frames = ctx.config.data.buckets[0]
    export = ctx.config.export
    options = {"frame_rate": float(ctx.config.data.fps), "stg_scale": 0.0, "audio_stg_scale": 0.0, "modality_scale": 1.0, "audio_modality_scale": 1.0, **export.call_options(pipe)}
    mels: list[Any] = []  # the log-mel the audio VAE decoded, as the vocoder gets it
    hook = pipe.vocoder.register_forward_pre_hook(lambda module, args: mels.append(args[0].detach()))
    try:
        video, audio = pipe(
            prompt,
            height=height,
            width=width,
            num_frames=frames,
            num_inference_steps=export.sample_steps,
            guidance_scale=export.guidance_scale,
            audio_guidance_scale=export.guidance_scale,
            max_sequence_length=ctx.config.data.max_sequence_length,
            generator=generator,
            output_type="np",
            return_dict=False,
            **options,
        )
    finally:
        hook.remove()
    return {
        "frames": video[0],
        "audio": audio[0].float().mean(0).cpu().numpy(),
        "audio_rate": int(pipe.vocoder.config.output_sampling_rate),
        "mel": mels[-1][0].float().mean(0).cpu().numpy(),  # [T, mel bins], the channels averaged
        "mel_rate": int(pipe.audio_vae.config.sample_rate),
    }


def objective(model_dir: Path) -> FlowMatching:
    return FlowMatching(weights=LATENT_WEIGHTS)


def flops() -> Any:
    """``(model, batch) -> FLOPs`` of a step: every weight on every token of both streams (an
    upper bound: video weights see only video tokens), self-attention per stream, and the two
    cross-modal attentions."""
    import math

    from mmcore.train import StepFlops, attention_flops, dense_flops

    seen = StepFlops()

    def count(model: Any, batch: dict[str, Any]) -> float:
        cfg = model.config
        video, audio = batch["latents"]["video"], batch["latents"]["audio"]
        samples = video.shape[0]
        tokens, sounds = math.prod(video.shape[2:]) // (cfg.patch_size**2 * cfg.patch_size_t), audio.shape[2]
        width, audio_width, blocks = cfg.num_attention_heads * cfg.attention_head_dim, cfg.audio_num_attention_heads * cfg.audio_attention_head_dim, cfg.num_layers
        return (
            dense_flops(seen.counts("", model), samples * (tokens + sounds))
            + attention_flops(blocks, width, [tokens] * samples)
            + attention_flops(blocks, audio_width, [sounds] * samples)
            + attention_flops(blocks, audio_width, [tokens] * samples, [sounds] * samples)
            + attention_flops(blocks, audio_width, [sounds] * samples, [tokens] * samples)
        )

    return count


FAMILY = DiffusionFamily(
    transformer_class="LTX2VideoTransformer3DModel",
    pipeline_class="LTX2Pipeline",
    adapter=ADAPTER,
    encoders=Encoders,
    predict=predict,
    probe=probe,
    sample=sample,
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("transformer_blocks",),
    demo=write_shapes_with_tones,
    demo_checker=caption_agreement,
    sound_checker=pitch_agreement,
    predict_options=predict_options,
    objective=objective,
    flops=flops,
)
