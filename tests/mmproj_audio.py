"""A tiny audio projector, generated: a random-weight Whisper-style audio
encoder with an Ultravox projector (``clip.projector_type`` ``ultravox``),
written as the GGUF that llama.cpp's libmtmd loads beside a text model (the
``clip.audio.*`` keys and the ``a.*`` / ``mm.a.*`` tensors that ``clip.cpp``
of the llama.cpp vendored by llama-cpp-python 0.3.36 reads).

No checkpoint is downloaded: the weights are drawn from a fixed seed, so the
same arguments always write the same file (about 720 KB). Its output is
meaningless but its shape is real. libmtmd turns sound into Whisper's log-mel
spectrogram (16 kHz, 10 ms hop, ``N_MEL`` bins), padded with 30 s of silence
and cut into windows of 3000 frames (30 s), each window one audio chunk (the
last, incomplete, window is dropped: it is always padding). One window:

* two 1-d convolutions (kernel 3, the second with stride 2): 3000 -> 1500
  positions of width ``HIDDEN``;
* ``BLOCKS`` transformer blocks over them (learned positions, 1500 rows);
* Ultravox's StackAudioFrames: ``STACK`` positions side by side,
  1500 / ``STACK`` rows of width ``HIDDEN * STACK``;
* the projector: RMS norm, a linear layer to ``2 * PROJ_HIDDEN``, SwiGLU,
  RMS norm, a linear layer to ``n_embd_text`` (576 for SmolLM2-135M).

So any sound of at most 30 s becomes one chunk of ``N_AUDIO_TOKENS`` (1500
positions over a stack of 20: 75) embeddings. The stack must divide 1500:
libmtmd counts the tokens as ``ceil(3000 / STACK) // 2`` while the graph
yields ``ceil(1500 / STACK)`` rows, and aborts the process (GGML_ABORT "Invalid
number of output tokens") where the two differ, as they do for Ultravox's own
8 (187 counted, 188 computed); engine/media.py refuses such a projector.

Shapes are written in numpy order (the reverse of ggml's ``ne``): a linear
layer from ``a`` to ``b`` features is ``(b, a)``; a 1-d convolution kernel is
``(out, in, width)`` and its bias ``(out, 1)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .mmproj import add_encoder

#: Whisper's front end, fixed by libmtmd for this projector type
SAMPLE_RATE = 16000
WINDOW_FRAMES = 3000  # 30 s of 10 ms mel frames
#: mel bins (libmtmd builds its filter bank for any count in 1..256)
N_MEL = 16
#: the encoder's sizes (kept tiny)
HIDDEN = 32
FFN = 64
HEADS = 2
BLOCKS = 1
#: positions after the strided convolution, one per 20 ms
N_POS = WINDOW_FRAMES // 2
#: Ultravox's frame stacking (a divisor of N_POS: see above)
STACK = 20
#: the projector's inner width (after SwiGLU)
PROJ_HIDDEN = 64
#: what one sound of at most 30 s becomes
N_AUDIO_TOKENS = N_POS // STACK


def write_audio_mmproj(path: Path, n_embd_text: int = 576, seed: int = 0, stack: int = STACK) -> Path:
    """Write the audio projector GGUF to ``path`` and return it."""
    import gguf  # a test dependency (pyproject's "test" extra)

    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        # scaled like a trained layer's (fan-in is every axis but the first)
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    def bias(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", "turbospark test audio projector")
    writer.add_string("general.description", f"random-weight Whisper encoder + ultravox projector, seed {seed}")
    writer.add_bool("clip.has_vision_encoder", False)
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.projector_type", "ultravox")
    writer.add_uint32("clip.audio.num_mel_bins", N_MEL)
    add_encoder(writer, "audio", HIDDEN, FFN, BLOCKS, HEADS, n_embd_text)
    writer.add_uint32("clip.audio.projector.stack_factor", stack)

    # the convolutions are F16, as convert_hf_to_gguf.py writes Whisper's
    writer.add_tensor("a.conv1d.1.weight", weight(HIDDEN, N_MEL, 3).astype(np.float16))
    writer.add_tensor("a.conv1d.1.bias", bias(HIDDEN, 1))
    writer.add_tensor("a.conv1d.2.weight", weight(HIDDEN, HIDDEN, 3).astype(np.float16))
    writer.add_tensor("a.conv1d.2.bias", bias(HIDDEN, 1))
    writer.add_tensor("a.position_embd.weight", weight(N_POS, HIDDEN))
    for i in range(BLOCKS):
        blk = f"a.blk.{i}"
        writer.add_tensor(f"{blk}.attn_q.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{blk}.attn_q.bias", bias(HIDDEN))
        writer.add_tensor(f"{blk}.attn_k.weight", weight(HIDDEN, HIDDEN))  # Whisper's k has no bias
        writer.add_tensor(f"{blk}.attn_v.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{blk}.attn_v.bias", bias(HIDDEN))
        writer.add_tensor(f"{blk}.attn_out.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{blk}.attn_out.bias", bias(HIDDEN))
        for norm in ("ln1", "ln2"):
            writer.add_tensor(f"{blk}.{norm}.weight", ones(HIDDEN))
            writer.add_tensor(f"{blk}.{norm}.bias", np.zeros(HIDDEN, np.float32))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(FFN, HIDDEN))
        writer.add_tensor(f"{blk}.ffn_up.bias", bias(FFN))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(HIDDEN, FFN))
        writer.add_tensor(f"{blk}.ffn_down.bias", bias(HIDDEN))
    writer.add_tensor("a.post_ln.weight", ones(HIDDEN))
    writer.add_tensor("a.post_ln.bias", np.zeros(HIDDEN, np.float32))
    # the Ultravox projector: no biases
    writer.add_tensor("mm.a.norm_pre.weight", ones(HIDDEN * stack))
    writer.add_tensor("mm.a.mlp.1.weight", weight(2 * PROJ_HIDDEN, HIDDEN * stack))
    writer.add_tensor("mm.a.norm_mid.weight", ones(PROJ_HIDDEN))
    writer.add_tensor("mm.a.mlp.2.weight", weight(n_embd_text, PROJ_HIDDEN))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":  # pragma: no cover - by hand: python -m tests.mmproj_audio OUT.gguf
    import sys

    print(write_audio_mmproj(Path(sys.argv[1])))
