"""The web page's Chat against the scripted model (issue 44), for what a
real model cannot be made to say or do on cue: an answer of hostile HTML and
Markdown renders inert (no dialog, no script run, no request to another
origin: checked through the DevTools protocol); several answers at once with
arrows, all kept with the picked one and their numbers (a reload shows them
and the pick still changes); regenerate; an earlier message edited into a
new branch; the list by last use; reasoning streamed folded; a 200-turn conversation that opens and
scrolls. One server
(no keys: loopback), one browser."""

from __future__ import annotations

import time

import httpx
import pytest

from turbospark import ListObserver, Server

from .chromium import LivePage
from .fakes import Script, ScriptedModel
from .web_support import CHAT, answer_js, escape, foreign, idle, send, shot

HOSTILE = [
    "Look: <img src=x onerror=\"window.pwned='img'\"> and <script>window.pwned='script'</script> ",
    "[click me](javascript:window.pwned='link') <a href=\"javascript:window.pwned='a'\">raw link</a> ",
    '![a picture](http://evil.example/pic.png) <iframe src="http://evil.example/frame"></iframe> ',
    '<svg onload="window.pwned=\'svg\'"></svg> <a href="https://example.org/" onclick="window.pwned=\'click\'">ok</a> ',
    "[a fine link](https://example.org/)\n\n",
    "```html\n<b>code</b>\n```",
]
SCRIPTS = [
    Script(HOSTILE),
    Script(["First ", "choice."]),
    Script(["Second ", "choice."]),
    Script(["Regenerated ", "answer."]),
    Script(["Branch ", "answer."]),
    Script(["Later ", "answer."]),
    # several answers, stopped before their first piece, and after it (pieces slow and many enough that a
    # loaded machine's Esc still comes first: a stopped run ends at its next piece)
    *[Script(["Never ", "shown."], delay=2.0)] * 2,
    *[Script(["Cut "] + ["on "] * 40 + ["end."], delay=0.3)] * 2,
    Script(["<think>", "The user wants ", "a short ", "answer.", "</think>", "\n\nShort", " answer."]),
]


@pytest.fixture(scope="module")
def scripted_page(tmp_path_factory):
    model = ScriptedModel(scripts=list(SCRIPTS), vision=True)  # (it says it sees: the page offers images)
    srv = Server(models=[model], observer=ListObserver(), state_dir=str(tmp_path_factory.mktemp("state"))).start()
    try:
        with LivePage(srv.url + "/") as page:
            page.wait("!!document.querySelector('#c-model option')")
            yield srv, page
    finally:
        srv.stop()


def texts(srv, cid: str) -> list[tuple[str, str]]:
    r = httpx.get(f"{srv.url}/v1/conversations/{cid}/items?order=asc&limit=100", timeout=10)
    return [(i["role"], "".join(p.get("text", "") for p in i["content"])) for i in r.json()["data"]]


def picked(srv, cid: str, text: str) -> None:
    """The conversation's last item is the picked answer (written back by the page)."""
    deadline = time.monotonic() + 30
    while texts(srv, cid)[-1] != ("assistant", text) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert texts(srv, cid)[-2:] == [("user", "Give me two."), ("assistant", text)]


def test_hostile_output_renders_inert(scripted_page):
    srv, page = scripted_page
    assert page.js("document.getElementById('c-attach').hidden") is False  # a model that takes images
    send(page, "Say something nasty.")
    idle(page)
    body = f"{answer_js()}.body"
    assert page.js("window.pwned === undefined")
    assert not page.seen("Page.javascriptDialogOpening")
    assert not foreign(page, srv.url), foreign(page, srv.url)
    assert page.js(f"{body}.querySelectorAll('img, script, iframe, svg, object, embed, style').length") == 0
    hrefs = page.js(f"[...{body}.querySelectorAll('a')].map((a) => a.getAttribute('href'))")
    assert not any(h and h.lower().startswith("javascript") for h in hrefs), hrefs
    # the Markdown image and link are links (the image never loaded); raw HTML is text
    assert hrefs == [None, "http://evil.example/pic.png", "https://example.org/"], hrefs
    assert page.js(f"{body}.querySelector('a[href^=\"https\"]').rel") == "noopener noreferrer nofollow"
    assert page.js(
        f"[...{body}.querySelectorAll('*')].every((e) => ![...e.attributes].some((a) => a.name.startsWith('on')))"
    )
    shown = page.js(f"{body}.textContent")
    assert "<img src=x onerror=" in shown and "<script>" in shown  # what the model wrote, as text
    assert page.js(f"{body}.querySelector('pre code').textContent") == "<b>code</b>\n"
    # the link that was javascript: is left without a target: clicking it runs nothing
    page.js(f"[...{body}.querySelectorAll('a')].filter((a) => !a.getAttribute('href')).forEach((a) => a.click())")
    assert page.js("window.pwned === undefined") and not page.errors(), page.errors()


def test_several_answers_regenerate_and_a_branch(scripted_page):
    srv, page = scripted_page
    cid = page.js(f"{CHAT}.cid")
    page.js("document.getElementById('c-n').value = '2'")
    send(page, "Give me two.")
    idle(page)
    assert page.js(f"{answer_js()}.arrows.textContent") == "‹1 / 2›"
    assert page.js(f"{answer_js()}.body.textContent").strip() == "First choice."
    assert texts(srv, cid)[-2:] == [("user", "Give me two."), ("assistant", "First choice.")]
    rid, stats = page.js(f"{answer_js()}.requestId"), [page.js(f"{answer_js()}.stats.textContent")]
    page.js(f"{answer_js()}.arrows.querySelector('[aria-label=\"Next answer\"]').click()")
    page.wait(f"{answer_js()}.body.textContent.trim() === 'Second choice.'")
    stats.append(page.js(f"{answer_js()}.stats.textContent"))
    assert all(t.startswith("2 tokens · ") and t.endswith(f"request {rid}") for t in stats), stats
    picked(srv, cid, "Second choice.")
    shot(page, "choices")

    # a reload: both answers, the picked one shown, each with its numbers; the pick still changes
    page.navigate(f"{srv.url}/#/chat/{cid}")
    page.wait(f"{CHAT}.cid === '{cid}' && {CHAT}.entries.length === 4")
    assert page.js(f"{answer_js()}.arrows.textContent") == "‹2 / 2›"
    assert page.js(f"{answer_js()}.body.textContent").strip() == "Second choice."
    assert page.js(f"{answer_js()}.stats.textContent") == stats[1]
    page.js(f"{answer_js()}.arrows.querySelector('[aria-label=\"Previous answer\"]').click()")
    assert page.js(f"{answer_js()}.body.textContent").strip() == "First choice."
    assert page.js(f"{answer_js()}.stats.textContent") == stats[0]
    picked(srv, cid, "First choice.")

    page.js("document.getElementById('c-n').value = '1'")
    page.js(f"{answer_js()}.actions.querySelector('button').click()")  # Regenerate
    page.wait(f"{CHAT}.busy === null && {answer_js()}.body.textContent.trim() === 'Regenerated answer.'")
    assert [t for _, t in texts(srv, cid)][-2:] == ["Give me two.", "Regenerated answer."]
    assert len(texts(srv, cid)) == 4

    # edit the second message: a new conversation with the turn before it, then the edit and its answer
    page.js(f"{CHAT}.entries[2].node.querySelector('button').click()")  # Edit
    page.wait("document.activeElement && document.activeElement.classList.contains('edit')")
    page.js("document.activeElement.value = ''")
    page.type("An edited question.")
    page.key("Enter", "Enter", 13, "\r")
    page.wait(f"{CHAT}.cid !== '{cid}' && {CHAT}.busy === null && {answer_js()}.body.textContent.includes('Branch')")
    branch = page.js(f"{CHAT}.cid")
    assert [t for _, t in texts(srv, branch)][1:] == [texts(srv, cid)[1][1], "An edited question.", "Branch answer."]
    assert len(texts(srv, cid)) == 4  # the original is left as it was
    meta = httpx.get(f"{srv.url}/v1/conversations/{branch}", timeout=10).json()["metadata"]
    assert meta["branch_of"] == cid and meta["title"].endswith("(edit)")
    assert page.js("document.querySelectorAll('#c-list li').length") == 2

    # the list is by last use: a new turn in the original moves it to the top, here and after a reload
    first = "document.querySelector('#c-list li').dataset.id"
    assert page.js(first) == branch
    page.js(f"document.querySelector('#c-list li[data-id=\"{cid}\"] .open').click()")
    page.wait(f"{CHAT}.cid === '{cid}' && {CHAT}.entries.length === 4")
    send(page, "One more.")
    idle(page)
    assert page.js(first) == cid and texts(srv, cid)[-1] == ("assistant", "Later answer.")
    page.navigate(f"{srv.url}/#/chat/{cid}")
    page.wait("document.getElementById('c-list').dataset.loaded === '1'")
    assert page.js("[...document.querySelectorAll('#c-list li')].map((li) => li.dataset.id)") == [cid, branch]


def test_several_answers_stopped(scripted_page):
    """Stopped before any text: only the question is kept (no empty answer
    for later turns to read); stopped after some: every answer the stop cut
    is kept as cut, not only the one shown."""
    srv, page = scripted_page
    page.js("document.getElementById('c-new').click()")
    page.wait(f"{CHAT}.cid === null && {CHAT}.entries.length === 0")
    page.js("document.getElementById('c-n').value = '2'")
    try:
        send(page, "Two, but stop at once.")
        page.wait(f"{CHAT}.busy !== null && {CHAT}.cid !== null")
        escape(page)
        idle(page)
        cid = page.js(f"{CHAT}.cid")
        assert texts(srv, cid) == [("user", "Two, but stop at once.")]
        send(page, "Two, stop after a word.")
        page.wait(f"{answer_js()}.alts.every((a) => a.text.length > 0)")
        escape(page)
        idle(page)
        last = httpx.get(f"{srv.url}/v1/conversations/{cid}/items?order=desc&limit=1", timeout=10).json()["data"][0]
        assert [a["status"] for a in last["alternatives"]] == ["incomplete", "incomplete"], last
        assert all(a["content"][0]["text"].startswith("Cut ") for a in last["alternatives"]), last
    finally:
        page.js("document.getElementById('c-n').value = '1'")


def test_reasoning_streams_folded_and_comes_back_after_a_reload(scripted_page):
    """A model that thinks: its reasoning streams into a folded box, apart
    from the answer, and is kept with the turn (a reload shows it again)."""
    srv, page = scripted_page
    page.js("document.getElementById('c-new').click()")
    page.wait(f"{CHAT}.cid === null && {CHAT}.entries.length === 0")
    send(page, "Think first.")
    page.wait(f"{answer_js()}.reasoningBox.lastChild.textContent.length > 0")  # (seen while it streams)
    idle(page)
    box = f"{answer_js()}.reasoningBox"
    assert page.js(f"{box}.hidden") is False and page.js(f"{box}.open") is False
    assert page.js(f"{box}.lastChild.textContent") == "The user wants a short answer."
    assert page.js(f"{answer_js()}.body.textContent").strip() == "Short answer."
    cid = page.js(f"{CHAT}.cid")
    items = httpx.get(f"{srv.url}/v1/conversations/{cid}/items?order=asc", timeout=10).json()["data"]
    kinds = [i["type"] for i in items]
    assert kinds == ["message", "reasoning", "message"], kinds
    page.navigate(f"{srv.url}/#/chat/{cid}")
    page.wait(f"{CHAT}.cid === '{cid}' && {CHAT}.entries.length === 2")
    assert page.js(f"{box}.lastChild.textContent") == "The user wants a short answer."
    assert page.js(f"{box}.open") is False and page.js(f"{answer_js()}.body.textContent").strip() == "Short answer."


def test_items_posted_with_odd_fields_still_open(scripted_page):
    """A conversation's items hold what any client of the key posted: odd
    ``timings`` and ``alternatives`` open as well as they can (no script
    error, the conversation opened), and an answer with no numbers shows
    none, not those of the answer shown before it."""
    srv, page = scripted_page
    good = {"cache_n": 0, "prompt_n": 10, "prompt_ms": 20, "predicted_n": 4, "predicted_ms": 40, "queue_ms": 1}
    items = [
        {"type": "message", "role": "user", "content": "Odd numbers?"},
        {"type": "message", "role": "assistant", "content": "Odd.", "timings": {"prompt_ms": "5", "predicted_n": "x"}},
        {"type": "message", "role": "user", "content": "Odd answers?"},
        {
            "type": "message",
            "role": "assistant",
            "content": "Alt two",
            "chosen": 1,
            "alternatives": [
                None,
                {"content": 5},
                {"content": [{"type": "output_text", "text": "Alt two"}], "timings": {**good, "request_id": 7}},
                {"content": "Alt three"},
            ],
        },
    ]
    made = httpx.post(srv.url + "/v1/conversations", json={"items": items}, timeout=10).json()["id"]
    page.js(f"location.hash = '#/chat/{made}'")
    page.wait(f"{CHAT}.cid === '{made}' && {CHAT}.entries.length === 4")
    assert page.js(f"{answer_js(1)}.body.textContent").strip() == "Odd."
    assert page.js(f"{answer_js()}.arrows.textContent") == "‹2 / 3›"
    assert page.js(f"{answer_js()}.body.textContent").strip() == "Alt two"
    assert page.js(f"{answer_js()}.stats.textContent") == "4 tokens · 100.0 tok/s · first token 21 ms · request 7"
    page.js(f"{answer_js()}.arrows.querySelector('[aria-label=\"Next answer\"]').click()")
    assert page.js(f"{answer_js()}.body.textContent").strip() == "Alt three"
    assert page.js(f"{answer_js()}.stats.textContent") == ""
    assert not page.errors(), page.errors()


def test_a_long_conversation_opens_and_scrolls(scripted_page):
    """200 turns, and an agent's turn with reasoning and a tool call."""
    srv, page = scripted_page
    made = httpx.post(srv.url + "/v1/conversations", json={"metadata": {"title": "Long"}}, timeout=10).json()["id"]
    for start in range(0, 200, 10):
        turns = [
            item
            for n in range(start, start + 10)
            for item in (
                {"type": "message", "role": "user", "content": f"Question {n}?"},
                {"type": "message", "role": "assistant", "content": f"Answer **{n}** with `code` and\n\n- a list"},
            )
        ]
        assert httpx.post(f"{srv.url}/v1/conversations/{made}/items", json={"items": turns}, timeout=10).is_success
    agent = [  # a turn of an agent's (through the API): its reasoning folded, its tool call and output shown
        {"type": "message", "role": "user", "content": "What is the weather?"},
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "I should call the tool."}],
        },
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "12 C, rain"},
        {"type": "message", "role": "assistant", "content": "It rains in Oslo."},
    ]
    assert httpx.post(f"{srv.url}/v1/conversations/{made}/items", json={"items": agent}, timeout=10).is_success
    began = time.monotonic()
    page.js(f"location.hash = '#/chat/{made}'")
    page.wait("document.querySelectorAll('#c-log .msg').length === 402")
    took = time.monotonic() - began
    assert took < 20, took  # (generous: the machine is shared)
    last = f"{answer_js()}.node"
    assert page.js(f"{last}.querySelector('details.reasoning:not([hidden])').open") is False
    assert page.js(f"{last}.querySelector('details.reasoning pre').textContent") == "I should call the tool."
    calls = page.js(f"[...{last}.querySelectorAll('.call')].map((c) => c.textContent)")
    assert calls == ['tool call weather{"city": "Oslo"}', "tool call → output12 C, rain"], calls
    log = "document.getElementById('c-log')"
    page.wait(f"{log}.scrollTop + {log}.clientHeight >= {log}.scrollHeight - 2", timeout=10)  # opened at the end
    page.js(f"{log}.scrollTop = 0")
    assert page.js(f"{log}.querySelector('.msg').getBoundingClientRect().top") < 200
    assert page.js("document.documentElement.scrollWidth <= window.innerWidth")


def test_an_unreachable_server_is_said_so(scripted_page):
    srv, page = scripted_page
    page.call("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
              "uploadThroughput": -1}, page=True)  # fmt: skip
    try:
        page.js(
            "{ const s = document.getElementById('c-search'); s.value = 'x'; s.dispatchEvent(new Event('input')); }"
        )
        page.wait("document.getElementById('banner').textContent.includes('cannot be reached')")
    finally:
        page.call("Network.emulateNetworkConditions", {"offline": False, "latency": 0, "downloadThroughput": -1,
                  "uploadThroughput": -1}, page=True)  # fmt: skip
    page.js("{ const s = document.getElementById('c-search'); s.value = ''; s.dispatchEvent(new Event('input')); }")
    page.wait("document.getElementById('banner').textContent === ''")
