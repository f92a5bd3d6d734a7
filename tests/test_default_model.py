"""Which model serves a name (issue 42, item 8; docs/MODELS.md): a name no
model answers to goes to the server's default model in every dialect, and
a pull does not change that (it made a one-model server "several models",
404 to ``gpt-4o`` and ``claude-sonnet-4-5``); ``--strict-model-names``
makes such a name a 404 in each dialect's error shape. The default is the
first ``--model``, else a config section's ``default = true``, else its
first section. The pulls go to a fake Ollama registry on loopback."""

from __future__ import annotations

import anthropic
import httpx
import ollama
import openai
import pytest

from turbospark import ListObserver
from turbospark.config import Config, ConfigError, load_config
from turbospark.engine.model import ModelOptions
from turbospark.models.catalog import resolve_model
from turbospark.models.registry import ModelSpec, Registry, RoutingError

from .fakes import ScriptedModel
from .hubs import FakeRegistry
from .views_support import bundled_gguf, fresh_server

HELLO = [{"role": "user", "content": "Say hello."}]
PULLED = "smollm2:135m"


@pytest.fixture(scope="module")
def registry_env():
    """A fake Ollama registry offering ``smollm2:135m`` (the bundled GGUF),
    and the environment pointing pulls at it."""
    reg = FakeRegistry().start()
    reg.add_model("smollm2", "135m", bundled_gguf())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TURBOSPARK_OLLAMA_REGISTRY", reg.url)
        yield reg
    reg.stop()


@pytest.fixture(scope="module")
def store(registry_env, tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def pulled(server, store):
    """The session's model (``smollm2-135m``, the default) in a server with
    a store, after an Ollama client pulled a second model into it."""
    obs = ListObserver()
    with fresh_server(server, observer=obs, store_dir=store) as srv:
        ollama.Client(host=srv.url, timeout=120).pull(PULLED)
        assert PULLED in {m.model for m in ollama.Client(host=srv.url).list().models}
        assert srv.registry.lookup(PULLED) is not None  # known to the registry: two models now
        yield srv, obs


def routed(obs: ListObserver, request_id: str):
    return next(e for e in obs.of(int(request_id)) if e.kind == "requestRouted")


def test_openai_names_go_to_the_default_after_a_pull(pulled):
    srv, obs = pulled
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=HELLO, max_tokens=4)
    assert raw.parse().choices[0].message.content is not None
    ev = routed(obs, raw.headers["x-request-id"])
    assert (ev.requested, ev.served) == ("gpt-4o", "smollm2-135m")


def test_anthropic_names_go_to_the_default_after_a_pull(pulled):
    srv, obs = pulled
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
    raw = client.messages.with_raw_response.create(model="claude-sonnet-4-5", messages=HELLO, max_tokens=4)
    assert raw.parse().content is not None
    ev = routed(obs, raw.headers["x-request-id"])
    assert (ev.requested, ev.served) == ("claude-sonnet-4-5", "smollm2-135m")


def test_ollama_names_go_to_the_default_after_a_pull(pulled):
    srv, obs = pulled
    answer = ollama.Client(host=srv.url, timeout=60).chat(model="llama3.2", messages=HELLO, options={"num_predict": 4})
    assert answer.message.content is not None
    ev = next(e for e in obs.events if e.kind == "requestRouted" and e.requested == "llama3.2")
    assert ev.served == "smollm2-135m"
    # a lookup never falls back: an Ollama client still learns the model is not here
    with pytest.raises(ollama.ResponseError) as exc:
        ollama.Client(host=srv.url, timeout=60).show("llama3.2")
    assert exc.value.status_code == 404


def test_llama_server_routes_name_no_model_and_get_the_default(pulled):
    srv, _ = pulled
    r = httpx.get(srv.url + "/slots", timeout=30)  # was a 400 "several models are loaded"
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), list) and r.json()


@pytest.fixture(scope="module")
def strict(server, store, pulled):
    """The same, with ``strict_model_names`` (and the same store)."""
    obs = ListObserver()
    with fresh_server(server, observer=obs, store_dir=store, strict_model_names=True) as srv:
        yield srv, obs


def test_strict_names_are_a_404_in_each_dialects_shape(strict):
    srv, obs = strict
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as exc:
        oai.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=4)
    assert exc.value.body["code"] == "model_not_found" and "'gpt-4o' not found" in exc.value.body["message"]
    claude = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(anthropic.NotFoundError) as aexc:
        claude.messages.create(model="claude-sonnet-4-5", messages=HELLO, max_tokens=4)
    body = aexc.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "claude-sonnet-4-5" in body["error"]["message"]
    with pytest.raises(ollama.ResponseError) as oexc:
        ollama.Client(host=srv.url, timeout=60).chat(model="llama3.2", messages=HELLO)
    assert oexc.value.status_code == 404 and "llama3.2" in oexc.value.error
    assert not [e for e in obs.events if e.kind == "requestRouted"]
    # the default's own name, and what the store holds, still resolve
    raw = oai.chat.completions.with_raw_response.create(model="smollm2-135m", messages=HELLO, max_tokens=2)
    assert routed(obs, raw.headers["x-request-id"]).served == "smollm2-135m"
    assert ollama.Client(host=srv.url, timeout=60).show(PULLED).details is not None
    # a request naming no model (llama-server's /slots) still gets the default
    assert httpx.get(srv.url + "/slots", timeout=30).status_code == 200


# -- the rule itself, and where the default comes from -------------------------------------------------
def test_the_default_serves_unknown_names_among_several_models():
    reg = Registry()
    for name in ("alpha", "beta"):
        reg.attach(_scripted(name))
    with pytest.raises(RoutingError):  # no default (nothing populated it): several models, 404
        reg.resolve("gpt-4o")
    reg.default = "beta"
    assert reg.resolve("gpt-4o").entry.id == "beta" and reg.resolve(None).entry.id == "beta"
    assert reg.resolve("alpha").entry.id == "alpha"
    reg.strict_names = True
    with pytest.raises(RoutingError) as exc:
        reg.resolve("gpt-4o")
    assert exc.value.status == 404 and exc.value.code == "model_not_found"
    assert reg.resolve(None).entry.id == "beta"  # naming none is not naming a wrong one


def test_a_request_the_default_cannot_serve_goes_to_the_one_model_that_can():
    reg = Registry()
    reg.attach(_scripted("chat"))
    reg.default = "chat"
    reg.configure(ModelSpec("embedder", (), "embedding", path="/nowhere.gguf"))
    assert reg.resolve("text-embedding-3-small", "embeddings").entry.id == "embedder"
    assert reg.resolve("embedder", "chat").entry.id == "chat"  # (an embedding model takes no chat)
    reg.strict_names = True
    with pytest.raises(RoutingError) as exc:
        reg.resolve("embedder", "chat")
    assert exc.value.status == 404


def _scripted(name: str):
    from turbospark.models.local import LocalBackend

    return LocalBackend(ScriptedModel(name))


def _serve_args(*argv: str):
    from turbospark.cli import _model_options, parser

    args = parser().parse_args(["serve", *argv])
    _model_options(args)
    return args


def test_the_default_is_a_sections_default_else_the_first_model_else_the_first_section(tmp_path):
    gguf = resolve_model("smollm2-135m")[0]
    path = tmp_path / "turbospark.toml"
    path.write_text(f'[models.one]\nmodel = "{gguf}"\n[models.two]\nmodel = "{gguf}"\n')
    assert _serve_args("--config", str(path)).default_model == "one"
    assert _serve_args("--config", str(path), "--model", gguf).default_model != "one"  # the --model's id
    path.write_text(f'[models.one]\nmodel = "{gguf}"\n[models.two]\nmodel = "{gguf}"\ndefault = true\n')
    assert _serve_args("--config", str(path)).default_model == "two"
    assert _serve_args("--config", str(path), "--model", gguf).default_model == "two"
    assert load_config(str(path)).default == "two" and "default" in load_config(str(path)).sections["two"]
    path.write_text(f'[models.one]\nmodel = "{gguf}"\ndefault = true\n[models.two]\nmodel = "{gguf}"\ndefault = true\n')
    with pytest.raises(ConfigError, match="models.two.default: models.one is the default model already"):
        load_config(str(path))
    path.write_text(f'[models.one]\nmodel = "{gguf}"\ndefault = "yes"\n')
    with pytest.raises(ConfigError, match="models.one.default must be bool"):
        load_config(str(path))


def test_strict_model_names_is_a_flag_and_a_server_key(tmp_path):
    path = tmp_path / "turbospark.toml"
    path.write_text("[server]\nstrict_model_names = true\n")
    assert _serve_args("--config", str(path)).strict_model_names is True
    assert _serve_args("--strict-model-names").strict_model_names is True
    assert _serve_args().strict_model_names is False


def test_a_reload_follows_the_files_default():
    from turbospark.compose import _follow_default

    reg = Registry()
    for name in ("one", "two"):
        reg.attach(_scripted(name))
    reg.default = "one"
    gguf = resolve_model("smollm2-135m")[0]
    cfg = Config(models=[ModelOptions(path=gguf, id="two")], default="two")
    _follow_default(reg, cfg)
    assert reg.default == "two"
    reg.detach("two")
    _follow_default(reg, Config(models=[ModelOptions(path=gguf, id="one")]))
    assert reg.default == "one"
