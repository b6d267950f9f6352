"""Open a page in headless Chromium and ask it what its media did, with the standard library only.

Chromium speaks the DevTools protocol over two pipes (``--remote-debugging-pipe``: it reads
commands from fd 3 and writes replies to fd 4, JSON messages ended by a NUL byte), so no
websocket client, chromedriver or network port is needed. :func:`media_report` loads a page
from a ``file://`` URL, makes every ``<img>``, ``<video>`` and ``<audio>`` load in full, and
returns what the browser says about each: decoded size, ``readyState``, ``error``.

The flags keep Chromium off the network (this machine has none: without them it keeps trying
to reach Google's services) and out of the user's profile (a fresh ``--user-data-dir``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

QUIET = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-file-access-from-files",
]

#: Waits for each medium to be decoded (``loadeddata``: its first frame or samples) or fail, at most ``limit`` ms.
PROBE = """(async (limit) => {
  while (document.readyState !== 'complete') await new Promise(r => setTimeout(r, 20));
  const settle = (el, ok, events) => new Promise(resolve => {
    if (ok()) return resolve();
    const done = () => resolve();
    for (const name of events) el.addEventListener(name, done, {once: true});
    setTimeout(done, limit);
  });
  const out = [];
  for (const img of document.images) {
    await settle(img, () => img.complete, ['load', 'error']);
    out.push({tag: 'img', src: img.getAttribute('src'), naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight});
  }
  for (const el of document.querySelectorAll('video, audio')) {
    el.preload = 'auto';
    if (el.readyState < 2 && !el.error) el.load();
    await settle(el, () => el.readyState >= 2 || el.error, ['loadeddata', 'error']);
    out.push({tag: el.tagName.toLowerCase(), src: el.getAttribute('src'), readyState: el.readyState, duration: el.duration,
              error: el.error ? el.error.code + ' ' + el.error.message : null, videoWidth: el.videoWidth || 0});
  }
  return {title: document.title, media: out};
})"""


def chromium() -> str | None:
    """The Chromium binary on PATH, if any."""
    return next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None)


class DevTools:
    """One headless Chromium, driven over its DevTools pipe."""

    def __init__(self, binary: str, timeout: float = 60) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="mmcore-chromium-")
        ours_in, theirs_out = os.pipe()  # chromium writes replies to its fd 4
        theirs_in, ours_out = os.pipe()  # and reads commands from its fd 3
        command = " ".join([binary, *QUIET, f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"])
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {command} 3<&{theirs_in} 4>&{theirs_out}"], pass_fds=(theirs_in, theirs_out), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(theirs_in)
        os.close(theirs_out)
        self.reader, self.writer = os.fdopen(ours_in, "rb"), os.fdopen(ours_out, "wb")
        self.next_id, self.buffer = 0, b""

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}, **({"sessionId": session} if session else {})}
        self.writer.write(json.dumps(message).encode() + b"\0")
        self.writer.flush()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            while b"\0" not in self.buffer:
                chunk = os.read(self.reader.fileno(), 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium closed its DevTools pipe (exit {self.proc.poll()})")
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\0", 1)
            reply = json.loads(line)
            if reply.get("id") == self.next_id:  # events and other replies are not waited for
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(f"chromium did not answer {method} in {self.timeout:.0f} s")

    def media_report(self, page: Path, limit_ms: int = 10000) -> dict[str, Any]:
        """``{"title", "media": [...]}`` of ``page`` as Chromium loaded it (see :data:`PROBE`)."""
        if not page.is_file():  # Chromium would show its error page, never this URL
            raise FileNotFoundError(page)
        url = page.absolute().as_uri()
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        deadline = time.monotonic() + self.timeout
        while self.call("Runtime.evaluate", {"expression": "location.href", "returnByValue": True}, session)["result"].get("value") != url:
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium did not open {url}")
            time.sleep(0.05)
        done = self.call("Runtime.evaluate", {"expression": f"{PROBE}({limit_ms})", "awaitPromise": True, "returnByValue": True}, session)
        if "exceptionDetails" in done:
            raise RuntimeError(f"the probe failed in {url}: {done['exceptionDetails']}")
        self.call("Target.closeTarget", {"targetId": target})
        return done["result"]["value"]

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.close()
        self.writer.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "DevTools":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def screenshot(binary: str, page: Path, out: Path, size: str = "1200,1400") -> None:
    """A PNG of ``page`` as Chromium draws it (to look at a report by eye)."""
    with tempfile.TemporaryDirectory(prefix="mmcore-chromium-") as profile:
        subprocess.run([binary, *QUIET, f"--user-data-dir={profile}", f"--screenshot={out}", f"--window-size={size}", page.absolute().as_uri()], check=True, capture_output=True, timeout=60)


__all__ = ["DevTools", "chromium", "screenshot"]
