"""The conformance suite fails the breaks it exists for, each naming its rule: a misnamed output,
a dict for a StageResult, an adapter rule that drops a tensor, torch imported by the entry point,
a misspelled hook. Each broken pack is the whisper pack with one thing changed, pip-installed as
its own distribution, and the suite is run on it as a pack author runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmcore_helpers import pip_install_target, write_pack_project

pytest.importorskip("mm_pack_whisper", reason="the broken packs borrow the whisper pack's parts")

SPEC = """
from mmcore import PackSpec, Stage, StageResult
{extra}
PACK = PackSpec(
    name="{name}", category="audio", sdk="1.0", config_class="mm_pack_whisper.config:WhisperConfig",
    presets={{"tiny": {{"model": {{"source": "init:tiny"}}, "data": {{"demo_samples": 8}}, "training": {{"steps": 3}}}}}},
    default_preset="tiny",
    stages={{
        "download": Stage("mmcore.engines.download:download_stage", parts={{"build_init": "mm_pack_whisper.tiny:build_init_checkpoint"}}),
        "convert": {convert},
        "preprocess": {preprocess},
        "train": Stage("mmcore.train.loop:train_stage", parts={{"recipe": "mm_pack_whisper.model:recipe"}}),
    }},
)

def convert_misnamed(ctx, upstream):
    from mmcore.engines.convert import convert_stage
    from mm_pack_whisper.adapter import ADAPTER
    from mm_pack_whisper.model import build_model

    result = convert_stage(ctx, upstream, adapter=ADAPTER, build_model=build_model)
    return StageResult(outputs={{"ckpt": result.outputs["checkpoint"]}})

def preprocess_dict(ctx, upstream):
    from mm_pack_whisper.preprocess import preprocess

    return vars(preprocess(ctx, upstream))

from mmcore.engines.convert import RenameAdapter
DROPS_FINAL_NORM = RenameAdapter(rules=[], tied=["proj_out.weight"], ignore=[r"model\\.decoder\\.layer_norm\\."])
"""

CONVERT = 'Stage("mmcore.engines.convert:convert_stage", parts={{"adapter": "{adapter}", "build_model": "mm_pack_whisper.model:build_model"}})'
GOOD_CONVERT = CONVERT.format(adapter="mm_pack_whisper.adapter:ADAPTER")
GOOD_PREPROCESS = '"mm_pack_whisper.preprocess:preprocess"'

BROKEN = {
    "misnamed": dict(convert='"mm_pack_misnamed:convert_misnamed"', preprocess=GOOD_PREPROCESS, extra=""),
    "dictresult": dict(convert=GOOD_CONVERT, preprocess='"mm_pack_dictresult:preprocess_dict"', extra=""),
    "dropsrule": dict(convert=CONVERT.format(adapter="mm_pack_dropsrule:DROPS_FINAL_NORM"), preprocess=GOOD_PREPROCESS, extra=""),
    "importstorch": dict(convert=GOOD_CONVERT, preprocess=GOOD_PREPROCESS, extra="import torch  # at import: what `mmcore list` must not pay for\n"),
    "typo": dict(convert=GOOD_CONVERT, preprocess=GOOD_PREPROCESS, extra="def mmcore_trian(ctx, upstream):\n    return None\n"),
}

# (pack, the conformance check to run, what its failure must say)
EXPECTED = [
    ("misnamed", "every_stage", "[pipeline] mmcore run: the tiny preset did not run end to end: error: pack 'misnamed' broke the stage contract at convert (convert records output 'checkpoint')"),
    ("dictresult", "every_stage", "broke the stage contract at preprocess (return type): returned dict, not mmcore.StageResult"),
    (
        "dropsrule",
        "every_stage",
        "the converted checkpoint would not fit the training model: model.decoder.layer_norm.bias: the model has it, the converted checkpoint does not: an adapter rule drops or misnames it",
    ),
    ("importstorch", "entry_point", "[import] entry point: importing the importstorch entry point imports torch"),
    ("typo", "spec_is", "unknown hook 'mmcore_trian' (did you mean 'mmcore_train'?)"),
]


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("broken-projects")
    projects = [write_pack_project(root, f"mm-pack-{name}", f"mm_pack_{name}", SPEC.format(name=name, **parts), {name: f"mm_pack_{name}"}) for name, parts in BROKEN.items()]
    target = tmp_path_factory.mktemp("broken-site")
    pip_install_target(projects, target)
    return target


@pytest.fixture(scope="module")
def outcomes(broken_site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    """The suite run once over all the broken packs: (pack, check) -> what pytest reported."""
    import xml.etree.ElementTree as ET

    folder = tmp_path_factory.mktemp("conformance-of-broken-packs")
    classes = [f"class Test_{name}(PackConformance):\n    pack_name = {name!r}\n" for name in BROKEN]
    (folder / "test_broken.py").write_text("from mmcore.testing.conformance import PackConformance\n\n\n" + "\n\n".join(classes))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
    env["MMCORE_HOME"] = str(folder / "home")
    env["PYTHONPATH"] = os.pathsep.join([str(broken_site), *(p for p in sys.path if p)])
    checks = " or ".join(sorted({check for _, check, _ in EXPECTED}))
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", checks, "--junitxml=report.xml", "test_broken.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    found: dict[tuple[str, str], str] = {}
    for case in ET.parse(folder / "report.xml").iter("testcase"):
        pack = case.get("classname", "").rpartition("Test_")[2]
        for outcome in (*case.iter("failure"), *case.iter("error")):
            found[(pack, case.get("name", ""))] = (outcome.get("message") or "") + (outcome.text or "")
    return found


@pytest.mark.parametrize(("pack", "check", "message"), EXPECTED, ids=[e[0] for e in EXPECTED])
def test_conformance_fails_the_break_naming_its_rule(outcomes: dict[tuple[str, str], str], pack: str, check: str, message: str) -> None:
    reports = [text for (name, test), text in outcomes.items() if name == pack and check in test]
    assert reports, f"the {check} check did not fail for {pack}: {sorted(outcomes)}"
    assert any(message in text for text in reports), reports


def test_the_lora_rule_loads_the_base_through_export_class_only_where_no_library_has_the_named_class(tmp_path: Path) -> None:
    """A pack's own model class (no transformers class of the name the base's config gives)
    loads the LoRA rule's base through ``export_class``; a base whose named class imports keeps
    it, and a loader function (no ``from_pretrained``) is not taken for a class."""
    import json

    import transformers

    from mmcore.testing.conformance.base import _base_class

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"]}))
    assert _base_class(tmp_path, "transformers:LlamaForCausalLM") is transformers.LlamaForCausalLM
    with pytest.raises(Exception, match="NoSuchModelForCausalLM"):
        _base_class(tmp_path, "json:loads")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert _base_class(tmp_path, "transformers:GPT2LMHeadModel") is transformers.LlamaForCausalLM
