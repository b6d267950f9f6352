"""The pack conformance suite: the contract, checked by running the pack.

A pack's tests subclass :class:`PackConformance` and name the pack (and, where its tiny preset
needs it, overrides that make the run small)::

    from mmcore.testing.conformance import PackConformance

    class TestConformance(PackConformance):
        pack_name = "qwen2vl"
        overrides = ("data.demo_samples=8",)

The pack must be installed (its entry point is what users get). One tiny run of every stage
(``preset``, ``overrides``) is shared by the class's checks, run in the test process; one more
run, a real ``mmcore train`` process, is killed with SIGKILL during training and resumed. Each
failure starts with ``[rule] hook:``:

* import: the entry point imports neither torch nor transformers nor diffusers;
  the pack imports from mmcore only what :mod:`mmcore.sdk` lists.
* spec: name, category, stages, distribution; every preset validates.
* pipeline: every stage finishes (or declines) and records the outputs the engines read.
* convert: key coverage against the model and a bit-identical round trip (``convert.verify``).
* export: the exported folder loads in its library with nothing missing: the class it names
  itself (``config.json`` architectures, ``model_index.json``), or ``export_class``.
* kernels: each kernel has a reference; each implementation usable here matches it on the
  kernel's example input.
* bad input: a sample that is not a sample fails preprocess with one line naming the file.
* resume: training killed between checkpoints (one step after ``kill_step``'s) resumes to the
  uninterrupted losses, each step in ``metrics.jsonl`` once.
* mixed data: text-only samples beside images, videos and audio (``mixed_media``) train on two
  processes to the one-process losses, with a mixed held-out split evaluated on both.
* lora: ``training.lora`` trains adapters only (the checkpoint holds nothing else), a LoRA run
  killed with SIGKILL resumes to the uninterrupted losses, the adapter export loads in its
  library (peft's ``PeftModel.from_pretrained``, or diffusers' ``load_lora_weights``) with the
  trained tensors, nothing missing, and ``mmcore infer`` answers from its checkpoint and export.

A rule that came with a later SDK than the pack declares (:data:`RULE_SINCE`) skips, saying so:
a pack that passed conformance keeps passing it on every later minor of its SDK.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import pytest

from mmcore.framework.pack import CATEGORIES, STAGE_OUTPUTS, STAGES


def _fail(rule: str, hook: str, message: str) -> None:
    pytest.fail(f"[{rule}] {hook}: {message}", pytrace=False)


#: The SDK minor each later rule came with (the others are 1.0's). A pack declares the SDK it was
#: written for (``PackSpec(sdk=...)``); a minor only adds, so a pack written before a rule
#: existed takes no part in its feature and is not failed by it: the rule skips, saying why.
RULE_SINCE = {"evaluate": "1.5", "infer": "1.5", "lora": "1.6", "mixed data": "1.16"}


def _takes_part(entry: Any, rule: str) -> None:
    """Skip ``rule`` for a pack whose declared SDK predates it."""
    since, declared = RULE_SINCE[rule], entry.spec.sdk
    minor = lambda version: tuple(int(part) for part in version.split("."))  # noqa: E731
    try:
        older = minor(declared) < minor(since)
    except ValueError:
        return  # not MAJOR.MINOR: `mmcore list` reports the pack broken; every rule applies
    if older:
        pytest.skip(f"[{rule}] came with SDK {since}; the pack declares SDK {declared}: declare PackSpec(sdk={since!r}) or later to take part")


class _Cli:
    """``python -m mmcore ARGS`` in a folder, with only the ``MMCORE_*`` variables given."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
        full["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this process's view of installed packs
        full.update(env)
        return subprocess.run([sys.executable, "-m", "mmcore", *args], cwd=self.cwd, env=full, capture_output=True, text=True, timeout=1800)


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}  # a resumed run repeats steps: keep the last


class PackConformance:
    #: The pack under test (its entry-point name).
    pack_name: ClassVar[str] = ""
    #: The preset of the shared run: small enough to run every stage in seconds on a CPU.
    preset: ClassVar[str] = "tiny"
    #: Overrides of the shared run (``key=value``). Checkpoints every step, so resume is tested.
    overrides: ClassVar[tuple[str, ...]] = ()
    #: ``"library:Class"`` whose ``from_pretrained`` loads the export's ``model`` output (or
    #: ``"module:function"`` that loads it, for an export no hub library reads). Default: the
    #: class the export names itself (``config.json`` architectures, ``model_index.json``).
    export_class: ClassVar[str] = ""
    #: Training is killed after this step, then resumed.
    kill_step: ClassVar[int] = 2
    #: Steps of the shared run (more than ``kill_step``).
    steps: ClassVar[int] = 3
    #: One ``mmcore infer`` request (a line of ``--input``) for the trained run, where the pack
    #: has ``infer``; ``images``/``videos``/``audios`` are counts of media files the suite writes.
    infer_request: ClassVar[dict[str, Any]] = {"prompt": "<image>What colour is it?", "images": 1}
    #: Whether the pack trains LoRA adapters (``training.lora``): every pack on mmcore's train
    #: engine does; a pack with a train loop of its own may say it does not.
    supports_lora: ClassVar[bool] = True
    #: Overrides of the LoRA runs (on top of ``overrides``): long enough for the loss to fall.
    lora_overrides: ClassVar[tuple[str, ...]] = ("training.lora.r=8", "training.lr=1e-2", "training.steps=6", "evaluate.enabled=false")
    #: Media kinds (``image``, ``video``, ``audio``) the mixed-data rule mixes with text-only
    #: samples in MLLM JSON; empty: ``("image",)`` for a vlm or omni pack, else the rule skips
    #: (the pack reads no conversations).
    mixed_media: ClassVar[tuple[str, ...]] = ()
    #: Overrides of the mixed-data runs (e.g. ``training.moe_aux_loss_coef=0``: a router's
    #: balance loss is per micro-batch, so it differs between one process and two by design).
    mixed_overrides: ClassVar[tuple[str, ...]] = ()
    #: Whether the mixed-data rule runs in ``make test`` (one pack per kit) rather than only in
    #: ``make test-matrix``.
    mixed_in_make_test: ClassVar[bool] = False
    #: Names of this class's tests that run only in ``make test-matrix`` (marker ``matrix``):
    #: the expensive ones whose code path another pack's ``make test`` already runs (a variant
    #: of a family, a kit family whose LoRA is the kit's), for the test budget.
    matrix: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ shared runs
    # Runs happen in this process (torch and the pack imported once), except the one that is
    # killed: that is a real `mmcore train` killed with SIGKILL at the crash point.
    @classmethod
    def _overrides(cls) -> list[str]:
        return ["convert.verify=true", f"training.steps={cls.steps}", "training.checkpoint_every=1", *cls.overrides]

    @classmethod
    def _runner(cls, run_dir: Path, *extra: str) -> Any:
        from mmcore.framework.plugins import Plugins
        from mmcore.testing import make_runner

        return make_runner(Plugins.load(), cls.pack_name, run_dir, preset=cls.preset, overrides=[*cls._overrides(), *extra])

    @pytest.fixture(scope="class")
    @classmethod
    def work(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        assert cls.pack_name, "set pack_name on your PackConformance subclass"
        return tmp_path_factory.mktemp(f"conformance-{cls.pack_name}")

    @pytest.fixture(scope="class")
    @classmethod
    def tiny_run(cls, work: Path) -> Path:
        """Every stage of the pack, once, shared by the checks of this class."""
        from mmcore.errors import MmcoreError

        try:
            cls._runner(work / "tiny").run_pipeline(resume="no")
        except MmcoreError as exc:
            _fail("pipeline", "mmcore run", f"the {cls.preset} preset did not run end to end: error: {exc.one_line()}")
        return work / "tiny"

    def _manifest(self, run: Path, stage: str) -> dict[str, Any]:
        path = run / stage / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else {}

    @pytest.fixture
    def plugins(self):  # type: ignore[no-untyped-def]
        from mmcore.framework.plugins import Plugins

        assert self.pack_name, "set pack_name on your PackConformance subclass"
        return Plugins.load()

    @pytest.fixture
    def entry(self, plugins):  # type: ignore[no-untyped-def]
        return plugins.pack(self.pack_name)

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

    # ------------------------------------------------------------------ pipeline
    def test_every_stage_finishes_with_the_outputs_the_engines_read(self, plugins, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        from mmcore.framework.hookspecs import STAGE_HOOKS

        for stage in plugins.implemented_stages(self.pack_name):
            manifest = self._manifest(tiny_run, stage)
            if not manifest:
                _fail("pipeline", STAGE_HOOKS[stage], "wrote no manifest")
            if manifest["status"] == "declined":
                continue
            missing = [name for name in STAGE_OUTPUTS[stage] if name not in manifest["outputs"]]
            if missing:
                _fail("pipeline", STAGE_HOOKS[stage], f"records no output {missing[0]!r}")
        for stage in ("download", "train"):
            if stage in plugins.implemented_stages(self.pack_name) and self._manifest(tiny_run, stage).get("status") != "finished":
                _fail("pipeline", STAGE_HOOKS[stage], f"the {stage} stage cannot decline")

    def test_convert_covers_the_model_and_round_trips_bit_identically(self, plugins, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        if "convert" not in plugins.implemented_stages(self.pack_name):
            pytest.skip("the pack has no convert stage")
        manifest = self._manifest(tiny_run, "convert")
        if manifest["metrics"].get("verified") is not True:
            _fail("convert", "mmcore_convert", "convert.verify=true did not verify the round trip (use mmcore.engines.convert.convert_stage)")
        if not any(note.startswith("key coverage:") for note in manifest["notes"]):
            _fail("convert", "mmcore_convert", "key coverage against the training model was not checked (use mmcore.engines.convert.convert_stage)")

    def test_export_loads_in_its_library(self, plugins, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        from mmcore.framework.registry import import_object

        if "export" not in plugins.implemented_stages(self.pack_name):
            pytest.skip("the pack has no export stage")
        folder = Path(self._manifest(tiny_run, "export")["outputs"]["model"])
        folder = folder if folder.is_absolute() else tiny_run / "export" / folder
        export_class = self.export_class or _named_class(folder)
        if not export_class:
            _fail("export", "conformance subclass", f"{folder} names no class (config.json architectures, model_index.json _class_name): set export_class")
        cls = import_object(export_class)
        if not hasattr(cls, "from_pretrained"):
            cls(folder)  # a pack's own loader: raises if the export does not load
        elif export_class.startswith("transformers:"):
            _, info = cls.from_pretrained(folder, output_loading_info=True)
            gaps = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
            if gaps:
                _fail("export", "mmcore_export", f"{export_class} loads {folder} with {gaps}")
        else:
            cls.from_pretrained(folder)

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

    # ------------------------------------------------------------------ bad input
    def test_a_bad_sample_fails_preprocess_in_one_line_naming_the_file(self, work: Path, tiny_run: Path) -> None:
        """A sample that is not one is the user's error: a one-line StageError naming the file,
        raised by the pack (no error.log: that is written for crashes, which are the pack's)."""
        from mmcore.errors import MmcoreError

        bad = work / "bad-samples.jsonl"
        bad.write_text('{"this is": "not a sample"}\n')
        for stage in STAGES[: STAGES.index("preprocess")]:  # what preprocess may read, as finished
            if (tiny_run / stage).is_dir():
                shutil.copytree(tiny_run / stage, work / "bad" / stage, symlinks=True)
        try:
            self._runner(work / "bad", f"data.datasets=[{bad}]").run_stage("preprocess")
        except MmcoreError as exc:
            line = exc.one_line()
            crashed = (work / "bad" / "preprocess" / "error.log").exists()
            if crashed or "\n" in line or bad.name not in line:
                _fail("bad input", "mmcore_preprocess", f"expected a one-line error naming {bad.name}" + (" (the stage crashed instead: see its error.log)" if crashed else "") + f", got: {line}")
            return
        _fail("bad input", "mmcore_preprocess", f"{bad.name} holds no valid sample, yet preprocess finished")

    # ------------------------------------------------------------------ evaluate and infer
    def test_evaluate_writes_one_result_per_item(self, plugins, entry, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        if "evaluate" not in plugins.implemented_stages(self.pack_name):
            pytest.skip("the pack has no evaluate stage")
        _takes_part(entry, "evaluate")
        manifest = self._manifest(tiny_run, "evaluate")
        if manifest.get("status") != "finished":
            return  # declined: nothing to check
        results = tiny_run / "evaluate" / manifest["outputs"]["results"]
        rows = [json.loads(line) for line in results.read_text().splitlines()]
        if len(rows) != manifest["metrics"].get("items", len(rows)):
            _fail("evaluate", "mmcore_evaluate", f"metrics say {manifest['metrics'].get('items')} items, {results.name} holds {len(rows)}")

    def test_infer_answers_from_the_training_checkpoint_and_the_export(self, plugins, entry, work: Path, tiny_run: Path) -> None:  # type: ignore[no-untyped-def]
        if not plugins.has_infer(self.pack_name):
            pytest.skip("the pack has no infer")
        _takes_part(entry, "infer")
        self._infer_from_checkpoint_and_export(work, tiny_run)

    def _infer_from_checkpoint_and_export(self, work: Path, run: Path) -> None:
        """``mmcore infer`` on ``run``: one request answered from the training checkpoint and from
        the export, with equal greedy text; a request with a missing file its own error, exit 1."""
        import copy

        from mmcore.testing.media import write_audio, write_image, write_video

        request = copy.deepcopy(self.infer_request)
        media = work / "infer-media"
        writers = {"images": (lambda path: write_image(path, (200, 40, 40)), "png"), "videos": (write_video, "mp4"), "audios": (write_audio, "wav")}
        for kind, (write, suffix) in writers.items():
            if kind in request:
                names = [f"{kind}-{i}.{suffix}" for i in range(int(request[kind]))]
                for name in names:
                    if not (media / name).exists():
                        write(media / name)
                request[kind] = names
        media.mkdir(parents=True, exist_ok=True)
        missing = {k: ["missing." + writers[k][1]] for k in writers if k in request} or {"images": ["missing.png"]}
        (media / "requests.jsonl").write_text(json.dumps(request) + "\n" + json.dumps({**request, **missing}) + "\n")
        answers = {}
        for which in ("latest", "export"):
            out = media / f"{run.name}-{which}.jsonl"
            proc = _Cli(work)("infer", "--run-dir", str(run), "--checkpoint", which, "--input", str(media / "requests.jsonl"), "--output", str(out),
                              "generation.max_new_tokens=4", "generation.num_inference_steps=2")
            rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
            if len(rows) != 2 or "error" in rows[0]:
                _fail("infer", "mmcore_infer", f"{run.name}, --checkpoint {which}: expected an answer and an error, got {rows or proc.stderr.strip()[-300:]}")
            if proc.returncode != 1 or "not found" not in rows[1].get("error", ""):
                _fail("infer", "mmcore_infer", f"a request with a missing file must be its own one-line error and exit 1; got exit {proc.returncode}, {rows[1]}")
            answers[which] = rows[0]
        if "text" in answers["latest"] and answers["latest"]["text"] != answers["export"].get("text"):
            _fail("infer", "mmcore_infer", f"{run.name}: greedy answers differ between the training checkpoint and the export: {answers}")

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
        killed = self._killed_and_resumed(work, tiny_run, "killed", *([f"training.checkpoint_every={self.kill_step}"] if between else []),
                                          kill_at=self.kill_step + 1 if between else self.kill_step)
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
        settings = [f"data.datasets=[{data}]", "data.demo_samples=0", "data.eval_fraction=0.25", "training.steps=4", "training.balance_towers=false",
                    "training.eval_every=0", "evaluate.enabled=false", *self.mixed_overrides]
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
            proc = _Cli(work)("run", "--pack", self.pack_name, "--preset", self.preset, "--run-dir", str(run), "--nproc-per-node", "2",
                              *self._overrides(), *settings, *layout)
            if proc.returncode != 0:
                _fail("mixed data", "mmcore run --nproc-per-node 2", f"exit {proc.returncode} on mixed media: " + " | ".join(proc.stderr.strip().splitlines()[-3:]))
        one, two = _losses(runs["one"]), _losses(runs["two"])
        if list(one) != list(two) or any(abs(two[s] - one[s]) > 1e-4 * abs(one[s]) for s in one):
            _fail("mixed data", "mmcore_train", f"two processes' losses {two} differ from one process's {one} (rel 1e-4)")
        metrics = [self._manifest(runs[n], "train").get("metrics", {}) for n in ("one", "two")]
        if metrics[1].get("fillers", 0) <= 0:
            _fail("mixed data", "mmcore_train", "no step put different media side by side on the two processes (or no fillers were used): the rule proved nothing")
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
        held = [k[len("model."):] for k in safe_dcp.read_metadata(checkpoint).state_dict_metadata if k.startswith("model.")]
        if not held or not all(is_adapter(k) for k in held):
            _fail("lora", "mmcore_train", f"a LoRA checkpoint must hold the adapters only, not {[k for k in held if not is_adapter(k)][:3] or 'nothing'} (use mmcore.train.loop's loop)")
        export = self._manifest(straight, "export")
        if "adapter" not in export.get("outputs", {}):
            _fail("lora", "mmcore_export", "records no output 'adapter' after LoRA training (use mmcore.engines.export.export_checked or a kit's export)")
        tensors = _load_adapter_in_its_library(straight / "download" / self._manifest(straight, "download")["outputs"]["model"], straight / "export" / export["outputs"]["adapter"])
        if not any(k.endswith("lora_B.weight") and bool(v.abs().sum() > 0) for k, v in tensors.items()):
            _fail("lora", "mmcore_train", "every lora_B is still zero after training: the adapters did not learn")
        if plugins.has_infer(self.pack_name):  # the adapters on their base, from the checkpoint and from the export
            self._infer_from_checkpoint_and_export(work, straight)
        killed = self._killed_and_resumed(work, tiny_run, "lora-killed", *self.lora_overrides)
        if _losses(killed) != _losses(straight):
            _fail("lora", "mmcore_train", f"resumed LoRA losses {_losses(killed)} differ from uninterrupted {_losses(straight)}")


def _load_adapter_in_its_library(base: Path, adapter: Path) -> dict[str, Any]:
    """Load the adapter folder on ``base`` as its ecosystem does; the adapter tensors the library
    holds afterwards (peft's saved names), required to equal the files' exactly."""
    import torch
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file

    from mmcore.framework.registry import import_object

    base_class = import_object(_named_class(base))
    if (adapter / "adapter_config.json").is_file():
        model = PeftModel.from_pretrained(base_class.from_pretrained(base), str(adapter))
        held = get_peft_model_state_dict(model)
        saved = load_file(str(adapter / "adapter_model.safetensors"))
    else:
        pipe = base_class.from_pretrained(base)
        if hasattr(pipe, "load_lora_weights"):
            pipe.load_lora_weights(str(adapter))
        else:  # a pipeline without a LoRA loader: its denoiser's own
            pipe.transformer.load_lora_adapter(str(adapter), prefix="transformer", weight_name="pytorch_lora_weights.safetensors")
        held = {f"transformer.{k}": v for k, v in get_peft_model_state_dict(pipe.transformer, adapter_name=pipe.transformer.active_adapters()[0]).items()}
        saved = load_file(str(adapter / "pytorch_lora_weights.safetensors"))
    if set(held) != set(saved):
        _fail("lora", "mmcore_export", f"the library loaded other adapter tensors than the export holds: {sorted(set(held) ^ set(saved))[:3]}")
    differing = [k for k in saved if not torch.equal(held[k].to(saved[k].dtype), saved[k])]
    if differing:
        _fail("lora", "mmcore_export", f"the library holds {differing[0]} other than the export wrote")
    return saved


def _named_class(folder: Path) -> str:
    """``"transformers:Arch"`` or ``"diffusers:Pipeline"`` as the exported folder names itself."""
    if (folder / "model_index.json").is_file():
        return "diffusers:" + json.loads((folder / "model_index.json").read_text())["_class_name"]
    if (folder / "config.json").is_file():
        names = json.loads((folder / "config.json").read_text()).get("architectures") or []
        return f"transformers:{names[0]}" if names else ""
    return ""


def _device_here(device: str) -> bool:
    """Whether kernels for ``device`` can run in this process (reference and cpu always can)."""
    if device == "cpu":
        return True
    try:
        import torch

        if device == "cuda":
            return torch.cuda.is_available()
        return bool(getattr(torch, device, None) and getattr(torch, device).is_available())
    except Exception:
        return False


__all__ = ["PackConformance"]
