"""The pipeline rules: every stage, convert round trip, export loads, bad input, evaluate and infer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mmcore.framework.pack import STAGE_OUTPUTS, STAGES

from mmcore.testing.conformance.base import ConformanceBase, _Cli, _fail, _named_class, _takes_part


class StageRules(ConformanceBase):
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
        if export_class.startswith("diffusers:"):  # the generic loader users call on a pipeline folder
            from mmcore.errors import StageError
            from mmcore.kits.diffusion.export import load_pipeline

            try:
                load_pipeline(folder)
            except StageError as exc:
                _fail("export", "mmcore_export", str(exc).partition(": ")[2])
            return
        try:
            cls = import_object(export_class)
        except Exception as exc:  # a class its library does not have: one line, not a traceback
            _fail("export", "mmcore_export", f"{folder} names {export_class}, which does not import: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        try:
            if not hasattr(cls, "from_pretrained"):
                cls(folder)  # a pack's own loader: raises if the export does not load
                return
            if not export_class.startswith("transformers:"):
                cls.from_pretrained(folder)
                return
            _, info = cls.from_pretrained(folder, output_loading_info=True)
        except Exception as exc:
            _fail("export", "mmcore_export", f"{export_class} cannot load {folder}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        gaps = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if gaps:
            _fail("export", "mmcore_export", f"{export_class} loads {folder} with {gaps}")

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
            proc = _Cli(work)(
                "infer", "--run-dir", str(run), "--checkpoint", which, "--input", str(media / "requests.jsonl"), "--output", str(out), "generation.max_new_tokens=4", "generation.num_inference_steps=2"
            )
            rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
            if len(rows) != 2 or "error" in rows[0]:
                _fail("infer", "mmcore_infer", f"{run.name}, --checkpoint {which}: expected an answer and an error, got {rows or proc.stderr.strip()[-300:]}")
            if proc.returncode != 1 or "not found" not in rows[1].get("error", ""):
                _fail("infer", "mmcore_infer", f"a request with a missing file must be its own one-line error and exit 1; got exit {proc.returncode}, {rows[1]}")
            answers[which] = rows[0]
        if "text" in answers["latest"] and answers["latest"]["text"] != answers["export"].get("text"):
            _fail("infer", "mmcore_infer", f"{run.name}: greedy answers differ between the training checkpoint and the export: {answers}")
