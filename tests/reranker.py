"""A tiny reranker, generated: a random-weight BERT cross-encoder with its
classification head, written as the GGUF llama.cpp loads as a reranker
(``bert.pooling_type`` 4, rank: the ``[CLS]`` row through ``cls`` → tanh →
``cls.output``, one score a pair), the keys and tensors of the llama.cpp that
llama-cpp-python 0.3.36 vendors (``src/models/bert.cpp``) and of what its
converter writes for ``BertForSequenceClassification``.

No checkpoint is downloaded: the weights are drawn from a fixed seed, so the
same arguments always write the same file (the tests' one is about 200 KB).
Its scores are arbitrary but its shape is real: a WordPiece vocabulary
(``[CLS]`` query ``[SEP]`` document, as llama.cpp joins a pair for a
``bert`` tokenizer), learned positions up to ``context``, token types.

The vocabulary is small: the special tokens, single letters and digits
(word-initial and continuing, so any lower-case ASCII word tokenizes), the
punctuation and a few hundred common words. Shapes are written in numpy
order (the reverse of ggml's ``ne``): a linear layer from ``a`` to ``b``
features is ``(b, a)``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: llama.cpp's pooling type "rank" (LLAMA_POOLING_TYPE_RANK)
POOLING_RANK = 4
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(5)
#: gguf TokenType: normal, unknown, control
NORMAL, UNKNOWN, CONTROL = 1, 2, 3
WORDS = (
    "the of and to in is was for on that with as by at from it an be this are or which his her they "
    "not have has had but were their one all been she he we you can will more when there who its so "
    "what about into than up out them other some time only new would could these may first two after "
    "cat cats dog dogs kitten puppy pet pets animal animals bird fish mouse sleep sleeps sat mat "
    "stock stocks market markets price prices bank money fell rose trade shares economy rate rates "
    "paris france city capital river tower europe london berlin country world weather rain sun snow "
    "python code program computer software bug function server model models data query document "
    "search rank score answer question good bad best small large fast slow red blue green house car"
).split()


@dataclass(frozen=True)
class Shape:
    """A cross-encoder's sizes and the type its weight matrices are written in."""

    hidden: int = 32
    ffn: int = 64
    heads: int = 2
    layers: int = 2
    context: int = 256
    dtype: str = "float32"


#: the tests' reranker (about 200 KB)
TINY = Shape()
#: a MiniLM-L12-sized cross-encoder (ms-marco-MiniLM-L-12-v2's shape, its
#: vocabulary aside) in f16: what a real rerank costs, for bench/rerank.py
BASE = Shape(384, 1536, 12, 12, 512, "float16")


def vocabulary() -> list[str]:
    """The tokens as llama.cpp's ``bert`` tokenizer reads them: a word's
    first piece carries the phantom space (U+2581), a continuing piece none
    (WordPiece's ``##`` removed), special tokens as they are."""
    pieces = list(string.ascii_lowercase + string.digits)
    words = [*pieces, *string.punctuation, *WORDS]
    return [*SPECIALS, *("\u2581" + w for w in dict.fromkeys(words)), *pieces]


def write_reranker(path: Path, seed: int = 0, shape: Shape = TINY, template: str | None = None) -> Path:
    """Write the reranker GGUF to ``path`` and return it; ``template``: a
    rerank prompt template (``tokenizer.chat_template.rerank``, with
    ``{query}`` and ``{document}``, as Qwen3-Reranker's GGUF carries)."""
    import gguf  # a test dependency (pyproject's "test" extra)

    rng = np.random.default_rng(seed)
    s = shape
    tokens = vocabulary()

    def weight(*dims: int) -> np.ndarray:
        # scaled like a trained layer's so activations neither vanish nor blow up
        return (rng.standard_normal(dims) / np.sqrt(dims[-1])).astype(np.float32)

    def linear(out: int, inp: int) -> np.ndarray:
        return weight(out, inp).astype(s.dtype)

    def bias(n: int) -> np.ndarray:
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    def norm(name: str) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(s.hidden, np.float32))
        writer.add_tensor(f"{name}.bias", np.zeros(s.hidden, np.float32))

    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_string("general.name", "turbospark test reranker")
    writer.add_string("general.description", f"random-weight BERT cross-encoder, seed {seed}")
    writer.add_uint32("general.file_type", 1 if s.dtype == "float16" else 0)
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.hidden)
    writer.add_feed_forward_length(s.ffn)
    writer.add_block_count(s.layers)
    writer.add_head_count(s.heads)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(POOLING_RANK))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if t in SPECIALS else NORMAL for t in tokens])
    writer.add_token_type_count(2)
    writer.add_bos_token_id(CLS)
    writer.add_sep_token_id(SEP)
    writer.add_unk_token_id(UNK)
    writer.add_pad_token_id(PAD)
    writer.add_mask_token_id(MASK)
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    if template is not None:
        writer.add_string("tokenizer.chat_template.rerank", template)

    writer.add_tensor("token_embd.weight", weight(len(tokens), s.hidden))
    writer.add_tensor("token_types.weight", weight(2, s.hidden))
    writer.add_tensor("position_embd.weight", weight(s.context, s.hidden))
    norm("token_embd_norm")
    for i in range(s.layers):
        blk = f"blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{blk}.{name}.weight", linear(s.hidden, s.hidden))
            writer.add_tensor(f"{blk}.{name}.bias", bias(s.hidden))
        norm(f"{blk}.attn_output_norm")
        writer.add_tensor(f"{blk}.ffn_up.weight", linear(s.ffn, s.hidden))
        writer.add_tensor(f"{blk}.ffn_up.bias", bias(s.ffn))
        writer.add_tensor(f"{blk}.ffn_down.weight", linear(s.hidden, s.ffn))
        writer.add_tensor(f"{blk}.ffn_down.bias", bias(s.hidden))
        norm(f"{blk}.layer_output_norm")
    # the classification head: dense + tanh over the [CLS] row, then one logit
    writer.add_tensor("cls.weight", linear(s.hidden, s.hidden))
    writer.add_tensor("cls.bias", bias(s.hidden))
    writer.add_tensor("cls.output.weight", (weight(1, s.hidden) * 4).astype(s.dtype))
    writer.add_tensor("cls.output.bias", np.zeros(1, np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":  # pragma: no cover - by hand: python -m tests.reranker OUT.gguf [base]
    import sys

    print(write_reranker(Path(sys.argv[1]), shape=BASE if sys.argv[2:] == ["base"] else TINY))
