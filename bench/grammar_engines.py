"""Evaluation: llguidance in place of our JSON-schema → GBNF converter?

Issue 15 asked whether a well-kept library (llguidance, llama.cpp's optional
grammar engine; xgrammar, vLLM's and SGLang's) could replace
``tools/grammar/`` (our converter, ~1.7k lines) for structured output and the
lazy tool-call grammar. This script measures the two things that decide it,
side by side in one run:

1. **Coverage**: a corpus of schemas using every keyword the converter
   enforces; for each, whether each engine compiles it, and whether it
   accepts a valid document and refuses an invalid one (llguidance by
   feeding its matcher the document's tokens; ours by running the real
   llama.cpp grammar sampler over them).
2. **Speed**: greedy constrained decode on Qwen2.5-Coder-0.5B (a JSON
   object grammar), free vs our GBNF (llama.cpp's grammar sampler, checked
   one token at a time as the engine does) vs llguidance driven from Python
   the same way (the sampled token checked first; a full mask only when it
   is refused). Ratios to free, medians over rounds.

llguidance is not a dependency: ``pip install llguidance`` first (the
script says so and exits otherwise). xgrammar is not measured: its PyPI
package requires torch (a 700 MB+ install for a CPU server), which the
set-up contract rules out.

    python bench/grammar_engines.py [--rounds 3] [--tokens 160]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from turbospark.catalog import resolve_model  # noqa: E402
from turbospark.engine import sampling  # noqa: E402
from turbospark.engine.llama import lib  # noqa: E402
from turbospark.engine.model import LlamaChatModel, ModelOptions  # noqa: E402
from turbospark.engine.types import CancelFlag, GenerationConfig  # noqa: E402
from turbospark.tools.grammar import UnsupportedSchema, json_object_grammar, json_schema_grammar  # noqa: E402

#: (name, schema, a valid document, an invalid one): every keyword the
#: converter enforces (tools/grammar/keywords.py HANDLED)
CORPUS: list[tuple[str, dict[str, Any], Any, Any]] = [
    ("object/required", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, {"a": "x"}, {}),
    (
        "additionalProperties false",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        {"a": 1},
        {"a": 1, "b": 2},
    ),
    (
        "min/maxProperties",
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2, "maxProperties": 2},
        {"x": 1, "y": 2},
        {"x": 1},
    ),
    ("enum", {"enum": ["red", "green", 3]}, "green", "blue"),
    ("const", {"const": {"k": [1, 2]}}, {"k": [1, 2]}, {"k": [2, 1]}),
    (
        "$ref/$defs",
        {"$defs": {"n": {"type": "integer", "minimum": 0}}, "type": "array", "items": {"$ref": "#/$defs/n"}},
        [1, 2],
        [-1],
    ),
    (
        "allOf",
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"required": ["b"]},
            ]
        },
        {"a": 1, "b": True},
        {"a": 1},
    ),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}, "ab", "abc"),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, True, "x"),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}, [1, "a"], ["a", 1]),
    ("min/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, [1, 2], [1]),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2], [1, 1]),
    ("min/maxLength", {"type": "string", "minLength": 3, "maxLength": 4}, "abc", "ab"),
    ("pattern", {"type": "string", "pattern": "^[a-z]{2}-[0-9]+$"}, "ab-12", "ab12"),
    ("format date-time", {"type": "string", "format": "date-time"}, "2026-12-04T10:00:00Z", "yesterday"),
    ("format uuid", {"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "123"),
    ("integer range", {"type": "integer", "minimum": 10, "maximum": 99}, 42, 100),
    ("exclusive range", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, 0.5, 1),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, 15, 12),
]


# ------------------------------------------------------------ our converter
def ours_accepts(model: LlamaChatModel, grammar: str, text: str) -> bool:
    """Run llama.cpp's grammar sampler over the document's tokens."""
    L = lib()
    g = L.llama_sampler_init_grammar(model.file.vocab, grammar.encode(), b"root")
    if not g:
        raise RuntimeError("llama.cpp refused the grammar")
    data = np.zeros(1, dtype=sampling._TOKEN_DATA)
    try:
        for t in [*model.tokenize(text, False, False), model.file.eos]:
            data["id"][0], data["logit"][0], data["p"][0] = t, 1.0, 0.0
            arr = L.llama_token_data_array()
            arr.data = data.ctypes.data_as(L.llama_token_data_p)
            arr.size, arr.selected, arr.sorted = 1, -1, False
            L.llama_sampler_apply(g, ctypes.byref(arr))
            if not np.isfinite(data["logit"][0]):
                return False
            if t != model.file.eos:
                L.llama_sampler_accept(g, t)
        return True
    finally:
        L.llama_sampler_free(g)


# ------------------------------------------------------------ llguidance
def llg_tokenizer(model: LlamaChatModel) -> Any:
    """llguidance's tokenizer over the model's llama.cpp vocabulary (its own
    helper for llama-cpp-python)."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    return lltokenizer_from_vocab(model.file.vocab)


def llg_matcher(tok: Any, schema: dict[str, Any]) -> Any:
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    return llguidance.LLMatcher(tok, grammar)


def llg_accepts(tok: Any, model: LlamaChatModel, schema: dict[str, Any], text: str) -> bool:
    m = llg_matcher(tok, schema)
    ids = model.tokenize(text, False, False)
    return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()


def _compact(doc: Any) -> str:
    """The document as both engines' default layout accepts it (llguidance
    without flexible whitespace takes none between tokens)."""
    return json.dumps(doc, separators=(",", ":"))


def coverage(model: LlamaChatModel, tok: Any) -> None:
    print(f"{'schema':<28} {'ours':<22} {'llguidance':<22}")
    score = {"ours": 0, "llguidance": 0}
    for name, schema, good, bad in CORPUS:
        cells = []
        for engine in ("ours", "llguidance"):
            try:
                if engine == "ours":
                    grammar = json_schema_grammar(schema)

                    def check(doc: Any, grammar: str = grammar) -> bool:
                        return ours_accepts(model, grammar, _compact(doc))
                else:
                    import llguidance

                    err = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_json_schema(schema))
                    if err:
                        raise ValueError(err)

                    def check(doc: Any, schema: dict[str, Any] = schema) -> bool:
                        return llg_accepts(tok, model, schema, _compact(doc))

                ok, refused = check(good), not check(bad)
                cells.append("enforced" if ok and refused else f"valid {ok} invalid-refused {refused}")
                score[engine] += ok and refused
            except (UnsupportedSchema, ValueError, RuntimeError) as exc:
                cells.append("refused: " + str(exc).splitlines()[0][:12])
        print(f"{name:<28} {cells[0]:<22} {cells[1]:<22}")
    print(f"enforced: ours {score['ours']}/{len(CORPUS)}, llguidance {score['llguidance']}/{len(CORPUS)}")


# ------------------------------------------------------------ speed
PROMPT = "Write a JSON array of 30 fictional people, each an object with name, age, city and job."


_MATCHER: list[Any] = []


def _llg_sample(chain: Any, ctx_ptr: Any, index: int) -> int:
    """``SamplerChain.sample`` for llguidance, done the way the engine does
    its own grammar: sample freely, ask the matcher about that one token,
    and only when it is refused compute the full mask and sample again."""
    L = lib()
    m = _MATCHER[0]
    token = int(L.llama_sampler_sample(chain.ptr, ctx_ptr, index))  # accepts it into the chain
    if m.validate_tokens([token]) == 1:
        m.consume_token(token)
        return token
    mask = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
    if not hasattr(chain, "_data"):  # a chain without a grammar has no candidate buffer
        chain._data = np.zeros(chain.n_vocab, dtype=sampling._TOKEN_DATA)
        chain._ids = np.arange(chain.n_vocab, dtype=np.int32)
    arr = chain._candidates(ctx_ptr, index)
    chain._data["logit"][mask[: chain.n_vocab] == 0] = -np.inf
    L.llama_sampler_apply(chain.ptr, ctypes.byref(arr))
    token = int(arr.data[arr.selected].id)
    m.consume_token(token)
    return token


def rate(model: LlamaChatModel, ids: list[int], n: int, **cfg: Any) -> float:
    config = GenerationConfig(temperature=0, max_new_tokens=n, speculative=False, **cfg)
    r = asyncio.run(model.run_completion(ids, config, None, CancelFlag()))
    return (r.new_tokens - 1) / r.decode_seconds if r.decode_seconds else 0.0


def speed(model: LlamaChatModel, tok: Any, rounds: int, tokens: int) -> None:
    ids = model.render_chat([{"role": "user", "content": PROMPT}])
    ours = json_object_grammar(bound_strings=True)
    original = sampling.SamplerChain.sample
    schema = {"type": "array", "items": {"type": "object"}}

    def run(name: str) -> float:
        if name == "llguidance":
            _MATCHER[:] = [llg_matcher(tok, schema)]
            sampling.SamplerChain.sample = _llg_sample  # type: ignore[method-assign]
            try:
                return rate(model, ids, tokens)
            finally:
                sampling.SamplerChain.sample = original  # type: ignore[method-assign]
        return rate(model, ids, tokens, **({"grammar": ours} if name == "ours (GBNF)" else {}))

    cases = ["free", "ours (GBNF)", "llguidance"]
    rates: dict[str, list[float]] = {k: [] for k in cases}
    rate(model, ids, 16)
    for i in range(rounds):
        for name in cases if i % 2 == 0 else reversed(cases):
            rates[name].append(run(name))
        print(f"round {i + 1}: " + "  ".join(f"{k} {rates[k][-1]:6.1f}" for k in cases), flush=True)
    free = statistics.median(rates["free"])
    for name in cases:
        med = statistics.median(rates[name])
        print(f"{name:<14} {med:7.1f} tok/s   ratio to free {med / free:5.2f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=160)
    args = ap.parse_args()
    try:
        import llguidance  # noqa: F401
    except ImportError:
        print("llguidance is not installed: pip install llguidance (it is not a dependency)")
        return 2
    model = LlamaChatModel(ModelOptions(path=resolve_model("qwen2.5-coder-0.5b")[0], id="bench", ctx=2048, parallel=1))
    try:
        tok = llg_tokenizer(model)
        coverage(model, tok)
        print()
        speed(model, tok, args.rounds, args.tokens)
    finally:
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
