"""The replica router (replicas.py) and the remote/group configuration,
without engines: which replica a key goes to, how load bounds it, what a
failure and a health check do, and how config and attach bodies are read.
The same paths run against real upstreams in test_remote.py."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from turbospark.config import ConfigError, load_config
from turbospark.engine.model import ModelOptions
from turbospark.models.loading import GroupOptions, RemoteConfigError, remote_options
from turbospark.models.replicas import Replica, ReplicaSet, routing_key
from turbospark.upstream import wire
from turbospark.upstream.model import RemoteOptions


def group(n: int = 2, **kw: Any) -> ReplicaSet:
    reps = [Replica(name, SimpleNamespace(id=f"g@{name}", info={})) for name in "abcdefgh"[:n]]
    return ReplicaSet("g", reps, **kw)


def test_a_key_sticks_to_its_replica() -> None:
    g = group(3)
    first = g.pick("session:x")
    assert first is not None
    assert all(g.pick("session:x") is first for _ in range(20))


def test_new_keys_are_spread_evenly_even_when_few() -> None:
    g = group(2)
    chosen = [g.pick(f"prefix:{i}") for i in range(8)]
    counts = {r.name: sum(c is r for c in chosen) for r in g.replicas}
    assert counts == {"a": 4, "b": 4}
    # and they stay where they were put
    assert [g.pick(f"prefix:{i}") for i in range(8)] == chosen


def test_a_hot_key_spills_over_the_in_flight_bound() -> None:
    g = group(2)
    home = g.pick("session:hot")
    assert home is not None
    done = [g.started(home) for _ in range(g.load_slack - 1)]  # its replica is busier than the other
    assert g.pick("session:hot") is home  # a small imbalance does not move a conversation
    done.append(g.started(home))  # load_slack more than the idle one, and over 1.25 x the mean
    other = g.pick("session:hot")
    assert other is not None and other is not home
    for d in done:
        d()
    assert home.in_flight == 0
    # with many in flight the multiplicative bound is the larger: with 6 on the
    # other replica the home holds 11 (< ceil(1.25 x 18 / 2) = 12, above 6 + 4)
    # and spills at 12 (= ceil(1.25 x 19 / 2))
    g = group(2)
    home = g.pick("session:hot")
    assert home is not None
    other = next(r for r in g.replicas if r is not home)
    busy = [g.started(other) for _ in range(6)] + [g.started(home) for _ in range(11)]
    assert g.pick("session:hot") is home
    busy.append(g.started(home))
    assert g.pick("session:hot") is other
    for d in busy:
        d()


def test_the_slack_keeps_placed_keys_only() -> None:
    """A new key goes by the bound alone: with 3 in flight on one replica and
    none on the other, every new key lands on the idle one."""
    g = group(2)
    busy_one = g.replicas[0]
    done = [g.started(busy_one) for _ in range(3)]
    assert {g.pick(f"prefix:new{i}").name for i in range(6)} == {"b"}  # type: ignore[union-attr]
    for d in done:
        d()


def test_keyless_requests_go_to_the_least_loaded() -> None:
    g = group(2)
    a, b = g.replicas
    g.started(a)
    assert g.pick(None) is b
    g.started(b)
    g.started(b)
    assert g.pick(None) is a


def test_round_robin_ignores_keys() -> None:
    g = group(2, routing="round-robin")
    names = [g.pick("session:same").name for _ in range(4)]  # type: ignore[union-attr]
    assert sorted(names) == ["a", "a", "b", "b"] and names[0] != names[1]


def test_a_failed_replica_is_down_until_a_check_passes_after_the_cooldown() -> None:
    changes: list[tuple[str, str]] = []
    healthy = {"a": True, "b": True}

    async def probe(r: Replica) -> str | None:
        return None if healthy[r.name] else "unreachable"

    g = group(2, cooldown=0.2, probe=probe, on_change=lambda r, state, why: changes.append((r.name, state)))
    a, b = g.replicas
    g.failed(a, "unreachable (ConnectError)")
    assert not a.up and changes == [("a", "down")]
    assert all(g.pick(f"session:{i}") is b for i in range(10))
    asyncio.run(g.check())  # within the cooldown: still down, though it answers
    assert not a.up
    time.sleep(0.25)
    healthy["b"] = False
    asyncio.run(g.check())
    assert a.up and not b.up and changes[0] == ("a", "down") and set(changes[1:]) == {("b", "down"), ("a", "ok")}
    assert g.pick("session:0") is a
    # every replica excluded: no replica; every replica down: the one down longest is tried
    assert g.pick("k", frozenset({"a", "b"})) is None
    g.failed(a, "x")
    assert g.pick("session:1") is b


def test_routing_key_is_the_session_else_the_conversation_beginning() -> None:
    sys_msg = {"role": "system", "content": "rules"}
    turn1 = [sys_msg, {"role": "user", "content": "hello"}]
    turn3 = [*turn1, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    assert routing_key("abc", turn1, None) == "session:abc"
    assert routing_key(None, turn1, None) == routing_key(None, turn3, None)
    assert routing_key(None, turn1, None) != routing_key(None, [sys_msg, {"role": "user", "content": "bye"}], None)
    assert routing_key(None, turn1, [{"type": "function"}]) != routing_key(None, turn1, None)


def test_upstream_counts_come_from_usage_or_timings_never_chunks() -> None:
    r = wire.Reading()
    for piece in ("a", "b", "c"):
        r.chunk({"choices": [{"index": 0, "delta": {"content": piece}}]})
    assert r.counts() == (0, 0, 0, None)  # said nothing: zeros, not three
    r.chunk({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3,
             "prompt_tokens_details": {"cached_tokens": 5}}})  # fmt: skip
    assert r.counts() == (9, 3, 5, None)
    t = wire.Reading()
    t.chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
             "timings": {"prompt_n": 4, "cache_n": 6, "predicted_n": 2}})  # fmt: skip
    assert t.counts() == (10, 2, 6, None) and t.reason().value == "maxTokens"


def test_upstream_error_bodies_in_every_shape() -> None:
    assert wire.error_message(429, b'{"error": {"message": "slow", "code": "rl"}}') == ("slow", "rl")
    assert wire.error_message(400, b'{"object": "error", "message": "too long"}')[0] == "too long"
    assert wire.error_message(500, b'{"error": "boom"}')[0] == "boom"
    assert wire.error_message(422, b'{"detail": "bad"}')[0] == "bad"
    assert wire.error_message(502, b"<html>gateway</html>")[0] == "<html>gateway</html>"
    assert wire.error_message(503, b"")[0] == "HTTP 503"


def test_an_upstreams_context_refusal_is_worded_as_ours() -> None:
    """llama-server's and vLLM's refusals of a prompt over the context, with
    their numbers, become this server's wording (Claude Code parses it) and
    code (Codex acts on it); anything else is left as it was."""
    message = "request (4476 tokens) exceeds the available context size (4096 tokens)"
    err = {"code": 400, "message": message, "type": "exceed_context_size_error", "n_prompt_tokens": 4476, "n_ctx": 4096}
    llama = orjson.dumps({"error": err})
    over = wire.context_overflow(wire.error_message(400, llama)[0], llama)
    assert over is not None and over.code == "context_length_exceeded"
    assert str(over).startswith("prompt is too long: 4476 tokens > 4096 maximum")
    cases = {
        "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. "
        "Please reduce the length of the input messages.": "prompt is too long: 5000 tokens > 4096 maximum",
        "This model's maximum context length is 4096 tokens. However, you requested 4200 tokens (200 in the "
        "messages, 4000 in the completion). Please reduce the length of the messages or completion.":
        "input length and `max_tokens` exceed context limit: 200 + 4000 > 4096",
        "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 "
        "tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None":
        "input length and `max_tokens` exceed context limit: 2778 + 8000 > 4096",
    }  # fmt: skip
    for message, worded in cases.items():
        raw = orjson.dumps({"object": "error", "message": message, "type": "BadRequestError", "code": 400})
        over = wire.context_overflow(message, raw)
        assert over is not None and str(over).startswith(worded), (message, over)
    assert (
        wire.context_overflow("tools are not supported", b'{"error": {"message": "tools are not supported"}}') is None
    )
    assert wire.context_overflow("exceeds", b'{"error": {"type": "exceed_context_size_error"}}') is None  # no numbers


def test_routing_key_sees_past_a_long_system_prompt() -> None:
    long_system = {"role": "system", "content": "rule. " * 5000}
    one = routing_key(None, [long_system, {"role": "user", "content": "first conversation"}], None)
    two = routing_key(None, [long_system, {"role": "user", "content": "second conversation"}], None)
    assert one != two


def test_reasoning_efforts_become_what_upstreams_take() -> None:
    from turbospark.core.request import ChatRequest

    def body(effort: str | None) -> dict[str, Any]:
        return wire.request_body(ChatRequest(messages=[{"role": "user", "content": "x"}], reasoning=effort), None)

    assert body("none")["chat_template_kwargs"] == {"enable_thinking": False} and "reasoning_effort" not in body("none")
    assert body("max")["reasoning_effort"] == "high" and body("low")["reasoning_effort"] == "low"
    assert "reasoning_effort" not in body(None)


def test_remote_options_refuse_a_key_in_the_config() -> None:
    ok = remote_options("m", {"base_url": "http://h:1/v1", "model": "x", "api_key_env": "K", "ctx": 100}, "s")
    assert ok.ctx == 100 and ok.api_key_env == "K"
    with pytest.raises(RemoteConfigError, match="api_key_env"):
        remote_options("m", {"base_url": "http://h/v1", "model": "x", "headers": {"authorization": "Bearer k"}}, "s")
    with pytest.raises(RemoteConfigError, match="unknown key s.api_key"):
        remote_options("m", {"base_url": "http://h/v1", "model": "x", "api_key": "sk-1"}, "s")
    with pytest.raises(RemoteConfigError, match="base_url"):
        remote_options("m", {"base_url": "gpu-box:8000", "model": "x"}, "s")
    for url in ("http://user:sk-1@h/v1", "http://h/v1?api-key=sk-1"):
        with pytest.raises(RemoteConfigError, match="credentials"):
            remote_options("m", {"base_url": url, "model": "x"}, "s")


def test_config_reads_remote_models_and_groups(tmp_path) -> None:
    f = tmp_path / "t.toml"
    f.write_text(
        """
[defaults]
ctx = 1024

[models.big]
kind = "remote"
base_url = "http://gpu-box:8000/v1"
model = "Qwen/Qwen3-32B"
api_key_env = "GPU_BOX_KEY"
ctx = 32768
aliases = ["gpt-4o"]

[models.pool]
model = "Qwen/Qwen3-32B"
ctx = 32768
routing = "round-robin"
cooldown = 3
replicas = [
  { name = "a", base_url = "http://gpu-a:8000/v1" },
  { base_url = "http://gpu-b:8000/v1", ctx = 16384 },
  { name = "here", model = "smollm2-135m" },
]
"""
    )
    cfg = load_config(str(f))
    big, pool = cfg.models
    assert isinstance(big, RemoteOptions) and big.ctx == 32768 and big.aliases == ("gpt-4o",)
    assert isinstance(pool, GroupOptions) and pool.routing == "round-robin" and pool.cooldown == 3
    names = [n for n, _ in pool.replicas]
    assert names == ["a", "gpu-b:8000", "here"]
    a, b, here = (o for _, o in pool.replicas)
    assert isinstance(a, RemoteOptions) and a.model == "Qwen/Qwen3-32B" and a.ctx == 32768
    assert isinstance(b, RemoteOptions) and b.ctx == 16384
    assert isinstance(here, ModelOptions) and here.ctx == 1024 and here.id == "pool@here"


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ('kind = "remote"\nmodel = "x"', "base_url is required"),
        ('kind = "remote"\nbase_url = "http://h/v1"\nmodel = "x"\napi_key = "sk"', "unknown key"),
        ('model = "x"\nreplicas = []', "list of tables"),
        ('model = "x"\nrouting = "random"\nreplicas = [{ base_url = "http://h/v1" }]', "routing must be one of"),
        ('model = "x"\nreplicas = [{ base_url = "http://h/v1" }, { base_url = "http://h/v1" }]', "named"),
        # a CA bundle is read when the config is: a bad one is no 500 at every request
        ('kind = "remote"\nbase_url = "https://h/v1"\nmodel = "x"\nca_file = "TMP/none.pem"', "no readable PEM"),
        ('kind = "remote"\nbase_url = "https://h/v1"\nmodel = "x"\nca_file = "TMP/not-pem.txt"', "no readable PEM"),
    ],
)
def test_config_errors_name_the_key(tmp_path, section: str, error: str) -> None:
    (tmp_path / "not-pem.txt").write_text("hello")
    section = section.replace("TMP", str(tmp_path))
    f = tmp_path / "t.toml"
    f.write_text(f"[models.m]\n{section}\n")
    with pytest.raises(ConfigError, match=error):
        load_config(str(f))
