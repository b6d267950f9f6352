"""What a diffusion family does with its pipeline's frozen parts, written once on public
diffusers API: encoding clips and captions as the pipeline does (:class:`PipelineEncoders`),
and the latent layouts denoisers read (:func:`pack_latents` / :func:`unpack_latents`: packed
tokens as FLUX and LTX-Video take them; :func:`latent_token_ids`: their positions;
:func:`rotary_positions_3d`: CogVideoX's), so a pack never calls a pipeline's private methods.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable


def is_video_vae(vae: Any) -> bool:
    """True for a VAE that encodes clips [B, 3, F, H, W] (3-D convolutions), False for an image VAE [B, 3, H, W]."""
    import torch

    return any(isinstance(m, torch.nn.Conv3d) for m in vae.modules())


def latent_statistics(vae: Any) -> tuple[Any, Any]:
    """(per-channel mean, std) of a VAE's latents: Wan's ``latents_mean``/``latents_std`` in its
    config, LTX-Video's as buffers; (None, None) where it has none."""
    cfg = vae.config
    if cfg.get("latents_mean", None) is not None:
        return cfg["latents_mean"], cfg["latents_std"]
    buffers = dict(vae.named_buffers())
    return buffers.get("latents_mean"), buffers.get("latents_std")


def normalise_latents(vae: Any, z: Any) -> Any:
    """The VAE's raw latents ``z`` [B, C, (F,) H, W] as its pipelines hand them to the denoiser:
    ``(z - mean) * scaling_factor / std`` where the VAE has per-channel statistics (Wan's
    ``latents_mean``/``latents_std`` in its config, LTX-Video's as buffers), else
    ``(z - shift_factor) * scaling_factor`` (FLUX, CogVideoX, HunyuanVideo, SD)."""
    import torch

    cfg = vae.config
    scale = cfg.get("scaling_factor", None) or 1.0
    mean, std = latent_statistics(vae)
    if mean is None:
        return (z - (cfg.get("shift_factor", None) or 0.0)) * scale
    view = (1, -1) + (1,) * (z.ndim - 2)
    mean, std = torch.as_tensor(mean, dtype=z.dtype).view(view), torch.as_tensor(std, dtype=z.dtype).view(view)
    return (z - mean) * scale / std


def vae_latents(vae: Any, frames: Any) -> Any:
    """uint8 frames [F, H, W, 3] -> the normalised latents the denoiser is trained on: [C, F', H', W']
    from a video VAE, [C, H', W'] from an image VAE (of the first frame); the posterior's mode
    (deterministic, so a feature cache is)."""
    import torch

    with torch.no_grad():
        pixels = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0  # [1, 3, F, H, W] in [-1, 1]
        if not is_video_vae(vae):
            pixels = pixels[:, :, 0]
        z = vae.encode(pixels.to(vae.dtype)).latent_dist.mode()
        return normalise_latents(vae, z)[0]


def denormalise_latents(vae: Any, latents: Any) -> Any:
    """The inverse of :func:`normalise_latents`: the denoiser's latents [B, C, (F,) H, W] as the
    VAE's raw latents, what ``vae.decode`` takes."""
    import torch

    cfg = vae.config
    scale = cfg.get("scaling_factor", None) or 1.0
    mean, std = latent_statistics(vae)
    if mean is None:
        return latents / scale + (cfg.get("shift_factor", None) or 0.0)
    view = (1, -1) + (1,) * (latents.ndim - 2)
    return latents * torch.as_tensor(std, dtype=latents.dtype).view(view) / scale + torch.as_tensor(mean, dtype=latents.dtype).view(view)


class OwnFolderModel:
    """For a pack's own diffusers ``ModelMixin`` whose folders the pack's code reads (a released
    layout diffusers does not know, loaded strictly; put it before ``ModelMixin`` in the bases):
    ``from_pretrained``, what diffusers' pipeline loader calls for the component, takes a local
    folder (``subfolder`` joined) and hands it and ``torch_dtype`` to the class's ``load_folder``;
    the loader's other options do not apply to a local folder read whole (SDK 1.30)."""

    @classmethod
    def load_folder(cls, folder: Path, dtype: Any = None) -> Any:
        raise NotImplementedError(f"{cls.__name__}.load_folder")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, **kwargs: Any) -> Any:
        folder = Path(pretrained_model_name_or_path)
        if kwargs.get("subfolder"):
            folder = folder / kwargs["subfolder"]
        return cls.load_folder(folder, kwargs.get("torch_dtype"))


class VideoLatents:
    """For a pack's own ``DiffusionPipeline`` with a video ``vae`` (Open-Sora Plan's, Step-Video's):
    clips to the denoiser's latents and back, as :func:`normalise_latents` and
    :func:`denormalise_latents` define them, and the VAE's compression."""

    vae: Any

    def vae_scales(self) -> tuple[int, int]:
        """(temporal, spatial) compression of the VAE (:func:`vae_compression`)."""
        return vae_compression(self.vae)

    def encode_video(self, video: Any) -> Any:
        """[B, 3, F, H, W] in [-1, 1] -> normalised latents (the posterior's mode: deterministic, so a cache is)."""
        import torch

        with torch.no_grad():
            return normalise_latents(self.vae, self.vae.encode(video.to(self.vae.dtype)).latent_dist.mode())

    def decode_latents(self, latents: Any) -> Any:
        """Normalised latents -> the VAE's decoding, [B, 3, F, H, W] in about [-1, 1]."""
        import torch

        with torch.no_grad():
            return self.vae.decode(denormalise_latents(self.vae, latents).to(self.vae.dtype)).sample

    # -- sampling: the flow-matching Euler loop both pipelines run, their denoisers' calls their own

    def shifted_sigmas(self, steps: int) -> Any:
        """Noise levels 1 -> 0 for ``steps`` Euler steps: ``linspace(1, 0, steps + 1)`` shifted by
        the scheduler's ``shift`` (``shift * s / (1 + (shift - 1) * s)``, SD3's time shift)."""
        import numpy as np

        shift = float(self.scheduler.config.shift)  # type: ignore[attr-defined]
        s = np.linspace(1.0, 0.0, steps + 1)
        return shift * s / (1 + (shift - 1) * s)

    def initial_latents(self, num_frames: int, height: int, width: int, generator: Any, latents: Any = None) -> Any:
        """float32 latents to start from: ``latents`` as given, or the VAE's grid of a clip of that
        size drawn from ``generator`` on the CPU (the same noise on any device)."""
        import torch

        if latents is None:
            t_scale, s_scale = self.vae_scales()
            shape = (1, self.transformer.config.in_channels, (num_frames - 1) // t_scale + 1, height // s_scale, width // s_scale)  # type: ignore[attr-defined]
            latents = torch.randn(shape, generator=generator, dtype=torch.float32).to(self._execution_device)  # type: ignore[attr-defined]
        return latents.float()

    def euler(self, latents: Any, sigmas: Any, velocity: Callable[[Any, float], Any], toward_noise: bool) -> Any:
        """Euler's steps from ``sigmas[0]`` to ``sigmas[-1]``: ``velocity(latents, sigma)`` (guidance
        applied) is the latents' rate of change as the noise level grows (``toward_noise``:
        noise - data, Open-Sora Plan's) or as it falls (data - noise, Step-Video's)."""
        sign = 1.0 if toward_noise else -1.0  # exact: a step's size only changes sign
        for i in self.progress_bar(range(len(sigmas) - 1)):  # type: ignore[attr-defined]
            latents = latents + float(sigmas[i + 1] - sigmas[i]) * sign * velocity(latents, float(sigmas[i]))
        return latents

    def video_frames(self, latents: Any) -> Any:
        """Normalised latents -> frames [B, F, H, W, 3] in [0, 1] (numpy), the offloaded models freed."""
        video = self.decode_latents(latents).float()
        video = ((video + 1) / 2).clamp(0, 1).permute(0, 2, 3, 4, 1).cpu().numpy()
        self.maybe_free_model_hooks()  # type: ignore[attr-defined]
        return video


def vae_frames(vae: Any, latents: Any) -> Any:
    """The inverse of :func:`vae_latents` for a batch: normalised latents [B, C, (F,) H, W] ->
    decoded frames, float32 [B, F, H, W, 3] in [0, 1] (an image VAE's pictures: F = 1), as the
    pipelines decode them (:func:`normalise_latents` undone, then ``vae.decode``)."""
    import torch

    z = denormalise_latents(vae, latents.float())
    with torch.no_grad():
        pixels = vae.decode(z.to(vae.dtype)).sample.float()
    pixels = ((pixels + 1) / 2).clamp(0, 1)
    if pixels.ndim == 4:  # an image VAE: [B, 3, H, W]
        pixels = pixels[:, :, None]
    return pixels.permute(0, 2, 3, 4, 1).cpu()


def vae_compression(vae: Any) -> tuple[int, int]:
    """(temporal, spatial) compression of a VAE: a latent frame per ``temporal`` frames (after
    the first), a latent per ``spatial`` x ``spatial`` pixels; temporal is 0 for an image VAE."""
    cfg = vae.config
    spatial = getattr(vae, "spatial_compression_ratio", None) or cfg.get("scale_factor_spatial", None) or cfg.get("spatial_compression_ratio", None)
    if spatial is None:
        spatial = 2 ** (len(cfg.get("block_out_channels", (0,))) - 1)
    if not is_video_vae(vae):
        return 0, int(spatial)
    temporal = getattr(vae, "temporal_compression_ratio", None) or cfg.get("scale_factor_temporal", None) or cfg.get("temporal_compression_ratio", None)
    if temporal is None and cfg.get("temperal_downsample", None) is not None:  # Wan2.1's spelling
        temporal = 2 ** sum(cfg["temperal_downsample"])
    return int(temporal or 1), int(spatial)


def vae_compression_of(model_dir: Path, subfolder: str = "vae") -> tuple[int, int]:
    """:func:`vae_compression` of the VAE in a pipeline folder, built on the meta device (no weights read)."""
    import json

    import diffusers
    import torch

    config = json.loads((model_dir / subfolder / "config.json").read_text())
    cls = getattr(diffusers, config["_class_name"])
    with torch.device("meta"):
        vae = cls.from_config(config)
    return vae_compression(vae)


def pack_latents(latents: Any, patch: int = 1, patch_t: int = 1) -> Any:
    """Latents [B, C, F, H, W] (or an image's [B, C, H, W]) -> tokens [B, (F/pt)(H/p)(W/p),
    C*pt*p*p]: frames, rows, columns in order, each token's features channel-major, then the
    patch's time, row, column. LTX-Video's layout, and FLUX's (its images with ``patch=2``)."""
    if latents.ndim == 4:
        latents = latents[:, :, None]
    b, c, f, h, w = latents.shape
    x = latents.reshape(b, c, f // patch_t, patch_t, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(b, (f // patch_t) * (h // patch) * (w // patch), c * patch_t * patch * patch)


def unpack_latents(tokens: Any, frames: int | None, height: int, width: int, patch: int = 1, patch_t: int = 1) -> Any:
    """The inverse of :func:`pack_latents`: tokens -> [B, C, F, H, W] (``frames`` None: an image's [B, C, H, W])."""
    b, _, features = tokens.shape
    f = frames or 1
    c = features // (patch_t * patch * patch)
    x = tokens.reshape(b, f // patch_t, height // patch, width // patch, c, patch_t, patch, patch)
    out = x.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(b, c, f, height, width)
    return out[:, :, 0] if frames is None else out


def latent_token_ids(frames: int, height: int, width: int, device: Any = None, dtype: Any = None) -> Any:
    """[frames * height * width, 3] positions (frame, row, column) of packed tokens in
    :func:`pack_latents`' order (sizes in tokens): FLUX's ``img_ids`` for ``frames=1``."""
    import torch

    grid = torch.stack(torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij"), dim=-1)
    return grid.reshape(-1, 3).to(device=device, dtype=dtype or torch.float32)


def rotary_positions_3d(model: Any, frames: int, height: int, width: int, device: Any = None) -> Any:
    """The 3-D rotary positions ``(cos, sin)`` a CogVideoX-shaped pipeline gives its denoiser for
    latents of ``frames`` x ``height`` x ``width`` (latent sizes, before the denoiser's patches),
    made as ``CogVideoXPipeline._prepare_rotary_positional_embeddings`` makes them from pixel
    sizes, on diffusers' public functions; None for a denoiser with learnt positions
    (``use_rotary_positional_embeddings`` false: CogVideoX 1.0 2B). With ``patch_size_t``
    (CogVideoX 1.5) the frames are patched in time and the grid is sliced from the largest."""
    if not model.config.use_rotary_positional_embeddings:
        return None
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    p, p_t = model.config.patch_size, model.config.patch_size_t
    grid, base = (height // p, width // p), (model.config.sample_height // p, model.config.sample_width // p)
    if p_t is None:
        crops = get_resize_crop_region_for_grid(grid, base[1], base[0])
        return get_3d_rotary_pos_embed(embed_dim=model.config.attention_head_dim, crops_coords=crops, grid_size=grid, temporal_size=frames, device=device)
    return get_3d_rotary_pos_embed(
        embed_dim=model.config.attention_head_dim, crops_coords=None, grid_size=grid, temporal_size=(frames + p_t - 1) // p_t, grid_type="slice", max_size=base, device=device
    )


class PipelineEncoders:
    """The frozen VAE and text encoder(s) of a pipeline folder, used as the pipeline uses them:
    the kit's ``DiffusionFamily.encoders`` (``(model dir, max text length) -> encoders``). A
    family subclasses it, names ``pipeline_class`` and shapes :meth:`prompt`'s output into its
    one caption tensor in ``text``."""

    pipeline_class = ""

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        import diffusers
        import torch

        self.pipe = getattr(diffusers, self.pipeline_class).from_pretrained(model_dir, transformer=None)
        for part in self.pipe.components.values():
            if isinstance(part, torch.nn.Module):
                part.eval()
        self.max_sequence_length = max_sequence_length

    def latents(self, frames: Any) -> Any:
        """uint8 [F, H, W, 3] -> normalised latents (:func:`vae_latents`)."""
        return vae_latents(self.pipe.vae, frames)

    def prompt(self, caption: str) -> tuple[Any, ...]:
        """The pipeline's own ``encode_prompt`` of one caption, without classifier-free guidance,
        at ``max_sequence_length`` tokens, on the CPU: what it returns (Wan, CogVideoX:
        ``(states, None)``; LTX-Video: ``(states, mask, None, None)``; FLUX: ``(states, pooled, text_ids)``)."""
        import torch

        takes = inspect.signature(self.pipe.encode_prompt).parameters
        options = {"do_classifier_free_guidance": False, "prompt_2": None, "max_sequence_length": self.max_sequence_length, "device": torch.device("cpu")}
        with torch.no_grad():
            return tuple(self.pipe.encode_prompt(caption, **{k: v for k, v in options.items() if k in takes}))

    def text(self, caption: str) -> Any:
        """One caption's features as one tensor: by default the first output's sequence [L, D]."""
        return self.prompt(caption)[0][0]


__all__ = [
    "PipelineEncoders",
    "is_video_vae",
    "normalise_latents",
    "vae_latents",
    "vae_frames",
    "vae_compression",
    "vae_compression_of",
    "pack_latents",
    "unpack_latents",
    "latent_token_ids",
    "rotary_positions_3d",
]
