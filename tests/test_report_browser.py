"""The evaluate stage's report.html as a person sees it: opened in a real browser (headless
Chromium), every picture decoded and every player able to play, for a VLM, an audio and a video
pack; and still so when the run's folder is copied elsewhere (the page points inside itself).

Skipped where no Chromium is installed (Debian: ``apt-get install chromium``; ``.ci/run`` does).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mmcore.testing.browser import DevTools, chromium

pytestmark = [pytest.mark.slow, pytest.mark.skipif(chromium() is None, reason="no chromium on PATH (apt-get install chromium): report.html is not opened in a browser")]

# The cheapest runs that reach evaluate with held-out items (one training step each: the
# report, not the model, is under test).
RUNS = {
    "vlm": ["--pack", "qwen2vl", "--preset", "tiny", "data.demo_samples=16", "evaluate.limit=3"],
    "audio": ["--pack", "whisper", "--preset", "tiny", "data.demo_samples=16", "evaluate.limit=3"],
    # a caption with markup: shown as text, never as HTML
    "video": ["--pack", "wan", "--preset", "tiny", "data.demo_samples=8", 'export.sample_prompts=["a red square moves right", "a <b>blue</b> square & co"]'],
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each run's evaluate folder, copied away from its run: what a user mails or archives."""
    from mmcore.testing import StageCLI

    root = tmp_path_factory.mktemp("reports")
    mm = StageCLI(root)
    copies = {}
    for name, args in RUNS.items():
        mm("run", *args, "training.steps=1", "--run-dir", f"{name}-run")
        copies[name] = Path(shutil.copytree(root / f"{name}-run/evaluate", root / "copied" / name))
        shutil.rmtree(root / f"{name}-run")  # nothing may point back into the run
    return copies


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    with DevTools(chromium()) as tools:  # type: ignore[arg-type]
        yield tools


def rows(folder: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def test_vlm_report_shows_each_held_out_picture_beside_the_users_question(reports, browser) -> None:  # type: ignore[no-untyped-def]
    page = reports["vlm"] / "report.html"
    seen = browser.media_report(page)
    assert seen["title"] == "vlm-run"  # the run's name, not a path
    items = rows(reports["vlm"])
    pictures = [m for m in seen["media"] if m["tag"] == "img"]
    assert len(pictures) == len(items) > 0
    assert all(p["naturalWidth"] > 0 and p["naturalHeight"] > 0 for p in pictures), pictures  # decoded, not a broken-image icon
    text = page.read_text()
    assert all(r["prompt"].startswith("What colour is the") and r["prompt"] in text for r in items)  # the user's words ...
    assert "<|im_start|>" not in text and "&lt;|im_start|&gt;" not in text and "\nassistant" not in text  # ... not the chat template
    assert "pack: <b>qwen2vl</b>" in text and "<details><summary>config</summary>" in text and "cutoff_len: 256" in text


def test_audio_report_plays_each_held_out_clip(reports, browser) -> None:  # type: ignore[no-untyped-def]
    seen = browser.media_report(reports["audio"] / "report.html")
    players = [m for m in seen["media"] if m["tag"] == "audio"]
    assert len(players) == len(rows(reports["audio"])) > 0
    assert all(p["error"] is None and p["readyState"] >= 2 and p["duration"] > 0 for p in players), players  # decoded audio, not just a file


def test_video_report_plays_each_generated_sample(reports, browser) -> None:  # type: ignore[no-untyped-def]
    page = reports["video"] / "report.html"
    seen = browser.media_report(page)
    videos = [m for m in seen["media"] if m["tag"] == "video"]
    assert len(videos) == 2
    # the sample mp4 (H.264) decodes in Chromium: a first frame of the sample's size
    assert all(v["error"] is None and v["readyState"] >= 2 and v["videoWidth"] == 32 for v in videos), videos
    assert all(m["naturalWidth"] > 0 for m in seen["media"] if m["tag"] == "img")  # the contact sheet
    text = page.read_text()
    assert "a &lt;b&gt;blue&lt;/b&gt; square &amp; co" in text and "<b>blue</b>" not in text
    assert "data: <b>export.sample_prompts</b>" in text


def test_odd_file_names_still_load_and_markup_in_the_data_stays_text(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Media named as users name them (spaces, '#', '<'), a prompt with markup: the files are
    kept beside the report and found, the text shown as text (no second browser run needed)."""
    import wave

    import numpy as np
    from PIL import Image

    from mmcore.data.video import write_mp4
    from mmcore.engines.report import keep_media, write_results

    data = tmp_path / "data"
    data.mkdir()
    Image.new("RGB", (8, 6), "red").save(data / "a b#1 <x>.png")
    write_mp4(data / "clip 1.mp4", np.zeros((4, 16, 16, 3), dtype=np.uint8), 4)
    with wave.open(str(data / "tone?.wav"), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(8000)
        out.writeframes(np.zeros(4000, dtype=np.int16).tobytes())
    report = tmp_path / "evaluate"
    media = keep_media(report, sorted(data.iterdir()))
    rows = [{"item": "x.json:0", "prompt": "<script>document.title='pwned'</script>What is <b>this</b>?", "media": media}]
    write_results(report, rows, {"items": 1}, title="a <title>", columns=("item", "prompt"))
    seen = browser.media_report(report / "report.html")
    assert seen["title"] == "a <title>"  # the script did not run
    assert sorted(m["tag"] for m in seen["media"]) == ["audio", "img", "video"]
    assert all(m.get("naturalWidth", 1) > 0 and not m.get("error") for m in seen["media"]), seen
    assert "&lt;script&gt;" in (report / "report.html").read_text()
