"""The run directory: one sub-directory per stage, each finished by an atomic manifest.

``runs/<name>/``
    ``run.json``         which pack/preset/config made the run (a run directory belongs to one pack)
    ``config.yaml``      the resolved config the stages read (workers of a distributed stage too)
    ``<stage>/``         the stage's outputs
    ``<stage>/.started.json``  present while the stage runs or after it died
    ``<stage>/manifest.json``  written last, atomically: the stage is finished

A stage without ``manifest.json`` is unfinished; its outputs are never handed to a later stage.
A finished stage that must run again is moved aside to ``.<stage>.replaced`` until its
replacement has finished, so a failed or killed rerun loses nothing; asked for again with the
config that made it, it comes back instead of running again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mmcore.errors import UsageError
from mmcore.framework.files import atomic_write_json, fsync_dir, iter_files, sha256_file, sha256_tree, stat_key

MANIFEST = "manifest.json"
STARTED = ".started.json"
MANIFEST_FORMAT = 1


@dataclass
class Manifest:
    """A finished (or declined) stage: what it read, what it made, with which config and versions."""

    pack: str
    stage: str
    status: str  # "finished" or "declined"
    plan: str  # hash of config slice + upstream fingerprints + versions, known before running
    fingerprint: str  # plan + content hashes of the inputs the stage read and the files it wrote; what later stages depend on
    config: dict[str, Any] = field(default_factory=dict)
    upstream: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    #: output name -> {file relative to the output: [size, sha256]}, recorded when the stage finished
    output_files: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    started_at: float = 0.0
    finished_at: float = 0.0
    format: int = MANIFEST_FORMAT
    stage_dir: Path | None = field(default=None, repr=False, compare=False)

    @property
    def duration_s(self) -> float:
        return round(self.finished_at - self.started_at, 3)

    def output(self, name: str) -> Path:
        """Absolute path of output ``name``."""
        try:
            value = self.outputs[name]
        except KeyError:
            raise UsageError(f"stage {self.stage!r} recorded no output {name!r} (it has: {', '.join(self.outputs) or 'none'})") from None
        path = Path(value)
        return path if path.is_absolute() or self.stage_dir is None else self.stage_dir / path

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("stage_dir")
        data["duration_s"] = self.duration_s
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], stage_dir: Path | None = None) -> "Manifest":
        data = dict(data)
        data.pop("duration_s", None)
        known = set(cls.__dataclass_fields__) - {"stage_dir"}
        return cls(**{k: v for k, v in data.items() if k in known}, stage_dir=stage_dir)


def hash_inputs(paths: list[str]) -> dict[str, dict[str, Any]]:
    return {path: {"sha256": sha256_tree(Path(path)), "stat": stat_key(Path(path))} for path in sorted(set(paths))}


def changed_inputs(manifest: Manifest) -> list[str]:
    """Recorded inputs that no longer exist or whose content changed (stat first, hash if needed)."""
    changed = []
    for path, record in manifest.inputs.items():
        p = Path(path)
        if not p.exists():
            changed.append(path)
        elif stat_key(p) != record.get("stat") and sha256_tree(p) != record.get("sha256"):
            changed.append(path)
    return changed


def missing_outputs(manifest: Manifest) -> list[str]:
    return [name for name in manifest.outputs if not manifest.output(name).exists()]


#: Files up to this size are hashed on every cheap check (configs, indexes, DCP's ``.metadata``).
SMALL_FILE_BYTES = 1 << 20


def _output_root(manifest: Manifest, name: str) -> Path:
    return manifest.output(name).resolve()  # train's ``checkpoints/latest`` is a link


def hash_outputs(manifest: Manifest) -> dict[str, dict[str, list[Any]]]:
    """Size and sha256 of every file of every output the stage wrote into the run directory,
    as it left them. An output elsewhere (download's local model folder or hub snapshot) is
    not the run's: it is hashed once already, as an input or by the download."""
    recorded: dict[str, dict[str, list[Any]]] = {}
    own = manifest.stage_dir.resolve() if manifest.stage_dir is not None else None
    for name in manifest.outputs:
        root = _output_root(manifest, name)
        if not root.exists() or own is None or not root.is_relative_to(own):
            continue
        recorded[name] = {(file.relative_to(root).as_posix() if root.is_dir() else "."): [file.stat().st_size, sha256_file(file)] for file in iter_files(root)}
    return recorded


def output_problems(manifest: Manifest, *, full: bool = False) -> list[str]:
    """Recorded output files that are gone, resized, or (small files; every file with ``full``)
    whose content changed since the stage finished: truncation and tampering, found before a
    later stage reads them. Files added since are not looked at: nothing reads them."""
    problems = []
    for name, files in manifest.output_files.items():
        root = _output_root(manifest, name)
        for rel, (size, digest) in files.items():
            file = root if rel == "." else root / rel
            if not file.is_file():
                problems.append(f"{file}: missing")
                continue
            now = file.stat().st_size
            if now != size:
                problems.append(f"{file}: {now} bytes, {size} when stage {manifest.stage!r} finished")
            elif (full or size <= SMALL_FILE_BYTES) and sha256_file(file) != digest:
                problems.append(f"{file}: content changed since stage {manifest.stage!r} finished")
    return problems


class RunDir:
    def __init__(self, root: str | os.PathLike[str], folders: dict[str, str] | None = None) -> None:
        self.root = Path(root).absolute()
        self._lock_handle: Any = None
        #: stage -> its folder where not the stage's name (``mmcore eval --data``'s own results)
        self.folders = dict(folders or {})

    def stage_dir(self, stage: str) -> Path:
        return self.root / self.folders.get(stage, stage)

    # ---------------------------------------------------------------- manifests
    def read_manifest(self, stage: str) -> Manifest | None:
        manifest, problem = self.load_manifest(stage)
        if problem:  # written atomically, so this is a hand edit; the stage counts as unfinished
            print(f"warning: {problem}; the stage counts as unfinished")
        return manifest

    def load_manifest(self, stage: str) -> tuple[Manifest | None, str | None]:
        """(the stage's manifest or None, why a manifest that is there cannot be read or None)."""
        path = self.stage_dir(stage) / MANIFEST
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return Manifest.from_json(data, stage_dir=self.stage_dir(stage)), None
        except FileNotFoundError:
            return None, None
        except (ValueError, TypeError) as exc:
            return None, f"{path}: unreadable manifest ({type(exc).__name__}: {exc})"

    def write_manifest(self, manifest: Manifest) -> None:
        atomic_write_json(self.stage_dir(manifest.stage) / MANIFEST, manifest.to_json())

    def drop_manifest(self, stage: str) -> None:
        try:
            (self.stage_dir(stage) / MANIFEST).unlink()
        except FileNotFoundError:
            pass

    # ---------------------------------------------------------------- started markers
    def read_started(self, stage: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.stage_dir(stage) / STARTED).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None

    def mark_started(self, stage: str, plan: str, resuming: bool = False) -> None:
        atomic_write_json(self.stage_dir(stage) / STARTED, {"plan": plan, "started_at": time.time(), "pid": os.getpid(), "resuming": resuming})

    def clear_started(self, stage: str) -> None:
        try:
            (self.stage_dir(stage) / STARTED).unlink()
        except FileNotFoundError:
            pass

    def replaced_dir(self, stage: str) -> Path:
        return self.root / f".{self.folders.get(stage, stage)}.replaced"

    def start_afresh(self, stage: str) -> None:
        """Empty the stage's directory for a new attempt without losing finished work: a
        directory holding a finished (or declined) stage is moved aside to ``.<stage>.replaced``
        and deleted only once its replacement has finished (:meth:`finish_replacing`); the
        leftovers of an unfinished attempt are deleted."""
        folder = self.stage_dir(stage)
        aside = self.replaced_dir(stage)
        if (folder / MANIFEST).is_file():
            shutil.rmtree(aside, ignore_errors=True)  # older than the finished work now set aside
            os.replace(folder, aside)
            fsync_dir(self.root)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)

    def finish_replacing(self, stage: str) -> None:
        shutil.rmtree(self.replaced_dir(stage), ignore_errors=True)

    def restore_replaced(self, stage: str, plan: str) -> bool:
        """Put back the finished stage a rerun set aside and did not replace (it failed or was
        killed), when it is what ``plan`` asks for again (the config went back to it) and the
        rerun was of another config (a forced rerun of this one resumes instead); the rerun's
        unfinished leftovers are deleted. True when restored."""
        started = self.read_started(stage)
        if started is not None and started.get("plan") == plan:
            return False
        aside = self.replaced_dir(stage)
        try:
            set_aside = json.loads((aside / MANIFEST).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return False
        if not isinstance(set_aside, dict) or set_aside.get("plan") != plan:
            return False
        folder = self.stage_dir(stage)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(aside, folder)
        fsync_dir(self.root)
        return True

    # ---------------------------------------------------------------- run metadata
    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def run_json_path(self) -> Path:
        return self.root / "run.json"

    def read_run_json(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.run_json_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None

    # ---------------------------------------------------------------- locking
    def lock(self) -> None:
        """Hold the run directory's lock for the life of this process (:mod:`mmcore.run.lock`)."""
        from mmcore.run.lock import lock_run

        self._lock_handle = lock_run(self.root)
