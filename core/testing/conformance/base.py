"""What every conformance rule shares: the pack's settings, the shared tiny run, helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest


def _fail(rule: str, hook: str, message: str) -> None:
    pytest.fail(f"[{rule}] {hook}: {message}", pytrace=False)


#: The SDK minor each later rule came with (the others are 1.0's). A pack declares the SDK it was
#: written for (``PackSpec(sdk=...)``); a minor only adds, so a pack written before a rule
#: existed takes no part in its feature and is not failed by it: the rule skips, saying why.
RULE_SINCE = {"evaluate": "1.5", "infer": "1.5", "lora": "1.6", "mixed data": "1.16", "conditioning": "1.19", "global rng": "1.19", "two processes": "1.19", "conditions": "1.20"}

#: Rules a stage of the shared tiny run checks itself (what its one-line error starts with):
#: a failure there is reported under that rule, not as the pipeline's.
STAGE_RULES = {"export: diffusers.DiffusionPipeline.from_pretrained cannot load": ("export", "mmcore_export"), "global rng: ": ("global rng", "mmcore_train")}


def _predates(entry: Any, rule: str) -> bool:
    """Whether the pack's declared SDK predates ``rule``."""
    since, declared = RULE_SINCE[rule], entry.spec.sdk
    minor = lambda version: tuple(int(part) for part in version.split("."))  # noqa: E731
    try:
        return minor(declared) < minor(since)
    except ValueError:
        return False  # not MAJOR.MINOR: `mmcore list` reports the pack broken; every rule applies


def _takes_part(entry: Any, rule: str) -> None:
    """Skip ``rule`` for a pack whose declared SDK predates it."""
    if _predates(entry, rule):
        since = RULE_SINCE[rule]
        pytest.skip(f"[{rule}] came with SDK {since}; the pack declares SDK {entry.spec.sdk}: declare PackSpec(sdk={since!r}) or later to take part")


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


class ConformanceBase:
    """The settings a pack's conformance class sets, and the runs its rules share."""

    #: The pack under test (its entry-point name).
    pack_name: ClassVar[str] = ""
    #: The preset of the shared run: small enough to run every stage in seconds on a CPU.
    preset: ClassVar[str] = "tiny"
    #: Overrides of the shared run (``key=value``). Checkpoints every step, so resume is tested.
    overrides: ClassVar[tuple[str, ...]] = ()
    #: ``"library:Class"`` whose ``from_pretrained`` loads the export's ``model`` output (or
    #: ``"module:function"`` that loads it, for an export no hub library reads). Default: the
    #: class the export names itself (``config.json`` architectures, ``model_index.json``). The
    #: LoRA rule loads the adapter on it where the class the base names is in no library.
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
        return cls._shared_run(work)

    @classmethod
    def _shared_run(cls, work: Path) -> Path:
        """The tiny run in ``work/tiny``; training checks the global-RNG rule on it
        (:data:`mmcore.train.guards.CHECK_GLOBAL_RNG`), and a stage's own rule
        (:data:`STAGE_RULES`) fails it under that rule's name."""
        from mmcore.errors import MmcoreError
        from mmcore.framework.plugins import Plugins
        from mmcore.train.guards import CHECK_GLOBAL_RNG

        saved = os.environ.get(CHECK_GLOBAL_RNG)
        try:
            os.environ[CHECK_GLOBAL_RNG] = "0" if _predates(Plugins.load().pack(cls.pack_name), "global rng") else "1"
            cls._runner(work / "tiny").run_pipeline(resume="no")
        except MmcoreError as exc:
            line = exc.one_line()
            for start, (rule, hook) in STAGE_RULES.items():
                if line.startswith(start):
                    _fail(rule, hook, line.partition(": ")[2])
            _fail("pipeline", "mmcore run", f"the {cls.preset} preset did not run end to end: error: {line}")
        finally:
            if saved is None:
                os.environ.pop(CHECK_GLOBAL_RNG, None)
            else:
                os.environ[CHECK_GLOBAL_RNG] = saved
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


def _load_adapter_in_its_library(base: Path, adapter: Path, base_class: str | None = None) -> dict[str, Any]:
    """Load the adapter folder on ``base`` as its ecosystem does; the adapter tensors the library
    holds afterwards (peft's saved names), required to equal the files' exactly. ``base_class``:
    the conformance class's ``export_class``, the base's loader where the class the folder names
    is in no library (a pack's own model class)."""
    import torch
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file

    base_class = _base_class(base, base_class)
    if (adapter / "adapter_config.json").is_file():
        model = PeftModel.from_pretrained(base_class.from_pretrained(base), str(adapter))
        held = get_peft_model_state_dict(model)
        saved = _as_peft_reads(model, load_file(str(adapter / "adapter_model.safetensors")))
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


def _base_class(base: Path, export_class: str | None) -> Any:
    """The class the folder names, or where that does not import ``export_class`` (with a ``from_pretrained``)."""
    from mmcore.framework.registry import import_object

    try:
        return import_object(_named_class(base))
    except Exception:
        own = import_object(export_class) if export_class else None
        if own is None or not hasattr(own, "from_pretrained"):
            raise
        return own


def _as_peft_reads(model: Any, saved: dict[str, Any]) -> dict[str, Any]:
    """The file's adapter tensors under the names peft loads them as: with transformers 5 it
    applies the family's conversion mapping to adapter keys too (hub names -> model names)."""
    try:
        from peft.utils.transformers_weight_conversion import convert_peft_adapter_state_dict_for_transformers
    except ImportError:  # a peft without transformers 5 conversions reads the names as written
        return saved
    return convert_peft_adapter_state_dict_for_transformers(model=model, peft_config=model.peft_config["default"], adapter_state_dict=dict(saved))


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
