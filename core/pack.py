"""What a pack declares about itself, and what a stage hands back to the core.

Both are plain dataclasses so that reading them never imports torch: ``mmcore list``
and ``mmcore info`` load every pack's entry point to read its :class:`PackSpec`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

#: The pipeline, in order. Every run directory has one sub-directory per stage.
STAGES: tuple[str, ...] = ("download", "convert", "preprocess", "extract", "train", "export")

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
}

_PACK_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")


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
        requires_torch_npu: Informational, for ``mmcore doctor``.
    """

    name: str
    category: str = "other"
    summary: str = ""
    config_class: str = "mmcore.config:RunConfig"
    presets: Mapping[str, Any] = field(default_factory=dict)
    default_preset: str | None = None
    distributed_stages: tuple[str, ...] = ("train",)
    stage_sections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
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
