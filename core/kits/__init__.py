"""Kits: what a family of packs shares, so that a pack holds only what is its own.

* :mod:`mmcore.kits.vlm` — transformers conversational models (VLMs, omni thinkers): chat-template
  preprocessing, padded or packed collation, loss, shard and freeze groups, held-out accuracy,
  export with reload and a ``generate()`` check. A pack declares a :class:`~mmcore.kits.vlm.VLMFamily`;
  the kit's train recipe is :class:`~mmcore.kits.vlm.VLMRecipe` (a package, one job per module);
  :mod:`mmcore.kits.auto` makes a family from a transformers class name alone.
* :mod:`mmcore.kits.diffusion` — diffusers flow-matching denoisers (text-to-video/image):
  captioned-clip preprocessing in buckets, VAE and text-encoder extract into the feature cache,
  flow-matching loss and timestep sampling, diffusers export with sample videos. A pack
  declares a :class:`~mmcore.kits.diffusion.DiffusionFamily`.
"""

from __future__ import annotations

from mmcore.framework.facade import lazy_exports

from typing import Any, Sequence


def blocks_at(model: Any, paths: Sequence[str]) -> list[Any]:
    """The items of the module lists at dotted ``paths`` (``"model.language_model.layers"``), in order."""
    blocks: list[Any] = []
    for path in paths:
        found = model
        for name in path.split("."):
            found = getattr(found, name)
        blocks.extend(found)
    return blocks


#: the SDK names of this façade -> the module that defines each (:mod:`mmcore.sdk`)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("VLMRecipe", "VLMDPORecipe", "VLMMegatronRecipe"), "mmcore.kits.vlm"),
    **dict.fromkeys(("VLMGRPORecipe",), "mmcore.kits.vlm.grpo"),
    **dict.fromkeys(("DiffusionRecipe",), "mmcore.kits.diffusion.recipe"),
    **dict.fromkeys(
        (
            "PipelineEncoders",
            "latent_token_ids",
            "normalise_latents",
            "pack_latents",
            "rotary_positions_3d",
            "unpack_latents",
            "vae_compression",
            "vae_compression_of",
            "vae_latents",
            "vae_frames",
            "denormalise_latents",
            "OwnFolderModel",
            "VideoLatents",
        ),
        "mmcore.kits.diffusion.pipelines",
    ),
    **dict.fromkeys(("TINY_COMPONENTS", "pipeline_components", "tiny_pipeline"), "mmcore.kits.diffusion.tiny"),
    **dict.fromkeys(("DiffusionDPORecipe",), "mmcore.kits.diffusion.dpo"),
    **dict.fromkeys(("DiffusionGRPORecipe",), "mmcore.kits.diffusion.grpo"),
    **dict.fromkeys(
        (
            "DiffusionFamily",
            "DiffusionTraining",
            "EVAL_SIGMAS",
            "EXPERTS",
            "FLOW_MATCHING",
            "FlowGrpoSection",
            "FlowMatching",
            "FlowMatchingTraining",
            "GuidanceEmbeddingTraining",
            "NoiseSchedule",
            "SampleExport",
            "VideoData",
            "collate",
            "content_key",
            "denoiser_flops",
            "diffusion_loss",
            "flow_matching_loss",
            "guidance_option",
            "sigmas",
            "text_to_video_sample",
        ),
        "mmcore.kits.diffusion",
    ),
    **dict.fromkeys(
        (
            "MelClipExpander",
            "audio_clips",
            "clip_key",
            "collate_mel_clips",
            "mel_tower_tokens",
            "pad_clips",
            "use_cached_audio",
        ),
        "mmcore.kits.mel_audio",
    ),
    **dict.fromkeys(
        (
            "ProcessorImages",
            "TINY_SIZES",
            "TransformersNames",
            "auto_family",
            "shrink_config",
            "tiny_checkpoint",
        ),
        "mmcore.kits.auto",
    ),
    **dict.fromkeys(
        (
            "VLMFamily",
            "restarting_positions",
            "rows_of",
            "with_tail",
        ),
        "mmcore.kits.vlm",
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
