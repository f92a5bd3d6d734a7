"""No existence oracle in slot files (issue 42, item 10): restoring another
tenant's slot file is answered exactly as restoring a file that does not
exist (400, "there is no saved slot named ..."), and saving a name another
holds is no refusal either: each tenant's files are in a folder of its own,
so no tenant learns which names another has saved."""

from __future__ import annotations

import httpx

from turbospark import ListObserver, Server

from .test_slots_llamacpp import one_slot

A, B, ADMIN = {"x-api-key": "key-a"}, {"x-api-key": "key-b"}, {"x-api-key": "admin"}


def act(srv: Server, action: str, filename: str | None = None, headers: dict[str, str] | None = None):
    body = {"filename": filename} if filename is not None else None
    return httpx.post(f"{srv.url}/slots/0?action={action}", json=body, headers=headers, timeout=60)


def test_another_tenants_file_reads_as_a_missing_one(tmp_path):
    model = one_slot()
    keys = {"api_keys": ["key-a", "key-b"], "admin_keys": ["admin"]}
    try:
        with Server(models=[model], observer=ListObserver(), slot_save_path=str(tmp_path), **keys) as srv:
            body = {"prompt": "The quiet library kept its windows open in summer, and", "n_predict": 4}
            assert httpx.post(srv.url + "/completion", json=body, headers=A, timeout=60).status_code == 200
            assert act(srv, "save", "taken.bin", A).status_code == 200
            assert act(srv, "erase", headers=A).status_code == 200
            foreign, missing = act(srv, "restore", "taken.bin", B), act(srv, "restore", "absent.bin", B)
            assert foreign.status_code == missing.status_code == 400, (foreign.text, missing.text)
            shown = foreign.json()["error"]["message"].replace("taken.bin", "NAME")
            assert shown == missing.json()["error"]["message"].replace("absent.bin", "NAME")
            assert "there is no saved slot named" in shown
            assert "tenant" not in foreign.text
            # B's names are its own: saving one A holds neither fails nor touches A's file
            assert httpx.post(srv.url + "/completion", json=body, headers=B, timeout=60).status_code == 200
            assert act(srv, "save", "taken.bin", B).status_code == 200
            assert act(srv, "erase", headers=B).status_code == 200
            # the owner restores it; an admin's names are the folder's own
            assert act(srv, "restore", "taken.bin", A).status_code == 200
            assert act(srv, "save", "mine.bin", ADMIN).status_code == 200
            assert act(srv, "erase", headers=A).status_code == 200
            assert act(srv, "restore", "taken.bin", ADMIN).status_code == 400
            assert (tmp_path / "mine.bin").is_file() and not (tmp_path / "taken.bin").exists()
    finally:
        model.close()


def test_a_tenant_folder_that_cannot_be_made_is_a_clear_refusal(tmp_path):
    (tmp_path / ".tenants").write_text("in the way")  # (a file where the tenants' folder goes)
    model = one_slot()
    try:
        with Server(models=[model], observer=ListObserver(), slot_save_path=str(tmp_path), api_keys=["key-a"]) as srv:
            body = {"prompt": "The quiet library kept its windows open in summer, and", "n_predict": 2}
            assert httpx.post(srv.url + "/completion", json=body, headers=A, timeout=60).status_code == 200
            r = act(srv, "save", "x.bin", A)
            assert r.status_code == 400 and "cannot write x.bin" in r.json()["error"]["message"], r.text
            assert str(tmp_path) not in r.text
    finally:
        model.close()
