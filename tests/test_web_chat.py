"""The web page's Chat in a real headless Chromium (issue 44) against a real
server with the bundled model and two API keys: the key asked for and kept
in the tab only; a message typed and sent from the keyboard streams in, with
the engine's numbers and a link to its request in Activity; Esc stops an
answer and the engine run ends ``cancelled``; the conversation is on the
server (a reload finds it, each answer with its numbers, another browser
with the same key too, another
key does not); a phone-wide window never scrolls sideways; the first load
stays under its weight. One server, two browsers."""

from __future__ import annotations

import httpx
import pytest

from turbospark.observe import ListObserver

from .chromium import LivePage
from .support import wait_until
from .views_support import fresh_server
from .web_support import (
    CHAT,
    MAX_PAGE_BYTES,
    answer_js,
    enter,
    escape,
    foreign,
    give_key,
    idle,
    page_weight,
    send,
    shot,
    tab_to,
)

KEYS = ("web-key-a", "web-key-b")
ADMIN = "web-admin-key"


@pytest.fixture(scope="module")
def chatting(server, tmp_path_factory):
    seen = ListObserver()
    state = str(tmp_path_factory.mktemp("state"))
    with fresh_server(server, observers=[seen], api_keys=KEYS, admin_keys=[ADMIN], state_dir=state) as srv:
        yield srv, seen


def generated(seen: ListObserver, rid: int):
    return wait_until(lambda: next((e for e in seen.events if e.kind == "generated" and e.id == rid), None))


def items(srv, cid: str, key: str = KEYS[0]) -> list[dict]:
    r = httpx.get(f"{srv.url}/v1/conversations/{cid}/items?order=asc", headers={"x-api-key": key}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def settings(page: LivePage, max_tokens: int) -> None:
    page.js(f"document.getElementById('c-max').value = '{max_tokens}'; document.getElementById('c-temp').value = '0'")


def test_chat_streams_stops_and_keeps_the_conversation(chatting):
    srv, seen = chatting
    with LivePage(srv.url + "/") as page:
        give_key(page, KEYS[0])  # (the page's first data call was a 401)
        page.wait("!!document.querySelector('#c-model option')")
        assert page.js("sessionStorage.getItem('turbospark-key')") == KEYS[0]
        assert page.js("document.querySelector('#c-model').selectedOptions[0].textContent") == "smollm2-135m (loaded)"
        assert page_weight(page, srv.url) <= MAX_PAGE_BYTES
        assert page.js("document.getElementById('c-attach').hidden")  # SmolLM2 takes no image
        settings(page, 24)
        # the keyboard only: Tab to the message box, Shift+Enter a new line, Enter sends
        tab_to(page, "c-input")
        page.type("Say hello")
        enter(page, shift=True)
        page.type("in one sentence.")
        assert page.js("document.getElementById('c-input').value") == "Say hello\nin one sentence."
        enter(page)
        # it streams: text shows while the answer is still running
        page.wait(f"{CHAT}.busy !== null && {answer_js()}.body.textContent.length > 0")
        idle(page)
        rid = page.js(f"{answer_js()}.requestId")
        g = generated(seen, rid)
        stats = page.wait(f"{answer_js()}.stats.textContent")
        assert f"{g.new_tokens} tokens" in stats and f"request {rid}" in stats, stats
        first = (rid, g)
        cid = page.js(f"{CHAT}.cid")
        said = items(srv, cid)
        assert [(i["role"], i["type"]) for i in said] == [("user", "message"), ("assistant", "message")]
        assert said[1]["content"][0]["text"].strip()[:12] in page.js(f"{answer_js()}.body.textContent")
        shot(page, "chat")

        # Esc stops an answer mid-way: the engine's run ends cancelled, the partial answer is kept
        settings(page, 400)
        send(page, "Write a long story about a lighthouse keeper and the sea.")
        page.wait(f"{answer_js()}.body.textContent.length > 10")
        escape(page)
        idle(page)
        rid = page.js(f"{answer_js()}.requestId")
        stopped = (rid, generated(seen, rid))
        assert stopped[1].stop_reason == "cancelled"
        page.wait(f"{answer_js()}.node.dataset.stop === 'cancelled'")
        assert "(stopped)" in page.js(f"{answer_js()}.body.textContent")
        said = items(srv, cid)
        assert len(said) == 4 and said[3]["status"] == "incomplete" and said[3]["content"][0]["text"]
        assert generated(seen, rid).new_tokens < 400

        # its request in Activity
        page.js(f"{answer_js()}.stats.querySelector('a').click()")
        shown = f'#rows tr.sel[data-id="{rid}"]'
        page.wait(f"!document.getElementById('view-activity').hidden && !!document.querySelector('{shown}')")
        details = page.wait("(document.getElementById('details').textContent.match(/\"id\": \\d+/) || [''])[0]")
        assert details == f'"id": {rid}'
        shot(page, "activity")

        # a reload: the conversation is in the list (the key still in the tab), and opens whole
        page.navigate(srv.url + "/")
        page.wait(f"!!document.querySelector('#c-list li[data-id=\"{cid}\"]')")
        page.js(f"document.querySelector('#c-list li[data-id=\"{cid}\"] .open').click()")
        page.wait(f"{CHAT}.entries.length === 4 && document.querySelectorAll('#c-log .msg').length === 4")
        # each answer read back shows the engine's numbers for its request, kept in the conversation
        for n, (rid, g) in ((1, first), (3, stopped)):
            back = page.js(f"{answer_js(n)}.stats.textContent")
            assert f"{g.new_tokens} tokens · " in back and " tok/s · first token " in back, back
            assert back.endswith(f"request {rid}") and ("stopped: cancelled" in back) == (n == 3), back
        assert not foreign(page, srv.url) and not page.errors(), (foreign(page, srv.url), page.errors())
        assert all(KEYS[0] not in url for url in page.requested())  # a key never in a URL


def test_another_browser_and_a_phone(chatting):
    """A second browser profile, 390 px wide: with the other key it sees no
    conversation of the first; with the same key it does. Nothing scrolls
    sideways in any view; an inference key sees no admin action, and an
    admin key given in the same tab shows them."""
    srv, _ = chatting
    with LivePage(srv.url + "/", width=390, height=844, mobile=True) as phone:
        give_key(phone, "not-a-key")  # a wrong key: said so, and asked again
        phone.wait("document.getElementById('keyMessage').textContent.includes('refused')")
        assert phone.js("document.getElementById('banner').textContent") == "Wrong API key."
        give_key(phone, KEYS[1])
        phone.wait("!!document.querySelector('#c-model option')")
        phone.wait("document.getElementById('c-list').dataset.loaded === '1'")
        assert phone.js("document.querySelectorAll('#c-list li').length") == 0
        phone.js("document.getElementById('keyButton').click()")
        give_key(phone, KEYS[0])
        phone.wait("document.querySelectorAll('#c-list li').length === 1")
        phone.js("document.querySelector('#c-list li .open').click()")
        phone.wait(f"{CHAT}.entries.length === 4")
        for view in ("chat", "models", "activity"):
            phone.js(f"location.hash = '#/{view}'")
            phone.wait(f"!document.getElementById('view-{view}').hidden")
            if view == "models":
                phone.wait("document.querySelectorAll('#m-rows tr').length > 0")
                assert phone.js("[...document.querySelectorAll('#view-models .admin')].every((e) => e.hidden)")
            if view == "activity":  # (this key's requests only)
                phone.wait("document.getElementById('state').textContent === 'live'")
                phone.wait("document.querySelectorAll('#rows tr').length > 0")
                paths = phone.js("[...document.querySelectorAll('#rows tr')].map((tr) => tr.children[3].textContent)")
                assert not [p for p in paths if p.startswith("/app/")], paths  # (the page's own files)
            width = phone.js("document.documentElement.scrollWidth")
            assert width <= 390, (view, width)
            if view == "chat":
                shot(phone, "phone-chat")
        # light and dark from the system setting
        phone.js("location.hash = '#/chat'")
        phone.wait("!document.getElementById('view-chat').hidden")
        light = phone.js("getComputedStyle(document.body).backgroundColor")
        phone.call("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
                   page=True)  # fmt: skip
        dark = phone.js("getComputedStyle(document.body).backgroundColor")
        assert (light, dark) == ("rgb(255, 255, 255)", "rgb(15, 20, 25)")
        shot(phone, "phone-dark")
        # the admin key, given in the same tab: the Models view's admin parts show; an inference key hides them
        admin_parts = "[...document.querySelectorAll('#view-models .admin')].map((e) => !e.hidden)"
        phone.js("location.hash = '#/models'")
        phone.wait("!document.getElementById('view-models').hidden")
        assert not any(phone.js(admin_parts))
        for key, shown in ((ADMIN, "true"), (KEYS[0], "false")):
            phone.js("document.getElementById('keyButton').click()")
            give_key(phone, key)
            phone.wait(f"{admin_parts}.every((s) => s === {shown})")
