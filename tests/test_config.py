"""Config files, presets and overrides: precedence, and one clear line for every mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore_helpers import CLI
from mmcore.config import Layer, RunConfig, build_config, overrides_layer, parse_override, read_yaml
from mmcore.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_override_values_are_typed() -> None:
    assert parse_override("training.lr=1e-5") == (["training", "lr"], 1e-5)
    assert parse_override("data.datasets=[a.json, b.json]") == (["data", "datasets"], ["a.json", "b.json"])
    assert parse_override("training.max_grad_norm=null") == (["training", "max_grad_norm"], None)
    # globs as a user types them: YAML would read the leading * as an alias and fail
    assert parse_override("training.lora.target_modules=[*.q_proj, *.v_proj]") == (["training", "lora", "target_modules"], ["*.q_proj", "*.v_proj"])
    assert parse_override("training.freeze=*.mlp.*") == (["training", "freeze"], "*.mlp.*")
    with pytest.raises(ConfigError, match="not of the form"):
        parse_override("training.lr")


def test_precedence_defaults_preset_file_cli_overrides() -> None:
    cfg = build_config(
        RunConfig,
        [
            Layer("preset", {"training": {"lr": 1.0, "steps": 5}}),
            Layer("my.yaml", {"training": {"lr": 2.0}}),
            overrides_layer(["training.steps=7"]),
        ],
    )
    assert (cfg.training.lr, cfg.training.steps, cfg.training.warmup_steps) == (2.0, 7, 0)


def test_unknown_key_names_file_key_and_suggestion(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "my.yaml"
    path.write_text("training:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as info:
        build_config(RunConfig, [Layer(str(path), read_yaml(path))])
    assert str(info.value) == f"{path}: training.lrr: unknown key; did you mean 'training.lr'?"
    with pytest.raises(ConfigError, match=r"^command line: trainig: unknown key; did you mean 'training'\?$"):
        build_config(RunConfig, [overrides_layer(["trainig.lr=1"])])


def test_wrong_type_names_expected_type_and_value(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "my.yaml"
    path.write_text("training:\n  lr: fast\n  steps: -3\n")
    with pytest.raises(ConfigError) as info:
        build_config(RunConfig, [Layer(str(path), read_yaml(path))])
    lines = sorted(str(info.value).splitlines())
    assert len(lines) == 2
    assert lines[0].startswith(f"{path}: training.lr: Input should be a valid number") and lines[0].endswith("(got 'fast')")
    assert lines[1] == f"{path}: training.steps: Input should be greater than or equal to 0 (got -3)"


def test_missing_and_malformed_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="config file not found"):
        read_yaml(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+:\d+: invalid YAML"):
        read_yaml(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        read_yaml(listy)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--config", "absent.yaml"], "error: absent.yaml: config file not found"),
        (["training.lr=fast"], "error: command line: training.lr: Input should be a valid number"),
        (["training.bogus=1"], "error: command line: training.bogus: unknown key"),
        (["--preset", "huge"], "error: pack 'toy' has no preset 'huge'; its presets: tiny"),
    ],
)
def test_cli_bad_config_is_one_line_and_exit_2(cli: CLI, args: list[str], expected: str) -> None:
    proc = cli("train", "--pack", "toy", *args, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith(expected), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_debug_shows_the_traceback(cli: CLI) -> None:
    proc = cli("train", "--pack", "toy", "training.lr=fast", "--debug", check=False)
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_pack_config_class_extends_sections(cli: CLI, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cli("download", "--pack", "toy", "data.scale=2.5")
    assert "scale: 2.5" in (tmp_path / "runs" / "toy-tiny" / "config.yaml").read_text()


def test_every_tiny_preset_has_data_of_its_own() -> None:
    """The guide's promise: ``mmcore run --pack P --preset tiny`` runs every stage with no
    ``--data`` (the pack's demo data, which a user's ``--data`` replaces)."""
    import inspect

    from mmcore.framework.registry import import_object
    from mmcore.testing import make_config, plugins_with

    plugins = plugins_with(installed_packs=True)
    missing, checked = [], 0
    for name in sorted(n for n, e in plugins.packs.items() if e.ok and e.spec is not None):
        spec = plugins.pack(name).spec
        if not spec.config_class or not Path(inspect.getfile(import_object(spec.config_class))).resolve().is_relative_to(ROOT / "packs"):
            continue  # a test's toy pack another test put on this process's path
        for preset in (p for p in spec.presets if "tiny" in p):
            data = make_config(plugins, name, preset=preset).data
            if "preprocess" in plugins.implemented_stages(name) and not (getattr(data, "demo_samples", 0) or getattr(data, "datasets", None)):
                missing.append(f"{name}:{preset}")
            checked += 1
    assert checked >= 15 and not missing, f"tiny presets without data of their own (set data.demo_samples): {missing} ({checked} checked)"
