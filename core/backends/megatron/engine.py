"""``parallel.backend: megatron``: training a family on megatron-core.

The train engine's one loop (:func:`mmcore.train.run_training`) runs it, as it runs FSDP2: setup,
step, checkpoint, log, with the same promises. What differs is where the model lives: each process holds one tensor-parallel
shard of one pipeline stage (:class:`MegatronFamily` builds it: the recipe gives it as a
:class:`MegatronRecipe`; the family's table,
:class:`mmcore.backends.megatron.tensor_map.ParallelMap`, cuts the converted weights for it), the
micro-batches of a step run through Megatron's forward-backward schedule, and the
*data-parallel* group (processes / (TP x PP)), not the world, drives the sampler, the token
counts and the gradient sum.

Checkpoints are megatron-core's ``dist_checkpointing`` (model and AdamW state, each tensor with
its global shape and offsets), inside the engine's ``checkpoints/step-N`` protocol (written
under ``.incomplete``, renamed when whole, ``latest``, the last two kept) with the scheduler,
the data position and every rank's RNG state: a run resumes exactly, at the same or another
TP/PP. At the end each rank writes its pieces of the trained weights, cut back through the
table, in the family's training names (``checkpoints/trained``, one DCP checkpoint as the FSDP2
loop's: :mod:`mmcore.backends.megatron.trained`), which export reads as it reads any other.

With ``training.lora`` the adapters sit on the language model's layer linears (all, or those
``target_modules`` picks: :func:`lora_kinds`; :mod:`mmcore.backends.megatron.lora`, split over TP as
their base), the rest frozen; the trained
checkpoint holds them merged into the base, ``checkpoints/adapter`` in PEFT's format.

With ``parallel.virtual_pipeline`` = V a rank holds V model chunks (``build`` once per chunk),
chunk v of stage s the (v x PP + s)-th run of layers, run by Megatron's interleaved schedule;
the chunks' checkpoint keys are the layers' global ones, so a run resumes at any V.

Held-out evaluation (``training.eval_every``) runs the family's ``score`` forward only through
the same schedule, each data-parallel replica its share of the samples. Sequence parallelism
is the family's model's (:mod:`mmcore.backends.megatron.gpt`); the loop sums the gradients it leaves
partial (:func:`mmcore.backends.megatron.train.reduce_gradients`). Context parallelism
(``parallel.context_parallel``) is too: the family's model cuts each sequence into this rank's
chunks (:func:`mmcore.backends.megatron.context.to_context_rank`), the layer spec gathers keys and
values for attention (:mod:`mmcore.backends.megatron.context`), the loss cuts the shifted labels
alike, and the loop sums loss and gradients over the data-parallel x context-parallel group.

``training.precision: bf16`` (and ``auto`` on an accelerator with bf16) is the FSDP2 loop's
policy: bf16 compute, fp32 weights, gradient sums and optimizer state
(:class:`mmcore.backends.megatron.precision.Bf16Compute`: the model computes on bf16 copies of its
weights during a step and evaluation). Megatron's own bf16 path, its distributed optimizer,
needs CUDA: ``bench/gpu_megatron.py`` runs it beside this one.

``training.recompute`` wraps each transformer layer of the language model as the FSDP2 loop
wraps a recipe's blocks (:mod:`mmcore.train.recompute`: full, or selective keeping the matrix
multiplies' outputs).

``training.freeze`` picks the same training names as on FSDP2 (:func:`freeze_rank` maps them
to the Megatron parameters they make up). A frozen tower's features cached by the extract stage
are read as on FSDP2 (``MegatronFamily.use_cache``).

``training.lora`` trains adapters of :mod:`mmcore.backends.megatron.lora` on the layers' linears
(:func:`lora_kinds`), and ``modules_to_save`` whole (:func:`saved_modules`), written in PEFT's
format at the end (:func:`write_adapter`).

``training.ema`` keeps this rank's part of the moving average (:class:`mmcore.train.ema.MovingAverage`),
checkpointed sharded as the weights (it reshards on resume) and written at the end as they are
(with LoRA, the averaged adapters too: ``ema_adapter``, what export publishes beside the merged
average).

Not on this backend yet (each a one-line error): CPU offload, token-budget packing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

# the backend's parts, each in its module; their names stay importable from here (packs import
# them by this path: mmcore.sdk.SURFACE)
from mmcore.checkpoint.training import INCOMPLETE
from mmcore.backends.megatron.backend import MEGATRON_RNG, MegatronBackend, evaluate_held_out, save
from mmcore.backends.megatron.family import ADAPTER, RECOMPUTE_KEPT_OPS, TRAINED, Layout, MegatronFamily, MegatronPart, MegatronRecipe, MegatronTable
from mmcore.backends.megatron.weights import _by_layer, chosen_parameters, fill_rank, freeze_rank, load_rank, lora_kinds, rank_sources, saved_modules
from mmcore.backends.megatron.write import _write_gathered, gather_hub_state, write_adapter, write_trained

if TYPE_CHECKING:
    from mmcore.framework.context import StageContext
    from mmcore.framework.pack import StageResult
    from mmcore.run.rundir import Manifest
    from mmcore.train import TrainRecipe


def run_megatron_training(ctx: "StageContext", upstream: Mapping[str, "Manifest"], recipe: "TrainRecipe") -> "StageResult":
    """The train engine's loop on the megatron backend, whatever ``parallel.backend`` says."""
    from mmcore.train import run_training

    return run_training(ctx, upstream, recipe, backend=MegatronBackend())


__all__ = [
    "MegatronFamily",
    "MegatronRecipe",
    "MegatronPart",
    "MegatronTable",
    "MegatronBackend",
    "Layout",
    "TRAINED",
    "ADAPTER",
    "write_adapter",
    "run_megatron_training",
    "rank_sources",
    "load_rank",
    "fill_rank",
    "gather_hub_state",
    "write_trained",
    "RECOMPUTE_KEPT_OPS",
    "INCOMPLETE",
    "MEGATRON_RNG",
    "evaluate_held_out",
    "save",
    "freeze_rank",
    "chosen_parameters",
    "saved_modules",
    "lora_kinds",
    "_by_layer",
    "_write_gathered",
]
