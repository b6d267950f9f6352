"""The malformed-input corpus, part 1: command line, config, run directory, file system.

Each case is what a user might type or leave behind; each must end in one ``error:`` line with
the exact message and exit code below (2: fix the command or config; 1: the work failed), no
traceback, and nothing earlier lost. The packs' corpora cover checkpoints, datasets and media
(``packs/*/tests/test_*_malformed.py``); RELIABILITY.md lists them all.
"""

from __future__ import annotations

import errno
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from mmcore_helpers import CLI
from mmcore import PackSpec, StageResult, hookimpl
from mmcore.errors import MmcoreError
from mmcore.testing import make_runner, plugins_with


@dataclass
class Case:
    name: str
    args: Callable[[Path, Path], list[str]]  # (tmp_path, line_data) -> command line
    code: int
    message: str  # must appear in the single error line


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _foreign_dir(tmp: Path) -> Path:
    _write(tmp / "notes" / "thesis.tex", "precious")
    return tmp / "notes"


def _other_pack_run(tmp: Path) -> Path:
    _write(tmp / "other-run" / "run.json", json.dumps({"pack": "qwen2vl", "preset": "demo"}))
    _write(tmp / "other-run" / "train" / "manifest.json", "{}")
    return tmp / "other-run"


CASES = [
    Case("unknown pack", lambda t, d: ["run", "--pack", "nosuch"], 2, "unknown pack 'nosuch'; installed packs:"),
    Case("unknown preset", lambda t, d: ["run", "--pack", "toy", "--preset", "huge"], 2, "pack 'toy' has no preset 'huge'; its presets: tiny"),
    Case("override without =", lambda t, d: ["run", "--pack", "toy", "training.lr"], 2, "override 'training.lr' is not of the form section.key=value"),
    Case("misspelt key", lambda t, d: ["run", "--pack", "toy", "training.lrr=1"], 2, "training.lrr: unknown key; did you mean 'training.lr'?"),
    Case("wrong type", lambda t, d: ["run", "--pack", "toy", "training.steps=many"], 2, "training.steps: Input should be a valid integer"),
    Case("out of range", lambda t, d: ["run", "--pack", "toy", "training.steps=-1"], 2, "training.steps: Input should be greater than or equal to 0 (got -1)"),
    Case("grad norm negative", lambda t, d: ["run", "--pack", "toy", "training.max_grad_norm=-1"], 2, "training.max_grad_norm: Input should be greater than 0 (got -1)"),
    Case("lr infinite", lambda t, d: ["run", "--pack", "toy", "training.lr=inf"], 2, "training.lr: Input should be a finite number (got inf)"),
    Case("steps not whole", lambda t, d: ["run", "--pack", "toy", "training.steps=1e12"], 2, "training.steps: Input should be a valid integer (got 1000000000000.0)"),
    Case("steps past the bound", lambda t, d: ["run", "--pack", "toy", "training.steps=200000000"], 2, "training.steps: Input should be less than or equal to 100000000 (got 200000000)"),
    Case("seed past 64 bits", lambda t, d: ["run", "--pack", "toy", "run.seed=99999999999999999999999"], 2, "run.seed: 99999999999999999999999 does not fit in 64 bits"),
    Case("on_nonfinite unknown", lambda t, d: ["run", "--pack", "toy", "training.on_nonfinite=ignore"], 2, "training.on_nonfinite: Input should be 'stop' or 'skip' (got 'ignore')"),
    Case(
        "config nested 2000 deep",
        lambda t, d: ["run", "--pack", "toy", "--config", str(_write(t / "deep.yaml", "training: " + "{a: " * 2000 + "1" + "}" * 2000 + "\n"))],
        2,
        "deep.yaml: nested deeper than 32 levels",
    ),
    Case("override nested 2000 deep", lambda t, d: ["run", "--pack", "toy", "a" + ".a" * 2000 + "=1"], 2, "a.a.a...: nested deeper than 32 levels"),
    Case("new-pack of an installed name", lambda t, d: ["new-pack", "toy", "--category", "vlm", "--dir", str(t)], 2, "pack name 'toy' is taken: mm-pack-toy is installed and provides it"),
    Case("config file missing", lambda t, d: ["run", "--pack", "toy", "--config", str(t / "nope.yaml")], 2, "nope.yaml: config file not found"),
    Case("config not YAML", lambda t, d: ["run", "--pack", "toy", "--config", str(_write(t / "bad.yaml", "training: [1, 2\n"))], 2, "bad.yaml"),
    Case("config a list", lambda t, d: ["run", "--pack", "toy", "--config", str(_write(t / "list.yaml", "- 1\n- 2\n"))], 2, "list.yaml"),
    Case("run.name a path", lambda t, d: ["run", "--pack", "toy", "run.name=/etc"], 2, "run.name '/etc' must be a plain name"),
    Case("run.name climbing", lambda t, d: ["run", "--pack", "toy", "run.name=../../x"], 2, "run.name '../../x' must be a plain name"),
    Case("unknown device", lambda t, d: ["run", "--pack", "toy", "--device", "tpu"], 2, "unknown device 'tpu'; known devices:"),
    Case("run dir is a file", lambda t, d: ["run", "--pack", "toy", "--run-dir", str(_write(t / "afile", "x"))], 2, "is a file, not a directory"),
    Case("run dir a system dir", lambda t, d: ["run", "--pack", "toy", "--run-dir", "/usr"], 2, "/usr is a system directory, not a place for a run"),
    Case("run dir foreign", lambda t, d: ["run", "--pack", "toy", "--run-dir", str(_foreign_dir(t))], 2, "is not empty and is not an mmcore run directory (no run.json; it holds 'thesis.tex')"),
    Case("run dir of another pack", lambda t, d: ["run", "--pack", "toy", "--run-dir", str(_other_pack_run(t))], 2, "is a run of pack 'qwen2vl', not 'toy'; nothing was changed"),
    Case(
        "run.json hand-edited",
        lambda t, d: ["run", "--pack", "toy", "--run-dir", str(_write(t / "edited" / "run.json", "{pack: toy").parent)],
        2,
        "run.json: unreadable (not the JSON mmcore writes); nothing was changed",
    ),
    Case("dataset is a directory", lambda t, d: ["run", "--pack", "toy", "--data", str(t)], 1, "stage 'preprocess' of pack 'toy' failed: IsADirectoryError"),
    Case("stage before its upstream", lambda t, d: ["train", "--pack", "toy", "--data", str(d)], 2, "stage 'download' has not finished"),
    Case("status without a pack", lambda t, d: ["status", "--run-dir", str(t / "nothing")], 2, "--pack is required"),
    Case("verify a non-run", lambda t, d: ["verify", "--run-dir", str(t)], 2, "not an mmcore run directory"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_command_lines_get_one_line_and_their_exit_code(cli: CLI, line_data: Path, tmp_path: Path, case: Case) -> None:
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    proc = cli(*case.args(tmp_path, line_data), check=False)
    assert proc.returncode == case.code, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and case.message in errors[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    for path, data in before.items():  # nothing the user had was changed or deleted
        if path.name not in ("run.json", ".lock"):
            assert path.exists() and path.read_bytes() == data, path


def test_another_pack_on_a_finished_run_changes_nothing(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "mine")
    files = {p: p.read_bytes() for p in (tmp_path / "mine").rglob("*") if p.is_file() and p.name != ".lock"}
    proc = cli("run", "--pack", "whisper", "--run-dir", "mine", check=False)
    assert proc.returncode == 2 and "is a run of pack 'toy'" in proc.stderr
    assert {p: p.read_bytes() for p in (tmp_path / "mine").rglob("*") if p.is_file() and p.name != ".lock"} == files


def test_a_rerun_that_fails_keeps_the_finished_stage_until_it_succeeds(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data))
    run = tmp_path / "runs" / "toy-tiny"
    finished = (run / "train" / "checkpoint.json").read_bytes()
    proc = cli("run", "--pack", "toy", "--data", str(line_data), "training.steps=9", check=False, TOY_DIE_AT_STEP="2")
    assert proc.returncode != 0
    assert (run / ".train.replaced" / "checkpoint.json").read_bytes() == finished  # set aside, not deleted
    cli("run", "--pack", "toy", "--data", str(line_data), "training.steps=9")
    assert not (run / ".train.replaced").exists()  # deleted once the replacement finished


def test_a_failed_rerun_then_the_old_config_gets_the_finished_stage_back(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data))
    run = tmp_path / "runs" / "toy-tiny"
    finished = (run / "train" / "checkpoint.json").read_bytes()
    proc = cli("run", "--pack", "toy", "--data", str(line_data), "training.steps=9", check=False, TOY_DIE_AT_STEP="2")
    assert proc.returncode != 0 and (run / ".train.replaced").is_dir()
    # Back to the config that finished: the set-aside stage is restored, not trained again.
    again = cli("run", "--pack", "toy", "--data", str(line_data))
    assert "[train] restored the finished run of this config" in again.stdout, again.stdout
    assert "[train] skipped: up to date" in again.stdout
    assert (run / "train" / "checkpoint.json").read_bytes() == finished and not (run / ".train.replaced").exists()
    assert cli("verify", "--run-dir", str(run)).returncode == 0


def test_tampered_output_is_found_before_a_later_stage_reads_it(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data))
    run = tmp_path / "runs" / "toy-tiny"
    weights = run / "download" / "weights.json"
    weights.write_text(weights.read_text().replace("0.0", "9.9", 1).ljust(len(weights.read_text())))
    proc = cli("verify", "--run-dir", str(run), check=False)
    assert proc.returncode == 1 and "download    FAILED" in proc.stdout and "content changed since stage 'download' finished" in proc.stdout
    proc = cli("train", "--pack", "toy", "--data", str(line_data), "--force", check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"error: the output of stage 'download' changed after it finished: {weights.resolve()}: content changed" in proc.stderr
    proc = cli("run", "--pack", "toy", "--data", str(line_data))  # `run` rebuilds what changed
    assert "[download] running (output changed:" in proc.stdout
    assert "ok" in cli("verify", "--run-dir", str(run)).stdout


def test_verify_fails_on_a_manifest_that_is_not_json(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data))
    run = tmp_path / "runs" / "toy-tiny"
    (run / "train" / "manifest.json").write_text("garbage, not JSON")
    proc = cli("verify", "--run-dir", str(run), check=False)
    assert proc.returncode == 1, proc.stdout
    assert f"train       FAILED {run.resolve() / 'train' / 'manifest.json'}: unreadable manifest (JSONDecodeError: " in proc.stdout, proc.stdout
    assert proc.stderr.strip().splitlines() == [f"error: 1 stage(s) of {run.resolve()} changed after finishing (hint: rerun them with --force (or `mmcore run`))"]


def test_the_free_space_refusal_shows_small_sizes_and_names_the_reserve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmcore.framework.files import ensure_free_space

    monkeypatch.setenv("MMCORE_MIN_FREE_BYTES", str(1 << 62))
    with pytest.raises(MmcoreError) as info:  # a tiny model's checkpoint used to read "needs about 0.00 GiB"
        ensure_free_space(tmp_path, 2978 * 1024, "a training checkpoint")
    assert re.fullmatch(
        rf"a training checkpoint needs about 2.91 MiB in {tmp_path} plus 4 EiB kept free \(MMCORE_MIN_FREE_BYTES\), "
        r"and only [0-9.]+ [KMGT]?i?B are free \(hint: free disk space or point --run-dir at a larger disk\)",
        info.value.one_line(),
    ), info.value.one_line()


class WritesTo:
    """A stage writing where the test says: a full disk (/dev/full) is a real ENOSPC."""

    PACK = PackSpec(name="writer")

    def __init__(self, target: str) -> None:
        self.target = target

    @hookimpl
    def mmcore_download(self, ctx):
        with open(self.target, "wb") as handle:
            handle.write(b"weights" * 1000)
            handle.flush()
        return StageResult(outputs={"model": "."})


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_one_line_naming_the_stage_and_what_to_do(tmp_path: Path) -> None:
    runner = make_runner(plugins_with(WritesTo("/dev/full")), "writer", tmp_path / "run")
    with pytest.raises(MmcoreError) as info:
        runner.run_stage("download")
    line = info.value.one_line()
    assert line.startswith("stage 'download' of pack 'writer' could not write: No space left on device")
    assert "free disk space" in line and "the traceback is in" in line and "\n" not in line
    assert (tmp_path / "run" / "download" / "error.log").read_text().count("Traceback") == 1
    assert info.value.__cause__ is not None and info.value.__cause__.errno == errno.ENOSPC  # type: ignore[attr-defined]


class SavesCheckpoint:
    """A stage saving a DCP checkpoint whose data file is /dev/full: the disk fills mid-write."""

    PACK = PackSpec(name="saver")

    @hookimpl
    def mmcore_download(self, ctx):
        import torch
        import torch.distributed.checkpoint as dcp

        folder = ctx.stage_dir / "ckpt"
        folder.mkdir()
        (folder / "__0_0.distcp").symlink_to("/dev/full")
        dcp.save({"w": torch.zeros(4096)}, checkpoint_id=str(folder), no_dist=True)
        return StageResult(outputs={"model": "ckpt"})


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_disk_full_inside_a_checkpoint_save_is_one_line_naming_the_path_and_free_space(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    runner = make_runner(plugins_with(SavesCheckpoint()), "saver", tmp_path / "run")
    with pytest.raises(MmcoreError) as info:  # torch's CheckpointException: a traceback per rank, flattened into its message
        # DCP's OSError names no file: the line names the stage's folder
        runner.run_stage("download")
    line = info.value.one_line()
    assert re.fullmatch(
        r"stage 'download' of pack 'saver' could not write: No space left on device \(\S+/run/download; [0-9.]+ [KMGT]?i?B free there\) "
        r"\(hint: free disk space .*; the traceback is in \S+/download/error.log\)",
        line,
    ), line
    assert "Traceback" in (tmp_path / "run/download/error.log").read_text()


def test_a_checkpoint_that_fails_to_write_gives_its_space_back(tmp_path: Path) -> None:
    from mmcore.checkpoint.training import commit_checkpoint
    from mmcore.framework.context import WorldInfo

    def write(partial: Path) -> None:  # a real ENOSPC after the first bytes landed
        partial.mkdir(parents=True)
        (partial / "big").write_bytes(b"x" * 4096)
        (partial / "data").symlink_to("/dev/full")
        with open(partial / "data", "wb") as handle:
            handle.write(b"weights" * 1000)
            handle.flush()

    with pytest.raises(OSError):
        commit_checkpoint(tmp_path, 3, WorldInfo(), write, {"step": 3})
    assert list(tmp_path.iterdir()) == []  # no step-00000003.incomplete holding the disk full


def test_a_stage_that_cannot_write_its_error_log_says_so(tmp_path: Path) -> None:
    class Breaks:
        PACK = PackSpec(name="breaks")

        @hookimpl
        def mmcore_download(self, ctx):
            shutil.rmtree(ctx.stage_dir)
            (ctx.stage_dir).write_text("a file where the stage directory was")
            raise RuntimeError("boom")

    runner = make_runner(plugins_with(Breaks()), "breaks", tmp_path / "run")
    with pytest.raises(MmcoreError) as info:
        runner.run_stage("download")
    assert re.fullmatch(r"stage 'download' of pack 'breaks' failed: RuntimeError: boom \(hint: no traceback saved: writing \S+ failed too \(Not a directory\)\)", info.value.one_line())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, r"config\.json: missing \(a folder holds config\.json\)$"),
        ('{"hidden_size": 8,}', r"config\.json: not JSON \(Expecting property name enclosed in double quotes at line 1\)$"),
        ("[1, 2]", r"config\.json: expected a JSON object, got list$"),
    ],
)
def test_a_released_config_that_is_not_a_json_object_is_one_line(tmp_path: Path, text: str | None, message: str) -> None:
    """A pack's own loader reads a released model's config files with ``mmcore.read_json_object``."""
    from mmcore import StageError, read_json_object

    path = tmp_path / "config.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(StageError, match=message):
        read_json_object(path, "a folder holds config.json")
    path.write_text('{"hidden_size": 8}')
    assert read_json_object(path, "a folder holds config.json") == {"hidden_size": 8}
