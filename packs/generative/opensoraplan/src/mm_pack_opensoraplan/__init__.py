"""mmcore pack for Open-Sora Plan v1.5 text-to-video (pack ``opensoraplan``) on the diffusion kit.

diffusers has no Open-Sora Plan class, so the pack carries its denoiser (``transformer``, ``model``:
the sparse U-shaped MMDiT under the public checkpoint's parameter names) and pipeline
(``pipeline``), and Open-Sora Plan's video VAE, the WF-VAE (``wfvae``, its blocks ``wfvae_blocks``,
its released folders ``wfvae_io``). The rest: the config (``config``), the family as the kit sees it (``family``),
tiny random pipelines (``tiny``) and the public ``model_ema.pt`` reader (``public``).

Importing this package must stay light (no torch, no diffusers): ``mmcore list`` imports it.
diffusers finds the classes here by name (``model_index.json`` names this package), hence the
lazy attributes.
"""

from typing import Any

__version__ = "0.1.0"

_LAZY = {"OpenSoraPlanTransformer3DModel": "mm_pack_opensoraplan.transformer", "OpenSoraPlanPipeline": "mm_pack_opensoraplan.pipeline", "WFVAEModel": "mm_pack_opensoraplan.wfvae"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
