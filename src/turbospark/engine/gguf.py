"""A GGUF file's header read without llama.cpp: its key/values and tensor
infos, and whether every tensor's data lies within the file. A truncated or
damaged file is refused here with a clear error (before a pull moves it into
the store, and before llama.cpp is asked to load it), never found out as a
failed load at the first request."""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import IO, Any

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: keys kept (arrays, e.g. the vocabulary, are skipped); ``clip.``: a
#: multimodal projector's (engine/media.py checks what libmtmd cannot run)
_WANTED = ("general.", "split.", "tokenizer.chat_template", "clip.")
#: ggml type -> (elements per block, bytes per block), as ggml_blck_size/ggml_type_size say
_TYPES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18), 42: (64, 18),
}  # fmt: skip
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


class NotGGUF(ValueError):
    """Not a GGUF file, or a damaged one (the message says what; it names no
    folder, only the file)."""


@dataclass(frozen=True)
class Header:
    meta: dict[str, Any]
    parameters: int
    #: the first tensor whose data runs past the end of the file: (name, end)
    overrun: tuple[str, int] | None
    size: int


class _Reader:
    def __init__(self, f: IO[bytes]) -> None:
        self.f = f

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise NotGGUF("the header ends early")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        n = self.take("<Q")
        if n > 1 << 26:
            raise NotGGUF("a string in the header is implausibly long")
        data = self.f.read(n)
        if len(data) != n:
            raise NotGGUF("the header ends early")
        return data.decode("utf-8", "replace")

    def value(self, kind: int, keep: bool) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, n = self.take("<I"), self.take("<Q")
            if inner in _SCALARS and not keep:  # skipped whole
                self.f.seek(n * struct.calcsize(_SCALARS[inner]), 1)
                return None
            if inner == _STRING and not keep:  # (a vocabulary: skipped string by string)
                for _ in range(n):
                    self.f.seek(self.take("<Q"), 1)
                return None
            values = [self.value(inner, keep) for _ in range(n)]
            return values if keep else None
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise NotGGUF(f"unknown value type {kind} in the header")
        return self.take(fmt)


def _tensors(r: _Reader, count: int) -> tuple[int, list[tuple[str, int, int]]]:
    """The parameter count and each tensor's (name, offset, bytes or -1)."""
    parameters, spans = 0, []
    for _ in range(count):
        name = r.string()
        n_dims = r.take("<I")
        if n_dims > 8:
            raise NotGGUF(f"tensor {name!r} has {n_dims} dimensions")
        dims = [r.take("<Q") for _ in range(n_dims)]
        kind, offset = r.take("<I"), r.take("<Q")
        n = 1
        for d in dims:
            n *= d
        parameters += n
        block = _TYPES.get(kind)
        nbytes = -1 if block is None or not dims else n // block[0] * block[1]
        spans.append((name, offset, nbytes))
    return parameters, spans


def header(path: str) -> Header:
    """The wanted key/values, the parameter count and the first tensor
    whose data lies outside the file. Raises :class:`NotGGUF`."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise NotGGUF("it does not start with a GGUF header")
        r = _Reader(f)
        version = r.take("<I")
        count = "<Q" if version >= 2 else "<I"
        tensors, kvs = r.take(count), r.take(count)
        if tensors > size or kvs > size:
            raise NotGGUF("the header's counts are implausible")
        meta: dict[str, Any] = {}
        for _ in range(kvs):
            key = r.string()
            keep = key.startswith(_WANTED) or key.endswith((".context_length", ".pooling_type"))
            value = r.value(r.take("<I"), keep)
            if keep:
                meta[key] = value
        parameters, spans = _tensors(r, tensors)
        align = meta.get("general.alignment", 32)
        align = align if isinstance(align, int) and align > 0 else 32
        start = -(-f.tell() // align) * align  # the data section, aligned
    overrun = None
    for name, offset, nbytes in spans:
        end = start + offset + max(nbytes, 1)
        if end > size:
            overrun = (name, end)
            break
    return Header(meta, parameters, overrun, size)


def check(path: str) -> Header:
    """The header of a file whose tensors all lie within it, or
    :class:`NotGGUF` saying what is wrong."""
    try:
        found = header(path)
    except OSError as exc:
        raise NotGGUF(f"it cannot be read ({exc.strerror or exc})") from None
    if found.overrun is not None:
        name, end = found.overrun
        raise NotGGUF(
            f"tensor {name!r} ends at byte {end}, past the end of the file ({found.size} bytes): "
            "the file is truncated or damaged"
        )
    return found


def check_model(path: str) -> None:
    """A model file (and every part of a split one) as llama.cpp would
    load it, or :class:`NotGGUF` naming the file (never its folder)."""
    parts = [path]
    match = _SPLIT.match(os.path.basename(path))
    if match and match["no"] == "00001":
        count = int(match["count"])
        folder = os.path.dirname(path)
        parts += [os.path.join(folder, f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(2, count + 1)]
    for part in parts:
        try:
            check(part)
        except NotGGUF as exc:
            raise NotGGUF(f"the model file {os.path.basename(part)} is not usable: {exc}") from None


def projector_info(path: str) -> dict[str, Any]:
    """A projector GGUF's ``general.*`` and ``clip.*`` keys, read from its
    header (Ollama's ``projector_info``); empty when it cannot be read."""
    try:
        meta = header(path).meta
    except (NotGGUF, OSError):
        return {}
    return {k: v for k, v in meta.items() if k.startswith(("general.", "clip."))}


def projector_modalities(info: dict[str, Any]) -> dict[str, bool]:
    """What a projector takes, as its header says (:func:`projector_info`):
    ``{"vision": …, "audio": …}``, as libmtmd reads ``clip.has_*_encoder``."""
    return {"vision": bool(info.get("clip.has_vision_encoder")), "audio": bool(info.get("clip.has_audio_encoder"))}


#: llama.cpp's pooling type "rank" (a reranker's)
POOLING_RANK = 4


def is_reranker(path: str) -> bool:
    """Whether a GGUF declares rank pooling (``<arch>.pooling_type`` 4: a
    reranker), read from its header; False when it cannot be read."""
    try:
        meta = header(path).meta
    except (NotGGUF, OSError):
        return False
    return meta.get(f"{meta.get('general.architecture', '')}.pooling_type") == POOLING_RANK
