"""Decoding levers for the local extractors: JSON-constrained generation and prompt-prefix KV reuse.

JSON-constrained generation uses xgrammar (https://github.com/mlc-ai/xgrammar), whose grammar matcher is
C++ and fills a token bitmask per step in microseconds, with a transformers logits processor of its own
(`xgrammar.contrib.hf`) and CPU wheels. lm-format-enforcer walks a character-level parser in Python at
every step, and outlines builds an index over the vocabulary per schema; on this 135M-parameter model a
decoding step costs a few milliseconds, so the mask must cost far less than that. xgrammar installs
without its GPU kernels (`pip install --no-deps xgrammar apache-tvm-ffi`, as the set-up commands do; its
`triton` requirement is for CUDA only).

The grammars say what the runtime's validation needs (validate.py), not a property order: an array of
strings for `entities`, an array of objects for the other list kinds, one object for the one-pass layout.
A model trained on compact JSON keeps its own key order and field set; the grammar only stops it from
writing anything that is not JSON and ends the generation at the closing bracket, where an unconstrained
model may run on to `max_new_tokens`.
"""

from __future__ import annotations

import copy
import json

from ..errors import ConfigError

SCHEMAS = {
    "entities": {"type": "array", "items": {"type": "string"}},
    "facts": {"type": "array", "items": {"type": "object"}},
    "states": {"type": "array", "items": {"type": "object"}},
    "artifacts": {"type": "array", "items": {"type": "object"}},
    "events": {"type": "array", "items": {"type": "object"}},
    "one_pass": {"type": "object"},
}


def _xgrammar():
    try:
        import xgrammar
        from xgrammar.contrib import hf  # noqa: F401  (the logits processor)
    except ImportError as e:
        raise ConfigError("extractor option constrained=true needs xgrammar: pip install --no-deps "
                          f"xgrammar==0.2.9 apache-tvm-ffi (import failed: {e})") from None
    return xgrammar


class JSONConstraint:
    """Compiled grammars for one tokenizer; `processor(kind)` is a fresh logits processor for one generate()
    call (xgrammar's processor holds per-row matchers, so it is not reused across calls)."""

    def __init__(self, tokenizer, vocab_size: int):
        xgr = _xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(info)
        self._compiled: dict[str, object] = {}

    def grammar(self, kind: str):
        if kind not in SCHEMAS:
            raise ConfigError(f"no JSON grammar for extraction kind {kind!r} (known: {', '.join(SCHEMAS)})")
        return self.compiled(SCHEMAS[kind])

    def compiled(self, schema: dict):
        """The grammar of a JSON schema, compiled once per schema."""
        key = json.dumps(schema, sort_keys=True)
        if key not in self._compiled:
            # any_whitespace=False: the compact separators the targets were written with (", " and ": ")
            self._compiled[key] = self._compiler.compile_json_schema(key, any_whitespace=False)
        return self._compiled[key]

    def processor(self, kind: str):
        from xgrammar.contrib.hf import LogitsProcessor

        return LogitsProcessor(self.grammar(kind))

    def schema_processor(self, schema: dict):
        """A fresh logits processor for one generate() call that keeps every row inside this JSON schema
        (an OpenAI-style `response_format` request: arbor_train/serve.py)."""
        from xgrammar.contrib.hf import LogitsProcessor

        return LogitsProcessor(self.compiled(schema))


def json_constraint(llm) -> JSONConstraint:
    """The compiled grammars of this model's tokenizer, kept on the model wrapper (compiled once)."""
    if getattr(llm, "_json_constraint", None) is None:
        llm._json_constraint = JSONConstraint(llm.tokenizer, int(llm.model.config.vocab_size))
    return llm._json_constraint


class PrefixKV:
    """Keys and values of prompt prefixes that many prompts share (a kind's instruction, computed once and
    reused for every turn of that kind). `cache_for(ids)` copies the longest stored prefix of a prompt; the
    caller hands generate() that copy, so only the rest of the prompt is prefilled. Used for
    one prompt at a time: a left-padded batch does not share a prefix position."""

    def __init__(self, model):
        self.model = model
        self.entries: dict[tuple[int, ...], object] = {}
        self.hits = 0
        self.misses = 0

    def add(self, ids: list[int]) -> None:
        import torch

        key = tuple(ids)
        if not key or key in self.entries:
            return
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=self.model.device), use_cache=True)
        self.entries[key] = out.past_key_values

    def cache_for(self, ids: list[int]):
        """A copy of the cache of the longest stored prefix of `ids` (shorter than ids), or None."""
        best = None
        for key in self.entries:
            if len(key) < len(ids) and tuple(ids[: len(key)]) == key and (best is None or len(key) > len(best)):
                best = key
        if best is None:
            self.misses += 1
            return None
        self.hits += 1
        return copy.deepcopy(self.entries[best])
