"""BAGEL's configuration, read from the release's folder the way its own loaders read it.

``ByteDance-Seed/BAGEL-7B-MoT`` ships ``llm_config.json`` (a Qwen2 config), ``vit_config.json``
(a SigLIP vision config), ``config.json`` and the weights ``ema.safetensors`` + ``ae.safetensors``.
The reference loaders (``app.py``, ``inferencer.py``) do not read everything from the files:
they force ``qk_norm``, an untied ``lm_head`` and the MoT layer on the LLM config, turn off the
ViT's 2-D RoPE, drop the ViT's last layer, and pass ``latent_patch_size=2``,
``max_latent_size=64``, ``vit_max_num_patch_per_side=70`` and ``connector_act`` by hand. Here
``config.json``'s fields of the same names win where present and those values are the defaults;
the VAE's shape is read off ``ae.safetensors`` itself (FLUX's file carries no config).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcore import read_json_object
from mmcore.errors import StageError

LLM_CONFIG, VIT_CONFIG, BAGEL_CONFIG, WEIGHTS, VAE_WEIGHTS = "llm_config.json", "vit_config.json", "config.json", "ema.safetensors", "ae.safetensors"

# BagelConfig's fields and the values the release's loaders give them.
DEFAULTS: dict[str, Any] = {
    "visual_gen": True,
    "visual_und": True,
    "latent_patch_size": 2,
    "max_latent_size": 64,
    "vit_max_num_patch_per_side": 70,
    "connector_act": "gelu_pytorch_tanh",
    "interpolate_pos": False,
    "timestep_shift": 1.0,
}


@dataclass
class BagelConfig:
    llm: Any
    vit: Any
    vae: dict[str, Any] = field(default_factory=dict)
    visual_gen: bool = True
    visual_und: bool = True
    latent_patch_size: int = 2
    max_latent_size: int = 64
    vit_max_num_patch_per_side: int = 70
    connector_act: str = "gelu_pytorch_tanh"
    interpolate_pos: bool = False
    timestep_shift: float = 1.0

    @property
    def latent_channels(self) -> int:
        return int(self.vae["z_channels"])

    @property
    def latent_downsample(self) -> int:
        """Pixels per latent token side: the VAE's downsampling times the latent patch."""
        return int(self.vae["downsample"]) * self.latent_patch_size

    @property
    def patch_latent_dim(self) -> int:
        return self.latent_patch_size**2 * self.latent_channels


def read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, f"a BAGEL folder holds {LLM_CONFIG}, {VIT_CONFIG}, {BAGEL_CONFIG}, {WEIGHTS}, {VAE_WEIGHTS}")


def llm_config(data: dict[str, Any]):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config

    cfg = Qwen2Config(**{k: v for k, v in data.items() if k not in ("architectures", "model_type")})
    # what the release's loaders set on top of the file
    cfg.qk_norm = True
    cfg.tie_word_embeddings = False
    cfg.layer_module = "Qwen2MoTDecoderLayer"
    return cfg


def vit_config(data: dict[str, Any]):  # type: ignore[no-untyped-def]
    from transformers import SiglipVisionConfig

    cfg = SiglipVisionConfig(**{k: v for k, v in data.items() if k not in ("architectures", "model_type")})
    cfg.num_hidden_layers -= 1  # BAGEL uses SigLIP's penultimate layer's features
    return cfg


def vae_shape(folder: Path) -> dict[str, Any]:
    """The FLUX-style autoencoder's shape, from ``ae.safetensors``'s tensor shapes."""
    from mm_pack_bagel.vae import shape_from_weights

    return shape_from_weights(folder / VAE_WEIGHTS)


def load_config(folder: Path, *, with_vae: bool = True) -> BagelConfig:
    folder = Path(folder)
    extra = read_json(folder / BAGEL_CONFIG)
    fields = {k: extra.get(k, v) for k, v in DEFAULTS.items()}
    for name, value in fields.items():
        if type(value) is not type(DEFAULTS[name]) and not (isinstance(DEFAULTS[name], float) and isinstance(value, int)):
            raise StageError(f"{folder / BAGEL_CONFIG}: {name} must be a {type(DEFAULTS[name]).__name__}, got {value!r}")
    config = BagelConfig(llm=llm_config(read_json(folder / LLM_CONFIG)), vit=vit_config(read_json(folder / VIT_CONFIG)), **fields)
    if config.interpolate_pos:
        raise StageError(f"{folder / BAGEL_CONFIG}: interpolate_pos: true is not supported (the release extrapolates positions)")
    if with_vae and config.visual_gen:
        config.vae = vae_shape(folder)
    return config
