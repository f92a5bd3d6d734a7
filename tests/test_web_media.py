"""The web page with a vision model and a real config file (issue 44), in a
real headless Chromium against one server made by ``Server.from_config``
from a TOML file: ``eye``, the bundled SmolLM2 with the tests' random
vision projector (tests/mmproj.py: 16 tokens an image), and ``far``, a
remote preset nothing answers for (never asked: it only shows in the
lists). No keys, on loopback: the admin parts of the page show.

Chat: the Image button shows for ``eye`` only; an image it chooses (the
file chooser answered over the DevTools protocol) goes with the message, the
answer streams, and the image reached the engine (the request's
``generated`` event counts it and its tokens), is kept in the conversation
as an ``input_image``, shows as a thumbnail, and again after a reload; the
next turn still has it in its prompt. An image the server refuses goes
back to the composer with its message, and the conversation made for it
is deleted again. Models: the file's presets with their sections (a remote
one's row says so), then the file edited and reloaded from the page (what
was added and removed), a broken file (its error shown, the presets in
force kept), a reload by another client (the view follows), a model that
fails to load. Random weights: the answer's text is never judged. One
server, one browser."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from turbospark.engine import media

if not media.available():
    pytest.skip("this llama-cpp-python is built without libmtmd (scripts/llama-wheel.sh)", allow_module_level=True)

from turbospark import ListObserver, Server  # noqa: E402
from turbospark.config import ConfigError  # noqa: E402
from turbospark.observe import Generated  # noqa: E402

from .chromium import LivePage  # noqa: E402
from .media_samples import RED  # noqa: E402
from .mmproj import N_IMAGE_TOKENS, write_mmproj  # noqa: E402
from .support import wait_until  # noqa: E402
from .test_media_dialects import png_declaring  # noqa: E402
from .web_support import CHAT, answer_js, enter, foreign, idle, send, shot  # noqa: E402

CONFIG = """
[defaults]
ctx = 2048
parallel = 1
threads = 2

[models.eye]
model = "smollm2-135m"
mmproj = "projectors/eye.gguf"
temperature = 0

[models.far]
kind = "remote"
base_url = "http://127.0.0.1:9/v1"
model = "elsewhere"
"""
#: ``far`` gone, ``wide`` new, ``eye`` as it was
EDITED = CONFIG.replace("[models.far]", "[models.wide]")
BROKEN = EDITED + "\n[models.d\n"
RED_URL = "data:image/png;base64," + base64.b64encode(RED).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, ListObserver, Path]]:
    folder = tmp_path_factory.mktemp("web-media")
    (folder / "projectors").mkdir()
    write_mmproj(folder / "projectors" / "eye.gguf")
    config = folder / "turbospark.toml"
    config.write_text(CONFIG)
    seen = ListObserver()
    srv = Server.from_config(str(config), observers=[seen], state_dir=str(folder / "state")).start()
    yield srv, seen, config
    srv.stop()


@pytest.fixture(scope="module")
def page(served: tuple[Server, ListObserver, Path]) -> Iterator[LivePage]:
    with LivePage(served[0].url + "/#/chat") as live:
        yield live


def generated(seen: ListObserver, rid: int) -> Generated:
    found = wait_until(lambda: next((e for e in seen.events if isinstance(e, Generated) and e.id == rid), None))
    assert isinstance(found, Generated)
    return found


def pick(page: LivePage, model: str) -> None:
    page.js(f"(() => {{ const s = document.getElementById('c-model'); s.value = {model!r};"
            " s.dispatchEvent(new Event('change')); })()")  # fmt: skip


def items(srv: Server, cid: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{srv.url}/v1/conversations/{cid}/items?order=asc", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def press_attach(page: LivePage) -> None:
    """The Image button pressed from the keyboard (Enter): the file chooser opens."""
    page.js("document.getElementById('c-attach').focus()")
    enter(page)


THUMBS = "[...document.querySelectorAll('#c-log .msg.user img.attached')]"


def test_an_image_attached_in_the_page_reaches_the_engine_and_stays(served, page: LivePage, tmp_path: Path):
    srv, seen, _ = served
    page.wait("document.querySelectorAll('#c-model option').length === 2")
    options = page.js("[...document.querySelectorAll('#c-model option')].map((o) => o.value)")
    assert options == ["eye", "far"], options  # (the loaded one first)
    pick(page, "far")  # a model without a projector: no attach button
    assert page.js("document.getElementById('c-attach').hidden")
    pick(page, "eye")
    assert not page.js("document.getElementById('c-attach').hidden")
    page.js("document.getElementById('c-max').value = '12'; document.getElementById('c-temp').value = '0'")

    # a picture the server refuses (a decompression bomb): not sent, back in the composer with its text
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_declaring(100_000, 100_000))
    page.choose_files([str(bomb)], lambda: press_attach(page))
    page.wait("document.getElementById('c-attached').textContent.includes('bomb.png')")
    send(page, "Look at this.")
    page.wait("document.getElementById('banner').textContent.startsWith('Not sent:')")
    idle(page)
    assert "pixels" in page.js("document.getElementById('banner').textContent")
    assert page.js(f"[{CHAT}.entries.length, document.getElementById('c-input').value]") == [0, "Look at this."]
    assert "bomb.png" in page.js("document.getElementById('c-attached').textContent")
    # the conversation made for it holds nothing: it is gone again (the next message makes its own)
    page.wait(f"{CHAT}.cid === null && document.querySelectorAll('#c-list li').length === 0")
    assert httpx.get(srv.url + "/v1/conversations", timeout=10).json()["data"] == []
    page.js("document.querySelector('#c-attached button').click()")  # removed (✕), the text cleared
    page.js("document.getElementById('c-input').value = ''")
    assert page.js("document.getElementById('c-attached').textContent") == ""

    picture = tmp_path / "red.png"
    picture.write_bytes(RED)
    page.choose_files([str(picture)], lambda: press_attach(page))
    page.wait("document.getElementById('c-attached').textContent.includes('red.png')")
    send(page, "What is in the picture?")
    idle(page)
    assert page.js("document.getElementById('c-attached').textContent") == ""  # (sent: no longer pending)
    assert not page.js("document.getElementById('banner').textContent")
    rid = page.js(f"{answer_js()}.requestId")
    g = generated(seen, rid)
    # the image reached the engine: one item of its tokens, encoded by the projector, inside the prompt
    assert (g.media_items, g.media_tokens, g.media_encoded) == (1, N_IMAGE_TOKENS, 1), g.to_dict()
    assert g.prompt_tokens > N_IMAGE_TOKENS and g.new_tokens > 0
    streamed = [p for p in page.seen("Network.responseReceived") if p["response"]["url"].endswith("/v1/responses")]
    assert streamed and streamed[-1]["response"]["mimeType"] == "text/event-stream"
    # kept in the conversation: the user item carries the image as sent
    cid = page.js(f"{CHAT}.cid")
    (listed,) = httpx.get(srv.url + "/v1/conversations", timeout=10).json()["data"]
    assert listed["id"] == cid and listed["metadata"]["title"] == "What is in the picture?", listed
    said = items(srv, cid)
    assert [(i["role"], i["type"]) for i in said] == [("user", "message"), ("assistant", "message")]
    assert said[0]["content"] == [
        {"type": "input_text", "text": "What is in the picture?"},
        {"type": "input_image", "image_url": RED_URL},
    ]
    kept = said[1]["content"][0]["text"]  # (the streamed text, as the page kept it, and shown)
    assert kept and page.js(f"{answer_js()}.alts[0].text") == kept and page.js(f"{answer_js()}.body.textContent")
    # a thumbnail in the thread (decoded: the page's CSP lets a data: image load)
    page.wait(f"{THUMBS}.length === 1 && {THUMBS}[0].complete && {THUMBS}[0].naturalWidth === 56")
    shot(page, "image")

    # the next turn: the image is still in the prompt (its tokens came with the reused prefix)
    send(page, "And its colour?")
    idle(page)
    g2 = generated(seen, page.js(f"{answer_js()}.requestId"))
    assert (g2.media_items, g2.media_tokens, g2.media_encoded) == (1, N_IMAGE_TOKENS, 0), g2.to_dict()
    assert g2.prompt_tokens > g.prompt_tokens and g2.reused_prefix_tokens > N_IMAGE_TOKENS, g2.to_dict()

    # a reload: the conversation opens with its thumbnail
    page.navigate(srv.url + "/")
    page.wait(f"!!document.querySelector('#c-list li[data-id=\"{cid}\"]')")
    page.js(f"document.querySelector('#c-list li[data-id=\"{cid}\"] .open').click()")
    page.wait(f"{CHAT}.entries.length === 4")
    page.wait(f"{THUMBS}.length === 1 && {THUMBS}[0].complete && {THUMBS}[0].naturalWidth === 56")
    assert not foreign(page, srv.url) and not page.errors(), (foreign(page, srv.url), page.errors())


def row(model: str) -> str:
    return f'#m-rows tr[data-model="{model}"]'


def presets(page: LivePage) -> str:
    return str(page.js("document.getElementById('m-config-text').textContent"))


def reload_from_the_page(page: LivePage, config: Path, text: str, shown: str) -> str:
    before = presets(page)
    config.write_text(text)
    page.js("document.getElementById('m-reload').click()")
    page.wait(f"document.getElementById('m-config-text').textContent !== {before!r}"
              f" && document.getElementById('m-config-text').textContent.includes({shown!r})")  # fmt: skip
    return presets(page)


def test_the_config_files_presets_and_its_reloads(served, page: LivePage):
    srv, _, config = served
    page.js("location.hash = '#/models'")
    page.wait("!document.getElementById('m-config').hidden")  # loopback, no keys: admin
    text = page.wait("document.getElementById('m-config-text').textContent.includes('presets:')"
                     " && document.getElementById('m-config-text').textContent")  # fmt: skip
    assert "not reloaded since the start" in text, text
    lines = text.splitlines()
    eye = next(line for line in lines if line.strip().startswith("eye ("))
    far = next(line for line in lines if line.strip().startswith("far ("))
    assert "(loaded)" in eye and '"mmproj":"projectors/eye.gguf"' in eye and '"temperature":0' in eye, eye
    assert '"kind":"remote"' in far and '"model":"elsewhere"' in far, far
    # a remote preset's row: another server runs it (no file, nothing resident, nothing to load or delete)
    page.wait(f"!!document.querySelector('{row('far')}')")
    cells = page.js(f"[...document.querySelector('{row('far')}').children].map((td) => td.textContent)")
    assert cells[1:4] + cells[5:6] + cells[8:] == ["remote", "–", "–", "–", ""], cells
    assert cells[4] == "8192" and cells[7] == "loaded", cells

    # edited: far removed, wide added (a remote: nothing loads); eye unchanged
    text = reload_from_the_page(page, config, EDITED, "last reload (admin")
    assert "ok; added: wide; removed: far" in text, text
    assert " wide (" in text and " far (" not in text, text
    page.wait(f"!!document.querySelector('{row('wide')}') && !document.querySelector('{row('far')}')")
    # broken: refused with its message, the presets in force kept
    text = reload_from_the_page(page, config, BROKEN, "failed:")
    assert "not valid TOML" in text and " eye (" in text and " wide (" in text, text
    assert "not valid TOML" in page.js("document.getElementById('m-note').textContent")
    assert sorted(m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=10).json()["data"]) == ["eye", "wide"]
    # mended: the refusal's note goes
    text = reload_from_the_page(page, config, CONFIG, "ok;")
    assert "ok; added: far; removed: wide" in text and page.js("document.getElementById('m-note').textContent") == ""
    # reloaded elsewhere (another client): the view follows, from the models it attached and detached
    config.write_text(EDITED)
    r = httpx.post(srv.url + "/v1/admin/config/reload", timeout=60)
    assert r.status_code == 200 and r.json()["added"] == ["wide"], r.text
    page.wait("document.getElementById('m-config-text').textContent.includes('ok; added: wide; removed: far')")
    page.wait(f"!!document.querySelector('{row('wide')}') && !document.querySelector('{row('far')}')")
    # a model the file names that cannot be loaded: the reload is ok, that model said to have failed
    (config.parent / "junk.gguf").write_bytes(b"this is not a GGUF file")
    text = reload_from_the_page(page, config, EDITED + '\n[models.junk]\nmodel = "junk.gguf"\n', "junk failed")
    assert "ok; junk failed to load: " in text, text
    # a [server] setting changed (turbospark serve's file; Server.from_config refuses [server], so the
    # view's line is read from the view's own function): the reload is ok, and says it applies at a restart
    said = page.js(
        "import('/app/models.js').then((m) => m.lastReload({trigger: 'SIGHUP', at: 0, ok: true, added: [],"
        " removed: [], reloaded: [], failed: {}, restart_needed: ['max_body', 'port']}))",
        wait=True,
    )
    assert said.endswith("ok; [server] max_body, port changed: applies at a restart"), said
    assert not page.errors(), page.errors()


def test_from_config_refuses_what_only_turbospark_serve_does(tmp_path: Path):
    """``[server]`` settings are ``Server``'s arguments, a ``pull`` section
    needs the store ``turbospark serve`` resolves it in: both refused, naming
    the problem, before anything loads."""
    config = tmp_path / "turbospark.toml"
    config.write_text("[server]\nmax_body = 1048576\n")
    with pytest.raises(ConfigError, match=r"\[server\] is turbospark serve's; give Server\(...\) its settings"):
        Server.from_config(str(config))
    config.write_text('[models.p]\npull = "org/repo:Q4_K_M"\n')
    with pytest.raises(ConfigError, match="pull references need the pull feature"):
        Server.from_config(str(config))
