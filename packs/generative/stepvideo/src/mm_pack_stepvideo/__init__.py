"""mmcore pack for Step-Video-T2V text-to-video (pack ``stepvideo``) on the diffusion kit.

diffusers has no Step-Video class, so the pack carries its denoiser (``transformer``: the DiT
under the released checkpoint's parameter names), its Video-VAE (``stepvae``, ``stepvae_blocks``,
``stepvae_io``: the released ``vae_v2.safetensors``'s names) and pipeline (``pipeline``). The rest: the config
(``config``), the family as the kit sees it (``family``), tiny random pipelines (``tiny``) and the
released-weights reader / writer (``public``).

Importing this package must stay light (no torch, no diffusers): ``mmcore list`` imports it.
diffusers finds the classes here by name (``model_index.json`` names this package), hence the
lazy attributes.
"""

from typing import Any

__version__ = "0.1.0"

_LAZY = {"StepVideoTransformer3DModel": "mm_pack_stepvideo.transformer", "StepVideoPipeline": "mm_pack_stepvideo.pipeline", "StepVideoVAE": "mm_pack_stepvideo.stepvae"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
