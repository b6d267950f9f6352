"""A run directory is data, never authority: it cannot grant itself the running of checkpoint
code, and a model folder's links cannot carry files from elsewhere into the export."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


class Loads:
    """Reports whether the loaders would run checkpoint code in this stage."""

    from mmcore import PackSpec

    PACK = PackSpec(name="loads")

    from mmcore import hookimpl

    @hookimpl
    def mmcore_download(self, ctx):  # type: ignore[no-untyped-def]
        from mmcore import StageResult
        from mmcore.engines.download import remote_code

        (ctx.stage_dir / "model.json").write_text("{}")
        return StageResult(outputs={"model": "model.json"}, metrics=remote_code())


def test_a_run_directory_cannot_grant_trust_remote_code(tmp_path: Path) -> None:
    from mmcore.run.runner import Runner
    from mmcore.run.session import Request, open_session
    from mmcore.testing import make_runner, plugins_with

    plugins = plugins_with(Loads())
    make_runner(plugins, "loads", tmp_path / "r")
    config = yaml.safe_load((tmp_path / "r/config.yaml").read_text())
    config["model"]["trust_remote_code"] = True  # planted, or copied from someone else's run
    (tmp_path / "r/config.yaml").write_text(yaml.safe_dump(config))

    continued = open_session(plugins, Request(run_dir=str(tmp_path / "r")))
    assert continued.config.model.trust_remote_code is False
    runner = Runner(plugins, "loads", continued.config, continued.run_dir)
    assert runner.run_stage("download").metrics == {"trust_remote_code": False}

    granted = open_session(plugins, Request(run_dir=str(tmp_path / "r"), overrides=["model.trust_remote_code=true"]))
    assert granted.config.model.trust_remote_code is True
    (tmp_path / "mine.yaml").write_text("model:\n  trust_remote_code: true\n")
    assert open_session(plugins, Request(pack="loads", run_dir=str(tmp_path / "r"), config_file=str(tmp_path / "mine.yaml"))).config.model.trust_remote_code is True
    # a permission, not what the stage computes: granting it leaves the finished stage up to date
    opted = Runner(plugins, "loads", granted.config, granted.run_dir)
    assert opted.freshness("download", opted.plan("download", {}))[0]
    assert opted.run_stage("download", force=True).metrics == {"trust_remote_code": True}


def test_status_says_when_trust_remote_code_is_on(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cli("download", "--pack", "toy", "--run-dir", "r")
    config = yaml.safe_load((tmp_path / "r/config.yaml").read_text())
    config["model"]["trust_remote_code"] = True
    (tmp_path / "r/config.yaml").write_text(yaml.safe_dump(config))
    plain = cli("status", "--run-dir", "r").stdout
    assert "trust_remote_code" not in plain and "download    ok" in plain
    granted = cli("status", "--run-dir", "r", "model.trust_remote_code=true").stdout
    assert "model.trust_remote_code=true (given on this command line or in --config): code in the checkpoint may run" in granted
    assert "download    ok" in granted


def test_side_files_copy_links_inside_as_content_and_refuse_links_leading_out(tmp_path: Path) -> None:
    from mmcore.engines.convert import copy_side_files
    from mmcore.errors import StageError

    model = tmp_path / "model"
    (model / "shared").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "shared/tokenizer.json").write_text('{"tok": 1}')
    (model / "tokenizer.json").symlink_to("shared/tokenizer.json")
    copy_side_files(model, tmp_path / "out")
    assert (tmp_path / "out/tokenizer.json").read_text() == '{"tok": 1}' and not (tmp_path / "out/tokenizer.json").is_symlink()

    # a hub cache snapshot's files are links into the repository's blobs/: inside its cache folder
    repo = tmp_path / "hub/models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs/abc").write_text("{}")
    (repo / "snapshots/0123").mkdir(parents=True)
    (repo / "snapshots/0123/config.json").symlink_to("../../blobs/abc")
    copy_side_files(repo / "snapshots/0123", tmp_path / "out-hub")
    assert (tmp_path / "out-hub/config.json").read_text() == "{}"

    (tmp_path / "secret").write_text("a key")
    (model / "notes.txt").symlink_to(tmp_path / "secret")
    with pytest.raises(StageError, match=f"^{model / 'notes.txt'}: a link to {tmp_path / 'secret'}, outside the model folder"):
        copy_side_files(model, tmp_path / "out2")
    (model / "notes.txt").unlink()
    (model / "shared/more").symlink_to(tmp_path, target_is_directory=True)  # a folder link, one level down
    with pytest.raises(StageError, match="shared/more: a link to"):
        copy_side_files(model, tmp_path / "out3")
    assert not (tmp_path / "out2/notes.txt").exists()
