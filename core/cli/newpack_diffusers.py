"""``mmcore new-pack NAME --category generative --from-diffusers PIPELINE``: a pack on the
diffusion kit for a diffusers pipeline class, which runs every stage before anything is filled in.

The pipeline class is introspected: its ``__init__`` names the components (their classes give the
tiny ``init:`` checkpoint, :func:`mmcore.kits.diffusion.tiny.tiny_pipeline`), and its denoiser's
``forward`` says which *shape* of family it is, each with a template of ``family.py`` and
``config.py`` (:data:`SHAPES`): 5-D video latents the denoiser reads whole (Wan; CogVideoX's
frames-first layout with 3-D rotary positions) or latents packed into tokens (FLUX's images,
LTX-Video's clips with a caption mask).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from mmcore.errors import UsageError
from mmcore.cli.diffusers_files import FILES
from mmcore.cli.diffusers_templates import FAMILIES


@dataclass(frozen=True)
class Shape:
    """One kind of denoiser call the generator has a template for."""

    example: str  # the pipeline it was written from
    what: str  # one line for the error listing the shapes
    forward: frozenset[str]  # the denoiser's forward arguments it fills (others must have defaults)
    needs: frozenset[str]  # the arguments that tell this shape from the others
    size_multiple: int  # VAE x patch of the example family (the author adjusts for theirs)
    frame_stride: int  # the VAE's temporal compression; 0: images
    bucket: str  # the tiny preset's bucket
    training: str  # the config's training section
    pipeline_options: str = ""  # the tiny preset's export.pipeline_options


_IGNORED = {"self", "return_dict", "attention_kwargs", "joint_attention_kwargs"}

SHAPES: dict[str, Shape] = {
    "wan": Shape(
        "WanPipeline",
        "5-D video latents [B, C, F, H, W] read whole, text states, timestep 1000 sigma",
        frozenset({"hidden_states", "timestep", "encoder_hidden_states", "encoder_hidden_states_image"}),
        frozenset({"hidden_states", "timestep", "encoder_hidden_states"}),
        16,
        4,
        "[[32, 32, 5]]",
        "FlowMatchingTraining",
    ),
    "cogvideox": Shape(
        "CogVideoXPipeline",
        "5-D video latents read frames first [B, F, C, H, W] with 3-D rotary positions, integer timesteps of a DDPM schedule",
        frozenset({"hidden_states", "encoder_hidden_states", "timestep", "timestep_cond", "ofs", "image_rotary_emb"}),
        frozenset({"image_rotary_emb"}),
        16,
        4,
        "[[32, 32, 5]]",
        "DiffusionTraining",
    ),
    "flux": Shape(
        "FluxPipeline",
        "images packed into 2x2-patch tokens with position ids, text states plus a pooled vector, guidance embedding",
        frozenset(
            {
                "hidden_states",
                "encoder_hidden_states",
                "pooled_projections",
                "timestep",
                "img_ids",
                "txt_ids",
                "guidance",
                "controlnet_block_samples",
                "controlnet_single_block_samples",
                "controlnet_blocks_repeat",
            }
        ),
        frozenset({"img_ids", "pooled_projections"}),
        16,
        0,
        "[[32, 32, 1]]",
        "GuidanceEmbeddingTraining",
    ),
    "ltx": Shape(
        "LTXPipeline",
        "video latents packed into tokens, text states with their mask, latent sizes and rope scale from the frame rate",
        frozenset({"hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask", "num_frames", "height", "width", "rope_interpolation_scale", "video_coords"}),
        frozenset({"encoder_attention_mask", "num_frames", "rope_interpolation_scale"}),
        8,  # the tiny VAE's 8x / 4x (TINY_COMPONENTS); LTX-Video's own checkpoints are 32 / 8
        4,
        "[[32, 32, 9]]",
        "FlowMatchingTraining",
        pipeline_options="{frame_rate: 8}",
    ),
}


def supported() -> str:
    return "; ".join(f"{name} ({shape.example}: {shape.what})" for name, shape in SHAPES.items())


def shape_of(pipeline: str, components: dict[str, str]) -> str:
    """The shape of pipeline ``pipeline``'s denoiser, from its ``forward``'s arguments; unknown: a one-line error listing the shapes."""
    import diffusers

    transformer = components.get("transformer")
    cls = getattr(diffusers, transformer or "", None)
    if cls is None:
        raise UsageError(
            f"--from-diffusers {pipeline}: no diffusers denoiser among its components ({', '.join(f'{k}: {v}' for k, v in components.items())}); shapes the generator knows: {supported()}"
        )
    params = inspect.signature(cls.forward).parameters
    required = {n for n, p in params.items() if n not in _IGNORED and p.default is inspect.Parameter.empty}
    given = set(params) - _IGNORED
    for name in ("ltx", "flux", "cogvideox", "wan"):  # the most particular first: Wan's call is everyone's core
        shape = SHAPES[name]
        if shape.needs <= given and required <= shape.forward:
            return name
    raise UsageError(f"--from-diffusers {pipeline}: its denoiser {transformer} takes ({', '.join(sorted(given))}), none of the shapes the generator knows: {supported()}")


def block_lists(transformer: str) -> list[str]:
    """The denoiser's lists of blocks (FSDP shards them one by one), from its default config on the meta device."""
    import diffusers
    import torch

    cls = getattr(diffusers, transformer)
    with torch.device("meta"):
        model = cls()
    return [name for name, child in model.named_children() if isinstance(child, torch.nn.ModuleList) and len(child) and "block" in name]


def values(name: str, pipeline: str) -> dict[str, str]:
    """The template values of a pack for ``pipeline``: its shape, components, block lists."""
    from mmcore.kits.diffusion.tiny import missing_tiny, pipeline_components

    components = pipeline_components(pipeline)
    shape_name = shape_of(pipeline, components)
    shape = SHAPES[shape_name]
    missing = missing_tiny(components)
    if missing:
        raise UsageError(f"--from-diffusers {pipeline}: no tiny config for {', '.join(missing)} (mmcore.kits.diffusion.tiny.TINY_COMPONENTS); add one there or build init:tiny yourself")
    blocks = block_lists(components["transformer"])
    return {
        "pipeline": pipeline,
        "transformer": components["transformer"],
        "shape": shape_name,
        "shape_what": shape.what,
        "example": shape.example,
        "subfolders": ", ".join(f'"{c}"' for c in components),
        "blocks": ", ".join(f'"{b}"' for b in blocks),
        "freeze": "{" + ", ".join(f'"{b}": ["{b}.*"]' for b in blocks) + "}",
        "size_multiple": str(shape.size_multiple),
        "frame_stride": str(shape.frame_stride),
        "bucket": shape.bucket,
        "training": shape.training,
        "convert_sections": ', "convert": ("convert", "training.expert")' if shape.training != "DiffusionTraining" else "",
        "export_options": f"\n  pipeline_options: {shape.pipeline_options}" if shape.pipeline_options else "",
        "family_body": FAMILIES[shape_name],
    }


def diffusers_files(name: str, pipeline: str, common: dict[str, str]) -> dict[str, str]:
    """Relative path -> text of every file of a generative pack for ``pipeline``."""
    vals = {**common, **values(name, pipeline)}
    vals["family_body"] = _fill(vals["family_body"], vals)
    return {path.format(**vals): _fill(text, vals) for path, text in FILES.items()}


def _fill(text: str, vals: dict[str, str]) -> str:
    return text.format(**vals)


__all__ = ["SHAPES", "Shape", "shape_of", "diffusers_files", "supported"]
