"""What a family gives the megatron backend (:class:`MegatronFamily`) and where a process sits
in the TP x PP x DP grid (:class:`Layout`); the names every part of the backend shares.

The backend asks for its family through protocols of its own, so that the generic contracts
(:class:`mmcore.train.TrainRecipe`, the kits' family declarations) carry no field of one backend:

* :class:`MegatronRecipe`: a train recipe that also runs on ``parallel.backend: megatron``
  (``megatron_family(ctx, upstream)``); :mod:`mmcore.backends.megatron.backend` checks
  ``isinstance(recipe, MegatronRecipe)`` and refuses, in one line, a recipe that is not one.
* :class:`MegatronPart`: a model family (a kit's declaration, e.g. a subclass of
  :class:`~mmcore.kits.vlm.VLMFamily`) that has a megatron-core side
  (``megatron_part(model_dir)``); the kit's recipe of such a family is a :class:`MegatronRecipe`.
* :class:`MegatronTable`: a model family with a Megatron table (``megatron_table(model_dir)``),
  for ``export.format: mindspeed-mm``.

All three are structural (:class:`typing.Protocol`, ``runtime_checkable``): a class implements
one by defining its method, without importing or subclassing it. SDK 1.x's ways, deprecated
until SDK 2.0, still work: ``TrainRecipe(megatron=...)`` makes a :class:`MegatronRecipe`;
``VLMFamily(megatron=..., parallel_map=...)`` stands for :class:`MegatronPart` and
:class:`MegatronTable`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from mmcore.engines.state_dict import StateDictAdapter
    from mmcore.framework.context import StageContext
    from mmcore.backends.megatron.tensor_map import ParallelMap
    from mmcore.run.rundir import Manifest

#: what ``training.recompute: selective`` keeps of a megatron-core layer: the linears' outputs; the
#: attention scores and probabilities are recomputed (Megatron's own selective recompute, of
#: the core attention; its local attention also masks the scores in place, which a kept output
#: must not be)
RECOMPUTE_KEPT_OPS = ("mm", "addmm")
TRAINED = "trained"  # checkpoints/trained: the final weights in the family's training names
ADAPTER = "adapter"  # checkpoints/adapter: with training.lora, the adapters in PEFT's format


def _next_token_loss(logits: Any, batch: dict[str, Any]) -> Any:
    from mmcore.train.causal_lm import next_token_loss_sum

    return next_token_loss_sum(logits, batch["labels"])


@dataclass
class MegatronFamily:
    """What a family gives the megatron backend (its pack's ``megatron.py``), through
    :meth:`MegatronRecipe.megatron_family`.

    Attributes:
        build: ``(layout) -> module``: this rank's part of the model (:class:`Layout`: its TP
            size, pipeline stage and virtual-stage chunk, whether sequence-parallel),
            uninitialised (the engine loads it). Its megatron-core ``GPTModel`` is the
            attribute ``decoder``; on the first (virtual) stage, the modules of ``whole`` are too. It
            follows Megatron's schedule protocol (``config``, ``set_input_tensor``) and returns
            the logits on the last stage.
        parallel_map: the family's table (hub names <-> Megatron names, how each is split).
        adapter: the family's state-dict adapter (hub names <-> training names), to read
            convert's checkpoint and to write the trained one.
        inputs: the batch fields ``build``'s module takes (``labels`` go to ``loss_sum``).
        decoder: the attribute holding the ``GPTModel``; ``decoder_prefix`` its tensors'
            prefix in the table (``"text_decoder."``).
        whole: hub name prefix -> attribute of a module every tensor-parallel rank of the first
            stage holds whole, as transformers has it (a vision tower: ``{"visual.": "visual"}``).
        loss_sum: ``(logits, batch) -> summed loss`` of a micro-batch on the last stage
            (default: next-token cross-entropy over ``batch["labels"]``).
        score: ``(logits, batch) -> {name: (numerator, denominator)}`` of a held-out micro-batch
            on the last stage (``accuracy``: (rows right, rows)); with ``held_out``, logged as
            ``eval/<name>`` = sum of numerators / sum of denominators at step 0, every
            ``training.eval_every`` steps and at the end, as the FSDP2 loop's evaluation.
            ``score_names``: the names it gives (every rank needs them, the last stage alone
            computes them).
        held_out: the held-out samples (``len`` and indexing; the kit's ``eval`` split);
            ``collate_one`` makes one sample a micro-batch.
        use_cache: ``(first chunk of the first stage) -> None``: switch its frozen towers to the
            extract stage's cached features (what the FSDP2 recipe's model gets with a finished
            extract stage; the samples then carry the features). None: the feature cache is refused.
        context_parallel: ``build``'s module takes ``parallel.context_parallel`` > 1: it pads
            each sequence to :func:`mmcore.backends.megatron.context.context_multiple`, hands the
            decoder this rank's chunks of its input and rotary positions
            (:func:`~mmcore.backends.megatron.context.to_context_rank`) and returns the logits of
            those tokens. False: the backend refuses context parallelism for the family.
    """

    build: Callable[["Layout"], Any]
    parallel_map: "ParallelMap"
    adapter: "StateDictAdapter"
    inputs: Sequence[str]
    decoder: str = "language_model"
    decoder_prefix: str = "text_decoder."
    whole: Mapping[str, str] = field(default_factory=dict)
    loss_sum: Callable[[Any, dict[str, Any]], Any] = _next_token_loss
    score: Callable[[Any, dict[str, Any]], Mapping[str, tuple[float, float]]] | None = None
    score_names: Sequence[str] = ()
    held_out: Any = None
    collate_one: Callable[[Any], dict[str, Any]] | None = None
    use_cache: Callable[[Any], None] | None = None
    context_parallel: bool = False


@dataclass(frozen=True)
class Layout:
    """Where this process sits: tensor-parallel rank, pipeline stage, data-parallel rank (and
    context-parallel rank: ``cp`` processes share each sample's sequence); whether
    the sequence is split over the tensor-parallel ranks between their layers; how many model
    chunks a pipeline rank holds (``virtual``: the interleaved schedule) and which of them a
    module is (``chunk``: what ``MegatronFamily.build`` builds)."""

    tp: int
    pp: int
    dp: int
    tp_rank: int
    stage: int
    dp_rank: int
    sequence_parallel: bool = False
    virtual: int = 1
    chunk: int = 0
    cp: int = 1
    cp_rank: int = 0

    @classmethod
    def current(cls, sequence_parallel: bool = False, virtual: int = 1) -> "Layout":
        from megatron.core import parallel_state as ps

        return cls(
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_data_parallel_world_size(),
            ps.get_tensor_model_parallel_rank(),
            ps.get_pipeline_model_parallel_rank(),
            ps.get_data_parallel_rank(),
            sequence_parallel,
            virtual,
            cp=ps.get_context_parallel_world_size(),
            cp_rank=ps.get_context_parallel_rank(),
        )

    @property
    def first_replica(self) -> bool:
        """Whether this rank's weights are the ones written: data-parallel replica 0, and within it
        context-parallel rank 0 (the ranks of a context-parallel group hold the same weights)."""
        return self.dp_rank == 0 and self.cp_rank == 0

    def of_chunk(self, chunk: int) -> "Layout":
        return dataclasses.replace(self, chunk=chunk)

    @property
    def virtual_stage(self) -> int:
        """This chunk's place among the PP x V runs of layers (Megatron's interleaved order)."""
        return self.chunk * self.pp + self.stage

    @property
    def rng_stream(self) -> int:
        """Which random stream this rank draws from: one per data-parallel replica and pipeline
        stage, shared by the tensor-parallel ranks (a LoRA dropout mask over an input every TP
        rank holds must be the same on each: :mod:`mmcore.backends.megatron.lora`)."""
        return self.dp_rank + self.dp * self.stage

    def describe(self) -> str:
        cp = f" x CP={self.cp}" if self.cp > 1 else ""
        return f"TP={self.tp}{' (sequence-parallel)' if self.sequence_parallel else ''} x PP={self.pp}{f' (x {self.virtual} virtual, interleaved)' if self.virtual > 1 else ''}{cp} x DP={self.dp}"


# --------------------------------------------------------------------------- the protocols


@runtime_checkable
class MegatronRecipe(Protocol):
    """A train recipe (:class:`mmcore.train.TrainRecipe`) that also runs on
    ``parallel.backend: megatron``: what :mod:`mmcore.backends.megatron.backend` asks of it besides the
    recipe's generic parts (it reads ``weights``, ``freeze_groups``, ``flops`` and
    ``build_model`` for the FLOPs as the FSDP2 backend does; ``collate`` and the sampler are the
    loop's). The VLM kit's recipe is one where its family is a :class:`MegatronPart`."""

    def megatron_family(self, ctx: "StageContext", upstream: Mapping[str, "Manifest"]) -> MegatronFamily:
        """The family on megatron-core for this run, called once per process at the backend's setup.

        :param ctx: The train stage's context: the validated config (``parallel``: TP, PP,
            virtual stages, sequence parallelism; ``training``), the process's place in the
            world, the accelerator, the stage directory.
        :param upstream: The finished manifests of the earlier stages, by stage name:
            ``download``'s ``model`` folder (the config and tokenizer the family is built
            from), ``preprocess``'s ``dataset``, ``extract``'s ``features`` where that stage ran
            (the backend then calls :attr:`MegatronFamily.use_cache`, refusing a family without it).
        :return: A :class:`MegatronFamily`; with ``score``, ``held_out`` and ``collate_one`` its
            held-out figures are logged as ``eval/<name>`` (at step 0, every
            ``training.eval_every`` steps and at the end).
        """
        ...


@runtime_checkable
class MegatronPart(Protocol):
    """A model family's megatron-core side, declared where the family is (a method of a kit
    family's subclass: ``Qwen2VLFamily.megatron_part`` in ``packs/vlm/qwen2vl``). A kit turns it
    into its recipe's :meth:`MegatronRecipe.megatron_family`, adding the run's held-out samples."""

    def megatron_part(self, model_dir: Path) -> MegatronFamily:
        """The family on megatron-core of one checkpoint.

        :param model_dir: A checkpoint folder of the family in the hub's layout (``config.json``,
            tokenizer): the download stage's ``model``. Read its config; the weights are loaded
            by the backend from convert's checkpoint through :attr:`MegatronFamily.parallel_map`.
        :return: A :class:`MegatronFamily` without ``held_out`` and ``collate_one`` (the kit's
            recipe sets them from the run's data).
        """
        ...


@runtime_checkable
class MegatronTable(Protocol):
    """A model family with a Megatron table (:class:`mmcore.backends.megatron.tensor_map.ParallelMap`: hub names
    <-> Megatron names, how each tensor is split): what ``export.format: mindspeed-mm`` writes
    MindSpeed-MM's layout with (:func:`mmcore.backends.megatron.mindspeed_mm.export_mindspeed`)."""

    def megatron_table(self, model_dir: Path) -> "ParallelMap":
        """The table of one checkpoint.

        :param model_dir: A checkpoint folder of the family in the hub's layout: the download
            stage's ``model``, or the export's ``from_pretrained`` folder (its ``config.json``
            gives the layer counts and sizes the table is written for).
        :return: The family's :class:`~mmcore.backends.megatron.tensor_map.ParallelMap` for that config.
        """
        ...


__all__ = ["MegatronFamily", "MegatronRecipe", "MegatronPart", "MegatronTable", "Layout", "TRAINED", "ADAPTER", "RECOMPUTE_KEPT_OPS"]
