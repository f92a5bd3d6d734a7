"""Pulls that hold (issue 42): one download per file whatever the name and
whichever process, nothing unverified in the store and a bad file never in
the way of a re-pull, verification with what a mirror gives (and a damaged
GGUF refused at load), URL pulls that never collide, clear refusals without
the server's paths, and ``GET /v1/admin/pulls``. Against the fake hub and
registry on loopback (``tests/hubs.py``), which play the hostile cases."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from turbospark import Server

from .ggufsplit import split_gguf
from .hubs import FakeHub, FakeRegistry, file_sha256, pulls_from
from .support import wait_until
from .test_pull import bundled

ONE = "hold-org/One-GGUF"  # one GGUF, named with and without its quant
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
M = "m-Q4_K_M.gguf"
#: a GGUF whose header breaks after the magic (a key "string" of 1 TiB)
BROKEN = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40) + bytes(64)


@pytest.fixture(scope="module")
def hubs(tmp_path_factory):
    gguf = bundled()
    hf, reg = FakeHub().start(), FakeRegistry().start()
    hf.add_file(ONE, FILE, gguf)
    hf.add_file("hold-org/Two-GGUF", FILE, gguf)
    for name in ("share-a", "share-b"):  # (two names, one blob)
        reg.add_model(name, "latest", gguf)
    for repo in ("Mirror", "Bare", "Whole", "Broken", "Planted", "Half", "Watch", "Huge", "Stale"):
        hf.add_file(f"hold-org/{repo}-GGUF", M, gguf)
    hf.add_file("hold-org/Broken-GGUF", M, BROKEN)
    half = os.path.getsize(gguf) // 2
    hf.as_mirror("hold-org/Mirror-GGUF", M)  # no sizes listed; the download's X-Linked-* say them
    hf.truncate("hold-org/Mirror-GGUF", M, half)
    hf.as_mirror("hold-org/Bare-GGUF", M, linked=False)  # nothing says the size: only the GGUF can
    hf.truncate("hold-org/Bare-GGUF", M, half)
    hf.as_mirror("hold-org/Whole-GGUF", M)
    hf.lie_size("hold-org/Huge-GGUF", M, 10**17)
    part = split_gguf(gguf, str(tmp_path_factory.mktemp("split") / "other"), 2)[0]
    hf.add_file("hold-org/U1", "collide.gguf", part)  # (a valid GGUF, other bytes)
    hf.add_file("hold-org/U2", "collide.gguf", gguf)
    for name in ("zero", "negative"):
        reg.add_model(name, "latest", b"GGUF" + bytes(60))
    reg.lie_size("zero", "latest", 0)
    reg.lie_size("negative", "latest", -3)
    with pulls_from(hf, reg):
        yield hf, reg
    hf.stop()
    reg.stop()


@pytest.fixture(scope="module")
def served(hubs, tmp_path_factory):
    """A server with no model of its own: ``(server, store folder, a folder attach may load from)``."""
    store, folder = tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("models")
    srv = Server(
        models=[], store_dir=str(store), models_dirs=[str(folder)], model_defaults={"ctx": 512, "parallel": 1}
    ).start()
    yield srv, store, folder
    srv.stop()


def pull(srv: Server, name: str) -> httpx.Response:
    return httpx.post(srv.url + "/api/pull", json={"model": name, "stream": False}, timeout=300)


def pulls(srv: Server) -> list[dict[str, Any]]:
    r = httpx.get(srv.url + "/v1/admin/pulls", timeout=30)
    return list(r.json().get("data", [])) if r.status_code == 200 else []


def tags(srv: Server) -> dict[str, str]:
    """The store's models by name, with their digests."""
    return {m["name"]: m["digest"] for m in httpx.get(srv.url + "/api/tags", timeout=30).json()["models"]}


def chat(srv: Server, model: str) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].message.content is not None


# -- 1. one download per file ----------------------------------------------------
def test_two_names_for_one_file_fetch_it_once(served, hubs):
    """``org/repo`` and ``hf.co/org/repo:Q4_1`` are one file: the second
    pull waits for the first's download (the hub's one GET is held until it
    does), and both succeed."""
    srv, store, _ = served
    hf, _ = hubs
    hold = hf.hold(ONE, FILE)
    results: dict[str, httpx.Response] = {}

    def one(name: str) -> None:
        results[name] = pull(srv, name)

    threads = [threading.Thread(target=one, args=(ONE,))]
    threads[0].start()
    try:
        assert hold.arrived.wait(60)
        threads.append(threading.Thread(target=one, args=(f"hf.co/{ONE}:Q4_1",)))
        threads[1].start()
        wait_until(
            lambda: hf.gets(ONE, FILE) >= 2 or any(p["state"] == "waiting" for p in pulls(srv)),
            what="the second pull waits for the first's download",
        )
    finally:
        hold.release()
        for t in threads:
            t.join(300)
    assert [r.status_code for r in results.values()] == [200, 200], [r.text for r in results.values()]
    assert hf.gets(ONE, FILE) == 1 and hf.bytes_sent(ONE, FILE) == os.path.getsize(bundled())
    assert file_sha256(store / "hf" / ONE / FILE) == file_sha256(bundled())
    assert f"{ONE}:Q4_1" in tags(srv)
    assert not [p for p in (store / ".partial").iterdir() if p.suffix == ".part"]
    chat(srv, f"{ONE}:Q4_1")


def test_cancelling_a_pull_that_follows_a_download_leaves_the_download(served, hubs):
    """Two names of one blob: the second pull waits for the first's
    download and is cancelled; it ends cancelled, and the download it
    followed goes on to its end (the cancel had ended both)."""
    srv, _, _ = served
    _, reg = hubs
    blob = "sha256:" + file_sha256(bundled())
    hold = reg.hold(blob)
    results: dict[str, httpx.Response] = {}

    def one(name: str) -> None:
        results[name] = pull(srv, name)

    threads = [threading.Thread(target=one, args=(name,)) for name in ("share-a", "share-b")]
    threads[0].start()
    try:
        assert hold.arrived.wait(60)
        threads[1].start()
        waiting = wait_until(
            lambda: [p["model"] for p in pulls(srv) if p["state"] == "waiting"], what="the second pull follows"
        )
        assert "share-b" in waiting[0], waiting
        r = httpx.delete(f"{srv.url}/v1/admin/pulls/{waiting[0]}", timeout=30)
        assert r.status_code == 200, r.text
    finally:
        hold.release()
        for t in threads:
            t.join(300)
    assert results["share-a"].status_code == 200, results["share-a"].text
    assert results["share-b"].status_code != 200 and "cancelled" in results["share-b"].text, results["share-b"].text
    assert reg.bytes_sent(blob) == os.path.getsize(bundled())
    assert "share-a" in tags(srv) and "share-b" not in tags(srv)


def test_two_processes_fetch_one_file_once(hubs, tmp_path):
    """Two ``turbospark pull`` processes on one store, under two names: the
    second waits on the store's lock, then finds the verified file."""
    hf, _ = hubs
    repo = "hold-org/Two-GGUF"
    hold = hf.hold(repo, FILE)
    store = str(tmp_path / "store")
    run = [sys.executable, "-m", "turbospark.cli", "pull", "--models-dir", store]
    opts: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    first = subprocess.Popen([*run, repo], **opts)
    second: subprocess.Popen[str] | None = None
    lines: list[str] = []
    try:
        assert hold.arrived.wait(120)
        second = subprocess.Popen([*run, f"hf.co/{repo}:Q4_1"], **opts)
        reader = threading.Thread(target=lambda: lines.extend(second.stderr or []), daemon=True)
        reader.start()
        wait_until(
            lambda: hf.gets(repo, FILE) >= 2 or "another process" in "".join(lines) or second.poll() is not None,
            timeout=120,
            what="the second process waits on the lock",
        )
        hold.release()
        assert first.wait(300) == 0, first.stderr.read() if first.stderr else ""
        assert second.wait(300) == 0, "".join(lines)
        reader.join(30)
    finally:
        hold.release()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert "another process is fetching this file" in "".join(lines)
    assert hf.gets(repo, FILE) == 1
    assert file_sha256(tmp_path / "store" / "hf" / repo / FILE) == file_sha256(bundled())


# -- 2. nothing unverified enters the store ------------------------------------------
def test_a_broken_header_never_enters_the_store_nor_blocks_a_re_pull(served, hubs):
    srv, store, _ = served
    hf, _ = hubs
    repo = "hold-org/Broken-GGUF"
    r = pull(srv, f"{repo}:Q4_K_M")
    assert r.status_code == 502 and "implausibly long" in r.json()["error"], r.text
    assert str(store) not in r.json()["error"]
    assert not (store / "hf" / repo / M).exists()  # refused before the rename
    hf.add_file(repo, M, bundled())  # the source mends the file
    r = pull(srv, f"{repo}:Q4_K_M")
    assert r.status_code == 200, r.text
    assert file_sha256(store / "hf" / repo / M) == file_sha256(bundled())


def test_a_bad_file_in_place_is_checked_and_replaced(served, hubs):
    """A file left in place (by an older server, a crash, a disk) is
    re-checked: the wrong bytes at the right size (the digest), half a file
    (the size) and a broken header are each fetched again and replaced."""
    srv, store, _ = served
    hf, _ = hubs
    good = Path(bundled()).read_bytes()
    flipped = bytearray(good)
    flipped[-100] ^= 0xFF
    for repo, planted in (
        ("hold-org/Planted-GGUF", bytes(flipped)),
        ("hold-org/Half-GGUF", good[: len(good) // 2]),
        ("hold-org/Stale-GGUF", BROKEN),
    ):
        target = store / "hf" / repo / M
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(planted)
        r = pull(srv, f"{repo}:Q4_K_M")
        assert r.status_code == 200, (repo, r.text)
        assert hf.gets(repo, M) == 1, repo
        assert hashlib.sha256(target.read_bytes()).hexdigest() == file_sha256(bundled()), repo
    r = pull(srv, "hold-org/Planted-GGUF:Q4_K_M")  # now intact: not fetched again
    assert r.status_code == 200 and hf.gets("hold-org/Planted-GGUF", M) == 1


# -- 3. verify with what the source gives -------------------------------------------
def test_a_mirror_without_sizes_is_verified_by_its_download_headers(served, hubs):
    srv, store, _ = served
    hf, _ = hubs
    size = os.path.getsize(bundled())
    r = pull(srv, "hold-org/Mirror-GGUF:Q4_K_M")  # half the file, the listing silent
    assert r.status_code == 502 and f"the source said {size}" in r.json()["error"], r.text
    assert "hold-org/Mirror-GGUF:Q4_K_M" not in tags(srv)
    assert not (store / "hf" / "hold-org" / "Mirror-GGUF" / M).exists()
    r = pull(srv, "hold-org/Whole-GGUF:Q4_K_M")  # the whole file: its X-Linked-Etag is its digest
    assert r.status_code == 200, r.text
    assert tags(srv)["hold-org/Whole-GGUF:Q4_K_M"] == file_sha256(bundled())


def test_a_truncated_gguf_is_refused_at_pull_time(served, hubs):
    """Nothing says the size: the GGUF's own tensor table does."""
    srv, store, _ = served
    r = pull(srv, "hold-org/Bare-GGUF:Q4_K_M")
    assert r.status_code == 502, r.text
    assert "past the end of the file" in r.json()["error"] and str(store) not in r.json()["error"]
    assert "hold-org/Bare-GGUF:Q4_K_M" not in tags(srv)
    assert not (store / "hf" / "hold-org" / "Bare-GGUF" / M).exists()


def test_a_truncated_gguf_is_refused_at_load_time(served, hubs, tmp_path):
    srv, store, folder = served
    half = folder / "half.gguf"
    with open(bundled(), "rb") as f:
        half.write_bytes(f.read(os.path.getsize(bundled()) // 2))
    with pytest.raises(ValueError, match="past the end of the file"):  # at start-up
        Server(models=[str(half)], model_defaults={"ctx": 512, "parallel": 1})
    r = httpx.post(srv.url + "/v1/admin/models", json={"model": str(half), "id": "half"}, timeout=120)
    assert r.status_code == 422 and "past the end of the file" in r.json()["error"]["message"], r.text
    # a pulled model whose file was damaged since: a clear refusal, not a 500
    assert pull(srv, "hold-org/Watch-GGUF:Q4_K_M").status_code == 200
    os.truncate(store / "hf" / "hold-org" / "Watch-GGUF" / M, os.path.getsize(bundled()) - 4096)
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": "hold-org/Watch-GGUF:Q4_K_M", "messages": [{"role": "user", "content": "Hi"}]},
        timeout=120,
    )
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "past the end of the file" in message and M in message and str(store) not in message
    assert pull(srv, "hold-org/Watch-GGUF:Q4_K_M").status_code == 200  # a re-pull mends it
    assert file_sha256(store / "hf" / "hold-org" / "Watch-GGUF" / M) == file_sha256(bundled())


# -- 4. URL pulls never collide ----------------------------------------------------
def test_url_pulls_of_one_file_name_stay_two(served, hubs):
    srv, store, _ = served
    hf, _ = hubs
    sha = file_sha256(bundled())
    first = f"{hf.url}/hold-org/U1/resolve/main/collide.gguf"
    second = f"{hf.url}/hold-org/U2/resolve/main/collide.gguf"
    assert pull(srv, first).status_code == 200
    r = pull(srv, f"{second}#sha256={sha}")
    assert r.status_code == 200, r.text
    assert hf.gets("hold-org/U2", "collide.gguf") == 1  # fetched, not taken for the first
    listed = tags(srv)
    assert f"{hf.host}/hold-org/U1/resolve/main/collide.gguf" in listed  # named by host and path
    assert listed[f"{hf.host}/hold-org/U2/resolve/main/collide.gguf"] == sha
    r = pull(srv, f"{second}#sha256={'0' * 64}")  # the digest given is checked, the file in place too
    assert r.status_code == 502 and "does not match" in r.json()["error"], r.text
    placed = store / "url" / hf.host.replace(":", "_") / "hold-org" / "U2" / "resolve" / "main" / "collide.gguf"
    assert file_sha256(placed) == sha  # (the verified file stays)


# -- 5. every refusal is a clear error -----------------------------------------------
@pytest.mark.parametrize(("name", "size"), [("zero", 0), ("negative", -3)])
def test_a_manifest_layer_of_no_size_is_refused_by_name(served, hubs, name, size):
    srv, store, _ = served
    _, reg = hubs
    r = pull(srv, name)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert reg.model_digest(name, "latest") in error and f"size {size}" in error, error
    assert "Errno" not in error and str(store) not in error


def test_no_space_names_no_path(served):
    srv, store, _ = served
    r = pull(srv, "hold-org/Huge-GGUF:Q4_K_M")
    assert r.status_code == 507 and "not enough disk space" in r.json()["error"]
    assert str(store) not in r.json()["error"]


# -- 11. pulls in flight are visible --------------------------------------------------
def test_admin_pulls_shows_pulls_in_flight_and_ended(served, hubs, tmp_path):
    srv, _, _ = served
    hf, _ = hubs
    size = os.path.getsize(bundled())
    hf.add_file("hold-org/Watch2-GGUF", M, bundled())
    hold = hf.hold("hold-org/Watch2-GGUF", M)
    done = threading.Thread(target=pull, args=(srv, "hold-org/Watch2-GGUF"))
    done.start()
    try:
        assert hold.arrived.wait(60)
        wait_until(lambda: any(p["state"] == "pulling" for p in pulls(srv)), what="the pull shows")
        now = next(p for p in pulls(srv) if p["state"] == "pulling")
        assert now["model"] == "hold-org/Watch2-GGUF:Q4_K_M" and now["total"] == size and now["completed"] == 0
        assert now["error"] is None and now["rate"] == 0
    finally:
        hold.release()
        done.join(300)
    ended = next(p for p in pulls(srv) if p["model"] == "hold-org/Watch2-GGUF:Q4_K_M")
    assert ended["state"] == "finished" and ended["completed"] == ended["total"] == ended["fetched"] == size
    assert ended["rate"] > 0 and ended["seconds"] > 0
    assert pull(srv, "zero").status_code == 502
    failed = pulls(srv)[0]
    assert failed["model"] == "zero" and failed["state"] == "failed" and "size 0" in failed["error"]
    keyed = Server(models=[], api_keys=["user-key"], admin_keys=["admin-key"], store_dir=str(tmp_path)).start()
    try:
        r = httpx.get(keyed.url + "/v1/admin/pulls", headers={"Authorization": "Bearer user-key"})
        assert r.status_code == 403
        r = httpx.get(keyed.url + "/v1/admin/pulls", headers={"Authorization": "Bearer admin-key"})
        assert r.status_code == 200 and r.json() == {"object": "list", "data": []}
    finally:
        keyed.stop()
