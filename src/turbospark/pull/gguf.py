"""What a GGUF file says about itself, read from its header without loading
it: architecture, parameter count, training context, quantization, name and
chat template (``turbospark models``, ``/api/show``, ``/api/tags``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..engine.gguf import MAGIC, NotGGUF, check

__all__ = ["MAGIC", "FILE_TYPES", "Facts", "NotGGUF", "read", "size_label"]
#: llama.cpp's ``llama_ftype`` names (``general.file_type``)
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}  # fmt: skip


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


def read(paths: Iterable[str]) -> Facts:
    """The facts of a model: its first file's metadata, its parameters summed
    over every part of a split model. Raises :class:`NotGGUF`."""
    paths = list(paths)
    first = check(paths[0])
    meta, parameters = first.meta, first.parameters
    for more in paths[1:]:
        parameters += check(more).parameters
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
