"""What a pack gives the train loop (:func:`mmcore.train.loop.run_training`): its model's part
of training, as a :class:`TrainRecipe`.

The loop calls these methods and nothing else of the model: build it (single-device code),
the dataset and how samples make a batch, batch -> summed loss, which blocks to shard and
which parameter groups may freeze. A kit's recipe (``VLMRecipe``, ``DiffusionRecipe``) is a
subclass, so "go to definition" from the loop's ``recipe.loss(model, batch)`` shows the
method every recipe has and, one step on, the kit's own.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.framework.context import StageContext
from mmcore.run.rundir import Manifest

if TYPE_CHECKING:
    import torch
    from torch import nn


class TrainRecipe:
    """What a pack supplies to the train engine: a subclass whose methods are the model's part
    of training (what the kits do: ``VLMRecipe``, ``DiffusionRecipe``), or, as SDK 1.x packs do,
    an instance built from keyword parts (``TrainRecipe(build_model=..., loss=...)``), each part
    a callable that takes the place of the method of that name.

    The four parts every recipe has are methods (:meth:`build_model`, :meth:`dataset`,
    :meth:`collate`, :meth:`loss`); the optional ones are ``None`` until a subclass defines
    them or a keyword gives them, and the engine reads ``None`` as "not used".

    A backend that needs more of a recipe asks through a protocol of its own, which a subclass
    implements beside these parts: ``parallel.backend: megatron`` a
    :class:`mmcore.backends.megatron.family.MegatronRecipe` (``megatron_family(ctx, upstream)``). The
    SDK 1.x keyword ``megatron=`` (that method as a callable) is still accepted, deprecated
    until SDK 2.0.

    Attributes:
        build_model: ``(ctx, upstream) -> nn.Module`` in fp32, single-device code. With
            ``weights`` it builds without loading (the engine calls it with parameters on the
            meta device, shards, then loads each rank's part); without, it returns the model
            on the CPU with weights loaded (e.g. with :func:`load_converted`).
        weights: optional ``(ctx, upstream) -> DCP checkpoint`` to start from (convert's).
        dataset: ``(ctx, upstream) -> Sequence`` of samples (map-style: ``len`` and ``[i]``).
        collate: list of samples -> batch dict; must set ``batch["num_loss_tokens"]`` (int).
        loss: ``(model, batch) -> tensor``: the summed loss of the batch.
        shard_modules: ``model -> list of modules`` that the backend shards one by one
            (decoder layers, vision blocks), before the root.
        freeze_groups: group name -> parameter-name globs, for ``training.freeze``
            (e.g. ``{"vision": ["model.visual.*"]}``); globs may also be given directly.
        evaluate: optional ``(ctx, model, step) -> metrics``, called on every rank at step 0,
            every ``training.eval_every`` steps and at the end; logged on the main process.
        loss_unit: what ``num_loss_tokens`` counts, for the throughput metric's name
            (``tokens`` -> ``tokens_per_s``; ``samples`` -> ``samples_per_s``).
        group_of: optional ``sample index -> key``; a micro-batch then only holds samples of
            one key (e.g. one resolution bucket, so latents stack).
        length_of: optional ``sample index -> tokens``, for ``training.max_tokens`` (packed
            rows filled to a token budget); recipes that pack provide it.
        flops: optional ``(model, batch) -> float``: FLOPs of one forward and backward of the
            batch (:mod:`mmcore.train.flops`), for the ``tflops`` and ``mfu`` metrics.
        lora_targets: the default of ``training.lora.target_modules`` (groups or module globs),
            among the linear layers of ``shard_modules``' blocks; empty: all of those layers.
        prepare: optional ``(ctx, model) -> None``, called once on every rank when the model is
            ready (weights loaded, or resumed) and before the first step, without gradients, in
            eval mode: what a loss needs from the starting weights (DPO's reference
            log-probabilities, :mod:`mmcore.train.preference`).
        step_metrics: optional ``() -> {name: tensor or (sum, count)}``: what the loss measured
            besides itself (DPO's rewards, GRPO's), read and reset after every step. A tensor is
            a sum over the step's loss units: the engine sums it over processes and divides by
            the step's loss units. A ``(sum, count)`` pair is divided by its own count, both
            summed over processes (a mean over answers or tokens of another kind).
        rollout: optional ``(ctx, model, micro_batches, step) -> micro_batches or None``, for a
            method that learns from the model's own samples (GRPO): called on every rank with
            the step's collated micro-batches, the model in eval mode without gradients and its
            forwards local to the process (a sharded model gathered whole: ranks may sample
            answers of different lengths); it returns the batches the step trains on, each
            with its ``num_loss_tokens`` (the engine counts them again), or None to train on
            the collated ones (a warm-up step).
        steps_per_rollout: with ``rollout``, the optimizer steps each rollout serves (GRPO's
            epochs over a rollout batch): the data is drawn and sampled on the steps that are
            multiples of it, the batches reused on the steps between.
        method: the ``training.method`` the recipe trains (``sft``, ``dpo``, ``grpo``): the
            engine refuses a run whose config asks for another, rather than train it silently
            as this one.
        sample_seeds: the engine adds ``batch["sample_seeds"]`` (int64, one per sample): a seed
            from ``run.seed``, the step, the accumulation index and the sample's index, for a loss
            that draws random numbers (noise levels, noise, caption dropout) per sample. The draws
            then do not depend on how samples are cut into micro-batches or ranks, nor on a
            resume (``sample_seed``).
        fill: optional :class:`~mmcore.data.fillers.Fill`, for a model whose towers run only on
            the media a batch holds: a rank whose micro-batch lacks a media kind that another
            rank's holds collates it with that kind's filler, so every rank calls the same
            towers (their sharded collectives) in the same order.
        media: optional :class:`~mmcore.data.fillers.MediaKinds`, for a model that calls every
            tower on every rank whatever its micro-batch holds (zero-weighted where unused), so
            it needs no fillers: the engine counts the steps whose data-parallel ranks held
            different media (``mixed_media_steps``), as it does from ``fill`` where a recipe
            has one.
        work_of: optional ``sample index -> tokens through the towers`` (vision patches, audio
            frames): the samplers give the data-parallel ranks of a step alike tower work, and
            the ``tower_balance`` metric (the busiest rank's tower tokens over the ranks' mean)
            says how alike.
        loss_terms: names of loss terms each divided by its own count over the step's whole
            batch (every micro-batch and rank), where a reference adds means of unlike units
            (BAGEL: token-mean cross-entropy plus latent-token-mean velocity MSE): collate
            sets ``batch["loss_counts"] = {name: count}``; the engine sums them with its other
            counts (the same collective) and gives every micro-batch
            ``batch["global_loss_counts"]`` (each term's count, and ``"all"``: the step's loss
            units), and the loss returns :func:`loss_of_terms` of its terms' sums, so the step's
            loss is the sum of the terms' means however samples fall into micro-batches and ranks.
        ulysses: the recipe splits its packed rows over ``parallel.ulysses`` ranks
            (:mod:`mmcore.backends.ulysses`: its build_model, collate and loss do, as the VLM
            kit's); the FSDP2 backend refuses ``parallel.ulysses`` > 1 for a recipe without.
    """

    # optional parts: None means the recipe does not use it
    weights: Callable[[StageContext, Mapping[str, Manifest]], Path] | None = None
    evaluate: Callable[[StageContext, "nn.Module", int], dict[str, float]] | None = None
    group_of: Callable[[int], Any] | None = None
    flops: Callable[["nn.Module", dict[str, Any]], float] | None = None
    length_of: Callable[[int], int] | None = None
    prepare: Callable[[StageContext, "nn.Module"], None] | None = None
    step_metrics: Callable[[], dict[str, "torch.Tensor"]] | None = None
    fill: Any = None
    media: Any = None
    rollout: Callable[[StageContext, "nn.Module", list[dict[str, Any]], int], list[dict[str, Any]] | None] | None = None
    work_of: Callable[[int], float] | None = None
    # settings
    freeze_groups: Mapping[str, Sequence[str]] = MappingProxyType({})
    loss_unit: str = "tokens"
    lora_targets: Sequence[str] = ()
    sample_seeds: bool = False
    steps_per_rollout: int = 1
    method: str = "sft"
    ulysses: bool = False
    loss_terms: Sequence[str] = ()

    _REQUIRED = ("build_model", "dataset", "collate", "loss")

    def __init__(self, **parts: Any) -> None:
        megatron = parts.pop("megatron", None)  # SDK 1.x, deprecated until 2.0: MegatronRecipe's megatron_family
        if megatron is not None:
            warnings.warn(
                "TrainRecipe(megatron=...) is deprecated and goes in SDK 2.0: define megatron_family(ctx, upstream) in a TrainRecipe subclass (mmcore.backends.megatron.family.MegatronRecipe)",
                DeprecationWarning,
                stacklevel=2,
            )
            self.megatron_family = megatron
        known = set(self._REQUIRED) | {"shard_modules"} | {name for name in vars(TrainRecipe) if not name.startswith("_") and not callable(getattr(TrainRecipe, name))}
        unknown = sorted(set(parts) - known)
        if unknown:
            raise TypeError(f"TrainRecipe got unknown part(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        missing = [name for name in self._REQUIRED if name not in parts and getattr(type(self), name) is getattr(TrainRecipe, name)]
        if missing:
            raise TypeError(f"TrainRecipe needs {', '.join(missing)} (a keyword part or a method of {type(self).__name__})")
        for name, value in parts.items():
            setattr(self, name, value)

    def build_model(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> "nn.Module":
        """The model in fp32, single-device code (see ``build_model`` above)."""
        raise NotImplementedError

    def dataset(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Sequence[Any]:
        """The training samples, map-style (``len`` and ``[i]``)."""
        raise NotImplementedError

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        """Samples -> one micro-batch; sets ``batch["num_loss_tokens"]``."""
        raise NotImplementedError

    def loss(self, model: "nn.Module", batch: dict[str, Any]) -> "torch.Tensor":
        """The summed loss of the batch (the engine divides by the global batch's loss units)."""
        raise NotImplementedError

    def shard_modules(self, model: "nn.Module") -> list["nn.Module"]:
        """The modules the backend shards one by one before the root (none by default)."""
        return []


__all__ = ["TrainRecipe"]


def loss_of_terms(batch: Mapping[str, Any], sums: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
    """What a recipe with :attr:`TrainRecipe.loss_terms` returns: each term's sum over the
    micro-batch scaled by the step's loss units over the term's count, so that once the engine
    divides by the loss units the step's loss is the sum of the terms' means. A term no sample of
    the step has (count 0) adds its (zero-sized) sum unscaled."""
    counts = batch["global_loss_counts"]
    total = None
    for name, value in sums.items():
        part = value * (counts["all"] / counts[name]) if counts[name] else value
        total = part if total is None else total + part
    if total is None:
        raise ValueError("loss_of_terms: no terms")
    return total
