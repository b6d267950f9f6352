"""A clip's latents as the diffusion kit holds them: one tensor (a video VAE's [C, F', H', W'],
an image VAE's [C, H', W']), or **named latents**, a dict of tensors a denoiser generates
jointly (LTX-2: ``{"video": [C, F', H', W'], "audio": [C', L, M']}``).

The kit's objectives, batches, extract and held-out loss go through these few functions, so one
code path serves both: noise is drawn per name, each name's error is averaged over its own
elements, and the family's ``latent_weights`` say how the names add up.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

#: the prefix of a named latent's field in a cached sample (``latents.audio``)
PREFIX = "latents."


def is_named(latents: Any) -> bool:
    """True for named latents (a dict of tensors)."""
    return isinstance(latents, Mapping)


def tree_map(fn: Callable[..., Any], first: Any, *rest: Any) -> Any:
    """``fn`` applied to a tensor, or to each name of named latents (``rest`` alike by name)."""
    if is_named(first):
        return {name: fn(value, *(other[name] for other in rest)) for name, value in first.items()}
    return fn(first, *rest)


def leaves(latents: Any) -> list[Any]:
    """The tensors, in name order for named latents."""
    return [latents[name] for name in sorted(latents)] if is_named(latents) else [latents]


def batch_size(latents: Any) -> int:
    return int(leaves(latents)[0].shape[0])


def device_of(latents: Any) -> Any:
    return leaves(latents)[0].device


def shape_of(latents: Any) -> Any:
    """A hashable shape: the tensor's, or ``((name, shape), ...)``."""
    return tuple((name, tuple(latents[name].shape)) for name in sorted(latents)) if is_named(latents) else tuple(latents.shape)


def stack(items: list[Any]) -> Any:
    """Per-sample latents -> a batch (stacked per name)."""
    import torch

    return tree_map(lambda *xs: torch.stack(xs), items[0], *items[1:])


def per_sample_error(squared: Any, weights: Mapping[str, float] | None, mean: Callable[[Any, Any], Any], generated: Any = None) -> Any:
    """Per-sample error [B] of squared errors (a tensor, or named): each name's mean over its own
    elements (``mean(squared, generated)``), the names summed with ``weights`` (default 1 each)."""
    if not is_named(squared):
        return mean(squared, generated)
    weights = weights or {}
    masks = generated if is_named(generated) else {name: generated for name in squared}
    return sum(float(weights.get(name, 1.0)) * mean(squared[name], masks.get(name)) for name in sorted(squared))


def regroup(sample: dict[str, Any]) -> dict[str, Any]:
    """A cached sample whose named latents come as ``latents.<name>`` fields -> ``latents`` as a
    dict (the clip's raw ``frames`` and ``audio`` dropped: the latents stand in for them)."""
    named = {key[len(PREFIX) :]: sample[key] for key in sample if key.startswith(PREFIX)}
    if not named:
        return sample
    rest = {k: v for k, v in sample.items() if not k.startswith(PREFIX) and k not in ("frames", "audio")}
    return {**rest, "latents": named}


__all__ = ["PREFIX", "is_named", "tree_map", "leaves", "batch_size", "device_of", "shape_of", "stack", "per_sample_error", "regroup"]
