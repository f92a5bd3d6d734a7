"""KV-cache arithmetic, so a configuration that cannot fit is refused at
start-up with the numbers instead of failing (or swapping) later."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .llama import CACHE_TYPE_BYTES, LlamaModelFile, lib


class MemoryRefused(RuntimeError):
    pass


@dataclass(frozen=True)
class KvPlan:
    slots: int
    tokens_per_slot: int
    bytes_per_token: int
    model_bytes: int
    cache_type: str = "f16"

    @property
    def cells(self) -> int:
        return self.slots * self.tokens_per_slot

    @property
    def kv_bytes(self) -> int:
        return self.cells * self.bytes_per_token

    def describe(self) -> str:
        return (
            f"KV cache {self.slots} slots x {self.tokens_per_slot} tokens x "
            f"{self.bytes_per_token / 1024:.1f} KiB/token = {self.kv_bytes / 2**20:.0f} MiB ({self.cache_type})"
        )


def kv_bytes_per_token(file: LlamaModelFile) -> int:
    """Bytes of f16 K and V per token across all layers (an upper bound for
    sliding-window models, whose windowed layers hold less)."""
    L = lib()
    md = file.metadata
    arch = md.get("general.architecture", "")
    n_layer: int = L.llama_model_n_layer(file.ptr)
    n_head = max(1, L.llama_model_n_head(file.ptr))
    n_head_kv: int = L.llama_model_n_head_kv(file.ptr)
    key_len = int(md.get(f"{arch}.attention.key_length", file.n_embd // n_head))
    value_len = int(md.get(f"{arch}.attention.value_length", key_len))
    return n_layer * n_head_kv * (key_len + value_len) * 2


def available_memory() -> int | None:
    """MemAvailable on Linux; None where we cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def plan_kv(file: LlamaModelFile, slots: int, tokens_per_slot: int, cache_type: str = "f16") -> KvPlan:
    per_token = round(kv_bytes_per_token(file) / 2 * CACHE_TYPE_BYTES[cache_type])
    plan = KvPlan(slots, tokens_per_slot, per_token, file.size_bytes, cache_type)
    avail = available_memory()
    if os.environ.get("TURBOSPARK_SKIP_MEMORY_CHECK"):
        return plan
    if avail is not None and plan.kv_bytes > avail:
        raise MemoryRefused(
            f"{plan.describe()} does not fit: only {avail / 2**20:.0f} MiB of memory is available "
            f"(after the {plan.model_bytes / 2**20:.0f} MiB of weights). Lower --ctx or --session-slots."
        )
    return plan
