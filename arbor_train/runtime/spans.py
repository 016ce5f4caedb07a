"""The encoder span layout: every extraction kind from one forward pass of a token-classification encoder.

A turn is read once (the user turn, then the assistant's reply as the second segment) and each token is
labelled in every *channel* at once, one softmax per channel over BIO tags of that channel's span types:

    summary      S            the user's words a summary keeps, in order
    entities     E            each mention of a named entity
    facts        F            a sentence that states an atomic fact
    states       <slot key>   a slot's value, typed by its key (the keys a bundle knows: `span_vocab.state_keys`)
    events       EV           an event's clause
    event_parts  SUBJ VERB QTY an event's subject, verb and quantity, inside its clause
    artifacts    NAME ITEM    a list's name and its items

`SpanCodec.decode` turns the tagged spans back into the runtime's per-kind items (the same JSON the causal
extractors write), which then pass the runtime's per-kind validation like any other output. What cannot be
read off the text comes from the bundle's vocabulary, learned from the training targets: a slot key's tag,
and an event verb's action and category.

`gold_spans` projects a training row's targets onto its text (a target it cannot place gets no span, so the
projection caps what a perfect tagger could score).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .text import sentences, truncate
from .validate import MAX_CHARS

CHANNELS: dict[str, tuple[str, ...]] = {
    "summary": ("S",), "entities": ("E",), "facts": ("F",), "states": (), "events": ("EV",),
    "event_parts": ("SUBJ", "VERB", "QTY"), "artifacts": ("NAME", "ITEM"),
}
KIND_CHANNELS = {"summary": ("summary",), "entities": ("entities",), "facts": ("facts",), "states": ("states",),
                 "events": ("events", "event_parts"), "artifacts": ("artifacts",)}
IGNORE = -100
_WORDS = re.compile(r"[$€£]?\w+(?:['’]\w+)?")
_QTY = re.compile(r"(?P<cur>[$€£])?(?P<num>\d[\d,]*(?:\.\d+)?)\s?(?P<unit>%|[a-zA-Z]+)?")
# an event's verb as the heuristic grammar reads it (runtime/extract.py), used when the vocabulary lacks it
_PAST = {"spent": "spend", "ran": "run", "paid": "pay", "bought": "buy", "swam": "swim", "sold": "sell",
         "wrote": "write", "read": "read"}


@dataclass(frozen=True)
class Span:
    seg: int  # 0: the user turn, 1: the assistant's reply
    start: int
    end: int
    type: str


def labels_for(state_keys: list[str]) -> list[str]:
    """The flat label list of the classification head: per channel `<channel>:O`, then `B-`/`I-` per type."""
    out = []
    for ch, types in CHANNELS.items():
        out.append(f"{ch}:O")
        for t in (state_keys if ch == "states" else types):
            out += [f"{ch}:B-{t}", f"{ch}:I-{t}"]
    return out


@dataclass
class SpanCodec:
    """Label layout and decoding of one span bundle: `labels` (the head's order) and `vocab`
    (`state_keys`, `state_tags` {key: tag}, `actions` {verb: [action, category]})."""

    labels: list[str]
    vocab: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.channels: dict[str, tuple[int, list[str]]] = {}  # channel -> (offset in the head, local labels)
        for i, lab in enumerate(self.labels):
            ch, _, tag = lab.partition(":")
            if ch not in CHANNELS:
                raise ValueError(f"label {lab!r}: unknown channel {ch!r} (known: {list(CHANNELS)})")
            off, local = self.channels.setdefault(ch, (i, []))
            local.append(tag)
        missing = [ch for ch in CHANNELS if ch not in self.channels]
        if missing:
            raise ValueError(f"labels lack the channel(s) {missing}")
        for ch, (off, local) in self.channels.items():
            if local[0] != "O" or self.labels[off: off + len(local)] != [f"{ch}:{t}" for t in local]:
                raise ValueError(f"channel {ch!r}: labels must be contiguous and start with {ch}:O")

    @classmethod
    def build(cls, state_keys: list[str], state_tags: dict[str, str], actions: dict[str, list[str]]) -> "SpanCodec":
        return cls(labels_for(state_keys), {"state_keys": list(state_keys), "state_tags": dict(state_tags),
                                            "actions": dict(actions)})

    @property
    def order(self) -> list[str]:
        return list(self.channels)

    def local(self, ch: str, tag: str) -> int:
        return self.channels[ch][1].index(tag)

    def local_labels(self, logits):
        """[..., tokens, channels] local label ids: the argmax of each channel's slice of the head's logits."""
        import torch

        return torch.stack([logits[..., off: off + len(tags)].argmax(-1) for off, tags in self.channels.values()], -1)

    # ------------------------------------------------------------------ tokens <-> spans
    def token_labels(self, enc_offsets: list[tuple[int, int]], seq_ids: list[int | None],
                     spans: dict[str, list[Span]], supervised: set[str]) -> list[list[int]]:
        """[tokens][channels] local label ids: B on a span's first token, I on the rest, O elsewhere; every
        label of a channel the row does not supervise (and of special tokens) is IGNORE. Within a channel a
        span that overlaps one already placed is dropped (BIO holds no nesting)."""
        n = len(enc_offsets)
        out = [[IGNORE] * len(self.order) for _ in range(n)]
        for c, ch in enumerate(self.order):
            if ch not in supervised:
                continue
            for i in range(n):
                if seq_ids[i] is not None and enc_offsets[i][1] > enc_offsets[i][0]:
                    out[i][c] = 0
            for sp in spans.get(ch, []):
                if f"B-{sp.type}" not in self.channels[ch][1]:
                    continue
                toks = [i for i in range(n) if seq_ids[i] == sp.seg and enc_offsets[i][1] > enc_offsets[i][0]
                        and enc_offsets[i][0] >= sp.start and enc_offsets[i][1] <= sp.end]
                if not toks or any(out[i][c] not in (0, IGNORE) for i in toks):
                    continue
                out[toks[0]][c] = self.local(ch, f"B-{sp.type}")
                for i in toks[1:]:
                    out[i][c] = self.local(ch, f"I-{sp.type}")
        return out

    def spans_of(self, pred: list[list[int]], enc_offsets: list[tuple[int, int]],
                 seq_ids: list[int | None]) -> dict[str, list[Span]]:
        """Spans read off per-token local label ids ([tokens][channels]); an I- that does not continue a
        span of its type starts one."""
        out: dict[str, list[Span]] = {}
        for c, ch in enumerate(self.order):
            tags = self.channels[ch][1]
            spans: list[Span] = []
            cur: list | None = None
            for i, lab in enumerate(p[c] for p in pred[: len(seq_ids)]):  # padding past the offsets
                seg = seq_ids[i]
                s, e = enc_offsets[i]
                tag = tags[lab] if 0 <= lab < len(tags) else "O"
                if seg is None or e <= s or tag == "O":
                    if seg is None or tag == "O":
                        cur = None
                    continue
                bio, _, typ = tag.partition("-")
                if bio == "I" and cur is not None and cur[0] == seg and cur[3] == typ:
                    cur[2] = e
                    continue
                cur = [seg, s, e, typ]
                spans.append(cur)  # type: ignore[arg-type]
            out[ch] = [Span(*x) for x in spans]
        return out

    # ------------------------------------------------------------------ spans -> kinds
    def decode(self, spans: dict[str, list[Span]], texts: tuple[str, str], timestamp: str | None = None) -> dict[str, Any]:
        """Every kind's raw output (before the runtime's validation) from one turn's spans."""
        def txt(sp: Span) -> str:
            return texts[sp.seg][sp.start: sp.end].strip(" ,;:.!?\"'")

        def inside(sp: Span, parts: list[Span]) -> list[Span]:
            return [p for p in parts if p.seg == sp.seg and p.start >= sp.start and p.end <= sp.end]

        ents = spans["entities"]
        ent_names = list(dict.fromkeys(t for s in ents if (t := txt(s))))

        def ents_in(sp: Span) -> list[str]:
            return list(dict.fromkeys(t for e in inside(sp, ents) if (t := txt(e))))[:8]

        bounds = [_sentence_bounds(t) for t in texts]

        def sentence_of(sp: Span) -> Span:
            s, e = next(((s, e) for s, e in bounds[sp.seg] if s <= sp.start < e), (sp.start, sp.end))
            return Span(sp.seg, s, e, "")

        summary = " ".join(txt(s) for s in spans["summary"] if s.seg == 0 and txt(s))
        speakers = (_speaker(texts[0]), _speaker(texts[1]))
        facts = [{"text": truncate(third_person(t, speakers[s.seg]), MAX_CHARS - 1), "entities": ents_in(s), "tags": []}
                 for s in spans["facts"] if (t := txt(s))]
        tags = self.vocab.get("state_tags", {})
        states = [{"key": s.type, "value": t, "tag": tags.get(s.type, ""), "entities": ents_in(sent := sentence_of(s)),
                   "evidence": truncate(texts[s.seg][sent.start: sent.end], MAX_CHARS - 1)} for s in spans["states"] if (t := txt(s))]
        actions = self.vocab.get("actions", {})
        events = []
        for s in spans["events"]:
            parts = inside(s, spans["event_parts"])
            subj = next((txt(p) for p in parts if p.type == "SUBJ"), "")
            verb = next((txt(p).lower() for p in parts if p.type == "VERB"), "")
            qty = next((p for p in parts if p.type == "QTY"), None)
            action, category = actions.get(verb) or [_PAST.get(verb, verb), _PAST.get(verb, verb)]
            quantity = unit = None
            if qty is not None and (m := _QTY.search(texts[qty.seg][qty.start: qty.end])):
                quantity = float(m.group("num").replace(",", ""))
                unit = m.group("cur") or m.group("unit") or None
            if not action:
                continue
            events.append({"subject": subj if subj and subj.lower() not in ("i", "we", "my", "our") else "user",
                           "action": action, "category": category or action, "quantity": quantity, "unit": unit,
                           "date": timestamp, "text": truncate(texts[s.seg][s.start: s.end].strip(), MAX_CHARS - 1),
                           "entities": ents_in(s)})
        artifacts: list[dict] = []
        for s in sorted(spans["artifacts"], key=lambda x: (x.seg, x.start)):
            if s.type == "NAME":
                before = texts[s.seg][max(0, s.start - 40): s.start]
                m = re.search(r"([A-Z][\w-]*)['’]s\s*$", before)
                artifacts.append({"name": txt(s).lower(), "subject": m.group(1) if m else "user", "items": [],
                                  "entities": []})
            elif artifacts and (t := txt(s)):
                artifacts[-1]["items"].append(truncate(t, MAX_CHARS - 1))
        for a in artifacts:
            a["entities"] = [e for e in ent_names if any(e in i for i in a["items"]) or e == a["subject"]][:8]
        return {"summary": summary, "entities": ent_names[:16], "facts": facts, "states": states, "events": events,
                "artifacts": [a for a in artifacts if a["items"]]}


def _sentence_bounds(text: str) -> list[tuple[int, int]]:
    out, pos = [], 0
    for s in sentences(text):
        i = text.find(s, pos)
        if i < 0:
            continue
        out.append((i, i + len(s)))
        pos = i + len(s)
    return out or [(0, len(text))]


# ---------------------------------------------------------------------------------- gold -> spans


def _words(text: str) -> list[tuple[str, int, int]]:
    return [(m.group(0).lower(), m.start(), m.end()) for m in _WORDS.finditer(text)]


def _find(text: str, needle: str, start: int = 0, end: int | None = None, case: bool = False) -> tuple[int, int] | None:
    """The first whole-word occurrence of needle in text[start:end] (case-insensitive unless `case`)."""
    needle = (needle or "").strip()
    if not needle:
        return None
    rx = re.compile(r"(?<!\w)" + re.escape(needle) + r"(?!\w)", 0 if case else re.I)
    m = rx.search(text, start, len(text) if end is None else end)
    return (m.start(), m.end()) if m else None


def _best_run(text: str, target: str, floor: float = 0.5) -> tuple[float, tuple[int, int]] | None:
    """(token F1, char range) of the run of words of text that, read in the third person (third_person),
    overlaps target's words best (F1 at least `floor`), or None. A run stays within one sentence."""
    tw = Counter(w for w, _, _ in _words(target))
    n_t = sum(tw.values())
    speaker = _speaker(text)
    best, where = floor, None
    for s, e in _sentence_bounds(text):
        ws = [(m, a + s, b + s) for _, a, b in _words(text[s:e]) for m in [_words(third_person(text[s + a: s + b], speaker))]]
        for i in range(len(ws)):
            have: Counter = Counter()
            common = n_p = 0
            for j in range(i, len(ws)):
                for w, _, _ in ws[j][0]:
                    have[w] += 1
                    n_p += 1
                    if have[w] <= tw[w]:
                        common += 1
                f = 2 * common / (n_p + n_t) if common else 0.0
                if f > best or (f == best and where is None):
                    best, where = f, (ws[i][1], ws[j][2])
    return None if where is None else (best, where)


_SPEAKER = re.compile(r"^\s*([A-Z][\w.'’-]*(?: [A-Z][\w.'’-]*){0,2}):\s")
_FIRST_PERSON = {"i": "{n}", "me": "{n}", "my": "{n}'s", "mine": "{n}'s", "myself": "{n}", "i'm": "{n} is",
                 "i’m": "{n} is", "i've": "{n} has", "i’ve": "{n} has", "i'll": "{n} will", "i’ll": "{n} will",
                 "i'd": "{n} would", "i’d": "{n} would"}


def _speaker(text: str) -> str | None:
    """The name a transcript line opens with ("Caroline: ..."), if any."""
    m = _SPEAKER.match(text or "")
    return m.group(1) if m else None


def third_person(sentence: str, speaker: str | None) -> str:
    """A speaker's sentence with the speaker's name for their first-person words and the name prefix dropped
    ("Caroline: I went ..." -> "Caroline went ..."): what a fact about them says. Unchanged without a speaker."""
    if not speaker:
        return sentence
    sentence = re.sub(r"^\s*" + re.escape(speaker) + r":\s*", "", sentence)
    return re.sub(r"(?<!\w)(?:[Ii](?:['’](?:m|ve|ll|d))?|[Mm]e|[Mm]y|[Mm]ine|[Mm]yself)(?!\w)",
                  lambda m: _FIRST_PERSON[m.group(0).lower()].format(n=speaker), sentence)


def _is_verb_of(word: str, action: str, verbs: dict[str, str] | None = None) -> bool:
    """Whether a (lower-cased) word of an event's text is the verb of its action: a verb the vocabulary maps
    to it, its past form, the action itself, or an inflection of it (paid, hiking; not the plural noun)."""
    return bool(action) and ((verbs or {}).get(word) == action or _PAST.get(word) == action or word == action
                             or (len(action) > 2 and word.startswith(action.rstrip("e")) and word != action + "s"))


def _lcs_words(src: list[tuple[str, int, int]], tgt: list[str]) -> list[tuple[int, int]]:
    """Char ranges of the source words on one longest common subsequence with the target words."""
    n, m = len(src), len(tgt)
    dp = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            dp[i][j] = dp[i + 1][j + 1] + 1 if src[i][0] == tgt[j] else max(dp[i + 1][j], dp[i][j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if src[i][0] == tgt[j]:
            out.append((src[i][1], src[i][2]))
            i, j = i + 1, j + 1
        elif dp[i + 1][j] >= dp[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def gold_spans(user: str, assistant: str, targets: dict[str, Any], state_keys: set[str],
               verbs: dict[str, str] | None = None) -> dict[str, list[Span]]:
    """A row's targets projected onto its text, per channel (only the kinds in `targets`). A target not found
    in the text places no span. verbs: surface verb -> action, to find an event's verb."""
    texts = (user, assistant)
    out: dict[str, list[Span]] = {ch: [] for ch in CHANNELS}
    if "summary" in targets and targets["summary"]:
        tw = [w for w, _, _ in _words(str(targets["summary"]))]
        src = _words(user)
        if len(src) * len(tw) <= 200_000:
            out["summary"] = [Span(0, s, e, "S") for s, e in _lcs_words(src, tw)]
    for e in sorted({str(x) for x in targets.get("entities") or [] if isinstance(x, str)}, key=len, reverse=True):
        for seg, t in enumerate(texts):
            for m in re.finditer(r"(?<!\w)" + re.escape(e) + r"(?!\w)", t):
                out["entities"].append(Span(seg, m.start(), m.end(), "E"))
    for f in targets.get("facts") or []:  # the sentence (of either speaker) that best states it
        if not isinstance(f, dict):
            continue
        found = [(sc, seg, w) for seg, t in enumerate(texts) if (hit := _best_run(t, str(f.get("text", ""))))
                 for sc, w in [hit]]
        if found:
            _, seg, w = max(found)
            out["facts"].append(Span(seg, *w, "F"))
    for s in targets.get("states") or []:
        if isinstance(s, dict) and s.get("key") in state_keys and (w := _find(user, str(s.get("value", "")))):
            out["states"].append(Span(0, *w, str(s["key"])))
    for ev in targets.get("events") or []:
        if not isinstance(ev, dict):
            continue
        run = _best_run(user, str(ev.get("text", "")))
        w = _find(user, str(ev.get("text", "")), case=True) or (run[1] if run else None)
        if w is None:
            continue
        s, e = w
        out["events"].append(Span(0, s, e, "EV"))
        subj = str(ev.get("subject") or "")
        if subj and subj != "user" and (p := _find(user, subj, s, e, case=True)):
            out["event_parts"].append(Span(0, *p, "SUBJ"))
        action = str(ev.get("action") or "").lower()
        verb_at = s
        for word, ws, we in _words(user[s:e]):
            if _is_verb_of(word, action, verbs):
                out["event_parts"].append(Span(0, s + ws, s + we, "VERB"))
                verb_at = s + we
                break
        q = ev.get("quantity")
        if q is not None:
            for m in _QTY.finditer(user, verb_at, e):
                try:
                    hit = abs(float(m.group("num").replace(",", "")) - float(q)) < 1e-6
                except ValueError:
                    hit = False
                if hit:
                    out["event_parts"].append(Span(0, m.start(), m.end(), "QTY"))
                    break
    for a in targets.get("artifacts") or []:
        if not isinstance(a, dict) or not (w := _find(user, str(a.get("name", "")))):
            continue
        out["artifacts"].append(Span(0, *w, "NAME"))
        pos = w[1]
        for item in a.get("items") or []:
            if (p := _find(user, str(item), pos)) is not None:
                out["artifacts"].append(Span(0, *p, "ITEM"))
                pos = p[1]
    return out


def learn_vocab(rows_targets: list[dict[str, Any]], min_count: int = 2) -> tuple[list[str], dict, dict]:
    """(state keys seen at least min_count times, key -> most common tag, verb -> [action, category]) from
    training targets ({kind: target} per row)."""
    keys: Counter = Counter()
    key_tags: dict[str, Counter] = {}
    verbs: dict[str, Counter] = {}
    for t in rows_targets:
        for s in t.get("states") or []:
            if isinstance(s, dict) and isinstance(s.get("key"), str) and s["key"]:
                keys[s["key"]] += 1
                key_tags.setdefault(s["key"], Counter())[str(s.get("tag") or "")] += 1
        for ev in t.get("events") or []:
            if not isinstance(ev, dict) or not ev.get("action"):
                continue
            action = str(ev["action"]).lower()
            for word, _, _ in _words(str(ev.get("text", ""))):
                if _is_verb_of(word, action):
                    verbs.setdefault(word, Counter())[(action, str(ev.get("category") or action))] += 1
                    break
    state_keys = sorted(k for k, n in keys.items() if n >= min_count)
    return (state_keys, {k: key_tags[k].most_common(1)[0][0] for k in state_keys},
            {w: list(c.most_common(1)[0][0]) for w, c in sorted(verbs.items())})


def read_batch(codec: SpanCodec, logits, enc, texts: list[tuple[str, str]], timestamps: list[str | None]) -> list[dict]:
    """Each turn's per-kind raw outputs from the head's logits ([batch, tokens, labels]) of `encode`'s batch."""
    local = codec.local_labels(logits)
    out = []
    for i, (pair, ts) in enumerate(zip(texts, timestamps)):
        offs = [tuple(x) for x in enc["offset_mapping"][i].tolist()]
        out.append(codec.decode(codec.spans_of(local[i].tolist(), offs, enc.sequence_ids(i)), pair, ts))
    return out


def encode(tokenizer, turns: list[tuple[str, str]], max_length: int):
    """Tokenize (user, assistant) pairs as the span head reads them: the user turn first, the reply as the
    second segment, truncated to max_length (the longer segment first); offsets map tokens back to characters."""
    return tokenizer([u for u, _ in turns], [a or "" for _, a in turns], truncation=True, max_length=max_length,
                     padding=True, return_offsets_mapping=True, return_tensors="pt")
