"""The llama.cpp-backed engine. Nothing in this package knows HTTP."""

from .types import (
    AdmissionError,
    CancelFlag,
    EngineError,
    GenerationConfig,
    Overloaded,
    Progress,
    RawDecodeResult,
    StopReason,
)

__all__ = [
    "AdmissionError",
    "CancelFlag",
    "EngineError",
    "GenerationConfig",
    "Overloaded",
    "Progress",
    "RawDecodeResult",
    "StopReason",
]
