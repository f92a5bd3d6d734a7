"""Split a GGUF file the way llama.cpp's ``gguf-split`` does (for the pull
tests' "split model" repository): every part a GGUF of its own, the first
with all the metadata, each with ``split.no``, ``split.count`` and
``split.tensors.count``, named ``prefix-0000i-of-0000n.gguf``."""

from __future__ import annotations

import os
import struct
from typing import IO

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(f: IO[bytes], kind: int) -> None:
    if kind == 8:  # string
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(n, 1)
    elif kind == 9:  # array
        inner, n = struct.unpack("<IQ", f.read(12))
        if inner in _SCALAR:
            f.seek(_SCALAR[inner] * n, 1)
        else:
            for _ in range(n):
                _skip_value(f, inner)
    else:
        f.seek(_SCALAR[kind], 1)


def _string(f: IO[bytes]) -> bytes:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n)


def _kv(key: str, kind: int, fmt: str, value: int) -> bytes:
    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<I", kind) + struct.pack(fmt, value)


def split_gguf(src: str, prefix: str, parts: int = 2) -> list[str]:
    with open(src, "rb") as f:
        assert f.read(4) == b"GGUF"
        version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
        kvs, alignment = [], 32
        for _ in range(n_kv):
            start = f.tell()
            key = _string(f).decode()
            (kind,) = struct.unpack("<I", f.read(4))
            at = f.tell()
            _skip_value(f, kind)
            if key == "general.alignment":
                end = f.tell()
                f.seek(at)
                alignment = struct.unpack("<I", f.read(4))[0]
                f.seek(end)
            end = f.tell()
            f.seek(start)
            kvs.append(f.read(end - start))
        tensors = []
        for _ in range(n_tensors):
            name = _string(f)
            (n_dims,) = struct.unpack("<I", f.read(4))
            rest = f.read(8 * n_dims + 4)
            (offset,) = struct.unpack("<Q", f.read(8))
            tensors.append((name, struct.pack("<I", n_dims) + rest, offset))
        data_start = -(-f.tell() // alignment) * alignment
        total = os.path.getsize(src) - data_start
    ends = [t[2] for t in tensors[1:]] + [total]
    sizes = [end - t[2] for t, end in zip(tensors, ends, strict=True)]
    per = -(-len(tensors) // parts)
    paths = []
    with open(src, "rb") as f:
        for i in range(parts):
            chunk = list(range(i * per, min((i + 1) * per, len(tensors))))
            extra = [
                _kv("split.no", 2, "<H", i),
                _kv("split.count", 2, "<H", parts),
                _kv("split.tensors.count", 5, "<i", len(tensors)),
            ]
            meta = (kvs if i == 0 else []) + extra
            head = b"GGUF" + struct.pack("<IQQ", version, len(chunk), len(meta)) + b"".join(meta)
            offset, infos = 0, []
            for j in chunk:
                name, dims, _ = tensors[j]
                infos.append(struct.pack("<Q", len(name)) + name + dims + struct.pack("<Q", offset))
                offset += -(-sizes[j] // alignment) * alignment
            head += b"".join(infos)
            path = f"{prefix}-{i + 1:05d}-of-{parts:05d}.gguf"
            with open(path, "wb") as out:
                out.write(head + b"\0" * (-len(head) % alignment))
                for j in chunk:
                    f.seek(data_start + tensors[j][2])
                    block = f.read(sizes[j])
                    out.write(block + b"\0" * (-len(block) % alignment))
            paths.append(path)
    return paths
