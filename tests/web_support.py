"""Helpers for the web page's browser tests (issue 44): keys pressed,
waits on the chat's state, the page's weight, and the screenshots for
docs/WEB.md (written only when ``TURBOSPARK_WEB_SHOTS`` names a folder:
``TURBOSPARK_WEB_SHOTS=docs/web pytest tests/test_web_*.py``)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import httpx

from .chromium import LivePage

#: the page's first load: all its scripts and styles, uncompressed
MAX_PAGE_BYTES = 200 * 1024
CHAT = "turbospark.chat.state"


def enter(page: LivePage, shift: bool = False) -> None:
    page.key("Enter", "Enter", 13, "\r", modifiers=8 if shift else 0)


def escape(page: LivePage) -> None:
    page.key("Escape", "Escape", 27)


def tab_to(page: LivePage, element_id: str, limit: int = 60) -> None:
    """Tab (the keyboard only) until ``element_id`` has the focus, which it shows."""
    for _ in range(limit):
        if page.js("document.activeElement && document.activeElement.id") == element_id:
            outline = page.js("getComputedStyle(document.activeElement).outlineStyle")
            assert outline not in ("none", ""), f"#{element_id} has the focus but does not show it"
            return
        page.key("Tab", "Tab", 9)
    raise AssertionError(f"#{element_id} never got the focus by Tab")


def give_key(page: LivePage, key: str) -> None:
    """Answer the key dialog (opened by a 401) from the keyboard."""
    page.wait("document.getElementById('keyDialog').open && document.getElementById('keyInput').value === ''")
    page.wait("document.activeElement && document.activeElement.id === 'keyInput'")
    page.type(key)
    enter(page)
    page.wait(f"sessionStorage.getItem('turbospark-key') === {key!r}")


def idle(page: LivePage, timeout: float = 120) -> None:
    """The chat is done with its answer (stream over, numbers read)."""
    page.wait(f"{CHAT}.busy === null", timeout=timeout)


def send(page: LivePage, text: str) -> None:
    """Type into the message box and press Enter."""
    before = page.js(f"{CHAT}.entries.length")
    page.js("document.getElementById('c-input').focus()")
    page.type(text)
    enter(page)
    page.wait(f"{CHAT}.entries.length > {before} || document.getElementById('banner').textContent !== ''")


def answer_js(n: int = -1) -> str:
    """JS for the chat's ``n``-th entry's Answer (from the end when negative)."""
    return f"{CHAT}.entries.at({n}).answer"


def page_weight(page: LivePage, base: str) -> int:
    """Bytes of every script and style the page loaded (as the server sends them: uncompressed)."""
    urls = {u for u in page.requested() if urlsplit(u).path.endswith((".js", ".css"))}
    assert urls, "the page loaded no script"
    return sum(len(httpx.get(u, timeout=10).content) for u in urls if u.startswith(base))


def foreign(page: LivePage, base: str) -> list[str]:
    """What the page asked for beyond its own server (data: URLs aside)."""
    return [u for u in page.requested() if not u.startswith(base) and not u.startswith(("data:", "about:"))]


def shot(page: LivePage, name: str) -> None:
    """A screenshot for the docs, when asked for."""
    folder = os.environ.get("TURBOSPARK_WEB_SHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        width, height = page.js("[window.innerWidth, window.innerHeight]")
        scale = 0.7 if width > 600 else 1  # (kept small for the repository)
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": scale}
        page.screenshot(os.path.join(folder, name + ".png"), clip=clip)
