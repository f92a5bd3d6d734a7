"""Headless Chromium for the dashboard tests: one-shot ``--dump-dom`` /
``--screenshot`` runs, and a live page driven over the DevTools protocol on
``--remote-debugging-pipe`` (fds 3 and 4, NUL-separated JSON), so a test
can watch the page update in real time. No extra Python dependency.

Chromium missing is a FAILURE, not a skip: ``.ci/run`` installs it."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("chromium is not installed (apt-get install -y chromium; .ci/run does this)")


def run_once(url: str, *args: str, timeout: float = 120) -> str:
    """One headless run (``--dump-dom`` and/or ``--screenshot=...``); stdout."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


class LivePage:
    """A page in a headless Chromium, controlled over the DevTools pipe."""

    def __init__(self, url: str, width: int = 1400, height: int = 900) -> None:
        self._profile = tempfile.mkdtemp(prefix="turbospark-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire() -> None:  # in the child, before exec: the pipe on fds 3 and 4
            # (via fds >= 10 first, in case either end already is 3 or 4)
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [
                chromium(),
                *FLAGS,
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            pass_fds=(3, 4),
            preexec_fn=wire,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            page=True,
        )
        self.call("Page.navigate", {"url": url}, page=True)

    def call(self, method: str, params: dict[str, Any] | None = None, page: bool = False) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if page:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise AssertionError("chromium closed the DevTools pipe")
                self._buf += chunk
            raw, _, self._buf = self._buf.partition(b"\0")
            reply = json.loads(raw)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]
        raise AssertionError(f"{method}: no reply")

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, page=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        error = None
        while time.monotonic() < deadline:
            try:
                value = self.js(expression)
            except AssertionError as exc:  # e.g. the page is still loading
                error, value = exc, None
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"the page never satisfied: {expression} (last error: {error})")

    def screenshot(self, path: str) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, page=True)["data"])
        with open(path, "wb") as f:
            f.write(data)
        return data

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._to_child)
        os.close(self._from_child)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> LivePage:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
