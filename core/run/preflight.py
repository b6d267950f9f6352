"""The parallel layout, checked by the launching process before the first stage runs: a layout
that cannot work is one ``error:`` line (exit 2) before download, convert and preprocess spend
their time, instead of an error per rank at train.

What is checked without the model: the backend's options against each other and the number of
processes, and whether the pack runs on megatron-core at all. With the model's ``config.json``
at hand (a local ``model.source``, this run's finished download, or the tiny config an
``init:<preset>`` builds), also the layout against the language model: tensor-parallel ranks
dividing the attention and key-value heads, pipeline stages no more than the layers. The train
stage still checks all of it (a run started another way).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

from mmcore.errors import ConfigError


def megatron_layout_problem(parallel: Any, training: Any, world_size: int) -> str | None:
    """What makes ``parallel`` unusable on megatron-core over ``world_size`` processes, whatever the model."""
    tp, pp = parallel.tensor_parallel, parallel.pipeline_parallel
    if training.optimizer == "adafactor":  # its row and column moments: megatron's checkpoint shards state shaped as the parameter
        return "training.optimizer: adafactor does not run on parallel.backend: megatron (its checkpoint shards optimizer state shaped like the parameters); use adamw or sgd"
    cp = parallel.context_parallel
    if world_size % (tp * pp * cp):
        cps = f" x parallel.context_parallel={cp}" if cp > 1 else ""
        return f"parallel.tensor_parallel={tp} x parallel.pipeline_parallel={pp}{cps} does not divide the {world_size} process(es) (--nproc-per-node x nodes)"
    if parallel.sequence_parallel and tp == 1:
        return "parallel.sequence_parallel splits the sequence over the tensor-parallel ranks: set parallel.tensor_parallel > 1 too"
    if parallel.virtual_pipeline > 1 and pp == 1:
        return "parallel.virtual_pipeline interleaves model chunks over pipeline stages: set parallel.pipeline_parallel > 1 too"
    if parallel.virtual_pipeline > 1 and training.grad_accum_steps < pp:
        return f"parallel.virtual_pipeline: the interleaved schedule needs at least parallel.pipeline_parallel={pp} micro-batches a step; training.grad_accum_steps is {training.grad_accum_steps}"
    return None


def model_layout_problem(parallel: Any, model_config: Mapping[str, Any], where: str) -> str | None:
    """What makes ``parallel`` unusable for the language model of ``model_config`` (a
    ``config.json``; its ``text_config`` where it has one), read from ``where``."""
    text = model_config.get("text_config") or model_config.get("llm_config") or model_config
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    groups = text.get("num_key_value_heads") or heads
    tp, pp, virtual = parallel.tensor_parallel, parallel.pipeline_parallel, parallel.virtual_pipeline
    for count, what in ((heads, "attention heads"), (groups, "key-value heads")):
        if isinstance(count, int) and count % tp:
            return f"parallel.tensor_parallel={tp} does not divide the model's {count} {what} ({where})"
    if isinstance(layers, int) and pp * virtual > layers:
        chunks = f"parallel.pipeline_parallel={pp}" + (f" x parallel.virtual_pipeline={virtual}" if virtual > 1 else "")
        return f"{chunks} is more pipeline stages than the model's {layers} layers ({where})"
    if isinstance(layers, int) and virtual > 1 and layers % (pp * virtual):
        return f"parallel.virtual_pipeline={virtual} x parallel.pipeline_parallel={pp} does not divide the model's {layers} layers (the interleaved schedule places equal runs of layers; {where})"
    return None


def check_layout(plugins: Any, pack: str, config: Any, run_dir: Path) -> None:
    """Refuse, as one :class:`ConfigError`, a layout the train stage would refuse (see the module)."""
    parallel = config.parallel
    if config.training.optimizer == "adafactor" and config.world_size > 1 and parallel.backend != "megatron":
        from mmcore.train.optim import ADAFACTOR_UNSHARDED

        raise ConfigError(f"training.optimizer: {ADAFACTOR_UNSHARDED}")
    split = parallel.tensor_parallel > 1 or parallel.pipeline_parallel > 1 or parallel.sequence_parallel or parallel.virtual_pipeline > 1 or parallel.context_parallel > 1
    if parallel.backend != "megatron":
        if split:
            raise ConfigError(
                f"parallel.tensor_parallel / pipeline_parallel / sequence_parallel / virtual_pipeline / context_parallel split the model on parallel.backend: megatron; this run's backend is {parallel.backend}"
                + (" (for sequences split over processes there: parallel.ulysses)" if parallel.context_parallel > 1 else "")
            )
        return
    spec = plugins.pack(pack).spec
    if spec is None or "train" not in plugins.implemented_stages(pack):
        return
    from mmcore.backends import megatron

    usable, why = megatron.status()
    if not usable:
        raise ConfigError(f"parallel.backend: megatron: {why}")
    if not _runs_on_megatron(spec):
        raise ConfigError(f"parallel.backend: megatron: the {pack} pack does not run on megatron-core (use parallel.backend: fsdp2)")
    problem = megatron_layout_problem(parallel, config.training, config.world_size)
    if problem is None and split:
        found = _model_config(spec, config, run_dir)
        problem = model_layout_problem(parallel, *found) if found is not None else None
    if problem:
        raise ConfigError(problem)


def _runs_on_megatron(spec: Any) -> bool:
    """False only where the declaration says so: a train stage bound to a kit family (mmcore's
    kits) that has no megatron part. A pack's own recipe may set one: then the train stage tells."""
    from mmcore.framework.pack import Stage
    from mmcore.framework.registry import import_object

    declared = spec.stages.get("train") if spec.stages else None
    recipe = declared.parts.get("recipe") if isinstance(declared, Stage) else None
    if not recipe or ":" not in recipe or "." not in recipe.split(":", 1)[1]:
        return True
    module, attribute = recipe.split(":", 1)
    try:
        owner = import_object(f"{module}:{attribute.rsplit('.', 1)[0]}")
    except Exception:  # the train stage names what does not import
        return True
    if not any(cls.__module__.startswith("mmcore.kits.") for cls in type(owner).__mro__):
        return True  # not a kit family: the train stage tells
    from mmcore.backends.megatron.family import MegatronPart

    return isinstance(owner, MegatronPart) or getattr(owner, "megatron", None) is not None  # SDK 1.x's field, until 2.0


def _model_config(spec: Any, config: Any, run_dir: Path) -> tuple[dict[str, Any], str] | None:
    """The model's ``config.json`` and where it came from, where one is at hand before download."""
    from mmcore.run.rundir import RunDir

    downloaded = RunDir(run_dir).read_manifest("download") if (Path(run_dir) / "download").is_dir() else None
    candidates = []
    if downloaded is not None and downloaded.status == "finished" and "model" in downloaded.outputs:
        candidates.append(downloaded.output("model") / "config.json")
    source = config.model.source or ""
    if source and not source.startswith("init:"):
        candidates.append(Path(source).expanduser() / "config.json")
    for path in candidates:
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8")), str(path)
            except (OSError, ValueError):
                return None  # download or convert says what is wrong with it
    if source.startswith("init:"):
        return _init_config(spec, source[len("init:") :], config.run.seed)
    return None


def _init_config(spec: Any, preset: str, seed: int) -> tuple[dict[str, Any], str] | None:
    """The config an ``init:<preset>`` download would write: the pack's builder, into a scratch
    folder (init presets are tiny random models, built in seconds)."""
    from mmcore.framework.pack import Stage
    from mmcore.framework.registry import import_object

    declared = spec.stages.get("download") if spec.stages else None
    path = declared.parts.get("build_init") if isinstance(declared, Stage) else None
    if not path:
        return None
    try:
        build = import_object(path)
        with tempfile.TemporaryDirectory(prefix="mmcore-preflight-") as scratch:
            build(preset, Path(scratch), seed)
            return json.loads((Path(scratch) / "config.json").read_text(encoding="utf-8")), f"init:{preset}"
    except Exception:  # an unknown preset, a builder that fails: the download stage says so
        return None


__all__ = ["check_layout", "megatron_layout_problem", "model_layout_problem"]
