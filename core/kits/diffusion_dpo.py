"""The old path of :mod:`mmcore.kits.diffusion.dpo` (Diffusion-DPO), kept importable."""

from mmcore.kits.diffusion.dpo import *  # noqa: F403
from mmcore.kits.diffusion.dpo import TIMESTEPS, DiffusionDPORecipe, accuracy_sum, diffusion_dpo_terms, dpo_recipe

__all__ = ["DiffusionDPORecipe", "dpo_recipe", "diffusion_dpo_terms", "accuracy_sum", "TIMESTEPS"]
