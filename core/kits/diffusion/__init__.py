"""The diffusion kit: the stages of a diffusers text-to-video (or -image) model trained by flow
matching, from one declaration.

A pack describes its family once, as a :class:`DiffusionFamily` (the denoiser and pipeline
classes, how the frozen VAE and text encoder encode, how the denoiser is called); the family's
methods are the stage functions and parts its declared stages bind::

    FAMILY = DiffusionFamily(transformer_class="WanTransformer3DModel", pipeline_class="WanPipeline", ...)

    STAGES = {
        "convert": "mm_pack_x.family:FAMILY.convert",
        "preprocess": "mm_pack_x.family:FAMILY.preprocess",
        "extract": "mm_pack_x.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_x.family:FAMILY.recipe"}),
        "export": "mm_pack_x.family:FAMILY.export",
        "evaluate": "mm_pack_x.family:FAMILY.evaluate",
        "infer": "mm_pack_x.family:FAMILY.infer",
    }

What the kit does with it, one module a job:

* :mod:`~mmcore.kits.diffusion.sections`: the config sections a family's config subclasses
  (:class:`VideoData`, :class:`FlowMatchingTraining`, :class:`SampleExport`, ...).
* :mod:`~mmcore.kits.diffusion.family`: :class:`DiffusionFamily`, the declaration, the denoiser
  it builds, and the stage methods, each handing its work to a module below.
* **preprocess** (:mod:`mmcore.data.clips`): captioned videos or images probed, put in the
  bucket of the closest aspect ratio they are long enough for, sampled at ``data.fps``, scaled
  and centre-cropped; uint8 frames stored with the caption.
* **extract** (:mod:`~mmcore.kits.diffusion.extract`): VAE latents and text embeddings of every
  clip into the feature cache, keyed by content and the checkpoint's fingerprint; resumable.
* **train**: the objective (:mod:`~mmcore.kits.diffusion.objectives`): flow matching (noise
  levels drawn uniform or logit-normal and shifted; the velocity ``noise - data`` regressed) or
  a DDPM scheduler's v / epsilon prediction (:class:`NoiseSchedule`); the recipe
  (:class:`~mmcore.kits.diffusion.recipe.DiffusionRecipe`), with the samples and batches of
  :mod:`~mmcore.kits.diffusion.batches` and the step's FLOPs of
  :mod:`~mmcore.kits.diffusion.flops`; Diffusion-DPO on preference pairs
  (:class:`~mmcore.kits.diffusion.dpo.DiffusionDPORecipe`); Flow-GRPO / DanceGRPO, online RL on
  image rewards (:class:`~mmcore.kits.diffusion.grpo.DiffusionGRPORecipe`, the SDE sampler and
  its log-probabilities in :mod:`~mmcore.kits.diffusion.flow_grpo`).
* **export** (:mod:`~mmcore.kits.diffusion.export`): the trained denoiser into a copy of the
  downloaded pipeline folder under diffusers' names; reloaded, every weight must be
  bit-identical and its output equal. After LoRA training, the adapter.
* **evaluate** and **infer** (:mod:`~mmcore.kits.diffusion.sampling`): sample videos (mp4) of
  the export and a contact sheet for the held-out captions, with a report page; ``mmcore infer
  --prompt`` writes a video and its frames to the run's ``infer/``.
* the pipeline's frozen parts on public diffusers API (:mod:`~mmcore.kits.diffusion.pipelines`):
  :class:`PipelineEncoders` (VAE latents normalised as pipelines do, the pipeline's own
  ``encode_prompt``), token packing (:func:`pack_latents`, :func:`unpack_latents`,
  :func:`latent_token_ids`), CogVideoX's 3-D rotary positions (:func:`rotary_positions_3d`), the VAE's compression; tiny random pipelines of any pipeline class
  whose components have a tiny config (:mod:`~mmcore.kits.diffusion.tiny`), what ``mmcore
  new-pack --from-diffusers`` builds its packs on.

The names below are the kit's SDK (:data:`mmcore.sdk.SURFACE`): import them from here.
"""

from __future__ import annotations

from mmcore.kits.diffusion.batches import FreshSamples, collate
from mmcore.kits.diffusion.export import LORA_WEIGHTS
from mmcore.kits.diffusion.extract import content_key
from mmcore.kits.diffusion.family import DiffusionFamily
from mmcore.kits.diffusion.flops import denoiser_flops
from mmcore.kits.diffusion.objectives import EVAL_SIGMAS, FLOW_MATCHING, FlowMatching, NoiseSchedule, diffusion_loss, flow_matching_loss, sigmas
from mmcore.kits.diffusion.sampling import text_to_video_sample
from mmcore.kits.diffusion.pipelines import (
    PipelineEncoders,
    latent_token_ids,
    normalise_latents,
    denormalise_latents,
    OwnFolderModel,
    VideoLatents,
    pack_latents,
    rotary_positions_3d,
    unpack_latents,
    vae_compression,
    vae_compression_of,
    vae_frames,
    vae_latents,
)
from mmcore.kits.diffusion.tiny import TINY_COMPONENTS, pipeline_components, tiny_pipeline
from mmcore.kits.diffusion.sections import EXPERTS, DiffusionTraining, FlowGrpoSection, FlowMatchingTraining, GuidanceEmbeddingTraining, SampleExport, VideoData, guidance_option

__all__ = [
    "DiffusionFamily",
    "VideoData",
    "DiffusionTraining",
    "FlowMatchingTraining",
    "FlowGrpoSection",
    "GuidanceEmbeddingTraining",
    "guidance_option",
    "EXPERTS",
    "SampleExport",
    "EVAL_SIGMAS",
    "sigmas",
    "FlowMatching",
    "NoiseSchedule",
    "FLOW_MATCHING",
    "diffusion_loss",
    "flow_matching_loss",
    "content_key",
    "collate",
    "denoiser_flops",
    "text_to_video_sample",
    "FreshSamples",
    "LORA_WEIGHTS",
    "PipelineEncoders",
    "vae_latents",
    "vae_frames",
    "normalise_latents",
    "denormalise_latents",
    "OwnFolderModel",
    "VideoLatents",
    "vae_compression",
    "vae_compression_of",
    "pack_latents",
    "unpack_latents",
    "latent_token_ids",
    "rotary_positions_3d",
    "TINY_COMPONENTS",
    "pipeline_components",
    "tiny_pipeline",
]
