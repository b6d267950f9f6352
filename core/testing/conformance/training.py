"""The training rules: killed and resumed, mixed media on two processes, LoRA."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mmcore.framework.pack import STAGES

from mmcore.testing.conformance.base import ConformanceBase, _Cli, _fail, _load_adapter_in_its_library, _losses, _takes_part


class TrainingRules(ConformanceBase):
    # ------------------------------------------------------------------ resume
    def _killed_and_resumed(self, work: Path, tiny_run: Path, name: str, *extra: str, kill_at: int = 0) -> Path:
        """A copy of the shared run whose training (with ``extra``) is killed with SIGKILL after
        step ``kill_at`` (default ``kill_step``) by a real ``mmcore train``, then resumed in this
        process; each step must be in ``metrics.jsonl`` once, the replayed ones included."""
        kill_at = kill_at or self.kill_step
        killed = work / name
        shutil.copytree(tiny_run, killed, symlinks=True)
        for stage in ("train", "export", "evaluate"):
            shutil.rmtree(killed / stage, ignore_errors=True)
        args = ["--pack", self.pack_name, "--preset", self.preset, *self._overrides(), *extra]
        proc = _Cli(work)("train", *args, "--run-dir", name, MMCORE_TEST_KILL=f"train-step:{kill_at}")
        if proc.returncode == 0:
            _fail("resume", "mmcore_train", f"training did not pass crash point train-step:{kill_at} (use mmcore.train.loop's loop)")
        self._runner(killed, *extra).run_stage("train", resume="required")
        steps = [json.loads(line)["step"] for line in (killed / "train/metrics.jsonl").read_text().splitlines() if '"loss"' in line]
        if steps != list(range(1, self._runner(killed, *extra).config.training.steps + 1)):
            _fail("resume", "mmcore_train", f"expected steps 1..{kill_at} before the kill and the rest after resuming, once each; got {steps}")
        return killed

    @pytest.mark.compares_runs
    def test_training_killed_mid_run_resumes_to_the_same_losses(self, plugins, work: Path, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        if "train" not in plugins.implemented_stages(self.pack_name):
            pytest.skip("the pack has no train stage")
        # Killed between checkpoints (saved at kill_step, killed one step later): the resumed run
        # replays that step, and metrics.jsonl must still hold each step once.
        between = self.kill_step + 1 <= self.steps
        killed = self._killed_and_resumed(work, tiny_run, "killed", *([f"training.checkpoint_every={self.kill_step}"] if between else []), kill_at=self.kill_step + 1 if between else self.kill_step)
        # Same batches, same kernels, same RNG streams: resumed losses equal the straight run's bits.
        if _losses(killed) != _losses(tiny_run):
            _fail("resume", "mmcore_train", f"resumed losses {_losses(killed)} differ from uninterrupted {_losses(tiny_run)}")

    # ------------------------------------------------------------------ mixed data across ranks
    @pytest.mark.compares_runs
    def test_mixed_media_on_two_processes_equals_one(self, plugins, entry, work: Path, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        """Real SFT data mixes text-only samples with images, videos and audio, 0, 1 or 2 items
        each: on two processes (micro-batches of 1) every step's ranks hold different media, yet
        both train, evaluate on a mixed held-out split and give the one-process losses (micro-
        batches of 2, the same global batch; fp32, only the reduction order differs: rel 1e-4)."""
        from mmcore.errors import MmcoreError
        from mmcore.testing.media import write_mixed_mllm

        kinds = self.mixed_media or (("image",) if entry.spec.category in ("vlm", "omni") else ())
        if not kinds or "train" not in plugins.implemented_stages(self.pack_name):
            pytest.skip("the pack reads no conversations with media (set mixed_media)")
        _takes_part(entry, "mixed data")
        data = write_mixed_mllm(work / "mixed-data", kinds)
        # plain shuffling (no tower balancing, which would pair samples of alike media): the worst case
        settings = [
            f"data.datasets=[{data}]",
            "data.demo_samples=0",
            "data.eval_fraction=0.25",
            "training.steps=4",
            "training.balance_towers=false",
            "training.eval_every=0",
            "evaluate.enabled=false",
            *self.mixed_overrides,
        ]
        runs = {}
        for name, layout in (("one", ["training.micro_batch_size=2"]), ("two", ["training.micro_batch_size=1"])):
            runs[name] = run = work / f"mixed-{name}"
            shutil.copytree(tiny_run, run, symlinks=True)  # the tiny run's model: only the data differs
            for stage in STAGES[STAGES.index("preprocess") :]:
                shutil.rmtree(run / stage, ignore_errors=True)
            if name == "one":
                try:
                    self._runner(run, *settings, *layout).run_pipeline(resume="no")
                except MmcoreError as exc:
                    _fail("mixed data", "mmcore run", f"one process on {data}: {exc.one_line()}")
                continue
            proc = _Cli(work)("run", "--pack", self.pack_name, "--preset", self.preset, "--run-dir", str(run), "--nproc-per-node", "2", *self._overrides(), *settings, *layout)
            if proc.returncode != 0:
                _fail("mixed data", "mmcore run --nproc-per-node 2", f"exit {proc.returncode} on mixed media: " + " | ".join(proc.stderr.strip().splitlines()[-3:]))
        one, two = _losses(runs["one"]), _losses(runs["two"])
        if list(one) != list(two) or any(abs(two[s] - one[s]) > 1e-4 * abs(one[s]) for s in one):
            _fail("mixed data", "mmcore_train", f"two processes' losses {two} differ from one process's {one} (rel 1e-4)")
        metrics = [self._manifest(runs[n], "train").get("metrics", {}) for n in ("one", "two")]
        if metrics[1].get("mixed_media_steps", 0) <= 0:
            _fail(
                "mixed data",
                "mmcore_train",
                "the engine counted no step whose two processes held different media (mixed_media_steps; a recipe declares its samples' media "
                "with fill, or media when its model calls every tower on every rank): the rule proved nothing",
            )
        held = [{k: v for k, v in m.items() if k.startswith("eval/")} for m in metrics]
        if held[0] != held[1]:
            _fail("mixed data", "mmcore_train", f"held-out metrics on two processes {held[1]} differ from one process's {held[0]}")

    # ------------------------------------------------------------------ LoRA
    @pytest.mark.compares_runs
    def test_lora_trains_only_the_adapters_resumes_and_exports_them(self, plugins, entry, work: Path, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        from mmcore.checkpoint import safe_dcp
        from mmcore.errors import MmcoreError
        from mmcore.train.lora import is_adapter

        stages = plugins.implemented_stages(self.pack_name)
        if "train" not in stages or "export" not in stages or not self.supports_lora:
            pytest.skip("the pack has no train and export stages, or trains no LoRA (supports_lora)")
        _takes_part(entry, "lora")
        straight = work / "lora"
        shutil.copytree(tiny_run, straight, symlinks=True)
        for stage in ("train", "export", "evaluate"):
            shutil.rmtree(straight / stage, ignore_errors=True)
        try:
            self._runner(straight, *self.lora_overrides).run_pipeline(resume="no")
        except MmcoreError as exc:
            _fail("lora", "mmcore run", f"{' '.join(self.lora_overrides)}: error: {exc.one_line()}")
        train = self._manifest(straight, "train")
        if "lora" not in train.get("metrics", {}):
            _fail("lora", "mmcore_train", "the train stage ignored training.lora (use mmcore.train.loop's loop, or set supports_lora = False)")
        losses = list(_losses(straight).values())
        metrics = train.get("metrics", {})
        if "eval/loss" in metrics and "eval/loss@0" in metrics:  # a loss at fixed noise (diffusion): the training loss is too noisy to read
            if not metrics["eval/loss"] < metrics["eval/loss@0"]:
                _fail("lora", "mmcore_train", f"the held-out loss did not fall with the adapters training ({' '.join(self.lora_overrides)}): {metrics['eval/loss@0']} -> {metrics['eval/loss']}")
        elif not sum(losses[-2:]) < sum(losses[:2]):
            _fail("lora", "mmcore_train", f"the loss did not fall with the adapters training ({' '.join(self.lora_overrides)}): {losses}")
        checkpoint = (straight / "train" / train["outputs"]["checkpoint"]).resolve()
        held = [k[len("model.") :] for k in safe_dcp.read_metadata(checkpoint).state_dict_metadata if k.startswith("model.")]
        if not held or not all(is_adapter(k) for k in held):
            _fail("lora", "mmcore_train", f"a LoRA checkpoint must hold the adapters only, not {[k for k in held if not is_adapter(k)][:3] or 'nothing'} (use mmcore.train.loop's loop)")
        export = self._manifest(straight, "export")
        if "adapter" not in export.get("outputs", {}):
            _fail("lora", "mmcore_export", "records no output 'adapter' after LoRA training (use mmcore.engines.export.export_checked or a kit's export)")
        tensors = _load_adapter_in_its_library(straight / "download" / self._manifest(straight, "download")["outputs"]["model"], straight / "export" / export["outputs"]["adapter"], self.export_class)
        if not any(k.endswith("lora_B.weight") and bool(v.abs().sum() > 0) for k, v in tensors.items()):
            _fail("lora", "mmcore_train", "every lora_B is still zero after training: the adapters did not learn")
        if plugins.has_infer(self.pack_name):  # the adapters on their base, from the checkpoint and from the export
            self._infer_from_checkpoint_and_export(work, straight)
        killed = self._killed_and_resumed(work, tiny_run, "lora-killed", *self.lora_overrides)
        if _losses(killed) != _losses(straight):
            _fail("lora", "mmcore_train", f"resumed LoRA losses {_losses(killed)} differ from uninterrupted {_losses(straight)}")
