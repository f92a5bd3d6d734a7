"""A tiny multimodal projector, generated: a random-weight CLIP vision
encoder with a LLaVA-style ``mlp`` projector, written as the GGUF that
llama.cpp's libmtmd loads beside a text model (``clip.cpp``'s loader: the
``clip.*`` keys and the ``v.*`` / ``mm.*`` tensors of the llama.cpp that
llama-cpp-python 0.3.36 vendors).

No checkpoint is downloaded: the weights are drawn from a fixed seed, so the
same arguments always write the same file (about 750 KB). Its output is
meaningless but its shape is real: an ``image_size`` square image becomes
``(image_size // patch_size) ** 2`` embeddings of width ``n_embd_text``, the
text model's (576 for the bundled SmolLM2-135M; another width is a projector
that does not fit).

Shapes are written in numpy order (the reverse of ggml's ``ne``): a linear
layer from ``a`` to ``b`` features is ``(b, a)``; the patch embedding is a
convolution kernel ``(hidden, 3, patch, patch)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: the vision tower's sizes (kept tiny: the file is about 750 KB)
IMAGE_SIZE = 56
PATCH_SIZE = 14
HIDDEN = 64
FFN = 128
HEADS = 4
#: two blocks: the llava graph runs all but the last (the "second to last
#: layer" LLaVA reads its features from), so one of them runs
BLOCKS = 2
#: the projector's inner width (mm.0 -> GELU -> mm.2)
PROJ_HIDDEN = 128
#: what one image becomes: one embedding per patch (the class token is dropped)
N_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2


@dataclass(frozen=True)
class Tower:
    """A vision tower's sizes (the projector's inner width included) and
    the type its weight matrices are written in."""

    image_size: int = IMAGE_SIZE
    patch_size: int = PATCH_SIZE
    hidden: int = HIDDEN
    ffn: int = FFN
    heads: int = HEADS
    blocks: int = BLOCKS
    proj_hidden: int = PROJ_HIDDEN
    dtype: str = "float32"

    @property
    def n_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


#: the tests' tower (about 750 KB)
TINY = Tower()
#: a CLIP ViT-B/14 at 224 pixels, LLaVA-1.5's shape at base size (about 170
#: MB in f16): what a real encode costs, for the benchmark (bench/media.py)
BASE = Tower(224, 14, 768, 3072, 12, 12, 2048, "float16")


def add_encoder(writer: Any, modality: str, hidden: int, ffn: int, blocks: int, heads: int, out: int) -> None:
    """The encoder's shape as clip.cpp reads it (``clip.vision.*`` or
    ``clip.audio.*``); ``out``: the text model's width it projects to."""
    key = f"clip.{modality}"
    writer.add_uint32(f"{key}.embedding_length", hidden)
    writer.add_uint32(f"{key}.feed_forward_length", ffn)
    writer.add_uint32(f"{key}.block_count", blocks)
    writer.add_uint32(f"{key}.attention.head_count", heads)
    writer.add_float32(f"{key}.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32(f"{key}.projection_dim", out)


def write_mmproj(path: Path, n_embd_text: int = 576, seed: int = 0, tower: Tower = TINY) -> Path:
    """Write the projector GGUF to ``path`` and return it."""
    import gguf  # a test dependency (pyproject's "test" extra)

    rng = np.random.default_rng(seed)
    t = tower

    def weight(*shape: int) -> np.ndarray:
        # scaled like a trained layer's so activations neither vanish nor blow up
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def linear(out: int, inp: int) -> np.ndarray:
        return weight(out, inp).astype(t.dtype)

    def bias(n: int) -> np.ndarray:
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", "turbospark test projector")
    writer.add_string("general.description", f"random-weight CLIP + mlp projector, seed {seed}")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.image_size", t.image_size)
    writer.add_uint32("clip.vision.patch_size", t.patch_size)
    add_encoder(writer, "vision", t.hidden, t.ffn, t.blocks, t.heads, n_embd_text)
    writer.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    writer.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    writer.add_bool("clip.use_gelu", False)  # quick GELU, as CLIP

    n_pos = t.n_tokens + 1  # the patches and the class token
    writer.add_tensor("v.patch_embd.weight", weight(t.hidden, 3, t.patch_size, t.patch_size))
    writer.add_tensor("v.class_embd", weight(t.hidden))
    writer.add_tensor("v.position_embd.weight", weight(n_pos, t.hidden))
    writer.add_tensor("v.pre_ln.weight", np.ones(t.hidden, np.float32))
    writer.add_tensor("v.pre_ln.bias", np.zeros(t.hidden, np.float32))
    for i in range(t.blocks):
        blk = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{blk}.{name}.weight", linear(t.hidden, t.hidden))
            writer.add_tensor(f"{blk}.{name}.bias", bias(t.hidden))
        for norm in ("ln1", "ln2"):
            writer.add_tensor(f"{blk}.{norm}.weight", np.ones(t.hidden, np.float32))
            writer.add_tensor(f"{blk}.{norm}.bias", np.zeros(t.hidden, np.float32))
        # the FFN width differs from the hidden one, so the loader's check for old files with
        # up and down swapped (ffn_down's input width == n_embd) stays quiet
        writer.add_tensor(f"{blk}.ffn_up.weight", linear(t.ffn, t.hidden))
        writer.add_tensor(f"{blk}.ffn_up.bias", bias(t.ffn))
        writer.add_tensor(f"{blk}.ffn_down.weight", linear(t.hidden, t.ffn))
        writer.add_tensor(f"{blk}.ffn_down.bias", bias(t.hidden))
    writer.add_tensor("mm.0.weight", linear(t.proj_hidden, t.hidden))
    writer.add_tensor("mm.0.bias", bias(t.proj_hidden))
    writer.add_tensor("mm.2.weight", linear(n_embd_text, t.proj_hidden))
    writer.add_tensor("mm.2.bias", bias(n_embd_text))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":  # pragma: no cover - by hand: python -m tests.mmproj OUT.gguf
    import sys

    print(write_mmproj(Path(sys.argv[1])))
