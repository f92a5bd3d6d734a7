"""Models with a multimodal projector (issue 43, item 1): ``--mmproj`` beside
a ``--model`` (the one it follows), ``mmproj =`` in a config section, ``mmproj``
in the admin attach body, the projector a pulled model brings (a Hugging Face
repo's ``mmproj-*.gguf``, an Ollama manifest's projector layer), ``--no-mmproj``;
a projector that does not fit its model is a clear error naming the file (a
start-up error, a 422 on attach, a 503 on a pulled model's first use); and
what the projector takes is shown where clients probe for it: ``/v1/models``
(and llama-server's ``models`` list), Ollama's ``/api/show``, ``/props``.

The projectors are the tests' random ones (tests/mmproj.py: images;
tests/mmproj_audio.py: sound) beside the bundled SmolLM2-135M; the hubs are
tests/hubs.py's fakes on loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from turbospark.engine import media

if not media.available():
    pytest.skip("this llama-cpp-python is built without libmtmd (scripts/llama-wheel.sh)", allow_module_level=True)

from turbospark import Server  # noqa: E402
from turbospark.config import ConfigError  # noqa: E402
from turbospark.engine.model import ModelOptions  # noqa: E402
from turbospark.engine.types import MEDIA_MARKER, AdmissionError  # noqa: E402
from turbospark.models.catalog import resolve_model  # noqa: E402

from .hubs import FakeHub, FakeRegistry, pulls_from  # noqa: E402
from .media_samples import RED  # noqa: E402
from .mmproj import N_IMAGE_TOKENS, write_mmproj  # noqa: E402
from .mmproj_audio import write_audio_mmproj  # noqa: E402
from .test_cli import listening_url  # noqa: E402

SMOL = resolve_model("smollm2-135m")[0]
SMALL = {"ctx": 512, "parallel": 1}
EYES, NARROW = "test-org/Eyes-GGUF", "test-org/Narrow-GGUF"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The projectors: one for images, one for sound, and one for a text
    model 512 wide (SmolLM2 is 576: it does not fit)."""
    folder = tmp_path_factory.mktemp("projectors")
    return {
        "vision": write_mmproj(folder / "mmproj-eyes.gguf"),
        "audio": write_audio_mmproj(folder / "mmproj-ears.gguf"),
        "narrow": write_mmproj(folder / "mmproj-narrow.gguf", n_embd_text=512),
        "folder": folder,
    }


@pytest.fixture(scope="module")
def hubs(files: dict[str, Path]) -> Iterator[tuple[FakeHub, FakeRegistry]]:
    hf, reg = FakeHub().start(), FakeRegistry().start()
    hf.add_file(EYES, "Eyes-Q4_K_M.gguf", SMOL)
    hf.add_file(EYES, "mmproj-Eyes-f16.gguf", files["vision"])
    hf.add_file(NARROW, "Narrow-Q4_K_M.gguf", SMOL)
    hf.add_file(NARROW, "mmproj-Narrow-f16.gguf", files["narrow"])
    reg.add_model("seer", "latest", SMOL, projector=files["vision"])
    reg.add_model("listener", "latest", SMOL, projector=files["audio"])
    with pulls_from(hf, reg):
        yield hf, reg
    hf.stop()
    reg.stop()


@pytest.fixture(scope="module")
def served(
    files: dict[str, Path], hubs: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path]]:
    """A server with a model that sees, one that hears and one that does
    neither (one GGUF, three projectors), and a store of its own."""
    store = tmp_path_factory.mktemp("store")
    models = [
        ModelOptions(path=SMOL, id="eyes", mmproj=str(files["vision"]), **SMALL),  # type: ignore[arg-type]
        ModelOptions(path=SMOL, id="ears", mmproj=str(files["audio"]), **SMALL),  # type: ignore[arg-type]
        ModelOptions(path=SMOL, id="plain", **SMALL),  # type: ignore[arg-type]
    ]
    folders = [str(files["folder"]), os.path.dirname(SMOL)]
    srv = Server(models, store_dir=str(store), model_defaults=SMALL, models_dirs=folders).start()
    yield srv, store
    srv.stop()


def cards(url: str, path: str = "/v1/models") -> tuple[dict[str, Any], dict[str, Any]]:
    """``/v1/models``'s OpenAI cards and llama-server's ``models`` entries, by id."""
    body = httpx.get(url + path, timeout=30).json()
    return {c["id"]: c for c in body["data"]}, {m["name"]: m for m in body["models"]}


def modalities(url: str, model: str) -> dict[str, bool]:
    r = httpx.get(url + "/props", params={"model": model}, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json()["modalities"])


def serve_args(*argv: str) -> tuple[Any, list[Any]]:
    from turbospark.cli import _model_options, parser

    args = parser().parse_args(["serve", *argv])
    return args, _model_options(args)


# -- what the projector takes, shown --------------------------------------------
def test_v1_models_and_llama_servers_models_list_show_what_each_model_takes(served):
    srv, _ = served
    for path in ("/v1/models", "/models"):
        data, listed = cards(srv.url, path)
        assert data["eyes"]["capabilities"]["vision"] is True and data["eyes"]["capabilities"]["audio"] is False
        assert data["ears"]["capabilities"]["audio"] is True and data["ears"]["capabilities"]["vision"] is False
        assert data["plain"]["capabilities"]["vision"] is False and data["plain"]["capabilities"]["audio"] is False
        assert listed["eyes"]["capabilities"] == listed["ears"]["capabilities"] == ["completion", "multimodal"]
        assert listed["plain"]["capabilities"] == ["completion"]
    one = httpx.get(srv.url + "/v1/models/eyes", timeout=30).json()
    assert one["capabilities"]["vision"] is True


def test_ollama_show_and_props_show_what_each_model_takes(served):
    srv, _ = served
    client = ollama.Client(host=srv.url, timeout=60)
    eyes, ears, plain = (client.show(m).capabilities or [] for m in ("eyes", "ears", "plain"))
    assert "vision" in eyes and "audio" not in eyes and "completion" in eyes
    assert "audio" in ears and "vision" not in ears
    assert "vision" not in plain and "audio" not in plain
    shown = httpx.post(srv.url + "/api/show", json={"model": "eyes"}, timeout=30).json()
    assert shown["projector_info"]["clip.has_vision_encoder"] is True  # its header, as Ollama shows it
    assert shown["projector_info"]["clip.vision.projection_dim"] == 576
    assert "projector_info" not in httpx.post(srv.url + "/api/show", json={"model": "plain"}, timeout=30).json()
    assert modalities(srv.url, "eyes") == {"vision": True, "audio": False}
    assert modalities(srv.url, "ears") == {"vision": False, "audio": True}
    assert modalities(srv.url, "plain") == {"vision": False, "audio": False}


def test_the_projector_is_loaded_and_used(served, files):
    srv, _ = served
    eyes = srv.registry.lookup("eyes")
    assert eyes is not None and eyes.info["mmproj"] == str(files["vision"])
    engine = eyes.model.engine
    prompt = engine.media_prompt(f"Look: {MEDIA_MARKER} what is it?", [RED], chat=False)
    try:  # the image stands in the prompt as its tokens' placeholders
        assert sum(1 for t in prompt.ids if t < 0) == N_IMAGE_TOKENS
    finally:
        prompt.close()
    plain = srv.registry.lookup("plain")
    assert plain is not None and plain.info["mmproj"] is None
    with pytest.raises(AdmissionError, match="no projector"):
        plain.model.engine.media_prompt(f"Look: {MEDIA_MARKER}", [RED], chat=False)


# -- attach ---------------------------------------------------------------------
def test_attach_takes_a_projector_and_refuses_a_bad_one_clearly(served, files, tmp_path):
    srv, _ = served
    url = srv.url + "/v1/admin/models"
    body = {"model": SMOL, "id": "attached-eyes", "mmproj": str(files["vision"]), **SMALL}
    r = httpx.post(url, json=body, timeout=120)
    assert r.status_code == 201, r.text
    assert cards(srv.url)[0]["attached-eyes"]["capabilities"]["vision"] is True
    assert modalities(srv.url, "attached-eyes") == {"vision": True, "audio": False}
    assert httpx.delete(url + "/attached-eyes", timeout=30).status_code == 200

    # a projector for another width: a 422 naming the file, never a folder of the server's
    r = httpx.post(url, json={**body, "id": "misfit", "mmproj": str(files["narrow"])}, timeout=120)
    assert r.status_code == 422 and r.json()["error"]["param"] == "mmproj", r.text
    message = r.json()["error"]["message"]
    assert "the projector mmproj-narrow.gguf does not load beside this model" in message
    assert str(files["folder"]) not in message
    assert "misfit" not in cards(srv.url)[0]

    elsewhere = write_mmproj(tmp_path / "mmproj-elsewhere.gguf")  # not under the allowed folders
    r = httpx.post(url, json={**body, "id": "stray", "mmproj": str(elsewhere)}, timeout=60)
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed", r.text
    r = httpx.post(url, json={**body, "id": "stray", "mmproj": str(files["folder"] / "absent.gguf")}, timeout=60)
    assert r.status_code == 403, r.text  # (the same answer: a caller never learns what exists)
    for wrong in ({"mmproj": True}, {"mmproj": ""}, {"kind": "embedding"}):
        r = httpx.post(url, json={**body, "id": "stray", **wrong}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "mmproj", r.text


# -- pulled models bring their projector --------------------------------------
def test_a_hugging_face_repos_projector_comes_with_its_model(served):
    srv, store = served
    name = f"{EYES}:Q4_K_M"
    r = httpx.post(srv.url + "/api/pull", json={"model": name, "stream": False}, timeout=300)
    assert r.status_code == 200, r.text
    assert (store / "hf" / EYES / "mmproj-Eyes-f16.gguf").is_file()
    data, listed = cards(srv.url)
    # not loaded yet: what it takes is read from its projector's header
    assert data[name]["state"] == "unloaded" and data[name]["capabilities"]["vision"] is True
    assert listed[name]["capabilities"] == ["completion", "multimodal"]
    assert modalities(srv.url, name) == {"vision": True, "audio": False}  # (loaded now, with it)
    entry = srv.registry.lookup(name)
    assert entry is not None and entry.model is not None and entry.model.capabilities.vision
    assert str(entry.info["mmproj"]).endswith(os.path.join("hf", EYES, "mmproj-Eyes-f16.gguf"))


def test_an_ollama_manifests_projector_layer_is_pulled_and_loaded(served, hubs):
    srv, store = served
    _, reg = hubs
    client = ollama.Client(host=srv.url, timeout=300)
    for name, sense, other in (("seer", "vision", "audio"), ("listener", "audio", "vision")):
        statuses = [p.status for p in client.pull(f"{name}:latest", stream=True)]
        assert statuses[-1] == "success", statuses
        layer = reg.manifest(name, "latest")["layers"][1]
        assert layer["mediaType"] == "application/vnd.ollama.image.projector"
        assert reg.gets(layer["digest"]) == 1
        assert (store / "ollama" / "library" / name / f"sha256-{layer['digest'][7:]}.gguf").is_file()
        caps = client.show(name).capabilities or []  # before any load: from the projector's header
        assert sense in caps and other not in caps
        answer = client.chat(model=name, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 3})
        assert answer.message.content is not None
        assert modalities(srv.url, f"{name}:latest") == {sense: True, other: False}


def test_a_pulled_projector_that_does_not_fit_is_a_503_naming_the_file(served):
    srv, store = served
    name = f"{NARROW}:Q4_K_M"
    r = httpx.post(srv.url + "/api/pull", json={"model": name, "stream": False}, timeout=300)
    assert r.status_code == 200, r.text
    chat = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_unloadable", r.text
    message = r.json()["error"]["message"]
    assert "mmproj-Narrow-f16.gguf" in message and "does not load" in message
    assert str(store) not in r.text and os.path.dirname(SMOL) not in r.text


def test_no_mmproj_leaves_a_pulled_models_projector_off(served, tmp_path):
    srv, store = served
    name = f"{EYES}:Q4_K_M"
    assert httpx.post(srv.url + "/api/pull", json={"model": name, "stream": False}, timeout=300).status_code == 200
    # the command line: a pulled --model loads with its projector, unless --no-mmproj
    _, (opts,) = serve_args("--model", name, "--models-dir", str(store))
    assert opts.mmproj == str(store / "hf" / EYES / "mmproj-Eyes-f16.gguf")
    small = ("--ctx", str(SMALL["ctx"]), "--parallel", str(SMALL["parallel"]))  # (a cheap load below)
    args, (opts,) = serve_args("--model", name, "--models-dir", str(store), "--no-mmproj", *small)
    assert opts.mmproj is None and args.model_defaults == {**SMALL, "mmproj": None}

    # a server with those defaults: its pulled models load without theirs
    quiet = Server(store_dir=str(store), model_defaults=args.model_defaults).start()
    try:
        client = ollama.Client(host=quiet.url, timeout=120)
        assert "vision" not in (client.show(name).capabilities or [])
        assert modalities(quiet.url, name) == {"vision": False, "audio": False}
    finally:
        quiet.stop()
    # attach: "mmproj": false leaves a pulled model's off
    body = {"model": name, "pull": True, "id": "eyes-shut", "mmproj": False, **SMALL}
    r = httpx.post(srv.url + "/v1/admin/models", json=body, timeout=120)
    assert r.status_code == 201, r.text
    assert modalities(srv.url, "eyes-shut") == {"vision": False, "audio": False}
    body = {**body, "id": "eyes-open", "mmproj": None}
    assert httpx.post(srv.url + "/v1/admin/models", json=body, timeout=120).status_code == 201
    assert modalities(srv.url, "eyes-open") == {"vision": True, "audio": False}
    for model_id in ("eyes-shut", "eyes-open"):
        httpx.delete(f"{srv.url}/v1/admin/models/{model_id}", timeout=30)


# -- the command line and the config file ---------------------------------------
def test_mmproj_belongs_to_the_model_it_follows(files, tmp_path):
    vision, audio = str(files["vision"]), str(files["audio"])
    _, (opts,) = serve_args("--model", SMOL, "--mmproj", vision)
    assert opts.mmproj == vision
    _, (opts,) = serve_args("--mmproj", vision)  # before any --model: the one model served
    assert opts.mmproj == vision
    twin = tmp_path / "twin.gguf"
    shutil.copy(SMOL, twin)  # (another id: two models)
    _, (first, second) = serve_args("--model", SMOL, "--mmproj", vision, "--model", str(twin), "--mmproj", audio)
    assert (first.mmproj, second.mmproj) == (vision, audio)
    _, (first, second) = serve_args("--model", SMOL, "--model", str(twin), "--mmproj", audio)
    assert (first.mmproj, second.mmproj) == (None, audio)
    refused = {
        ("--mmproj", vision, "--model", SMOL, "--model", str(twin)): "give it after the --model it belongs to",
        ("--model", SMOL, "--mmproj", vision, "--mmproj", audio): "has a --mmproj already",
        ("--model", SMOL, "--mmproj", str(tmp_path / "absent.gguf")): "no such file",
        ("--model", SMOL, "--mmproj", vision, "--no-mmproj"): "contradict",
    }
    for argv, why in refused.items():
        with pytest.raises(ConfigError, match=why):
            serve_args(*argv)


def test_config_sections_take_mmproj_relative_to_the_file(files, tmp_path):
    (tmp_path / "proj").mkdir()
    shutil.copy(files["vision"], tmp_path / "proj" / "eyes.gguf")
    config = tmp_path / "turbospark.toml"
    section = f'[models.eyes]\nmodel = "{SMOL}"\nctx = 512\n'
    config.write_text(section + 'mmproj = "proj/eyes.gguf"\n')
    args, (opts,) = serve_args("--config", str(config))
    assert opts.mmproj == str(tmp_path / "proj" / "eyes.gguf")
    _, (opts,) = serve_args("--config", str(config), "--no-mmproj")  # (the flag overrides the file)
    assert opts.mmproj is None
    config.write_text(section)
    _, (opts,) = serve_args("--config", str(config), "--mmproj", str(files["vision"]))  # the file's one model
    assert opts.mmproj == str(files["vision"])

    config.write_text("[defaults]\nmmproj = false\n" + section)
    args, (opts,) = serve_args("--config", str(config))
    assert opts.mmproj is None and args.model_defaults["mmproj"] is None  # (pulled models' too)
    wrong = {
        'mmproj = "proj/absent.gguf"\n': f"{config}: models.eyes.mmproj: no such file",
        "mmproj = true\n": "models.eyes.mmproj must be a projector GGUF's path, or false",
        'mmproj = "proj/eyes.gguf"\nkind = "embedding"\n': "an embedding model takes no projector",
    }
    for text, why in wrong.items():
        config.write_text(section + text)
        with pytest.raises(ConfigError, match=why):
            serve_args("--config", str(config))
    config.write_text('[defaults]\nmmproj = "proj/eyes.gguf"\n' + section)
    with pytest.raises(ConfigError, match="defaults.mmproj must be bool"):
        serve_args("--config", str(config))


def test_turbospark_serve_with_mmproj_shows_it_and_a_bad_one_stops_the_start(files, tmp_path):
    common = [sys.executable, "-m", "turbospark.cli", "serve", "--port", "0", "--ctx", "512", "--parallel", "1"]
    # a config section's projector that does not fit: a start-up error naming
    # the file (started first, so it starts while the good one below runs)
    config = tmp_path / "turbospark.toml"
    shutil.copy(files["narrow"], tmp_path / "narrow.gguf")
    config.write_text(f'[models.misfit]\nmodel = "{SMOL}"\nmmproj = "narrow.gguf"\n')
    misfit = subprocess.Popen(
        [*common, "--config", str(config)], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    proc = subprocess.Popen(
        [*common, "--model", SMOL, "--mmproj", str(files["vision"])],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines: list[str] = []
        url = listening_url(proc, lines)
        assert "projector mmproj-eyes.gguf: takes images" in "".join(lines)
        (card,) = httpx.get(url + "/v1/models", timeout=30).json()["data"]
        assert card["capabilities"]["vision"] is True
        assert httpx.get(url + "/props", timeout=30).json()["modalities"] == {"vision": True, "audio": False}
    finally:
        proc.terminate()
        proc.wait(60)
        try:
            _, stderr = misfit.communicate(timeout=300)
        finally:
            misfit.kill()  # (ended already, unless it failed to)
    assert misfit.returncode == 2, stderr
    assert f"the projector {tmp_path / 'narrow.gguf'} does not load" in stderr, stderr


def test_the_server_api_refuses_a_projector_that_does_not_fit(files):
    with pytest.raises(media.ProjectorError, match="mmproj-narrow.gguf does not load beside"):
        Server([ModelOptions(path=SMOL, mmproj=str(files["narrow"]), **SMALL)])  # type: ignore[arg-type]
    with pytest.raises(media.ProjectorError, match="projector file not found"):
        Server([ModelOptions(path=SMOL, mmproj=str(files["folder"] / "absent.gguf"), **SMALL)])  # type: ignore[arg-type]
