"""The diffusion kit's export check loads a pack's own pipeline class (diffusers has no
Open-Sora Plan pipeline): ``load_pipeline(folder, classes=...)`` looks the class up there;
without it, the folder is refused in one line as before."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_load_pipeline_takes_a_pack_pipeline_class(tmp_path: Path) -> None:
    import diffusers
    from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler

    from mmcore.errors import StageError
    from mmcore.kits.diffusion.export import load_pipeline

    class OwnPipeline(DiffusionPipeline):
        def __init__(self, scheduler) -> None:  # type: ignore[no-untyped-def]
            super().__init__()
            self.register_modules(scheduler=scheduler)

    OwnPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0)).save_pretrained(tmp_path / "pipe")
    with pytest.raises(StageError, match=r"_class_name 'OwnPipeline' is not a diffusers pipeline$"):
        load_pipeline(tmp_path / "pipe")
    loaded = load_pipeline(tmp_path / "pipe", classes=lambda name: OwnPipeline if name == "OwnPipeline" else getattr(diffusers, name))
    assert isinstance(loaded, OwnPipeline) and loaded.scheduler.config.shift == 7.0
