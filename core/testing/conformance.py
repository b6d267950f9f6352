"""The pack conformance suite: standard tests every pack passes.

A pack's tests subclass :class:`PackConformance` and name their pack::

    from mmcore.testing.conformance import PackConformance

    class TestConformance(PackConformance):
        pack_name = "qwen2vl"

The pack must be installed (its entry point is what users get). Tests that need more from the
pack (a tiny preset that runs end to end, a round trip) are added here as the contract grows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import ClassVar

import pytest

from mmcore.pack import CATEGORIES, STAGES


class PackConformance:
    pack_name: ClassVar[str] = ""

    @pytest.fixture
    def plugins(self):  # type: ignore[no-untyped-def]
        from mmcore.plugins import Plugins

        assert self.pack_name, "set pack_name on your PackConformance subclass"
        return Plugins.load()

    @pytest.fixture
    def entry(self, plugins):  # type: ignore[no-untyped-def]
        return plugins.pack(self.pack_name)

    def test_entry_point_loads_without_torch(self) -> None:
        """`mmcore list` imports every pack; a pack that imports torch at import makes it slow."""
        code = textwrap.dedent(
            f"""
            import importlib.metadata as md, json, sys
            eps = [ep for ep in md.entry_points(group="mmcore.packs") if ep.name == {self.pack_name!r}]
            eps[0].load()
            heavy = sorted(m for m in ("torch", "transformers", "diffusers") if m in sys.modules)
            print(json.dumps(heavy))
            """
        )
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this process's view of installed packs
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"importing the {self.pack_name} entry point imports heavy modules"

    def test_spec_is_consistent(self, plugins, entry) -> None:  # type: ignore[no-untyped-def]
        spec = entry.spec
        assert spec.name == self.pack_name
        assert spec.category in CATEGORIES
        stages = plugins.implemented_stages(self.pack_name)
        assert stages, "a pack implements at least one stage"
        assert set(stages) <= set(STAGES)
        assert entry.distribution and entry.version, "packs ship as distributions with a version"

    def test_presets_validate(self, plugins, entry) -> None:  # type: ignore[no-untyped-def]
        from mmcore.config import RunConfig, build_config
        from mmcore.session import config_class, preset_layer

        cls = config_class(entry)
        assert issubclass(cls, RunConfig)
        for preset in entry.spec.presets:
            build_config(cls, [preset_layer(entry, preset)])

    def test_kernels_have_reference_and_import(self, plugins, entry) -> None:  # type: ignore[no-untyped-def]
        registry = plugins.registry
        assert not registry.errors, registry.errors
        own = {name for (name, _), spec in registry.kernels.items() if spec.provider == entry.pm_name}
        for name in own:
            reference = registry.kernels.get((name, "reference"))
            assert reference is not None, f"kernel {name!r} has no reference implementation"
            assert callable(reference.load())
            for (kname, device), spec in registry.kernels.items():
                if kname == name and spec.usable():
                    assert callable(spec.load()), f"kernel {name!r} for {device} does not import"
