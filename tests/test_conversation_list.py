"""``GET /v1/conversations`` (issue 44), this server's extension: the
caller's conversations the last used first, paged by ``after``/``limit``, each
tenant its own, titles searched in any case, expired ones gone; bad
parameters are 400s in OpenAI's shape. Conversations are made with the
official ``openai`` SDK; the listing (which the SDK has no method for) is
read with httpx. No generation: the session's model is reused, not loaded."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from .support import assert_openai_error
from .views_support import fresh_server

KEYS = ("list-a", "list-b")


@pytest.fixture(scope="module")
def listed(server, tmp_path_factory):
    with fresh_server(server, api_keys=KEYS, state_dir=str(tmp_path_factory.mktemp("state"))) as srv:
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEYS[0], max_retries=0, timeout=60)
        titles = ["Trip to Oslo", "Soup recipes", "oslo weather", "Tax return", "Untitled"]
        made = [oai.conversations.create(metadata={"title": t}).id for t in titles]
        made.append(oai.conversations.create().id)  # no title at all
        other = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEYS[1], max_retries=0, timeout=60)
        theirs = other.conversations.create(metadata={"title": "Oslo for b"}).id
        yield srv, made, theirs


def get(srv, key: str = KEYS[0], **params) -> httpx.Response:
    return httpx.get(srv.url + "/v1/conversations", params=params, headers={"Authorization": f"Bearer {key}"})


def test_newest_first_paged(listed):
    srv, made, theirs = listed
    page = get(srv, limit=4).json()
    newest = list(reversed(made))
    assert page["object"] == "list" and [c["id"] for c in page["data"]] == newest[:4]
    assert page["has_more"] is True and page["first_id"] == newest[0] and page["last_id"] == newest[3]
    assert page["data"][1]["metadata"] == {"title": "Untitled"} and page["data"][0]["object"] == "conversation"
    rest = get(srv, limit=4, after=page["last_id"]).json()
    assert [c["id"] for c in rest["data"]] == newest[4:] and rest["has_more"] is False
    assert theirs not in {c["id"] for c in page["data"] + rest["data"]}
    # the other tenant sees its own only; a conversation of another tenant is no cursor
    assert [c["id"] for c in get(srv, KEYS[1]).json()["data"]] == [theirs]
    assert_openai_error(get(srv, KEYS[1], after=made[0]), 404, "after")


def test_search_titles(listed):
    srv, made, _ = listed
    found = get(srv, search="OSLO").json()
    assert [c["metadata"]["title"] for c in found["data"]] == ["oslo weather", "Trip to Oslo"]
    one = get(srv, search="oslo", limit=1).json()
    assert [c["id"] for c in one["data"]] == [made[2]] and one["has_more"] is True
    assert [c["id"] for c in get(srv, search="oslo", after=made[2]).json()["data"]] == [made[0]]
    assert get(srv, search="nothing like it").json() == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }


def test_renamed_and_deleted_and_expired(listed):
    srv, made, _ = listed
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEYS[0], max_retries=0, timeout=60)
    extra = oai.conversations.create(metadata={"title": "Draft"}).id
    oai.conversations.update(extra, metadata={"title": "Final plan"})
    assert [c["id"] for c in get(srv, search="final").json()["data"]] == [extra]
    oai.conversations.delete(extra)
    assert extra not in {c["id"] for c in get(srv, limit=100).json()["data"]}
    store = srv.assembly.state.responses
    store.clock = lambda: time.time() + 400 * 86_400  # (past the 30-day ttl)
    try:
        assert get(srv).json()["data"] == []
    finally:
        store.clock = time.time
    assert len(get(srv, limit=100).json()["data"]) == len(made)


def test_bad_parameters(listed):
    srv, _, _ = listed
    for params, param in [({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "x"}, "limit"),
                          ({"order": "asc"}, "order"), ({"after": "conv_nope"}, "after")]:  # fmt: skip
        r = get(srv, **params)
        assert_openai_error(r, 404 if param == "after" else 400, param)
    assert get(srv, "wrong-key").status_code == 401


def test_last_used_first(listed):
    """The list is by last use: a conversation given an item moves to the
    top (a rename is no use); paging with ``after`` sees each once. Runs
    last in this module: it reorders the list."""
    srv, made, _ = listed
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEYS[0], max_retries=0, timeout=60)
    oai.conversations.items.create(made[1], items=[{"type": "message", "role": "user", "content": "Back to soup."}])
    oai.conversations.update(made[3], metadata={"title": "Tax return 2026"})
    expected = [made[1], *[c for c in reversed(made) if c != made[1]]]
    assert [c["id"] for c in get(srv, limit=100).json()["data"]] == expected
    paged, after = [], None
    while True:
        page = get(srv, limit=2, **({"after": after} if after else {})).json()
        paged += [c["id"] for c in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert paged == expected
    assert [c["id"] for c in get(srv, search="soup").json()["data"]] == [made[1]]


def test_a_version_2_file_lists_by_creation_until_used(tmp_path):
    """A file written before conversations kept their last use (schema 2) is
    brought up to date in place: its conversations listed as before (by
    creation) until one is used."""
    import asyncio
    import sqlite3

    from turbospark.state import responses

    with sqlite3.connect(tmp_path / responses.FILE) as db:
        db.executescript(responses.V2)
        for n, cid in enumerate(("conv_old", "conv_new")):
            db.execute("INSERT INTO conversations VALUES (?, 't', ?, ?, '{}')", (cid, 1000.0 + n, time.time() + 60))
        db.execute("PRAGMA user_version=2")
    store = responses.ResponseStore(str(tmp_path))
    try:
        listing = store.conversations.listing
        assert [c.id for c in asyncio.run(listing("t", 10))[0]] == ["conv_new", "conv_old"]
        asyncio.run(store.conversations.append("conv_old", "t", [{"id": "msg_1", "type": "message"}]))
        assert [c.id for c in asyncio.run(listing("t", 10))[0]] == ["conv_old", "conv_new"]
    finally:
        store.close()
    with sqlite3.connect(tmp_path / responses.FILE) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == responses.VERSION == 3
