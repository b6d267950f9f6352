"""The generative rules: the trained denoiser reads its caption; 2 processes train as 1.

(The third rule of SDK 1.19, *global rng*, is checked by the train loop itself during the shared
tiny run: :class:`mmcore.train.guards.GlobalRngCheck`, reported by ``tiny_run``.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mmcore.framework.pack import STAGES

from mmcore.testing.conformance.base import ConformanceBase, _Cli, _fail, _losses, _takes_part

#: ``eval/loss_shuffled`` must differ from ``eval/loss`` by more than this, relative. A denoiser
#: that ignores its text computes the same numbers from the same latents, noise and levels: the
#: two are then bit-identical (difference 0; the deliberate break in tests/ measures exactly 0).
#: One that reads it does not, even at random initialisation, but tiny random text encoders make
#: captions that differ in one or two tokens of padded sequences, so the difference is small:
#: measured on the in-tree tiny runs (relative) flux 1.9e-3, hunyuanvideo 1.2e-3, wan-i2v 8.4e-4,
#: wan 1.8e-4, cogvideox 6.0e-5, hunyuanvideo1.5 2.4e-6 (and with other clips' first frames,
#: the *conditions* rule's, wan-i2v 1.5e-3). 1e-6 is about 8 fp32 ulps of the loss:
#: above any rounding a text-independent path could leave (none on a deterministic kernel; a few
#: ulps of reduction order on an accelerator), below the weakest real conditioning seen.
CAPTION_SENSITIVITY = 1e-6

#: Settings of the two-process rule's runs: caption dropout on, so each sample's drop decision
#: comes from its own seed too.
TWO_PROCESS_SETTINGS = ("training.steps=3", "training.eval_every=0", "training.caption_dropout=0.5", "evaluate.enabled=false")


def _generative(plugins, entry, name: str) -> None:  # type: ignore[no-untyped-def]
    if entry.spec.category != "generative" or "train" not in plugins.implemented_stages(name):
        pytest.skip("not a generative pack with a train stage")


def _depends(metrics: dict, other_key: str, rule: str, what: str, given: str, passed: str) -> None:  # type: ignore[type-arg]
    """Fail ``rule`` unless ``eval/<other_key>`` (the held-out loss given ``given``) differs from
    ``eval/loss`` by more than :data:`CAPTION_SENSITIVITY`, relative."""
    loss, other = float(metrics["eval/loss"]), float(metrics[f"eval/{other_key}"])
    if not abs(other - loss) > CAPTION_SENSITIVITY * abs(loss):
        _fail(
            rule,
            "mmcore_train",
            f"the held-out loss does not depend on {what}: eval/loss {loss:.8g}, with {given} eval/{other_key} {other:.8g} "
            f"(relative difference {abs(other - loss) / abs(loss) if loss else 0.0:.2g}, at most {CAPTION_SENSITIVITY:g}): does predict pass {passed} to the denoiser?",
        )


class GenerativeRules(ConformanceBase):
    # ------------------------------------------------------------------ conditioning
    def test_held_out_loss_depends_on_the_caption(self, plugins, entry, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        """The trained tiny denoiser's held-out error at fixed noise changes when each clip is
        given another clip's caption (``eval/loss_shuffled``, the diffusion kit's): a ``predict``
        that drops the text trains, exports and lowers its loss all the same, and only this sees it."""
        _generative(plugins, entry, self.pack_name)
        _takes_part(entry, "conditioning")
        metrics = self._manifest(tiny_run, "train").get("metrics", {})
        if "eval/loss" not in metrics or "eval/loss_shuffled" not in metrics:
            _fail(
                "conditioning",
                "mmcore_train",
                "the tiny run reports no eval/loss and eval/loss_shuffled (held-out clips with their own and with other clips' captions): "
                "set data.eval_fraction in the conformance class's overrides so clips are held out (the diffusion kit reports both)",
            )
        _depends(metrics, "loss_shuffled", "conditioning", "the caption", "other clips' captions", "the text")

    def test_held_out_loss_depends_on_the_conditions(self, plugins, entry, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        """A family conditioned on more than its caption (``DiffusionFamily.conditions``: image-to-video's
        first frame) reads those too: the held-out error changes when each clip is given another
        clip's conditions with its own caption (``eval/loss_other_condition``)."""
        _generative(plugins, entry, self.pack_name)
        _takes_part(entry, "conditions")
        metrics = self._manifest(tiny_run, "train").get("metrics", {})
        if "eval/loss_other_condition" not in metrics:
            pytest.skip("the family is conditioned on its caption alone (no eval/loss_other_condition)")
        _depends(metrics, "loss_other_condition", "conditions", "the family's conditions", "other clips' conditions", "them")

    # ------------------------------------------------------------------ two processes
    @pytest.mark.compares_runs
    def test_two_processes_train_as_one(self, plugins, entry, work: Path, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        """The shared run's data trained on two processes (FSDP2, micro-batches of 1) gives the
        one-process losses (micro-batches of 2, the same global batch): each sample's noise, noise
        level and caption dropout come from its own seed (``sample_seeds``), not from the rank it
        lands on. fp32; only the reduction order differs: rel 1e-5. FSDP2 must not warn about
        views (its hook would be lost on an in-place op)."""
        _generative(plugins, entry, self.pack_name)
        if "train" not in entry.spec.distributed_stages:
            pytest.skip("the pack trains on one process only (PackSpec.distributed_stages)")
        _takes_part(entry, "two processes")
        runs = {}
        for name in ("one", "two"):
            runs[name] = run = work / f"processes-{name}"
            shutil.copytree(tiny_run, run, symlinks=True)  # the tiny run's model and data: only the layout differs
            for stage in STAGES[STAGES.index("train") :]:
                shutil.rmtree(run / stage, ignore_errors=True)
        from mmcore.errors import MmcoreError

        try:
            self._runner(runs["one"], *TWO_PROCESS_SETTINGS, "training.micro_batch_size=2").run_stage("train", resume="no")
        except MmcoreError as exc:
            _fail("two processes", "mmcore train", f"one process: {exc.one_line()}")
        args = ["--pack", self.pack_name, "--preset", self.preset, "--run-dir", str(runs["two"]), "--nproc-per-node", "2", *self._overrides(), *TWO_PROCESS_SETTINGS, "training.micro_batch_size=1"]
        proc = _Cli(work)("train", *args)
        if proc.returncode != 0:
            _fail("two processes", "mmcore train --nproc-per-node 2", f"exit {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-3:]))
        if "returned a view tensor" in proc.stderr:
            warning = next(line for line in proc.stderr.splitlines() if "returned a view tensor" in line)
            _fail("two processes", "mmcore_train", f"FSDP2 warned of a view among the sharded module's outputs (its backward hook can be lost): {warning.strip()[:300]}")
        one, two = _losses(runs["one"]), _losses(runs["two"])
        if list(one) != list(two) or any(abs(two[s] - one[s]) > 1e-5 * abs(one[s]) for s in one):
            _fail("two processes", "mmcore_train", f"two processes' losses {two} differ from one process's {one} (rel 1e-5): does a sample's noise depend on the rank it lands on?")
