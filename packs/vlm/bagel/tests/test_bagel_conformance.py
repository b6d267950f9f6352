"""The mmcore conformance suite on the bagel pack: every stage run once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mmcore.framework.pack import STAGES
from mmcore.testing.conformance import PackConformance


class TestBagelConformance(PackConformance):
    pack_name = "bagel"
    overrides = ("data.demo_samples=8",)
    export_class = "mm_pack_bagel.model:Bagel"
    infer_request = {"prompt": "<image>What colour is the shape?", "images": 1}
    # LoRA runs the core engine's own adapters on this pack's projections (passes; 27 s): make test-matrix
    matrix = ("test_mixed_media_on_two_processes_equals_one", "test_lora_trains_only_the_adapters_resumes_and_exports_them")

    @pytest.mark.compares_runs
    def test_mixed_media_on_two_processes_equals_one(self, plugins, entry, work: Path, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        """The suite's mixed-media rule, less its fillers count: BAGEL calls every tower and
        head on every rank whatever the micro-batch holds (``Bagel.untouched_parts``: zero
        times the unused parts), so it uses no fillers. Text-only and image samples, one per
        micro-batch on two processes, give the one-process losses (rel 1e-4)."""
        from mmcore.testing.conformance.base import _Cli, _losses
        from mmcore.testing.media import write_mixed_mllm

        data = write_mixed_mllm(work / "mixed-data", ("image",))
        settings = [f"data.datasets=[{data}]", "data.demo_samples=0", "data.eval_fraction=0.25", "training.steps=4", "training.balance_towers=false", "training.eval_every=0"]
        runs = {}
        for name, layout in (("one", ["training.micro_batch_size=2"]), ("two", ["training.micro_batch_size=1"])):
            runs[name] = run = work / f"mixed-{name}"
            shutil.copytree(tiny_run, run, symlinks=True)
            for stage in STAGES[STAGES.index("preprocess") :]:
                shutil.rmtree(run / stage, ignore_errors=True)
            extra = ["--nproc-per-node", "2"] if name == "two" else []
            proc = _Cli(work)("run", "--pack", self.pack_name, "--preset", self.preset, "--run-dir", str(run), *extra, *self._overrides(), *settings, *layout)
            assert proc.returncode == 0, proc.stderr[-2000:]
        one, two = _losses(runs["one"]), _losses(runs["two"])
        assert list(one) == list(two) and all(abs(two[s] - one[s]) <= 1e-4 * abs(one[s]) for s in one), (one, two)
