"""What a GGUF file says about itself, read from its header without loading
it: architecture, parameter count, training context, quantization, name and
chat template (``turbospark models``, ``/api/show``, ``/api/tags``)."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

MAGIC = b"GGUF"
#: llama.cpp's ``llama_ftype`` names (``general.file_type``)
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}  # fmt: skip
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: keys kept (arrays, e.g. the vocabulary, are skipped)
_WANTED = ("general.", "split.", "tokenizer.chat_template")


class NotGGUF(ValueError):
    pass


@dataclass(frozen=True)
class Facts:
    architecture: str = ""
    name: str = ""
    parameters: int = 0
    context: int = 0
    quant: str = ""
    chat_template: str = ""
    #: parts of a split model (1: one file)
    split_count: int = 1

    def describe(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "parameters": self.parameters,
            "parameter_size": size_label(self.parameters),
            "context": self.context,
            "quant": self.quant,
        }


def size_label(parameters: int) -> str:
    """``135M``, ``1.5B`` (as Ollama shows it)."""
    if parameters >= 10**9:
        return f"{parameters / 10**9:.1f}B".replace(".0B", "B")
    if parameters >= 10**6:
        return f"{parameters / 10**6:.0f}M"
    return str(parameters)


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
        return str(self.f.read(n).decode("utf-8", "replace"))

    def value(self, kind: int, keep: bool) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, n = self.take("<I"), self.take("<Q")
            if inner in _SCALARS and not keep:  # skipped whole
                self.f.seek(n * struct.calcsize(_SCALARS[inner]), 1)
                return None
            values = [self.value(inner, keep) for _ in range(n)]
            return values if keep else None
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise NotGGUF(f"unknown value type {kind} in the header")
        return self.take(fmt)


def _header(path: str) -> tuple[dict[str, Any], int]:
    """The wanted key/values and the parameter count of one file."""
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise NotGGUF(f"{path} does not start with a GGUF header")
        r = _Reader(f)
        version = r.take("<I")
        count = "<Q" if version >= 2 else "<I"
        tensors, kvs = r.take(count), r.take(count)
        meta: dict[str, Any] = {}
        for _ in range(kvs):
            key = r.string()
            keep = key.startswith(_WANTED) or key.endswith(".context_length")
            value = r.value(r.take("<I"), keep)
            if keep:
                meta[key] = value
        parameters = 0
        for _ in range(tensors):
            r.string()
            dims = [r.take("<Q") for _ in range(r.take("<I"))]
            r.take("<I"), r.take("<Q")
            n = 1
            for d in dims:
                n *= d
            parameters += n
    return meta, parameters


def read(paths: Iterable[str]) -> Facts:
    """The facts of a model: its first file's metadata, its parameters summed
    over every part of a split model. Raises :class:`NotGGUF`."""
    paths = list(paths)
    meta, parameters = _header(paths[0])
    for more in paths[1:]:
        parameters += _header(more)[1]
    arch = str(meta.get("general.architecture", ""))
    file_type = meta.get("general.file_type")
    return Facts(
        architecture=arch,
        name=str(meta.get("general.name", "")),
        parameters=parameters,
        context=int(meta.get(f"{arch}.context_length", 0) or 0),
        quant=FILE_TYPES.get(file_type, str(file_type)) if isinstance(file_type, int) else "",
        chat_template=str(meta.get("tokenizer.chat_template", "")),
        split_count=int(meta.get("split.count", 1) or 1),
    )
