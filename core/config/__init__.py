"""A run's configuration: typed sections (:mod:`~mmcore.config.sections`), the layers they are
read from (:mod:`~mmcore.config.layers`), checks across keys (:mod:`~mmcore.config.knobs`),
validation errors as one line each (:mod:`~mmcore.config.errors`) and the ``mmcore config``
reference (:mod:`~mmcore.config.reference`).

Every name of the SDK 1.x module ``mmcore.config`` is importable from here.
"""

from __future__ import annotations

from mmcore.config.layers import (
    COMMAND_LINE,
    LAUNCH_OPTIONS,
    MAX_DEPTH,
    PERMISSIONS,
    Layer,
    build_config,
    dump_config,
    nest,
    overrides_layer,
    parse_override,
    read_yaml,
    without_permissions,
)
from mmcore.config.sections import (
    MAX_STEPS,
    TRACKER_NAMES,
    ConvertSection,
    DataSection,
    DpoSection,
    GrpoSection,
    EvaluateSection,
    ExportSection,
    ExtractSection,
    GenerationSection,
    LoggingSection,
    LoraSection,
    MegatronConvertSection,
    MegatronExportSection,
    ModelSection,
    ParallelSection,
    RunConfig,
    RunSection,
    Section,
    Steps,
    TrainingSection,
)

__all__ = [
    "COMMAND_LINE",
    "LAUNCH_OPTIONS",
    "MAX_DEPTH",
    "PERMISSIONS",
    "Layer",
    "build_config",
    "dump_config",
    "nest",
    "overrides_layer",
    "parse_override",
    "read_yaml",
    "without_permissions",
    "MAX_STEPS",
    "TRACKER_NAMES",
    "ConvertSection",
    "DataSection",
    "DpoSection",
    "GrpoSection",
    "EvaluateSection",
    "ExportSection",
    "ExtractSection",
    "GenerationSection",
    "LoggingSection",
    "LoraSection",
    "MegatronConvertSection",
    "MegatronExportSection",
    "ModelSection",
    "ParallelSection",
    "RunConfig",
    "RunSection",
    "Section",
    "Steps",
    "TrainingSection",
]
