"""The host-memory KV tier on the real model (issue 13, point 2): a
conversation evicted from its slot moves to host memory and is restored when
it returns (greedy output identical to a cold prefill); --cache-ram 0 turns
it off; tenants never see each other's saved states."""

from __future__ import annotations

import asyncio
import time

import pytest

from turbospark.engine.hostcache import common_prefix
from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.engine.types import CancelFlag, GenerationConfig
from turbospark.models.catalog import resolve_model

from .test_kv_sharing import text


def one_slot(cache_ram: int | None) -> LlamaChatModel:
    return LlamaChatModel(
        ModelOptions(
            path=resolve_model("smollm2-135m")[0],
            id="tier",
            parallel=1,
            session_slots=1,
            speculative=False,
            cache_ram=cache_ram,
        )
    )


def run(model: LlamaChatModel, messages: list[dict[str, str]], owner: str = ""):
    ids = model.render_chat(messages)
    cfg = GenerationConfig(temperature=0, max_new_tokens=24, owner=owner)
    return asyncio.run(model.run_completion(ids, cfg, None, CancelFlag(), lambda p: None))


FIRST = [{"role": "user", "content": "Read this and remember it: " + text(30, 1)}]
OTHER = [{"role": "user", "content": "Unrelated: " + text(25, 2)}]


def returning(answer: str) -> list[dict[str, str]]:
    # the next turn adds well over 64 tokens past the saved record
    return [
        *FIRST,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Now summarise it, and also consider this: " + text(8, 3)},
    ]


@pytest.fixture(scope="module")
def cold_answers():
    model = one_slot(0)
    try:
        first = run(model, FIRST)
        model.scheduler.prefix_reuse = False  # a cold prefill for the reference
        back = run(model, returning(first.text))
        return first.text, back
    finally:
        model.close()


def test_an_evicted_conversation_comes_back_from_host_memory(cold_answers):
    first_text, cold = cold_answers
    model = one_slot(256)
    try:
        first = run(model, FIRST)
        assert first.text == first_text
        other = run(model, OTHER)
        assert other.session_slot_evicted  # FIRST lost its slot ...
        assert model.load()["host_cache"]["entries"] == 1  # ... but not its KV
        back = run(model, returning(first.text))
        assert back.reused_from == "host" and back.reused_prefix_tokens >= first.prompt_tokens
        assert back.token_ids == cold.token_ids  # identical to a cold prefill
        stats = model.load()["host_cache"]
        assert stats["restored"] == 1 and stats["saved"] >= 2  # OTHER went to the tier in turn
    finally:
        model.close()


def test_cache_ram_0_turns_the_tier_off():
    model = one_slot(0)
    try:
        first = run(model, FIRST)
        run(model, OTHER)
        back = run(model, returning(first.text))
        assert back.reused_from != "host" and back.reused_prefix_tokens < first.prompt_tokens // 2
        assert model.load()["host_cache"] == {
            "budget_bytes": 0,
            "bytes": 0,
            "entries": 0,
            "saved": 0,
            "restored": 0,
            "evicted": 0,
        }
    finally:
        model.close()


def test_saved_states_never_cross_tenants():
    model = one_slot(256)
    try:
        first = run(model, FIRST, owner="tenant-a")
        run(model, OTHER, owner="tenant-a")  # FIRST goes to the tier, as tenant-a's
        stranger = run(model, returning(first.text), owner="tenant-b")
        assert stranger.reused_from is None and stranger.reused_prefix_tokens == 0
        owner = run(model, returning(first.text), owner="tenant-a")
        assert owner.reused_from == "host"
    finally:
        model.close()


def test_a_quantised_kv_cache_takes_about_half_the_memory_and_still_generates():
    path = resolve_model("smollm2-135m")[0]
    plans = {}
    for cache_type in ("f16", "q8_0"):
        model = LlamaChatModel(ModelOptions(path=path, id="kvq", parallel=1, speculative=False, cache_type=cache_type))
        try:
            plans[cache_type] = model.kv_plan
            result = run(model, [{"role": "user", "content": "Name three colours."}])
            assert result.new_tokens > 0 and result.text.strip()
            assert cache_type in model.info()["kv_cache"]
        finally:
            model.close()
    assert plans["q8_0"].kv_bytes / plans["f16"].kv_bytes == pytest.approx(34 / 64, rel=0.01)
    with pytest.raises(ValueError, match="cache type must be one of"):
        LlamaChatModel(ModelOptions(path=path, id="kvq", cache_type="q3_k"))


def test_the_tier_outlives_a_restart_with_a_cache_dir(cold_answers, tmp_path):
    """--cache-dir: the slot's record is written at unload and restored by
    the next process's model, with output identical to a cold prefill."""
    first_text, cold = cold_answers
    opts = dict(path=resolve_model("smollm2-135m")[0], id="tier", parallel=1, speculative=False, cache_ram=256)
    model = LlamaChatModel(ModelOptions(**opts, cache_dir=str(tmp_path)))
    try:
        first = run(model, FIRST)
    finally:
        model.close()
    (folder,) = list(tmp_path.iterdir())
    assert len(list(folder.glob("*.kv"))) == 1
    again = LlamaChatModel(ModelOptions(**opts, cache_dir=str(tmp_path)))
    try:
        back = run(again, returning(first.text))
        assert back.reused_from == "host" and back.reused_prefix_tokens >= first.prompt_tokens
        assert back.token_ids == cold.token_ids
        other_tenant = run(again, returning(first.text), owner="t2")
        assert other_tenant.reused_prefix_tokens == 0  # another tenant never sees it
        # a second live model of the same file keeps its tier in memory (the
        # last one to close replaced the other's records)
        twin = LlamaChatModel(ModelOptions(**opts, cache_dir=str(tmp_path)))
        try:
            deadline = time.monotonic() + 30
            while twin.scheduler.cache_dir is not None and time.monotonic() < deadline:
                time.sleep(0.02)  # (its engine thread takes the folder as it starts)
            assert twin.scheduler.cache_dir is None and again.scheduler.cache_dir is not None
        finally:
            twin.close()
    finally:
        again.close()
    other_type = LlamaChatModel(ModelOptions(**opts, cache_dir=str(tmp_path), cache_type="q8_0"))
    try:
        assert run(other_type, returning(first.text)).reused_from is None  # another KV type: its own folder
    finally:
        other_type.close()
    assert len(list(tmp_path.iterdir())) == 2


def test_a_record_whose_state_does_not_hold_its_tokens_is_dropped_not_decoded(cold_answers):
    """A saved record that claims more tokens than its KV holds (a file
    damaged or written by something else): restoring it would leave the
    sequence's positions short of where the next decode continues, which
    fails llama_decode for every sequence in the step (a 500 for this
    request and its neighbours, again after every restart). It is checked
    when restored, dropped for good, and the prompt is prefilled cold."""
    first_text, cold = cold_answers
    model = one_slot(256)
    try:
        run(model, FIRST)
        run(model, OTHER)  # FIRST moves to the host tier
        host = model.scheduler.host  # (the engine thread is idle between requests)
        (entry,) = [e for e in host.records() if e.tokens[:5] == model.render_chat(FIRST)[:5]]
        prompt = model.render_chat(returning(first_text))
        shared = common_prefix(entry.tokens, prompt)
        lying = prompt[: shared + 100]  # 100 positions more than its state holds
        key = host.best("", entry.tokens)[0]
        host.discard(key)
        assert host.put("", lying, entry.state, entry.prompt_len)
        back = run(model, returning(first_text))
        assert back.reused_from != "host"
        assert back.token_ids == cold.token_ids
        assert not [e for e in host.records() if e.tokens == lying]  # never tried again
        assert run(model, returning(first_text)).token_ids == cold.token_ids
    finally:
        model.close()
