"""Constrained decode: what a grammar costs the engine's decode rate.

The same greedy generation on the same model (default Qwen2.5-Coder-0.5B),
alternated over rounds:

  (a) free;
  (b) held to valid JSON (``json_object``'s grammar, what structured output
      and a forced tool call pay per token);
  (c) with the lazy tool-call grammars every ``tool_choice: auto`` request
      carries, not triggered (they only watch the output: for ``<tool_call>``,
      and its start for a bare JSON call naming an offered tool).

Prints each one's decode tok/s (engine figures: first to last token) and the
ratios (b)/(a) and (c)/(a), medians over rounds (target >= 0.95 for both).

    python bench/grammar.py [--rounds 3] [--tokens 200] [--model qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from turbospark.engine.model import LlamaChatModel, ModelOptions  # noqa: E402
from turbospark.engine.types import CancelFlag, GenerationConfig  # noqa: E402
from turbospark.models.catalog import resolve_model  # noqa: E402
from turbospark.tools.grammar import json_object_grammar, opening_call_grammar, tool_call_grammar  # noqa: E402

PROMPT = "Write a JSON array of 30 fictional people, each an object with name, age, city and job."
TOOL = {
    "type": "function",
    "function": {
        "name": "shell",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


def rate(model: LlamaChatModel, ids: list[int], n: int, **cfg: object) -> float:
    config = GenerationConfig(temperature=0, max_new_tokens=n, speculative=False, **cfg)  # type: ignore[arg-type]
    r = asyncio.run(model.run_completion(ids, config, None, CancelFlag()))
    return (r.new_tokens - 1) / r.decode_seconds if r.decode_seconds else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()
    model = LlamaChatModel(ModelOptions(path=resolve_model(args.model)[0], id="bench", ctx=2048, parallel=1))
    try:
        ids = model.render_chat([{"role": "user", "content": PROMPT}])
        json_grammar = json_object_grammar()
        specials = {m: t for m, t in model.marked_tokens.items() if m in ("<tool_call>", "</tool_call>")}
        lazy = tool_call_grammar([TOOL], "hermes", many=True, specials=specials)
        # served beside it with tool_choice auto: the bare-JSON opening grammar
        opening, opening_trigger = opening_call_grammar([TOOL])
        cases = {
            "free": {},
            "json grammar": {"grammar": json_grammar},
            "lazy tool grammar": {
                "grammar": lazy,
                "grammar_trigger": "<tool_call>",
                "opening_grammar": opening,
                "opening_trigger": opening_trigger,
            },  # fmt: skip
        }
        rates: dict[str, list[float]] = {k: [] for k in cases}
        rate(model, ids, 16)  # warm-up
        for i in range(args.rounds):
            order = list(cases) if i % 2 == 0 else list(reversed(cases))
            for name in order:
                rates[name].append(rate(model, ids, args.tokens, **cases[name]))
            print(f"round {i + 1}: " + "  ".join(f"{k} {rates[k][-1]:6.1f}" for k in cases), flush=True)
        free = statistics.median(rates["free"])
        print()
        for name in cases:
            med = statistics.median(rates[name])
            print(f"{name:<20} {med:7.1f} tok/s   ratio to free {med / free:5.2f}")
        print("target: both ratios >= 0.95")
    finally:
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
