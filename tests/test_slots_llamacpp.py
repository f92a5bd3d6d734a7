"""llama-server's slot routes (issue 38, item 3) on the real model through a
real server: ``GET /slots`` (processing, then idle; ``fail_on_no_slot``),
``POST /slots/{id}?action=save|restore|erase`` with ``--slot-save-path``
(a restored slot is reused by the next request that extends it; file names
stay inside the folder), and tenants: a key acts only on its own slots and
restores only its own files."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from turbospark import ListObserver, Server
from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.models.catalog import resolve_model

from .fakes import Script, ScriptedModel

PROMPT = "The quiet library at the end of the street kept its windows open in summer, and"


def one_slot() -> LlamaChatModel:
    return LlamaChatModel(
        ModelOptions(
            path=resolve_model("smollm2-135m")[0],
            id="slots",
            parallel=1,
            session_slots=1,
            speculative=False,
            cache_ram=0,  # no host tier: an erased slot's prefix is gone for good
        )
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, observer, slot folder) over one model with one slot."""
    folder = tmp_path_factory.mktemp("slotfiles") / "saved"
    model = one_slot()
    obs = ListObserver()
    try:
        with Server(models=[model], observer=obs, slot_save_path=str(folder)) as srv:
            yield srv, obs, folder
    finally:
        model.close()


def complete(srv: Server, obs: ListObserver, headers: dict[str, str] | None = None) -> tuple[str, int]:
    """PROMPT through ``/completion`` (greedy): (text, reused prefix tokens)."""
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0}
    r = httpx.post(srv.url + "/completion", json=body, headers=headers or {}, timeout=60)
    assert r.status_code == 200, r.text
    rid = int(r.headers["x-request-id"])
    deadline = time.monotonic() + 10
    while not any(e.kind == "generated" for e in obs.of(rid)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    gen = next(e for e in obs.of(rid) if e.kind == "generated")
    return r.json()["content"], gen.reused_prefix_tokens


def act(srv: Server, slot: int | str, action: str, filename: str | None = None, **kw) -> httpx.Response:
    body = {"filename": filename} if filename is not None else None
    return httpx.post(f"{srv.url}/slots/{slot}?action={action}", json=body, timeout=60, **kw)


def test_slots_show_a_long_generation_processing_then_idle(served):
    srv, _, _ = served
    started = threading.Event()
    done: dict[str, object] = {}

    def stream() -> None:
        body = {"prompt": PROMPT, "n_predict": 200, "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", srv.url + "/completion", json=body, timeout=120) as r:
            for _ in r.iter_bytes():
                started.set()
            done["status"] = r.status_code
        started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        assert started.wait(60)
        busy = httpx.get(srv.url + "/slots", timeout=10)
        full = httpx.get(srv.url + "/slots?fail_on_no_slot=1", timeout=10)
    finally:
        reader.join(120)
    assert done["status"] == 200
    assert busy.status_code == 200, busy.text
    (slot,) = busy.json()
    assert slot["id"] == 0 and slot["is_processing"] is True and slot["n_ctx"] == 4096
    assert slot["params"]["n_predict"] == 200 and slot["params"]["temperature"] == 0
    (progress,) = slot["next_token"]
    assert progress["has_next_token"] is True and progress["n_decoded"] + progress["n_remain"] == 200
    assert "prompt" not in slot  # never the prompt's text
    # the one slot was busy: llama-server's 503, in its error shape
    assert full.status_code == 503, full.text
    assert full.json()["error"] == {"code": 503, "message": "no slot available", "type": "unavailable_error"}
    idle = httpx.get(srv.url + "/slots", timeout=10).json()
    assert [s["is_processing"] for s in idle] == [False]
    # (released: nothing left to decode, as llama-server resets a slot it releases)
    assert idle[0]["next_token"][0] == {**idle[0]["next_token"][0], "has_next_token": False, "n_remain": -1}
    assert idle[0]["n_prompt_tokens"] > 200
    assert httpx.get(srv.url + "/slots?fail_on_no_slot=1", timeout=10).status_code == 200


def test_save_erase_restore_gives_the_prefix_back(served):
    srv, obs, folder = served
    first, _ = complete(srv, obs)
    saved = act(srv, 0, "save", "conv.bin")
    assert saved.status_code == 200, saved.text
    s = saved.json()
    assert s["id_slot"] == 0 and s["filename"] == "conv.bin" and s["n_saved"] > 0 and s["timings"]["save_ms"] >= 0
    assert s["n_written"] == os.path.getsize(folder / "conv.bin")
    erased = act(srv, 0, "erase")
    assert erased.status_code == 200 and erased.json() == {"id_slot": 0, "n_erased": s["n_saved"]}
    # erased: nothing of it is reused
    again, reused = complete(srv, obs)
    assert reused == 0 and again == first
    assert act(srv, 0, "erase").status_code == 200
    restored = act(srv, 0, "restore", "conv.bin")
    assert restored.status_code == 200, restored.text
    r = restored.json()
    assert r["id_slot"] == 0 and r["filename"] == "conv.bin" and r["n_restored"] == s["n_saved"]
    assert r["n_read"] == s["n_written"] and r["timings"]["restore_ms"] >= 0
    # restored: the same prompt continues from the slot's KV, with the same answer
    text, reused = complete(srv, obs)
    assert reused > 0 and text == first


@pytest.mark.parametrize("name", ["../escape.bin", "/tmp/turbospark-abs.bin", ".hidden", "a/b.bin", "a\\b", ""])
def test_a_file_name_outside_the_folder_is_refused(served, name):
    srv, obs, folder = served
    folder.mkdir(exist_ok=True)
    complete(srv, obs)
    r = act(srv, 0, "save", name)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == 400 and "filename" in r.json()["error"]["message"]
    assert not (folder.parent / "escape.bin").exists() and not os.path.exists("/tmp/turbospark-abs.bin")
    assert not any(p.name.startswith(".") for p in folder.iterdir())
    assert act(srv, 0, "restore", name).status_code == 400


def test_a_symlink_out_of_the_folder_is_refused(served, tmp_path):
    srv, obs, folder = served
    complete(srv, obs)
    folder.mkdir(exist_ok=True)
    (folder / "link.bin").symlink_to(tmp_path / "outside.bin")
    assert act(srv, 0, "save", "link.bin").status_code == 400
    assert not (tmp_path / "outside.bin").exists()


def test_restoring_a_missing_or_damaged_file_is_a_clean_400(served):
    srv, obs, folder = served
    first, _ = complete(srv, obs)
    missing = act(srv, 0, "restore", "never-saved.bin")
    assert missing.status_code == 400 and "never-saved.bin" in missing.json()["error"]["message"]
    folder.mkdir(exist_ok=True)
    assert act(srv, 0, "save", "good.bin").status_code == 200
    data = (folder / "good.bin").read_bytes()
    (folder / "damaged.bin").write_bytes(data[:-10] + bytes(10))  # its checksum fails
    (folder / "junk.bin").write_bytes(b"not a slot at all")
    for name in ("damaged.bin", "junk.bin"):
        r = act(srv, 0, "restore", name)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert complete(srv, obs)[0] == first  # the model still serves


def test_bad_slot_ids_and_actions(served):
    srv, _, _ = served
    assert act(srv, "abc", "erase").status_code == 400
    assert act(srv, 7, "erase").status_code == 404
    bad = act(srv, 0, "defragment")
    assert bad.status_code == 400 and "Invalid action" in bad.json()["error"]["message"]


def test_save_and_restore_need_a_slot_save_path():
    model = ScriptedModel(scripts=[Script(["one"])])
    with Server(models=[model]) as srv:
        for action in ("save", "restore"):
            r = act(srv, 0, action, "x.bin")
            assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error", r.text
            assert "--slot-save-path" in r.json()["error"]["message"]
        # a model without slots here (the scripted one has no KV)
        r = httpx.get(srv.url + "/slots", timeout=10)
        assert r.status_code == 501 and "no session slots" in r.json()["error"]["message"]


def test_a_tenant_acts_only_on_its_own_slots_and_files(tmp_path):
    model = one_slot()
    obs = ListObserver()
    a, b, admin = {"x-api-key": "key-a"}, {"x-api-key": "key-b"}, {"x-api-key": "admin"}
    try:
        keys = {"api_keys": ["key-a", "key-b"], "admin_keys": ["admin"]}
        with Server(models=[model], observer=obs, slot_save_path=str(tmp_path), **keys) as srv:
            complete(srv, obs, a)
            shown_b = httpx.get(srv.url + "/slots", headers=b, timeout=10).json()
            assert shown_b == []  # A's slot is not B's to see
            shown_a = httpx.get(srv.url + "/slots", headers=a, timeout=10).json()
            assert len(shown_a) == 1 and "params" in shown_a[0]
            assert len(httpx.get(srv.url + "/slots", headers=admin, timeout=10).json()) == 1
            assert act(srv, 0, "save", "b.bin", headers=b).status_code == 403
            assert act(srv, 0, "erase", headers=b).status_code == 403
            assert act(srv, 0, "save", "a.bin", headers=a).status_code == 200
            assert act(srv, 0, "save", "a.bin", headers=b).status_code == 403  # (not B's slot, nor file)
            assert act(srv, 0, "erase", headers=a).status_code == 200
            # the slot is empty now: B may use it, but not restore A's file into it
            assert act(srv, 0, "restore", "a.bin", headers=b).status_code == 400  # as a missing file
            assert act(srv, 0, "restore", "a.bin", headers=a).status_code == 200
            assert complete(srv, obs, a)[1] > 0
            # an admin acts on any slot
            assert act(srv, 0, "erase", headers=admin).status_code == 200
    finally:
        model.close()


def test_slot_save_path_is_a_flag_and_a_server_key_relative_to_the_file(tmp_path):
    from turbospark.cli import _model_options, parser

    path = tmp_path / "turbospark.toml"
    path.write_text('[server]\nslot_save_path = "slotfiles"\n')
    args = parser().parse_args(["serve", "--config", str(path)])
    _model_options(args)
    assert args.slot_save_path == str(tmp_path / "slotfiles")
    args = parser().parse_args(["serve", "--config", str(path), "--slot-save-path", "/srv/slots"])
    _model_options(args)
    assert args.slot_save_path == "/srv/slots"
    args = parser().parse_args(["serve"])
    _model_options(args)
    assert args.slot_save_path is None


def test_scheduler_call_runs_on_the_engine_thread_and_ends_with_it():
    from turbospark.engine.types import EngineError

    model = one_slot()
    scheduler = model.scheduler
    assert scheduler is not None
    try:
        assert scheduler.call(lambda: threading.current_thread().name, 10) == "turbospark-slots"
        with pytest.raises(ZeroDivisionError):
            scheduler.call(lambda: 1 // 0, 10)  # raised to the caller; the engine goes on
        assert scheduler.call(lambda: 2, 10) == 2 and scheduler.failure is None
    finally:
        model.close()
    with pytest.raises(EngineError):
        scheduler.call(lambda: 3, 10)
