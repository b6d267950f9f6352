"""The contract rules: the entry point, the SDK imports, the spec and presets, the kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path


from mmcore.framework.pack import CATEGORIES

from mmcore.testing.conformance.base import ConformanceBase, _device_here, _fail


class ContractRules(ConformanceBase):
    # ------------------------------------------------------------------ import
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
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        heavy = json.loads(out.stdout.strip().splitlines()[-1])
        if heavy:
            _fail("import", "entry point", f"importing the {self.pack_name} entry point imports {', '.join(heavy)}; import them inside stage functions")

    def test_pack_imports_only_the_sdk(self, entry) -> None:  # type: ignore[no-untyped-def]
        import importlib

        from mmcore.sdk import SDK_VERSION, imports_outside_sdk

        package = importlib.import_module(entry.value.partition(":")[0].split(".")[0])
        problems = imports_outside_sdk(Path(package.__file__).parent)
        if problems:
            _fail("sdk", "imports", f"outside mmcore SDK {SDK_VERSION}: " + "; ".join(problems[:5]))

    # ------------------------------------------------------------------ spec
    def test_spec_is_consistent(self, plugins, entry) -> None:  # type: ignore[no-untyped-def]
        spec = entry.spec
        assert spec.name == self.pack_name
        assert spec.category in CATEGORIES
        stages = plugins.implemented_stages(self.pack_name)
        if not stages:
            _fail("spec", "PACK.stages", "the pack runs no stage")
        assert entry.distribution and entry.version, "packs ship as distributions with a version"
        if self.preset not in spec.presets:
            _fail("spec", "PACK.presets", f"no preset {self.preset!r} for the conformance run")

    def test_presets_validate(self, plugins, entry) -> None:  # type: ignore[no-untyped-def]
        from mmcore.config import RunConfig, build_config
        from mmcore.run.session import config_class, preset_layer

        cls = config_class(entry)
        assert issubclass(cls, RunConfig)
        for preset in entry.spec.presets:
            build_config(cls, [preset_layer(entry, preset)])

    # ------------------------------------------------------------------ kernels
    def test_kernels_have_a_reference_and_match_it(self, plugins, entry) -> None:  # type: ignore[no-untyped-def]
        registry = plugins.registry
        assert not registry.errors, registry.errors
        own = sorted({name for (name, _), spec in registry.kernels.items() if spec.provider == entry.pm_name})
        for name in own:
            reference = registry.kernels.get((name, "reference"))
            if reference is None:
                _fail("kernels", "mmcore_register_kernels", f"kernel {name!r} has no reference implementation")
            if not reference.example:
                _fail("kernels", "mmcore_register_kernels", f"kernel {name!r} has no example input (KernelSpec.example) to check it on")
            from mmcore.framework.registry import import_object

            args = import_object(reference.example)()
            expected = reference.load()(*args)
            for (kname, device), spec in registry.kernels.items():
                if kname != name or device == "reference" or not spec.usable() or not _device_here(device):
                    continue
                import torch

                moved = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
                got = spec.load()(*moved)
                torch.testing.assert_close(got.cpu().float(), expected.float(), rtol=2e-2, atol=2e-2, msg=lambda m, k=name, d=device: f"[kernels] {k} on {d} differs from its reference: {m}")
