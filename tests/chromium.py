"""Headless Chromium for the web page's tests: one-shot ``--dump-dom`` /
``--screenshot`` runs, and a live page driven over the DevTools protocol on
``--remote-debugging-pipe`` (fds 3 and 4, NUL-separated JSON), so a test
can watch the page update in real time, press keys, and see what the page
did: its requests, script errors and dialogs (each dialog dismissed at
once), from the protocol's events. No extra Python dependency.

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
from collections.abc import Callable
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

    def __init__(self, url: str, width: int = 1400, height: int = 900, mobile: bool = False) -> None:
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
        #: every DevTools event seen so far (``{"method", "params"}``)
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
            page=True,
        )
        for domain in ("Page", "Runtime", "Network"):
            self.call(f"{domain}.enable", page=True)
        self.call("Page.bringToFront", page=True)  # (a background tab gets no animation frames)
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
            if "method" in reply:
                self._event(reply)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]
        raise AssertionError(f"{method}: no reply")

    def _event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event["method"] == "Page.javascriptDialogOpening":  # (a dialog blocks the page: dismissed)
            msg = {"id": 0, "method": "Page.handleJavaScriptDialog", "params": {"accept": False}}
            os.write(self._to_child, json.dumps({**msg, "sessionId": event.get("sessionId")}).encode() + b"\0")

    def seen(self, method: str) -> list[dict[str, Any]]:
        """The params of the events of ``method`` seen so far."""
        return [e["params"] for e in self.events if e["method"] == method]

    def requested(self) -> list[str]:
        """Every URL the page asked for (documents, scripts, fetches, images)."""
        return [p["request"]["url"] for p in self.seen("Network.requestWillBeSent")]

    def errors(self) -> list[Any]:
        """Uncaught script errors and console errors (CSP refusals among them)."""
        thrown = [p["exceptionDetails"] for p in self.seen("Runtime.exceptionThrown")]
        logged = [p for p in self.seen("Runtime.consoleAPICalled") if p.get("type") == "error"]
        return thrown + logged

    def key(self, key: str, code: str, vk: int, text: str = "", modifiers: int = 0) -> None:
        """A real key press (down, up) sent to the focused element; ``modifiers``: 8 = Shift."""
        base = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "modifiers": modifiers}
        self.call("Input.dispatchKeyEvent", {"type": "keyDown", **base, "text": text}, page=True)
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", **base}, page=True)

    def type(self, text: str) -> None:
        self.call("Input.insertText", {"text": text}, page=True)

    def choose_files(self, paths: list[str], press: Callable[[], None], timeout: float = 30) -> None:
        """Answer the file chooser that ``press`` (a person's key or click:
        a chooser needs one) opens with ``paths``, as a person's file dialog
        does (the input's ``change`` event fires)."""
        self.call("Page.setInterceptFileChooserDialog", {"enabled": True}, page=True)
        before = len(self.seen("Page.fileChooserOpened"))
        press()
        deadline = time.monotonic() + timeout
        while len(self.seen("Page.fileChooserOpened")) == before:  # (events come with replies)
            assert time.monotonic() < deadline, "no file chooser opened"
            self.js("0")
            time.sleep(0.05)
        chooser = self.seen("Page.fileChooserOpened")[-1]
        self.call("DOM.setFileInputFiles", {"files": paths, "backendNodeId": chooser["backendNodeId"]}, page=True)

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, page=True)

    def js(self, expression: str, wait: bool = False) -> Any:
        """``expression``'s value (``wait``: the value its promise resolves to)."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": wait}
        result = self.call("Runtime.evaluate", params, page=True)
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

    def screenshot(self, path: str, **params: Any) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png", **params}, page=True)["data"])
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
