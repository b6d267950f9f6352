"""The contract between the mmcore core and its plugins and packs.

Every hook is prefixed ``mmcore_``. An implementation may accept any subset of a hook's
parameters, by name (pluggy matches them by name). Mark implementations with
:data:`mmcore.hookimpl`; a function named ``mmcore_*`` on a pack is treated as an
implementation even unmarked, so a misspelled hook name is an error, not silently ignored.

Three kinds of hooks:

* **Stage hooks** (``mmcore_download`` ... ``mmcore_evaluate``, and ``mmcore_infer``) are called only on the pack the
  user chose, plus any plugin that implements them with ``wrapper=True`` (timing, profiling).
  They are ``firstresult``: the pack's result is the stage's result. A pack usually declares
  its stages in ``PackSpec.stages`` instead of implementing these (:mod:`mmcore.framework.stages` turns
  the declarations into these hooks). Either way the result is checked when the stage ends:
  a :class:`~mmcore.framework.pack.StageResult` (or None to decline) recording the outputs
  :data:`mmcore.framework.pack.STAGE_OUTPUTS` names for the stage, which later stages and engines read.
* **Registration hooks** hand the plugin a ``register`` callback, called once per thing
  provided (accelerators, kernels, distributed backends, CLI commands).
* **Observer hooks** see every stage of every pack without the pack knowing about them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

import pluggy

if TYPE_CHECKING:  # imported for annotations only; keeps `import mmcore` light
    import click

    from mmcore.framework.accelerator import Accelerator
    from mmcore.framework.context import StageContext
    from mmcore.engines.generation import ModelSource, Request
    from mmcore.framework.pack import StageResult
    from mmcore.framework.registry import BackendSpec, KernelSpec, RewardSpec
    from mmcore.run.rundir import Manifest

hookspec = pluggy.HookspecMarker("mmcore")


# --------------------------------------------------------------------------- stage hooks
# Returning None declines the stage for this run (``mmcore run`` prints it as skipped);
# not implementing the hook at all means the pack has no such stage.


@hookspec(firstresult=True)
def mmcore_download(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    """Fetch or build the model checkpoint (and its tokenizer/processor files).

    :param ctx: The stage's context: pack, run and stage directory, the validated config,
        the accelerator, the process's place in the world, the seed, the offline flag, and
        whether to resume work left unfinished. Record every file read as input with
        ``ctx.record_input(path)`` so that a changed input reruns the stage.
    :param upstream: The finished manifests of the earlier stages, by stage name (empty for
        ``download``). Never contains an unfinished stage.
    :return: What the stage produced, with output ``model`` (:data:`mmcore.framework.pack.MODEL`): the
        checkpoint folder. Or None to decline.
    """


@hookspec(firstresult=True)
def mmcore_convert(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    """Convert the downloaded checkpoint into the training backend's layout.

    :param ctx: See :func:`mmcore_download`.
    :param upstream: Finished manifests of earlier stages; ``upstream["download"]`` holds
        the checkpoint's location in its outputs.
    :return: What the stage produced, with output ``checkpoint`` (:data:`mmcore.framework.pack.CHECKPOINT`):
        a DCP checkpoint of the training model, keys ``"model." + fqn``. Or None to decline.
    """


@hookspec(firstresult=True)
def mmcore_preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    """Turn the user's raw datasets into the pack's on-disk training format.

    :param ctx: See :func:`mmcore_download`. Bad samples follow
        ``ctx.config.data.on_bad_sample`` (``error`` or ``skip``).
    :param upstream: Finished manifests of earlier stages.
    :return: What the stage produced, with output ``dataset`` (:data:`mmcore.framework.pack.DATASET`):
        the shard folder. Or None to decline.
    """


@hookspec(firstresult=True)
def mmcore_extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    """Run frozen encoders (VAE, text/vision/audio encoder) once and cache their outputs.

    :param ctx: See :func:`mmcore_download`.
    :param upstream: Finished manifests of earlier stages.
    :return: What the stage produced, with output ``features`` (:data:`mmcore.framework.pack.FEATURES`):
        the feature-cache folder. Or None to decline (most VLM packs do, unless an encoder is
        frozen).
    """


@hookspec(firstresult=True)
def mmcore_train(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    """Train. May run on several processes; ``ctx.world`` tells this process's rank.

    :param ctx: See :func:`mmcore_download`. ``ctx.resume`` is True when the stage was
        interrupted before with the same inputs and config: continue from the last checkpoint.
    :param upstream: Finished manifests of earlier stages.
    :return: What the stage produced (on every rank; the core writes the manifest on rank 0),
        with output ``checkpoint`` (:data:`mmcore.framework.pack.CHECKPOINT`): the last training checkpoint.
    """


@hookspec(firstresult=True)
def mmcore_export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    """Write the trained model back in the layout the ecosystem loads (transformers/diffusers/PEFT).

    :param ctx: See :func:`mmcore_download`.
    :param upstream: Finished manifests of earlier stages.
    :return: What the stage produced, with output ``model`` (:data:`mmcore.framework.pack.MODEL`): the
        folder the ecosystem loads. Or None to decline.
    """


@hookspec(firstresult=True)
def mmcore_evaluate(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    """Measure the exported model on held-out data, by generating as a user would.

    :param ctx: See :func:`mmcore_download`. ``ctx.config.evaluate`` says which data (the
        preprocess stage's held-out split, or ``evaluate.datasets``) and how many items;
        ``ctx.config.generation`` how to generate (greedy unless it says otherwise).
    :param upstream: Finished manifests of earlier stages; ``upstream["export"]`` holds the
        model to measure.
    :return: What the stage produced, with output ``results`` (:data:`mmcore.framework.pack.RESULTS`):
        per-item results, one JSON object per line; its metrics (accuracy, WER, ...) also go
        to ``metrics.json`` in the stage directory. Or None to decline.
    """


@hookspec(firstresult=True)
def mmcore_infer(ctx: StageContext, upstream: Mapping[str, Manifest], model: ModelSource, requests: list[Request]) -> list[dict[str, Any]] | None:
    """Answer requests with a trained model (``mmcore infer``): on request, outside the pipeline.

    :param ctx: A context for the ``infer`` command: ``ctx.stage_dir`` is where files it
        makes go (videos, images), ``ctx.config.generation`` the generation options the user
        gave (flags or config).
    :param upstream: Finished manifests of the run's stages (``download``, ``preprocess``,
        ``train``, ``export``, ... as far as they got).
    :param model: Which weights to use: the train stage's latest checkpoint, the export, or
        a folder in the ecosystem's layout (:class:`mmcore.engines.generation.ModelSource`).
    :param requests: The requests, media already checked to exist (:class:`mmcore.engines.generation.Request`).
    :return: One dict per request, in order: ``{"text": ...}`` for an answer or transcript,
        ``{"video": path, "contact_sheet": path}`` for a generated video, or
        ``{"error": "one line"}`` for a request that could not be answered (the rest still run).
    """


STAGE_HOOKS = {
    "download": "mmcore_download",
    "convert": "mmcore_convert",
    "preprocess": "mmcore_preprocess",
    "extract": "mmcore_extract",
    "train": "mmcore_train",
    "export": "mmcore_export",
    "evaluate": "mmcore_evaluate",
    "infer": "mmcore_infer",
}


# ---------------------------------------------------------------------- registration hooks


@hookspec
def mmcore_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    """Provide accelerators (``cpu``, ``cuda``, ``npu``, ...).

    :param register: Call with an :class:`mmcore.framework.accelerator.Accelerator` instance. Its
        ``name`` must be unique. Do not import the device library here: the accelerator
        imports it in its own methods, only when selected or probed.
    """


@hookspec
def mmcore_register_kernels(register: Callable[[KernelSpec], None]) -> None:
    """Provide kernels: one reference implementation per kernel name, plus device-specific ones.

    :param register: Call with a :class:`mmcore.framework.registry.KernelSpec`. Implementations are
        given as ``"module:attr"`` strings and imported only when the kernel is used, so a
        device library (``torch_npu``) is never imported where it is absent.
    """


@hookspec
def mmcore_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Provide distributed training backends (``fsdp2``, ``megatron``, ...).

    :param register: Call with a :class:`mmcore.framework.registry.BackendSpec`; its factory makes a
        :class:`mmcore.backends.protocol.Backend` (what the train loop calls, and when).
    """


@hookspec
def mmcore_register_rewards(register: Callable[[RewardSpec], None]) -> None:
    """Provide reward functions for online RL (``training.method: grpo``), used by name in
    ``training.grpo.rewards: {name: weight}``: a team ships its verifier as a small package.

    :param register: Call with a :class:`mmcore.framework.registry.RewardSpec`: a unique
        ``name`` and ``impl``, the ``"module:attr"`` of
        ``fn(completions: list[str], references: list[str | None], prompts: list[str]) -> list[float]``
        (keyword arguments; one finite float per completion). It is imported only when a run
        names it, and runs on every process for that process's answers; an exception it raises
        stops the run with a one-line error naming the reward.
    """


@hookspec
def mmcore_register_commands(register: Callable[[click.Command], None]) -> None:
    """Add sub-commands to the ``mmcore`` CLI (e.g. ``mmcore env``).

    :param register: Call with a :class:`click.Command`; its name must not clash with a
        built-in command.
    """


# -------------------------------------------------------------------------- observer hooks


@hookspec
def mmcore_stage_started(ctx: StageContext) -> None:
    """A stage is about to run (called on every process).

    :param ctx: The stage's context.
    """


@hookspec
def mmcore_stage_finished(ctx: StageContext, manifest: Manifest | None, error: BaseException | None) -> None:
    """A stage ended (called on every process).

    :param ctx: The stage's context.
    :param manifest: The finished manifest, or None when the stage failed or declined.
    :param error: The exception the stage raised, or None.
    """


@hookspec
def mmcore_stage_skipped(pack: str, stage: str, run_dir: str, reason: str) -> None:
    """A stage was not run: declined by the pack, absent, or already up to date.

    :param pack: The pack's name.
    :param stage: The stage's name.
    :param run_dir: The run directory.
    :param reason: Why, in words (shown to the user as well).
    """


@hookspec
def mmcore_log_metrics(ctx: StageContext, step: int, metrics: Mapping[str, Any], wall_time: float) -> None:
    """Metrics from a stage (train loss, lr, grad-norm, throughput...), on the main process.

    Metric sinks (JSONL, TensorBoard, ...) implement this; stages call it through
    ``ctx.log_metrics(step, metrics)``. The train loop hands its rows over in bursts, at most a
    second apart and before each checkpoint (:mod:`mmcore.train.metric_log`), so a row may
    arrive after later steps ran: take its time from ``wall_time``, not the clock.

    :param ctx: The stage's context.
    :param step: The step the metrics belong to (optimizer steps for training).
    :param metrics: Name -> number.
    :param wall_time: When the metrics were measured, in seconds since the epoch
        (``time.time()``). Since SDK 1.29; an implementation may leave it out of its signature.
    """


@hookspec
def mmcore_metrics_resumed(ctx: StageContext, step: int) -> None:
    """A stage resumed from its checkpoint of step ``step`` (main process only): a metric sink
    drops what it logged after that step in an earlier, interrupted attempt (those steps run and
    are logged again), so every step is recorded once.

    Stages call it through ``ctx.resumed_metrics_at(step)``.

    :param ctx: The stage's context.
    :param step: The step of the checkpoint the stage resumed from; metrics of later steps are
        void.
    """
