"""The built-in reward functions of online RL (``training.grpo.rewards``), registered through the
same hook a third party uses (:mod:`mmcore.train.rewards` has them)."""

from __future__ import annotations

from mmcore import hookimpl
from mmcore.framework.registry import RewardSpec

BUILT_IN = {
    "accuracy": ("accuracy", "1 where the answer (inside <answer> tags, if any) equals the reference, normalised as SQuAD does; else 0"),
    "exact": ("exact", "1 where the answer equals the reference exactly; else 0"),
    "format": ("format_match", "1 where the whole answer matches training.grpo.format_pattern; else 0"),
    "similarity": ("similarity", "partial credit: 1 - the edit distance to the reference over the longer length (normalised as accuracy)"),
    "length": ("length", "0 up to the reference's length, down to -1 at twice it"),
}

#: scores of generated pictures and videos (the diffusion kit's GRPO), in mmcore.train.image_rewards
BUILT_IN_IMAGE = {
    "colour": ("colour", "the share of the picture's coloured pixels in the colour its caption names (red, green, blue, yellow)"),
    "brightness": ("brightness", "the mean pixel value, 0 (black) to 1 (white)"),
}


@hookimpl
def mmcore_register_rewards(register):
    for name, (attr, summary) in BUILT_IN.items():
        register(RewardSpec(name, f"mmcore.train.rewards:{attr}", summary=summary))
    for name, (attr, summary) in BUILT_IN_IMAGE.items():
        register(RewardSpec(name, f"mmcore.train.image_rewards:{attr}", summary=summary, takes="image"))
