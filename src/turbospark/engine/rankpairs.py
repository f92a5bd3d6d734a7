"""A rerank request's (query, document) pairs as the token ids a reranker
reads, joined as llama-server joins them (``format_prompt_rerank``):

- a GGUF that carries a rerank template (``tokenizer.chat_template.rerank``,
  as Qwen3-Reranker's does) gets it with ``{query}`` and ``{document}``
  filled in, tokenized whole with its special tokens read;
- otherwise (BERT, XLM-RoBERTa cross-encoders) BOS where the vocabulary
  adds one, the query, EOS (SEP where there is no EOS) where it adds EOS,
  SEP where it adds SEP, the document, EOS where it adds EOS:
  ``[CLS] q [SEP] d`` for a WordPiece vocabulary, ``<s> q </s></s> d </s>``
  for XLM-R's.

A pair longer than the reranker's context (one pair is one sequence in one
micro-batch: it cannot be split) is refused with a 400 naming the document
and the numbers, or, when the caller asks, its document is cut at the end
until the pair fits (the query is never cut). ``max_doc_tokens`` (Cohere's
``max_tokens_per_doc``) cuts every document to that many tokens first.
Runs off the engine thread (the caller's worker thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from .llama import LlamaModelFile, lib
from .types import AdmissionError

#: the GGUF key of a rerank prompt template (llama_model_chat_template(model, "rerank"))
TEMPLATE_KEY = "tokenizer.chat_template.rerank"


@dataclass(frozen=True)
class Pairs:
    """A request's pairs: each one's token ids, and how many documents were cut."""

    ids: list[list[int]]
    truncated: int = 0


class PairFormat:
    """How one reranker joins a query and a document (module docstring)."""

    def __init__(self, file: LlamaModelFile, limit: int) -> None:
        L = lib()
        self.file = file
        #: the most tokens a pair may have (one micro-batch)
        self.limit = limit
        self.template: str | None = file.metadata.get(TEMPLATE_KEY) or None
        vocab = file.vocab
        eos = int(L.llama_vocab_eos(vocab))
        sep = int(L.llama_vocab_sep(vocab))
        add_eos, add_sep = bool(L.llama_vocab_get_add_eos(vocab)), bool(L.llama_vocab_get_add_sep(vocab))
        end = eos if eos >= 0 else sep
        self.head = [file.bos] if file.add_bos and file.bos >= 0 else []
        self.middle = ([end] if add_eos else []) + ([sep] if add_sep else [])
        self.tail = [end] if add_eos else []

    def tokens(self, text: str) -> list[int]:
        return self.file.tokenize(text, False, False)

    def pairs(
        self, query: str, documents: list[str], truncate: bool = False, max_doc_tokens: int | None = None
    ) -> Pairs:
        """Every document's pair with ``query`` (see the module docstring)."""
        if self.template is not None:
            return self._templated(query, documents, truncate, max_doc_tokens)
        q = self.tokens(query)
        fixed = len(self.head) + len(q) + len(self.middle) + len(self.tail)
        room = self.limit - fixed
        if room < 1:
            raise AdmissionError(
                f"the query is {len(q)} tokens, which leaves no room for a document in the reranker's "
                f"context of {self.limit} tokens",
                "query",
            )
        out: list[list[int]] = []
        cut = 0
        for i, doc in enumerate(documents):
            d = self.tokens(doc)
            if max_doc_tokens is not None and len(d) > max_doc_tokens:
                d, cut = d[:max_doc_tokens], cut + 1
            if len(d) > room:
                if not truncate:
                    raise self._too_long(i, fixed + len(d))
                d, cut = d[:room], cut + 1
            out.append([*self.head, *q, *self.middle, *d, *self.tail])
        return Pairs(out, cut)

    def _templated(self, query: str, documents: list[str], truncate: bool, max_doc_tokens: int | None) -> Pairs:
        """The template filled in (one pass: a query holding ``{document}``
        stays as written) and tokenized whole, special tokens read."""
        assert self.template is not None
        before, _, after = self.template.partition("{document}")
        before = before.replace("{query}", query)
        after = after.replace("{query}", query)
        out: list[list[int]] = []
        cut = 0
        for i, doc in enumerate(documents):
            if max_doc_tokens is not None:
                d = self.tokens(doc)
                if len(d) > max_doc_tokens:
                    doc, cut = self.file.detokenize(d[:max_doc_tokens]), cut + 1
            ids = self.file.tokenize(before + doc + after, False, True)
            if len(ids) > self.limit:
                if not truncate:
                    raise self._too_long(i, len(ids))
                ids = self._cut(before, after, doc, i)
                cut += 1
            out.append(ids)
        return Pairs(out, cut)

    def _cut(self, before: str, after: str, doc: str, index: int) -> list[int]:
        """The templated pair with its document cut at the end until it fits."""
        fixed = len(self.file.tokenize(before + after, False, True))
        d = self.tokens(doc)
        keep = self.limit - fixed
        while keep > 0:
            ids = self.file.tokenize(before + self.file.detokenize(d[:keep]) + after, False, True)
            if len(ids) <= self.limit:
                return ids
            keep -= max(1, len(ids) - self.limit)
        raise AdmissionError(
            f"the query is {fixed} tokens with the rerank template, which leaves no room for a document "
            f"in the reranker's context of {self.limit} tokens",
            "query",
        )

    def _too_long(self, index: int, n: int) -> AdmissionError:
        return AdmissionError(
            f"documents[{index}] makes a pair of {n} tokens with the query, but the reranker's context is "
            f"{self.limit} tokens (a pair is scored in one piece); shorten the document, "
            "or ask for truncation ('truncate': true)",
            f"documents[{index}]",
        )
