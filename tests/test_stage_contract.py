"""The stage contract: declared stages, the outputs each stage must record, the SDK version,
and convert's key coverage. Each break fails at its own stage, naming the pack and the rule,
with the traceback in the stage's error.log."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore import PackSpec, Stage, StageResult, hookimpl
from mmcore.errors import PackError
from mmcore.framework.stages import ContractError
from mmcore.testing import make_runner, plugins_with


def declared(name: str, convert: Stage | str, **spec: object) -> PackSpec:
    return PackSpec(name=name, stages={"download": "contract_stages:download", "convert": convert}, **spec)  # type: ignore[arg-type]


def run_convert(pack: PackSpec, run: Path) -> None:
    runner = make_runner(plugins_with(pack), pack.name, run)
    runner.run_stage("download")
    runner.run_stage("convert")


def test_a_declared_stage_runs_with_its_bound_parts_and_options(tmp_path: Path) -> None:
    pack = declared("bound", Stage("contract_stages:convert_bound", parts={"source": "contract_stages:SOURCE"}, options={"suffix": "-x"}))
    plugins = plugins_with(pack)
    assert plugins.implemented_stages("bound") == ["download", "convert"]
    run_convert(pack, tmp_path / "run")
    from mmcore.run.rundir import RunDir

    manifest = RunDir(tmp_path / "run").read_manifest("convert")
    assert manifest.metrics == {"source": "bound part"}
    assert manifest.output("checkpoint") == tmp_path / "run/convert/dcp-x"


@pytest.mark.parametrize(
    ("function", "rule"),
    [
        ("contract_stages:convert_misnamed", "convert records output 'checkpoint'"),
        ("contract_stages:convert_dict", "return type"),
        ("contract_stages:convert_missing_path", "output 'checkpoint' exists"),
    ],
)
def test_a_broken_stage_fails_where_it_breaks_naming_pack_and_rule_with_error_log(tmp_path: Path, function: str, rule: str) -> None:
    with pytest.raises(ContractError) as caught:
        run_convert(declared("broken", function), tmp_path / "run")
    message = caught.value.one_line()
    assert "pack 'broken' broke the stage contract at convert" in message and rule in message, message
    log = tmp_path / "run/convert/error.log"
    assert log.is_file() and "ContractError" in log.read_text()
    assert str(log) in message


def test_the_cli_reports_a_contract_break_in_one_line_with_exit_1(tmp_path: Path) -> None:
    """A misnamed output used to pass convert and fail train with exit 2, as a user error."""
    import subprocess
    import sys

    (tmp_path / "brokenpack.py").write_text(
        "from mmcore import PackSpec\npack = PackSpec(name='brokenpack', stages={'download': 'contract_stages:download', 'convert': 'contract_stages:convert_misnamed'})\n"
    )
    code = (
        "import sys, brokenpack; from mmcore.cli.commands import main; from mmcore import plugins\n"
        "real = plugins.Plugins.load\n"
        "plugins.Plugins.load = classmethod(lambda cls, **kw: real(extra_packs=[('brokenpack', brokenpack.pack)], installed_packs=False))\n"
        "sys.exit(main(['run', '--pack', 'brokenpack', '--run-dir', 'r']))\n"
    )
    env = {"PYTHONPATH": f"{tmp_path}{':'}{Path(__file__).parent}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "(convert records output 'checkpoint')" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "r/convert/error.log").is_file()


def test_a_stage_both_declared_and_hooked_is_refused() -> None:
    class Both:
        PACK = declared("both", "contract_stages:convert_bound")

        @hookimpl
        def mmcore_convert(self, ctx, upstream):  # type: ignore[no-untyped-def]
            return StageResult()

    with pytest.raises(PackError, match="'convert' is both declared in PACK.stages and implemented as mmcore_convert"):
        plugins_with(Both())


def test_declarations_that_cannot_work_are_refused_when_the_spec_is_made() -> None:
    with pytest.raises(ValueError, match="'trian' is not a stage"):
        PackSpec(name="x", stages={"trian": "m:f"})
    with pytest.raises(ValueError, match="'m.f' is not a 'module:attr' import path"):
        PackSpec(name="x", stages={"train": "m.f"})


@pytest.mark.parametrize(("sdk", "reason"), [("2.0", "major versions differ"), ("1.99", "upgrade mmcore"), ("one", "not MAJOR.MINOR")])
def test_a_pack_for_an_incompatible_sdk_is_listed_as_broken_with_the_reason(sdk: str, reason: str) -> None:
    from mmcore.framework.plugins import Plugins

    world = Plugins.load(extra_packs=[("future", PackSpec(name="future", sdk=sdk, stages={"download": "contract_stages:download"}))], installed_packs=False)
    assert not world.packs["future"].ok
    assert reason in (world.packs["future"].error or "")
    with pytest.raises(PackError, match="broken"):
        world.pack("future")


def test_a_declared_stage_that_does_not_import_fails_its_stage_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="declared stage imports.*contract_stages:no_such_function"):
        run_convert(declared("missing", "contract_stages:no_such_function"), tmp_path / "run")


# --------------------------------------------------------------------------- key coverage


def tied_model(tie: bool):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.lm_head = nn.Linear(4, 10, bias=False)
            if tie:
                self.lm_head.weight = self.embed.weight
            self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    with torch.device("meta"):
        return LM()


def test_coverage_understands_tied_weights_and_names_every_gap() -> None:
    import torch

    from mmcore.engines.convert import TensorInfo, coverage_problems, expected_tensors

    expected, aliases = expected_tensors(tied_model(tie=True))
    assert set(expected) == {"embed.weight", "steps"} and aliases == {"lm_head.weight": "embed.weight"}
    hub = {"embed.weight": TensorInfo((10, 4), torch.bfloat16), "steps": TensorInfo((), torch.int64)}
    assert coverage_problems(hub, expected, aliases) == []  # bf16 hub weights load into fp32 training weights

    expected, aliases = expected_tensors(tied_model(tie=False))
    problems = coverage_problems(hub, expected, aliases)
    assert problems == ["lm_head.weight: the model has it, the converted checkpoint does not: an adapter rule drops or misnames it"]
    wrong = {**hub, "lm_head.weight": TensorInfo((10, 5), torch.float32), "head.weight": TensorInfo((1,), torch.float32), "steps": TensorInfo((), torch.float32)}
    problems = coverage_problems(wrong, expected, aliases)
    assert "head.weight: converted but the model has no such tensor" in problems[0]
    assert "lm_head.weight: shape (10, 5) in the checkpoint, (10, 4) in the model" in problems
    assert "steps: dtype torch.float32 in the checkpoint, torch.int64 in the model" in problems


# --------------------------------------------------------------------------- the SDK


def test_every_name_the_sdk_lists_exists_and_importing_it_needs_no_torch() -> None:
    import importlib
    import json
    import subprocess
    import sys

    from mmcore.sdk import SURFACE

    from mmcore.sdk import LEGACY_SURFACE

    for module, names in [*SURFACE.items(), *LEGACY_SURFACE.items()]:
        missing = sorted(n for n in names if not hasattr(importlib.import_module(module), n))
        assert not missing, f"{module} lacks {missing}"
    # a façade's name is the object its SDK 1.x path gave (one object, two paths)
    for module, names in LEGACY_SURFACE.items():
        for name in names:
            old = getattr(importlib.import_module(module), name)
            assert any(getattr(importlib.import_module(f), name, None) is old for f, listed in SURFACE.items() if name in listed), f"{module}.{name} has no façade"
    code = "import json, sys, importlib; from mmcore.sdk import SURFACE; [importlib.import_module(m) for m in SURFACE]; print(json.dumps('torch' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) is False  # packs import SDK modules at their top level


def test_imports_outside_the_sdk_are_named_with_file_and_line(tmp_path: Path) -> None:
    from mmcore.sdk import imports_outside_sdk

    (tmp_path / "stage.py").write_text("from mmcore.train import run_training\nfrom mmcore.run.runner import Runner\nfrom mmcore.engines import _secret\nimport mmcore.run.launch\n")
    assert imports_outside_sdk(tmp_path) == [
        "stage.py:2: module mmcore.run.runner is not part of the mmcore SDK",
        "stage.py:3: mmcore.engines._secret is not part of the mmcore SDK",
        "stage.py:4: module mmcore.run.launch is not part of the mmcore SDK",
    ]
