"""The README's commands run as written: its "Using it" block, command by command, on the demo
(shortened by overrides on the lines that name the demo preset, so that every later line sees the
same config), with the README's own sample data file as ``held_out.json`` and its sample config
checked by ``mmcore config``. Offline, as every test: the hub is never asked."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: the demo in a few seconds: fewer samples and steps, no round-trip check, no held-out passes
SHORT_DEMO = "--preset demo data.demo_samples=40 training.steps=4 training.eval_every=0 training.checkpoint_every=0 convert.verify=false"


def block(after_heading: str, language: str) -> str:
    """The first ```language block after the heading ``after_heading``."""
    section = README.split(after_heading, 1)[1]
    match = re.search(rf"```{language}\n(.*?)```", section, flags=re.S)
    assert match, f"README: no {language} block after {after_heading!r}"
    return match.group(1)


def commands(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        line = re.split(r"\s{2,}#", line)[0].strip()  # the comments at the line ends
        if line:
            out.append(line)
    return out


def mmcore(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line)
    assert argv[0] == "mmcore", line
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MMCORE_HOME": str(cwd / "home"), "MMCORE_NO_ENVS": "1"}
    return subprocess.run([sys.executable, "-m", "mmcore", *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def write_readme_data(folder: Path) -> Path:
    """The README's sample data file, with the image it names drawn here."""
    from PIL import Image

    records = json.loads(block("## Your own data", "json"))
    for record in records:
        for name in record.get("images", []):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (64, 48), (200, 120, 40)).save(folder / name)
    path = folder / "held_out.json"
    path.write_text(json.dumps(records))
    return path


@pytest.fixture(scope="module")
def qwen2vl() -> None:
    from mmcore.framework.plugins import Plugins

    if "qwen2vl" not in Plugins.load().packs:
        pytest.skip("the qwen2vl pack is not installed (make install)")


def test_the_readme_config_example_is_a_valid_config(qwen2vl, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "my.yaml").write_text(block("## Your own data", "yaml"))
    result = mmcore("mmcore config --pack qwen2vl --config my.yaml", tmp_path)
    assert result.returncode == 0, result.stderr
    source = next(line for line in result.stdout.splitlines() if line.startswith("model.source:"))
    assert "[Qwen/Qwen2-VL-2B-Instruct, my.yaml]" in source, source
    nproc = next(line for line in result.stdout.splitlines() if line.startswith("parallel.nproc_per_node:"))
    assert "[8, my.yaml]" in nproc


def test_every_command_of_using_it_runs_as_written(qwen2vl, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lines = commands(block("## Using it", "bash"))
    assert lines and all(line.startswith("mmcore ") for line in lines), lines
    write_readme_data(tmp_path)
    outputs: dict[str, str] = {}
    for line in lines:
        command = line.split()[1]
        if command == "infer":  # the README's "any image of a coloured shape": one of the demo's own
            image = sorted((tmp_path / "runs/qwen2vl-demo/preprocess/demo-data/images").glob("*.png"))[0]
            (tmp_path / "shape.png").write_bytes(image.read_bytes())
        result = mmcore(line.replace("--preset demo", SHORT_DEMO), tmp_path)
        assert result.returncode == 0, f"{line}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        outputs[command] = result.stdout
    assert re.search(r"^qwen2vl\s", outputs["list"], flags=re.M)
    assert "presets:" in outputs["info"] and "freeze:" in outputs["info"]
    assert "best fitting layout: fsdp8" in outputs["plan"]
    assert outputs["config"].startswith("# pack qwen2vl, preset demo") and "training.steps: int = 100  [4, command line]" in outputs["config"]
    assert "held-out accuracy" in outputs["run"]
    run = tmp_path / "runs/qwen2vl-demo"
    for stage in ("download", "convert", "preprocess", "train", "export", "evaluate"):
        assert (run / stage / "manifest.json").is_file(), stage
    assert re.findall(r"^  (\w+)\s+ok\s", outputs["status"], flags=re.M) == ["download", "convert", "preprocess", "extract", "train", "export", "evaluate"], outputs["status"]
    assert "train       ok" in outputs["verify"] and "export      ok" in outputs["verify"]
    assert "infer" in outputs  # four steps teach nothing: its answer may be empty, so only the command is checked here
    # the README's own sample data, evaluated by the exported demo model: both samples read
    other = json.loads((run / "evaluate-held_out/metrics.json").read_text())
    assert other["items"] == 2, f"held_out.json's two samples were not all evaluated: {other}"
    # ... into its own folder: the run's own evaluation stays done
    status = mmcore(" ".join(lines[[line.split()[1] for line in lines].index("status")].split()).replace("--preset demo", SHORT_DEMO), tmp_path)
    assert re.search(r"^  evaluate\s+ok\s", status.stdout, flags=re.M), status.stdout
