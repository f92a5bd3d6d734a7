"""The host-memory KV tier's bookkeeping: bounded by bytes, least recently
used out first, partitioned by tenant, kept on disk with --cache-dir."""

from __future__ import annotations

import os
import stat

from turbospark.engine.hostcache import HostCache, cache_folder, default_budget_mib


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


def test_records_persist_privately_and_load_back_most_recent_first(tmp_path):
    c = HostCache(1 << 20)
    c.put("a", [1, 2, 3], b"S1" * 50, prompt_len=2)
    c.put("b", [4, 5], b"S2" * 50)
    folder = str(tmp_path / "kv")
    assert c.persist(folder) == 2
    files = sorted(os.listdir(folder))
    assert len(files) == 2 and all(stat.S_IMODE(os.stat(os.path.join(folder, f)).st_mode) == 0o600 for f in files)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    with open(os.path.join(folder, "999999.kv"), "wb") as f:  # garbage is skipped, not fatal
        f.write(b"not a record")
    d = HostCache(1 << 20)
    assert d.load(folder) == 2
    key, lcp = d.best("a", [1, 2, 3, 9])
    entry = d.take(key)
    assert lcp == 3 and entry.state == b"S1" * 50 and entry.prompt_len == 2
    assert d.best("a", [4, 5])[1] == 0 and d.best("b", [4, 5])[1] == 2  # owners kept
    small = HostCache(120)  # room for one record: the most recent one wins
    assert small.load(folder) == 1 and small.best("b", [4, 5])[1] == 2
    assert HostCache(0).load(folder) == 0
    c.take(c.best("b", [4, 5])[0])
    assert c.persist(folder) == 1 and os.listdir(folder) == ["000000.kv"]  # stale files go


def test_the_folder_is_per_model_file_and_kv_type(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    a = cache_folder(str(tmp_path), str(gguf), "f16")
    assert a == cache_folder(str(tmp_path), str(gguf), "f16")
    assert a != cache_folder(str(tmp_path), str(gguf), "q8_0")
    assert os.path.basename(a).startswith("m-")


def test_an_unwritable_folder_is_a_warning_not_a_failure(tmp_path):
    c = HostCache(1 << 20)
    c.put("a", [1], b"x")
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert c.persist(str(blocker / "kv")) == 0


def test_damaged_or_odd_files_are_skipped_and_the_good_ones_load(tmp_path):
    """Whatever a file in the folder holds, it is skipped or loaded, never a
    reason to fail the model's load (which failed it, and the exit's write
    then deleted every other record): a state damaged on disk fails its
    checksum, a header's numbers are checked against the file, a FIFO is
    never opened for a blocking read. A writer killed midway leaves a
    ``.tmp`` that the next write removes."""
    folder = str(tmp_path / "kv")
    good = HostCache(1 << 20)
    good.put("a", [1, 2, 3], b"S" * 100)
    assert good.persist(folder) == 1
    with open(os.path.join(folder, "000000.kv"), "rb") as f:
        whole = f.read()
    magic, head, rest = whole.split(b"\n", 2)

    def write(name: str, data: bytes) -> None:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)

    flipped = bytearray(whole)
    flipped[-10] ^= 0x40  # one bit of the state
    write("000001.kv", bytes(flipped))
    for i, header in enumerate(
        [
            head.replace(b'"tokens": 3', b'"tokens": 1e400'),
            head.replace(b'"tokens": 3', b'"tokens": 100000000000000000000'),
            head.replace(b'"tokens": 3', b'"tokens": 1000000000000'),
            head.replace(b'"prompt_len": 0', b'"prompt_len": 1e400'),
            b"[" * 200_000,
            b"42",
            head.replace(b'"owner": "a"', b'"owner": ["a"]'),
            head.replace(b'"owner": "a"', b'"owner": "b"'),  # (the checksum covers the header too)
            head.replace(b'"tokens": 3', b'"tokens": 2'),
        ]
    ):
        write(f"00001{i}.kv", magic + b"\n" + header + b"\n" + rest)
    os.mkfifo(os.path.join(folder, "000100.kv"))
    write("000000.kv.x.tmp", b"left by a writer killed midway")
    back = HostCache(1 << 20)
    assert back.load(folder) == 1 and back.best("a", [1, 2, 3])[1] == 3
    assert back.persist(folder) == 1
    assert sorted(os.listdir(folder)) == ["000000.kv"]


def test_one_model_at_a_time_keeps_a_folder(tmp_path):
    """Within this process a model still writing its records on its way out
    hands the folder to its next load (keep-alive, eviction, a reload after
    a failure: the next load was refused and kept its tier in memory for
    good); a live one keeps it; another process's lock file keeps it."""
    import subprocess
    import sys
    import threading

    from turbospark.engine.hostcache import FolderLock, folder_problem

    first, second = FolderLock(str(tmp_path)), FolderLock(str(tmp_path))
    assert first.acquire() is None
    assert "another model of this server" in (second.acquire(wait=0) or "")
    first.closing = True  # (its scheduler is closing, writing its records)
    assert "still writing" in (second.acquire(wait=0.05) or "")
    threading.Timer(0.2, first.release).start()
    assert second.acquire(wait=30) is None  # handed over once written
    second.release()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            str(tmp_path / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert "another server" in (FolderLock(str(tmp_path)).acquire(wait=0) or "")
    finally:
        holder.kill()
        holder.wait()
    assert folder_problem(str(tmp_path / "new" / "kv")) is None and (tmp_path / "new" / "kv").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert folder_problem(str(blocker)) is not None and folder_problem(str(blocker / "kv")) is not None
