"""Checks of ``training`` settings that span keys (a field's own range is pydantic's): each a
one-line :class:`ConfigError` naming the key and where it was set."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mmcore.errors import ConfigError

#: the values AdamW was always built with: betas and eps at these are no choice of the user's
ADAMW_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8}


def check_training(training: Any, origins: Mapping[tuple[str, ...], str], order: Sequence[str]) -> None:
    """``training`` (a validated section) against ``origins`` (key path -> the layer that set it)
    and ``order`` (the layers' origins, earliest first).

    A knob of another optimizer is refused rather than silently unused; so are ``steps`` and
    ``epochs`` given together, unless ``steps`` came from an earlier layer (a preset's steps
    give way to the user's epochs)."""

    def origin(key: str) -> str:
        return origins.get(("training", key), "defaults")

    for key, default in ADAMW_DEFAULTS.items():
        if training.optimizer != "adamw" and getattr(training, key) != default:
            raise ConfigError(f"{origin(key)}: training.{key}: only training.optimizer adamw uses it; this config's optimizer is {training.optimizer}")
    if training.optimizer != "sgd" and training.momentum:
        raise ConfigError(f"{origin('momentum')}: training.momentum: only training.optimizer sgd uses it; this config's optimizer is {training.optimizer}")
    if training.epochs is None or ("training", "steps") not in origins:
        return
    steps, epochs = origin("steps"), origin("epochs")
    if order.index(steps) >= order.index(epochs):
        where = f"{steps}: training.steps and training.epochs" if steps == epochs else f"{steps}: training.steps and {epochs}: training.epochs"
        raise ConfigError(f"{where} are both set: give one (steps counts optimizer steps, epochs passes over the data; training.epochs=null to count steps)")


def without_derived(values: dict[str, Any]) -> dict[str, Any]:
    """A dumped config less ``training.steps`` when ``training.epochs`` sets the length: read back,
    it must not count as the user's steps (:func:`check_training`)."""
    training = values.get("training")
    if isinstance(training, dict) and training.get("epochs") is not None:
        values = dict(values, training={k: v for k, v in training.items() if k != "steps"})
    return values


__all__ = ["check_training", "without_derived", "ADAMW_DEFAULTS"]
