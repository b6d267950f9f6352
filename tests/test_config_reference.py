"""``mmcore config`` and docs/configuration.md: every key documented, the document never stale."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def mmcore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mmcore", *args], capture_output=True, text=True, timeout=120)


def repository_pack_classes() -> dict:  # type: ignore[type-arg]
    """The installed packs' config classes that this repository holds (not a test's toy pack,
    which another test may have put on this process's path)."""
    from mmcore.config.reference import installed_pack_classes

    return {name: cls for name, cls in installed_pack_classes().items() if Path(inspect.getfile(cls)).resolve().is_relative_to(ROOT / "packs")}


def test_docs_configuration_md_is_what_mmcore_config_prints() -> None:
    from mmcore.config.reference import render_markdown

    classes = repository_pack_classes()
    if not {"qwen2vl", "wan", "whisper"} <= set(classes):
        pytest.skip("the repository's packs are not installed (make install)")
    expected = "\n".join(render_markdown(classes)) + "\n"
    assert (ROOT / "docs/configuration.md").read_text() == expected, "docs/configuration.md is stale: regenerate it with `mmcore config --markdown > docs/configuration.md`"


def test_every_key_of_the_core_and_the_packs_says_what_it_does() -> None:
    from mmcore.config import RunConfig
    from mmcore.config.reference import keys

    missing = [k.path for k in keys(RunConfig) if not k.description]
    for name, cls in repository_pack_classes().items():
        missing += [f"{name}: {k.path}" for k in keys(cls) if not k.description]
    assert not missing, f"config keys without a description: {missing}"


def test_a_pack_preset_and_override_show_their_values_and_who_set_them() -> None:
    result = mmcore("config", "--pack", "qwen2vl", "--preset", "demo", "training", "training.warmup_steps=3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# pack qwen2vl, preset demo")
    lr = next(line for line in lines if line.startswith("training.lr:"))
    assert lr.startswith("training.lr: float = 0.0001") and "preset demo" in lr, lr
    warmup = next(line for line in lines if line.startswith("training.warmup_steps:"))
    assert warmup.endswith("[3, command line]"), warmup
    assert not any(line.startswith("parallel.") for line in lines), "KEY training shows the training section only"
    described = lines[lines.index(lr) + 1]
    assert described.startswith("    ") and "learning rate" in described


def test_an_unknown_key_is_one_line_with_the_close_one() -> None:
    result = mmcore("config", "trainig.lr")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: trainig.lr: no such config key or section; did you mean 'training.lr'? (hint: mmcore config lists every key)"]
    result = mmcore("config", "--preset", "demo")
    assert result.returncode == 2 and "need --pack" in result.stderr
