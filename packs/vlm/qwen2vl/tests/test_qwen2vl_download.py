"""Download: init presets, local folders (hashed, so edits rerun the pipeline), hub ids offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def test_local_directory_is_used_in_place_and_hashed(mm, tiny_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    local = tmp_path / "my-model"
    shutil.copytree(tiny_dir, local)
    mm("convert", "--pack", "qwen2vl", "--preset", "tiny", "--model", str(local), "--run-dir", "r", check=False)
    mm("download", "--pack", "qwen2vl", "--preset", "tiny", "--model", str(local), "--run-dir", "r")
    manifest = json.loads((tmp_path / "r/download/manifest.json").read_text())
    assert manifest["outputs"]["model"] == str(local) and str(local) in manifest["inputs"]
    proc = mm("download", "--pack", "qwen2vl", "--preset", "tiny", "--model", str(local), "--run-dir", "r")
    assert "up to date" in proc.stdout
    config = json.loads((local / "config.json").read_text())
    config["text_config"]["rms_norm_eps"] = 1e-5
    (local / "config.json").write_text(json.dumps(config))
    proc = mm("download", "--pack", "qwen2vl", "--preset", "tiny", "--model", str(local), "--run-dir", "r")
    assert f"input changed: {local}" in proc.stdout


def test_hub_id_offline_without_cache_is_one_clear_line(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mm("download", "--pack", "qwen2vl", "--model", "Qwen/Qwen2-VL-2B-Instruct", "--offline", check=False, HF_HOME=str(tmp_path / "empty-hf-home"), HF_HUB_OFFLINE="1")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: Qwen/Qwen2-VL-2B-Instruct: not in the local hub cache, and offline mode is on (--offline or run.offline) (hint: download it once online, or point --model at a local directory)"
    )


def test_an_unreachable_hub_is_said_as_such_not_as_offline_mode(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 42: with no network the error said "offline mode is on", which nobody had set."""
    from mmcore.run.launch import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there: refused at once
    proc = mm("download", "--pack", "qwen2vl", "--model", "Qwen/Qwen2-VL-2B-Instruct", check=False, HF_HOME=str(tmp_path / "empty-hf-home"), HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0")
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"error: Qwen/Qwen2-VL-2B-Instruct: the hub at {endpoint} could not be reached (ConnectError: "), line
    assert (
        line.endswith("and the model is not in the local hub cache (hint: check the network or proxy (HTTPS_PROXY, HF_ENDPOINT), or point --model at a local directory)")
        and "offline mode" not in line
        and "\n" not in line
    ), line


def test_a_gated_repository_says_what_to_do(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A hub that answers as huggingface.co does for a gated model (403, X-Error-Code: GatedRepo),
    served here on loopback: the error says to accept the terms and set HF_TOKEN."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Gated(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = b'{"error": "Access to model org/gated is restricted."}'
            self.send_response(403)
            self.send_header("X-Error-Code", "GatedRepo")
            self.send_header("X-Error-Message", "Access to model org/gated is restricted.")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gated)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = mm(
            "download",
            "--pack",
            "qwen2vl",
            "--model",
            "org/gated",
            check=False,
            HF_HOME=str(tmp_path / "empty-hf-home"),
            HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}",
            HF_HUB_OFFLINE="0",
        )
    finally:
        server.shutdown()
    assert proc.returncode == 1 and proc.stderr.strip() == ("error: org/gated: a gated repository: accept its terms on its hub page with your account, and set HF_TOKEN to a token of that account"), (
        proc.stderr
    )


def test_bad_sources_are_named(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "empty").mkdir()
    proc = mm("download", "--pack", "qwen2vl", "--model", str(tmp_path / "empty"), check=False)
    assert proc.returncode == 1 and "no .safetensors files in the model directory" in proc.stderr
    proc = mm("download", "--pack", "qwen2vl", "--model", "init:huge", check=False)
    assert proc.returncode == 1 and "init:huge: unknown tiny preset; choose one of tiny, tiny-2.5, demo" in proc.stderr
    proc = mm("download", "--pack", "qwen2vl", "--model", "not a model", check=False)
    assert "neither an existing directory, init:<preset>, nor a hub id" in proc.stderr
