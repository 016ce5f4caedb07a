"""Memory-commit extractors: one protocol (`Extractor.run(kind, turns) -> raw outputs`), three families.

Kinds: summary, entities, facts, states, artifacts, events. Raw outputs (model text or Python objects)
always pass through validate.py before anything reaches the store; `ExtractorSet.extract` does that.

- `HeuristicExtractor`: regex grammar over the user turn (patterns visible in conf/runtime).
- `LLMExtractor`: a prompted causal LM (local HF or OpenAI-compatible), or a tuned bundle, with the
  versioned prompts in arbor_train.prompts; one batched generation per kind.
- `OnePassExtractor`: a bundle trained in the one-generation layout (`task.layout: one_pass`): one
  generation per turn answers every kind as one JSON object, split here per kind.
- `SpanExtractor`: a token-classification encoder bundle (`task.layout: spans`): one forward pass per turn
  tags spans for every kind (runtime/spans.py), decoded here per kind; no generation.
"""

from __future__ import annotations

from ..errors import ConfigError

import functools
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..prompts import extract_all_messages, extract_messages
from .kvcache import SqliteKV, cache_key
from .text import entities as find_entities
from .text import keywords as find_keywords
from .text import sentences, snake_case, truncate
from .validate import MAX_CHARS, ValidationReport, validate_kind

log = logging.getLogger(__name__)

KINDS = ("summary", "entities", "facts", "states", "artifacts", "events")


@dataclass
class TurnInput:
    user_text: str
    assistant_text: str = ""
    timestamp: str | None = None


@dataclass
class Extraction:
    summary: str = ""
    entities: list[str] = field(default_factory=list)
    keywords: list[str] = field(default_factory=list)
    facts: list[dict] = field(default_factory=list)
    states: list[dict] = field(default_factory=list)
    artifacts: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    report: ValidationReport = field(default_factory=ValidationReport)
    raw: dict[str, Any] = field(default_factory=dict)  # kind -> the extractor's output before validation


class Extractor(Protocol):
    name: str

    def run(self, kind: str, turns: list[TurnInput]) -> list[Any]: ...


_VAL = r"(?P<val>[^.;!?\n]+?)"
_END = r"(?=\s*(?:[.;!?\n]|,\s|\s+(?:and|but|so|because|which|since)\s|$))"
_SUBJ = r"(?P<subj>[Mm]y|[Oo]ur|(?:[A-Z][a-z]+)(?:'s|’s))"
_KEY = r"(?P<key>[a-z][a-z]+(?: [a-z]+){0,2}?)"
_STATE_IS = re.compile(
    _SUBJ + r" (?:new |current |updated |final )?" + _KEY
    + r" (?:is now|is|are|will be|has changed to|changed to|moved to|went up to|went down to|is set at|is set to)\s+"
    + _VAL + _END)
_STATE_SET = re.compile(
    r"\b(?i:set|change|changed|move|moved|update|updated|bump|bumped|raise|raised|lower|lowered|switch|switched|"
    r"increase|increased|reduce|reduced|push|pushed)\s+(?:the |" + _SUBJ + r" )?" + _KEY
    + r"(?: for (?P<subj2>[A-Z][a-z]+))?(?: from (?P<old>[^.;!?\n]+?))? to\s+" + _VAL + _END)
# \b first: a match starts at a word start only, so a long run of letters is scanned once, not once
# per position (without it one 100k-character token took 11 s: the optional `[a-z]+ ` rescanned it)
_ARTIFACT = re.compile(
    r"\b(?P<subj>(?:[A-Z][a-z]+)(?:'s|’s) |[Mm]y |[Oo]ur |[Tt]he )?(?P<name>(?:[a-z]+ )?(?:itinerary|agenda|playlist|"
    r"schedule|list|lineup|route|steps|menu|setlist|order of stops|running order|program|programme|checklist|"
    r"shortlist|stops))(?: for (?P<subj2>[A-Z][a-z]+|the [a-z]+(?: [a-z]+)?))?(?: is| goes| will be| is now)?\s*:\s*"
    r"(?P<items>[^\n]+?)(?:\.\s|\.$|$)")
_EVENT = re.compile(
    r"\b(?P<subj>I|[Ww]e|[A-Z][a-z]+)\s+(?:just |also |finally )?(?P<action>spent|ran|paid|bought|walked|swam|"
    r"cycled|biked|read|visited|attended|donated|saved|earned|logged|completed|finished|hiked|booked|ordered|"
    r"cooked|played|watched|sold|lifted|rowed|climbed|practiced|practised|studied|wrote|raised|collected)\b"
    r"(?P<rest>[^.;!?\n]*)")
_LEMMA = {"spent": "spend", "ran": "run", "paid": "pay", "bought": "buy", "walked": "walk", "swam": "swim",
          "cycled": "cycle", "biked": "bike", "visited": "visit", "attended": "attend", "donated": "donate",
          "saved": "save", "earned": "earn", "logged": "log", "completed": "complete", "finished": "finish",
          "hiked": "hike", "booked": "book", "ordered": "order", "cooked": "cook", "played": "play",
          "watched": "watch", "sold": "sell", "lifted": "lift", "rowed": "row", "climbed": "climb",
          "practiced": "practice", "practised": "practice", "studied": "study", "wrote": "write", "raised": "raise",
          "collected": "collect"}
_QTY = re.compile(r"(?P<cur>[$€£])?(?P<num>\d[\d,]*(?:\.\d+)?)\s?(?P<unit>%|[a-zA-Z]+)?")


class HeuristicExtractor:
    """Regex grammar for canonical phrasings; `implied` maps phrases to stable keys (config)."""

    def __init__(self, implied: dict[str, str] | None = None, event_categories: dict[str, str] | None = None,
                 max_facts: int = 6):
        self.name = "heuristic"
        self.implied = [(re.compile(r"\b" + p + r"\s+(?P<val>[A-Z][\w'’-]*(?:\s+[A-Z][\w'’-]*)*|[a-z][a-z-]+)"), k)
                        for p, k in (implied or {}).items()]
        self.event_categories = event_categories or {}
        self.max_facts = max_facts

    def run(self, kind: str, turns: list[TurnInput]) -> list[Any]:
        fn = getattr(self, f"_{kind}")
        return [fn(t) for t in turns]

    # ------------------------------------------------------------------ kinds
    def _summary(self, t: TurnInput) -> str:
        first = sentences(t.user_text)
        return truncate(first[0] if first else t.user_text, 160)

    def _entities(self, t: TurnInput) -> list[str]:
        return find_entities(t.user_text + "\n" + t.assistant_text)

    def _facts(self, t: TurnInput) -> list[dict]:
        out = []
        for s in sentences(t.user_text):
            if s.rstrip().endswith("?"):
                continue
            ents = find_entities(s)
            if not ents:
                continue
            out.append({"text": truncate(s, MAX_CHARS - 1), "entities": ents[:8], "tags": []})
            if len(out) >= self.max_facts:
                break
        return out

    def _states(self, t: TurnInput) -> list[dict]:
        text = t.user_text
        out: dict[tuple[str, str], dict] = {}

        def add(key: str, subj: str | None, val: str, evidence: str) -> None:
            key = snake_case(key)
            val = val.strip(" \"'")
            if not key or not val or len(val) >= MAX_CHARS or len(key) > 40:
                return
            subject = _subject(subj)
            ents = [e for e in find_entities(evidence) if e.lower() != subject.lower()][:4]
            if subject != "user":
                ents = [subject] + ents
            out[(key, subject)] = {"key": key, "value": val, "tag": "", "entities": ents,
                                   "evidence": truncate(evidence, MAX_CHARS - 1)}

        for m in _STATE_SET.finditer(text):
            add(m.group("key"), m.group("subj") or m.group("subj2"), m.group("val"), m.group(0))
        for m in _STATE_IS.finditer(text):
            add(m.group("key"), m.group("subj"), m.group("val"), m.group(0))
        for rx, key in self.implied:
            for m in rx.finditer(text):
                add(key, "my", m.group("val"), m.group(0))
        return list(out.values())[:6]

    def _artifacts(self, t: TurnInput) -> list[dict]:
        out = []
        for m in _ARTIFACT.finditer(t.user_text):
            raw = m.group("items")
            items = [i.strip(" .") for i in re.split(r",\s*(?:then\s+|and then\s+|and\s+)?|;\s*|\s+then\s+|\s*\d+[.)]\s+",
                                                     raw) if i and i.strip(" .")]
            items = [re.sub(r"^(?:and|then|first|finally)\s+", "", i, flags=re.I) for i in items]
            items = [truncate(i, MAX_CHARS - 1) for i in items if i]
            if len(items) < 2:
                continue
            subj = (m.group("subj") or "").strip()
            subj2 = m.group("subj2")
            subject = _subject(subj if subj.endswith(("'s", "’s")) else (subj2 or "my"))
            out.append({"name": m.group("name").strip().lower(), "subject": subject, "items": items[:20],
                        "entities": find_entities(raw)[:8]})
        return out

    def _events(self, t: TurnInput) -> list[dict]:
        out = []
        for m in _EVENT.finditer(t.user_text):
            verb = m.group("action").lower()
            action = _LEMMA.get(verb, verb)
            rest = m.group("rest")
            q = _QTY.search(rest)
            qty = unit = None
            if q:
                qty = float(q.group("num").replace(",", ""))
                unit = q.group("cur") or (q.group("unit") or None)
            dates = [e for e in find_entities(rest) if not any(ch.isdigit() for ch in e[:1])]
            out.append({"subject": _subject(m.group("subj")), "action": action,
                        "category": self.event_categories.get(verb, action), "quantity": qty, "unit": unit,
                        "date": t.timestamp, "text": truncate(m.group(0), MAX_CHARS - 1),
                        "entities": dates[:6]})
        return out[:8]


def _subject(s: str | None) -> str:
    if not s:
        return "user"
    s = s.strip()
    if s.lower() in {"my", "our", "i", "we", "the"}:
        return "user"
    return re.sub(r"(?:'s|’s)$", "", s)


class ExtractionCache(SqliteKV):
    """Raw model outputs keyed by (model identity, generation length, exact prompt), in SQLite: an
    evaluation that rebuilds the same memory (another read budget, an ablation, a rerun) reuses what a
    model already generated. Only models with a `cache_id` (what their outputs depend on) are cached."""

    def __init__(self, path: str | Path):
        super().__init__(path, table="outputs", value="output")

    @staticmethod
    def key(cache_id: str, max_new_tokens: int, messages: list[dict]) -> str:
        return cache_key(cache_id, max_new_tokens, messages)


SUMMARY_TOKENS = 64  # a summary is one short sentence
TURN_MARK = "Turn:\n"  # where a rendered extraction prompt's own turn starts (prompts.extract_messages)


class LLMExtractor:
    """Prompted or tuned causal LM extractor; generation is batched per kind (and cached, see
    ExtractionCache, when a cache is attached and the model has a cache id)."""

    def __init__(self, llm, max_new_tokens: int = 256, kinds: list[str] | None = None, constrained: bool = False,
                 prefix_cache: bool = False):
        self.llm = llm
        self.name = llm.name
        self.max_new_tokens = max_new_tokens
        self.kinds = set(kinds or KINDS)
        self.cache: ExtractionCache | None = None
        from .llm import HFCausalLM

        local = isinstance(llm, HFCausalLM)
        if prefix_cache and not local:
            raise ConfigError(f"extractor option prefix_cache needs a local model, not {llm.name}")
        if constrained and not (local or getattr(llm, "json_schemas", False)):
            raise ConfigError(f"extractor option constrained needs a local model or an OpenAI-compatible endpoint, "
                              f"not {llm.name}")
        self.constrained = constrained
        self.constraint = None  # a local model's compiled grammars (an endpoint gets the JSON schema instead)
        if constrained and local:
            from .constrain import json_constraint

            self.constraint = json_constraint(llm)
        self.prefix_kv = None
        if prefix_cache:
            from .constrain import PrefixKV

            self.prefix_kv = PrefixKV(llm.model)
        self._prefix_texts: set[str] = set()  # prompt prefixes whose keys and values prefix_kv holds

    def run(self, kind: str, turns: list[TurnInput]) -> list[Any]:
        msgs = [extract_messages(kind, t.user_text, t.assistant_text, t.timestamp) for t in turns]
        return self.generate(msgs, self.max_new_tokens if kind != "summary" else SUMMARY_TOKENS,
                             grammar=None if kind == "summary" else kind)

    def _prefix(self, messages: list[dict]) -> None:
        """Store the keys and values of this prompt up to its turn (what every turn of the kind shares); a
        prefix already stored is not tokenized again."""
        text = self.llm.render(messages)
        cut = text.find(TURN_MARK)
        if cut < 0 or text[:cut] in self._prefix_texts:
            return
        self._prefix_texts.add(text[:cut])
        tok = self.llm.tokenizer
        full = tok(text, add_special_tokens=False)["input_ids"]
        ids = tok(text[: cut + len(TURN_MARK)], add_special_tokens=False)["input_ids"]
        while ids and full[: len(ids)] != ids:  # a token that merges across the cut is left to the prompt
            ids = ids[:-1]
        self.prefix_kv.add(ids)

    def generate(self, msgs: list[list[dict]], n: int, grammar: str | None = None) -> list[str]:
        """Greedy completions of these prompts (batched by length for a local model), through the cache.
        grammar: the JSON grammar (constrain.SCHEMAS) the outputs follow when the extractor is constrained."""
        cache_id = getattr(self.llm, "cache_id", None)
        from .llm import HFCausalLM

        chat = self.llm.chat
        if isinstance(self.llm, HFCausalLM):  # a local model: batch by prompt length
            extra: dict = {"by_length": True}
            if self.constraint is not None and grammar is not None:
                extra["processor"] = functools.partial(self.constraint.processor, grammar)
                cache_id = cache_id and f"{cache_id}|json:{grammar}"
            if self.prefix_kv is not None:
                if msgs:
                    self._prefix(msgs[0])
                extra["prefix_kv"] = self.prefix_kv
            chat = functools.partial(self.llm.chat, **extra)
        elif self.constrained and grammar is not None:  # an endpoint: OpenAI structured output
            from .constrain import SCHEMAS

            chat = functools.partial(self.llm.chat, json_schema=SCHEMAS[grammar])
            cache_id = cache_id and f"{cache_id}|json:{grammar}"
        if self.cache is None or not cache_id:
            return chat(msgs, max_new_tokens=n)
        keys = [ExtractionCache.key(cache_id, n, m) for m in msgs]
        have = self.cache.get_many(sorted(set(keys)))
        todo = sorted({k: m for k, m in zip(keys, msgs) if k not in have}.items())
        if todo:
            outs = chat([m for _, m in todo], max_new_tokens=n)
            new = [(k, o) for (k, _), o in zip(todo, outs)]
            self.cache.put_many(new)
            have.update(new)
        return [have[k] for k in keys]


class OnePassExtractor(LLMExtractor):
    """The one-generation layout: one prompt per turn names every kind the bundle was trained on, and one
    JSON object answers them all. `run(kind, turns)` generates once for a list of turns and answers the
    other kinds of the same turns from that generation (ExtractorSet asks kind by kind). Each kind's part
    then passes the runtime's per-kind validation like any other output; an object that does not parse
    gives every kind the raw text, which that validation rejects and counts."""

    def __init__(self, llm, max_new_tokens: int = 384, kinds: list[str] | None = None, constrained: bool = False,
                 prefix_cache: bool = False):
        super().__init__(llm, max_new_tokens, kinds, constrained, prefix_cache)
        self.order = [k for k in KINDS if k in self.kinds]
        self._last: tuple[tuple, list[tuple[dict | None, str]]] | None = None

    def run(self, kind: str, turns: list[TurnInput]) -> list[Any]:
        key = tuple((t.user_text, t.assistant_text, t.timestamp) for t in turns)
        if self._last is None or self._last[0] != key:
            msgs = [extract_all_messages(self.order, t.user_text, t.assistant_text, t.timestamp) for t in turns]
            outs = self.generate(msgs, self.max_new_tokens, grammar="one_pass")
            self._last = (key, [(_object(o), o) for o in outs])
        out = []
        for obj, raw in self._last[1]:
            if obj is None:  # not an object: every kind sees the text, and validation rejects it
                out.append("" if kind == "summary" else raw)
            else:
                out.append(obj.get(kind, "" if kind == "summary" else []))
        return out


class SpanExtractor:
    """The encoder span layout: one forward pass of a token-classification encoder over a batch of turns
    tags spans for every kind at once (runtime/spans.py); `run(kind, turns)` answers the other kinds of the
    same turns from that pass, as OnePassExtractor does with its generation."""

    def __init__(self, model, tokenizer, codec, max_length: int = 256, batch_size: int = 32, name: str = "spans"):
        self.model, self.tokenizer, self.codec = model, tokenizer, codec
        self.max_length, self.batch_size, self.name = max_length, batch_size, name
        self._last: tuple[tuple, list[dict]] | None = None

    def read(self, turns: list[TurnInput]) -> list[dict]:
        import torch

        from .spans import encode, read_batch

        out: list[dict] = []
        dev = next(self.model.parameters()).device
        for i in range(0, len(turns), self.batch_size):
            chunk = turns[i: i + self.batch_size]
            pairs = [(t.user_text or "", t.assistant_text or "") for t in chunk]
            enc = encode(self.tokenizer, pairs, self.max_length)
            with torch.inference_mode():
                logits = self.model(**{k: v.to(dev) for k, v in enc.items() if k != "offset_mapping"}).logits
            out += read_batch(self.codec, logits.float().cpu(), enc, pairs, [t.timestamp for t in chunk])
        return out

    def run(self, kind: str, turns: list[TurnInput]) -> list[Any]:
        key = tuple((t.user_text, t.assistant_text, t.timestamp) for t in turns)
        if self._last is None or self._last[0] != key:
            self._last = (key, self.read(turns))
        return [d[kind] for d in self._last[1]]


def _object(text: str) -> dict | None:
    """A one-pass output as a JSON object (fences and trailing commas repaired), or None."""
    from .validate import ExtractionRejected, parse_json_output

    try:
        obj = parse_json_output(text, "one_pass", ValidationReport())
    except ExtractionRejected:
        return None
    return obj if isinstance(obj, dict) else None


DECODING_LEVERS = ("constrained", "prefix_cache")  # options that shape a generation (a span tagger has none)


def _levers(spec: dict) -> dict:
    """A model extractor's decoding levers (runtime/constrain.py): JSON-constrained generation, prefix KV reuse."""
    out = {}
    for key in DECODING_LEVERS:
        v = spec.get(key, False)
        if not isinstance(v, bool):
            raise ConfigError(f"extractor option {key} must be true or false, got {v!r}")
        out[key] = v
    return out


def build_extractor(spec, cache: dict) -> Extractor:
    """spec: 'heuristic' | {kind: heuristic, ...} | {kind: prompted, llm: {...}} | {kind: bundle, path: ...}."""
    if isinstance(spec, str):
        spec = {"kind": spec}
    spec = dict(spec)
    key = json.dumps(spec, sort_keys=True, default=str)
    if key in cache:
        return cache[key]
    kind = spec.pop("kind")
    if kind == "heuristic":
        ex: Extractor = HeuristicExtractor(**spec)
    elif kind == "prompted":
        from .llm import build_llm

        ex = LLMExtractor(build_llm(spec["llm"]), spec.get("max_new_tokens", 256), **_levers(spec))
    elif kind == "bundle":
        from .bundle import load_bundle
        from .llm import HFCausalLM, weights_id

        b = load_bundle(spec["path"], role="extractor", base_model=spec.get("base_model"))
        model, tok = b.load_model(base_override=spec.get("base_override"))
        quantize = spec.get("quantize")
        if quantize not in (None, "int8"):
            raise ConfigError(f"extractor option quantize must be null or int8, got {quantize!r}")
        if quantize == "int8":  # dynamic int8 matmuls on the CPU (weights int8, activations quantized per batch)
            import torch

            if model.device.type != "cpu":
                raise ConfigError("extractor option quantize=int8 is a CPU lever; this model is on "
                                  f"{model.device.type}")
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        elif spec.get("dtype", "fp32") != "fp32":
            from .llm import resolve_dtype

            model = model.to(resolve_dtype(spec["dtype"], "cpu" if model.device.type == "cpu" else "cuda"))
        if b.kind == "encoder_spans":  # one forward pass per batch of turns, every kind
            from .spans import SpanCodec

            gen = [k for k in DECODING_LEVERS if spec.get(k)]
            if gen:
                raise ConfigError(f"extractor option(s) {', '.join(gen)} shape a generation; the bundle "
                                  f"{spec['path']} is a span tagger (kind encoder_spans), which generates nothing")
            ex = SpanExtractor(model, tok, SpanCodec(b.manifest["labels"], b.manifest["span_vocab"]),
                               int(b.manifest.get("max_length") or 256), spec.get("batch_size", 32),
                               name=f"bundle:{spec['path']}")
        else:
            llm = HFCausalLM.from_parts(model, tok, name=f"bundle:{spec['path']}", batch_size=spec.get("batch_size", 8))
            # what its outputs depend on: the bundle's identity (training data fingerprint, export time) and dtype
            weights = "int8" if quantize else str(next(model.parameters()).dtype).replace("torch.", "")
            llm.cache_id = (f"bundle:{b.manifest['data_fingerprint']}|{b.manifest.get('created_at')}|"
                            f"{weights_id(b.path)}|{weights}")
            levers = _levers(spec)
            if b.manifest.get("layout", "kind") == "one_pass":  # one generation per turn, every kind
                ex = OnePassExtractor(llm, spec.get("max_new_tokens") or b.manifest.get("max_new_tokens", 384),
                                      kinds=b.manifest.get("kinds"), **levers)
            else:
                ex = LLMExtractor(llm, spec.get("max_new_tokens", 256), kinds=b.manifest.get("kinds"), **levers)
    else:
        raise ConfigError(f"runtime option extractors.<kind>.kind must be heuristic, prompted or bundle, got {kind!r}")
    cache[key] = ex
    return ex


class ExtractorSet:
    """Runs the configured extractor for each kind and validates every output."""

    def __init__(self, specs: dict[str, Any], heuristic_defaults: dict | None = None, enabled: list[str] | None = None):
        self._cache: dict = {}
        heuristic = {"kind": "heuristic", **(heuristic_defaults or {})}
        self.by_kind: dict[str, Extractor] = {}
        for kind in KINDS:
            spec = specs.get(kind, "heuristic") if specs else "heuristic"
            if spec == "heuristic" or (isinstance(spec, dict) and spec.get("kind") == "heuristic" and len(spec) == 1):
                spec = heuristic
            self.by_kind[kind] = build_extractor(spec, self._cache)
        self.enabled = set(enabled if enabled is not None else KINDS)

    def attach_cache(self, cache: ExtractionCache) -> None:
        """Cache every model-backed extractor's outputs (eval: rebuilt memories reuse generations)."""
        for ex in self.by_kind.values():
            if isinstance(ex, LLMExtractor):
                ex.cache = cache

    @property
    def uses_models(self) -> bool:
        return any(isinstance(self.by_kind[k], (LLMExtractor, SpanExtractor)) for k in self.enabled)

    def extract(self, turns: list[TurnInput]) -> list[Extraction]:
        outs = [Extraction() for _ in turns]
        for kind in KINDS:
            if kind not in self.enabled:
                continue
            raws = self.by_kind[kind].run(kind, turns)
            for ex, raw, t in zip(outs, raws, turns):
                ex.raw[kind] = raw
                if kind == "summary":
                    s = raw if isinstance(raw, str) else str(raw)
                    ex.summary = truncate(s, MAX_CHARS - 1) or truncate(t.user_text, 160)
                else:
                    setattr(ex, kind, validate_kind(raw, kind, ex.report))
        for ex, t in zip(outs, turns):
            ex.keywords = find_keywords(t.user_text + " " + t.assistant_text, k=10)
            if not ex.summary:
                ex.summary = truncate(t.user_text, 160)
        return outs
