"""DPO for the VLM kit, moved to :mod:`mmcore.kits.vlm.dpo` (this path stays for SDK 1.x imports)."""

from mmcore.kits.vlm.dpo import PAIR_FIELDS, PairSamples, VLMDPORecipe, answer_views, chosen_view, dpo_recipe  # noqa: F401

__all__ = ["dpo_recipe", "answer_views", "chosen_view", "PairSamples", "PAIR_FIELDS", "VLMDPORecipe"]
