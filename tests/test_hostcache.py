"""The host-memory KV tier's bookkeeping: bounded by bytes, least recently
used out first, partitioned by tenant."""

from __future__ import annotations

from turbospark.engine.hostcache import HostCache, default_budget_mib


def test_lookups_never_cross_owners_and_find_the_longest_shared_prefix():
    c = HostCache(1 << 20)
    assert c.put("a", [1, 2, 3, 4], b"A" * 10)
    assert c.put("a", [1, 2, 9], b"B" * 10)
    assert c.put("b", [1, 2, 3, 4, 5], b"C" * 10)
    key, lcp = c.best("a", [1, 2, 3, 4, 5, 6])
    assert lcp == 4 and c.take(key).state == b"A" * 10
    assert c.best("a", [1, 2, 3, 4, 5, 6]) == (c.best("a", [1, 2, 9])[0], 2)  # only [1, 2, 9] is left
    assert c.best("c", [1, 2, 3]) == (-1, 0)  # another tenant sees nothing
    assert (c.saved, c.restored) == (3, 1)


def test_the_budget_holds_least_recently_used_out_first():
    c = HostCache(3 * (100 + 8 * 2))
    for i in range(5):
        assert c.put("a", [i, i], b"x" * 100)
    assert len(c) == 3 and c.bytes <= c.budget and c.evicted == 2
    assert c.best("a", [0, 0])[1] == 0 and c.best("a", [4, 4])[1] == 2  # the oldest went first
    assert not c.put("a", [7], b"x" * 10_000)  # larger than the whole budget: not kept


def test_a_longer_record_of_the_same_conversation_replaces_its_prefix():
    c = HostCache(1 << 20)
    c.put("a", [1, 2, 3], b"old")
    c.put("a", [1, 2, 3, 4, 5], b"new")
    assert len(c) == 1 and c.take(c.best("a", [1, 2, 3, 4, 5])[0]).state == b"new"


def test_zero_budget_turns_the_tier_off():
    c = HostCache(0)
    assert not c.enabled and not c.put("a", [1], b"x") and len(c) == 0
    assert 0 <= default_budget_mib() <= 4096
