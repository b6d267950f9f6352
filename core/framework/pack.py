"""What a pack declares about itself, and what a stage hands back to the core.

Both are plain dataclasses so that reading them never imports torch: ``mmcore list``
and ``mmcore info`` load every pack's entry point to read its :class:`PackSpec`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

#: The pipeline, in order. Every run directory has one sub-directory per stage.
STAGES: tuple[str, ...] = ("download", "convert", "preprocess", "extract", "train", "export", "evaluate")

#: What a pack may declare besides the pipeline's stages: run on request (``mmcore infer``),
#: never by ``mmcore run``, and leaving no manifest.
ON_DEMAND: tuple[str, ...] = ("infer",)

#: Stages a pack may run on several processes (through torchrun) when the config asks for it.
DISTRIBUTABLE_STAGES: frozenset[str] = frozenset({"preprocess", "extract", "train"})

CATEGORIES: tuple[str, ...] = ("vlm", "generative", "audio", "omni", "other")

#: Config sections each stage reads by default. They make up the "config slice" recorded
#: in the stage's manifest; a change to it makes the stage (and everything after) run again.
DEFAULT_STAGE_SECTIONS: Mapping[str, tuple[str, ...]] = {
    "download": ("model",),
    "convert": ("convert",),
    "preprocess": ("data",),
    "extract": ("extract",),
    "train": ("training", "parallel"),
    "export": ("export",),
    "evaluate": ("evaluate", "generation"),
    "infer": ("generation",),
}

#: The outputs each stage must record (``StageResult.outputs``), by the names the engines and
#: later stages read. Checked when a stage finishes: a finished stage without them fails there,
#: naming the pack and this rule. A stage may record more outputs than these.
MODEL = "model"  # download: the checkpoint folder; export: the folder the ecosystem loads
CHECKPOINT = "checkpoint"  # convert and train: a DCP checkpoint of the training model
DATASET = "dataset"  # preprocess: the shard folder (mmcore.data.shards)
FEATURES = "features"  # extract: the feature cache folder (mmcore.data.feature_cache)
RESULTS = "results"  # evaluate: the per-sample results (JSONL, one object per held-out item)
STAGE_OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "download": (MODEL,),
    "convert": (CHECKPOINT,),
    "preprocess": (DATASET,),
    "extract": (FEATURES,),
    "train": (CHECKPOINT,),
    "export": (MODEL,),
    "evaluate": (RESULTS,),
}

_PACK_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class Stage:
    """A declared stage: the function that runs it, and the parts of the pack it is bound to.

    The core calls ``function(ctx, upstream, **parts, **options)`` where ``ctx`` is the
    :class:`~mmcore.framework.context.StageContext`, ``upstream`` the finished manifests of the earlier
    stages by name, each part the object its ``"module:attr"`` names (imported only when the
    stage runs, so declaring a stage never imports torch) and each option a literal. The
    function returns a :class:`StageResult`, or None to decline the stage for this config.

    Attributes:
        function: ``"module:attr"`` of the stage function: the pack's own, or an engine's
            (``"mmcore.train.loop:train_stage"``) bound to the pack's parts.
        parts: Keyword name -> ``"module:attr"`` of a pack object the function needs
            (``{"recipe": "mm_pack_x.model:recipe"}``).
        options: Keyword name -> literal value (``{"subfolder": "transformer"}``).
    """

    function: str
    parts: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def problems(self) -> list[str]:
        bad = [path for path in (self.function, *self.parts.values()) if not isinstance(path, str) or not _IMPORT_PATH.match(path)]
        return [f"{path!r} is not a 'module:attr' import path" for path in bad]


@dataclass(frozen=True)
class PackSpec:
    """A pack's declaration: exposed as the attribute ``PACK`` of its entry-point object.

    Attributes:
        name: The pack name users type (``--pack qwen2vl``). Must equal the entry-point name.
        category: One of ``vlm``, ``generative``, ``audio``, ``omni``, ``other``.
        summary: One line for ``mmcore list``.
        config_class: ``"module:Class"`` of the pack's config, a subclass of
            :class:`mmcore.config.RunConfig`. Imported lazily (only to validate a config).
        presets: Preset name -> path of a YAML file, relative to the pack's package
            (``"presets/demo.yaml"``), or an inline mapping.
        default_preset: Preset used when neither ``--preset`` nor ``--config`` is given.
        distributed_stages: Stages this pack can run on several processes.
        stage_sections: Per-stage override of :data:`DEFAULT_STAGE_SECTIONS`: section names
            or dotted field paths (``("extract", "training.freeze")``).
        stages: Stage name -> :class:`Stage` (or its function's ``"module:attr"`` alone):
            the stages the pack runs, declared as data. A pack may instead (or also, for
            other stages) implement the ``mmcore_<stage>`` hooks itself; one stage cannot be
            both. ``infer`` (``mmcore infer``, on request, outside the pipeline) goes in the
            same table.
        sdk: The mmcore SDK version the pack was written against (``"1.0"``); see
            :mod:`mmcore.sdk`. A pack whose SDK major differs from the core's, or whose minor
            is newer, is listed as broken with the reason.
    """

    name: str
    category: str = "other"
    summary: str = ""
    config_class: str = "mmcore.config:RunConfig"
    presets: Mapping[str, Any] = field(default_factory=dict)
    default_preset: str | None = None
    distributed_stages: tuple[str, ...] = ("train",)
    stage_sections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    stages: Mapping[str, "Stage | str"] = field(default_factory=dict)
    sdk: str = "1.0"

    def __post_init__(self) -> None:
        problems = []
        for stage, declared in self.stages.items():
            if stage not in STAGES and stage not in ON_DEMAND:
                problems.append(f"stages: {stage!r} is not a stage (stages: {', '.join(STAGES + ON_DEMAND)})")
            elif not isinstance(declared, (Stage, str)):
                problems.append(f"stages[{stage!r}] is a {type(declared).__name__}, not mmcore.Stage or 'module:attr'")
            else:
                problems += [f"stages[{stage!r}]: {p}" for p in self.declared(stage).problems()]
        if not _PACK_NAME.match(self.name):
            problems.append(f"name {self.name!r} must be lower-case letters, digits, '.', '_' or '-'")
        if self.category not in CATEGORIES:
            problems.append(f"category {self.category!r} is not one of {', '.join(CATEGORIES)}")
        bad_stages = set(self.distributed_stages) - DISTRIBUTABLE_STAGES
        if bad_stages:
            problems.append(f"distributed_stages {sorted(bad_stages)} cannot run distributed")
        if self.default_preset is not None and self.default_preset not in self.presets:
            problems.append(f"default_preset {self.default_preset!r} is not among the presets")
        if problems:
            raise ValueError("invalid PackSpec: " + "; ".join(problems))

    def sections_for(self, stage: str) -> tuple[str, ...]:
        return tuple(self.stage_sections.get(stage, DEFAULT_STAGE_SECTIONS[stage]))

    def declared(self, stage: str) -> Stage:
        """The declared stage ``stage`` as a :class:`Stage` (a bare import path is its function)."""
        value = self.stages[stage]
        return Stage(value) if isinstance(value, str) else value


@dataclass
class StageResult:
    """What a stage hook returns; the core turns it into the stage's ``manifest.json``.

    Attributes:
        outputs: Name -> path (relative to the stage directory, or absolute) of what the
            stage produced, e.g. ``{"checkpoint": "dcp"}``. The next stage finds them here.
        metrics: Small JSON-able figures worth keeping (samples kept/skipped, final loss, ...).
        notes: Free-form lines shown to the user when the stage finishes.
    """

    outputs: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
