"""Media for the tests, made with the standard library: PNGs of one colour
(or striped), WAVs of a tone or noise. Deterministic."""

from __future__ import annotations

import io
import math
import random
import struct
import wave
import zlib

from .mmproj import IMAGE_SIZE
from .mmproj_audio import SAMPLE_RATE


def png(width: int, height: int, rgb: tuple[int, int, int], stripe: bool = False) -> bytes:
    """An RGB PNG of one colour (or with a white vertical stripe), stdlib only."""
    rows = b""
    for _ in range(height):
        pixels = b"".join(
            bytes((255, 255, 255)) if stripe and width // 3 <= x < width // 2 else bytes(rgb) for x in range(width)
        )
        rows += b"\x00" + pixels  # filter type 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


RED = png(IMAGE_SIZE, IMAGE_SIZE, (200, 30, 30))
STRIPED = png(40, 24, (20, 60, 200), stripe=True)  # another size: resized to the projector's


def wav(samples: list[float], rate: int = SAMPLE_RATE) -> bytes:
    """A mono PCM16 WAV of ``samples`` (in -1..1), stdlib only."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", round(s * 32767)) for s in samples))
    return out.getvalue()


def sine(seconds: float, hz: float = 440.0) -> list[float]:
    return [0.5 * math.sin(2 * math.pi * hz * i / SAMPLE_RATE) for i in range(int(seconds * SAMPLE_RATE))]


def noise(seconds: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(-0.5, 0.5) for _ in range(int(seconds * SAMPLE_RATE))]


TONE_THEN_NOISE = wav(sine(1.0) + noise(1.0))  # 2 s
NOISE_THEN_TONE = wav(noise(1.0) + sine(1.0, hz=880.0))
