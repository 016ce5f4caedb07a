"""Text utilities shared by the heuristic components: tokens, stems, keywords, entities, cues.

Everything here is deterministic and model-free so that the heuristic runtime profile has no
dependencies beyond the standard library and PyStemmer.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

import Stemmer

_WORD = re.compile(r"[A-Za-z0-9$€£][A-Za-z0-9'’\-\.$€£%]*[A-Za-z0-9%]|[A-Za-z0-9$%]")
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_SENT = re.compile(r"(?<!\bDr\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bSt\.)(?<!\bMrs\.)(?<=[.!?])\s+(?=[A-Z0-9\"'])")
_CAP_SEQ = re.compile(
    r"\b(?:(?:Dr|Mr|Mrs|Ms|Prof|St)\.\s+)?(?:[A-Z][A-Za-z'’]+|[A-Z]{2,})(?:\s+(?:of|de|la|van|von)?\s*(?:[A-Z][A-Za-z'’]+|[A-Z]{2,}))*"
)
_NUMBER = re.compile(r"[$€£]?\d[\d,]*(?:\.\d+)?\s?(?:%|k|km|kg|mi|h|hours|minutes|days|usd|eur)?\b", re.I)
_DATE = re.compile(
    r"\b(?:\d{4}-\d{2}-\d{2}|(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?\s+\d{1,2}"
    r"(?:st|nd|rd|th)?(?:,?\s+\d{4})?|\d{1,2}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:jan|feb|mar|apr|may|jun|jul|"
    r"aug|sep|sept|oct|nov|dec)[a-z]*(?:\s+\d{4})?|(?:monday|tuesday|wednesday|thursday|friday|saturday|"
    r"sunday))\b",
    re.I,
)

STOPWORDS = frozenset(
    """a about above after again against all also am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing don't
    down during each few for from further had hadn't has hasn't have haven't having he he'd he'll he's her
    here here's hers herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its
    itself let's me more most mustn't my myself no nor not of off on once only or other ought our ours
    ourselves out over own same shan't she she'd she'll she's should shouldn't so some such than that
    that's the their theirs them themselves then there there's these they they'd they'll they're they've
    this those through to too under until up very was wasn't we we'd we'll we're we've were weren't what
    what's when when's where where's which while who who's whom why why's will with won't would wouldn't
    you you'd you'll you're you've your yours yourself yourselves just like really okay ok yes yeah sure
    thanks thank please hey hi hello well now also still get got go going want need know think let make
    one two would could maybe something anything lot bit actually tell said says say""".split()
)

# Words that start sentences or questions and should never be taken for named entities.
_NOT_ENTITY = frozenset(
    """I I'm I've I'd I'll The A An And But So Also What When Where Who Why How Which Can Could Would
    Should Will Do Does Did Is Are Was Were Let Let's Please Thanks Thank Yes No Okay Ok Sure Hey Hi
    Hello Great Good Nice Back Remember Oh Well Then Now That This These Those It It's My Our Your Their
    His Her We You They He She Any Anything Just Actually Speaking Going Returning Regarding About For
    On In At By To From Of With Right Cool Awesome Wow Sounds Sorry Also Quick Another Last First
    Next Currently Previously Before After Today Tomorrow Yesterday Monday Tuesday Wednesday Thursday
    Friday Saturday Sunday January February March April May June July August September October November
    December""".split()
)

# Capitalised only because they start a sentence: imperative and reporting verbs, common openers.
_SENTENCE_OPENERS = frozenset(
    """add book buy cancel change check confirm count find keep let list make move note noted plan put remember
    remind schedule send set show switch tell update use bump raise lower push drop swap start stop try
    going planning thinking looking quick small big new old happy glad great sounds""".split()
)

_stemmer = Stemmer.Stemmer("english")


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    return _stemmer.stemWord(word.lower())


_POSSESSIVE = re.compile(r"['’]s$")


def words(text: str) -> list[str]:
    """Lower-cased word tokens (keeps $, %, decimals inside a token; drops possessive 's)."""
    return [_POSSESSIVE.sub("", w.lower()).strip(".'’-") for w in _WORD.findall(text or "")]


def content_words(text: str) -> list[str]:
    return [w for w in words(text) if w and w not in STOPWORDS and len(w) > 1]


def stems(text: str) -> set[str]:
    return {stem(w) for w in content_words(text)}


def count_tokens_approx(text: str) -> int:
    """Word-piece-like approximation used when no tokenizer is configured (~1.3 tokens per word)."""
    n = len(_TOKEN.findall(text or ""))
    return n + n // 3


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT.split(text or "") if s.strip()]


def keywords(text: str, k: int = 12) -> list[str]:
    """Most frequent content words, ties broken by first occurrence."""
    toks = content_words(text)
    counts = Counter(toks)
    first = {}
    for i, t in enumerate(toks):
        first.setdefault(t, i)
    ranked = sorted(counts, key=lambda t: (-counts[t], first[t]))
    return ranked[:k]


def entities(text: str, k: int = 16) -> list[str]:
    """Capitalised spans, amounts and dates: a cheap named-entity proxy."""
    out: list[str] = []
    seen: set[str] = set()

    def add(e: str) -> None:
        e = e.strip(" .,'’")
        key = e.lower()
        if e and key not in seen:
            seen.add(key)
            out.append(e)

    spans = []
    for m in _CAP_SEQ.finditer(text or ""):
        start = m.start()
        for piece in re.split(r"(?<=['’]s)\s+", m.group(0)):  # "Chen's NeurIPS" is two entities
            spans.append((start, piece))
            start += len(piece) + 1
    for start, span in spans:
        parts = span.split()
        at_start = start == 0 or (text[:start].rstrip()[-1:] in {".", "!", "?", ":", "\n", '"'})
        while parts and (parts[0] in _NOT_ENTITY or parts[0].lower() in {"of", "de", "la"}
                         or (at_start and len(parts) == 1 and parts[0].lower().endswith("ly"))
                         or (at_start and (parts[0].lower() in _SENTENCE_OPENERS
                                           or (parts[0].lower().endswith("ed") and len(parts[0]) > 4)))):
            parts = parts[1:]
        while parts and parts[-1].lower() in {"of", "de", "la"}:
            parts = parts[:-1]
        if not parts:
            continue
        ent = " ".join(parts)
        if ent.lower() in STOPWORDS:
            continue
        if ent.endswith("'s") or ent.endswith("’s"):
            ent = ent[:-2]
        add(ent)
    for m in _DATE.finditer(text or ""):
        add(m.group(0))
    for m in _NUMBER.finditer(text or ""):
        if any(ch.isdigit() for ch in m.group(0)):
            add(m.group(0))
    return out[:k]


def match_cue(text: str, cues: list[str]) -> str | None:
    """Return the first cue phrase that starts the text (or appears after a short greeting)."""
    low = (text or "").lower().lstrip(" \"'")
    low = re.sub(r"^(?:ok|okay|so|oh|hey|hi|alright|right|well)[,!.]?\s+", "", low)
    for cue in cues:
        c = cue.lower()
        if low.startswith(c) and (len(low) == len(c) or not low[len(c)].isalnum()):
            return cue
    return None


def find_cue(text: str, cues: list[str]) -> str | None:
    """Return the first cue phrase found anywhere in the text (word-bounded)."""
    low = (text or "").lower()
    for cue in cues:
        if re.search(r"(?<!\w)" + re.escape(cue.lower()) + r"(?!\w)", low):
            return cue
    return None


def truncate(text: str, max_chars: int) -> str:
    text = " ".join((text or "").split())
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    if " " in cut[max_chars // 2 :]:
        cut = cut[: cut.rfind(" ")]
    return cut + "…"


def overlap(a: set[str], b: set[str]) -> float:
    """Share of a covered by b (0 when a is empty)."""
    if not a:
        return 0.0
    return len(a & b) / len(a)


def snake_case(key: str) -> str:
    key = re.sub(r"[^0-9a-zA-Z]+", "_", (key or "").strip()).strip("_")
    key = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key)
    return key.lower()


_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})$")


def minutes_between(earlier: str | None, later: str | None) -> int | None:
    """Whole minutes from one timestamp to a later one: ISO dates and times ("2023-05-08T13:56"), or
    clock times of one day ("13:56", IRC logs; a smaller later clock is taken as past midnight). None
    when either is missing or unreadable."""
    from datetime import datetime

    if not earlier or not later:
        return None
    a, b = _CLOCK.match(earlier.strip()), _CLOCK.match(later.strip())
    if a and b:
        d = (int(b[1]) * 60 + int(b[2])) - (int(a[1]) * 60 + int(a[2]))
        return d if d >= 0 else d + 24 * 60
    try:
        return max(0, int((datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds() // 60))
    except (ValueError, TypeError):
        return None


_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]
_DAY_MONTH_YEAR = re.compile(r"\b(\d{1,2})\s*(" + "|".join(_MONTHS) + r"),?\s*(\d{4})\b", re.I)
_MONTH_DAY_YEAR = re.compile(r"\b(" + "|".join(_MONTHS) + r")\s+(\d{1,2}),?\s*(\d{4})\b", re.I)
_ISO_DATE = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10}
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_RELATIVE = re.compile(
    r"\b(yesterday|today|tonight|this morning|last night|last weekend|last week|next week|last month|next month|"
    r"last year|next year|last (?:" + "|".join(_WEEKDAYS) + r")|"
    r"(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten) (day|week|month|year)s? ago)\b", re.I)


def parse_date(ts: str | None):
    """The calendar date of a timestamp: "1:56 pm on 8 May, 2023", "May 8, 2023" or ISO "2023-05-08..."
    (None when there is none)."""
    from datetime import date

    if not ts:
        return None
    for rx, order in ((_DAY_MONTH_YEAR, "dmy"), (_MONTH_DAY_YEAR, "mdy"), (_ISO_DATE, "iso")):
        m = rx.search(ts)
        if not m:
            continue
        try:
            if order == "dmy":
                return date(int(m[3]), _MONTHS.index(m[2].lower()) + 1, int(m[1]))
            if order == "mdy":
                return date(int(m[3]), _MONTHS.index(m[1].lower()) + 1, int(m[2]))
            return date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            return None
    return None


def _day(d) -> str:
    return f"{d.day} {_MONTHS[d.month - 1].capitalize()} {d.year}"


def _shift_months(d, n: int):
    y, m = divmod(d.month - 1 + n, 12)
    return d.replace(year=d.year + y, month=m + 1, day=1)


def resolve_dates(text: str, ts: str | None) -> str:
    """Relative dates written out against the turn's own time: "yesterday" becomes "yesterday (7 May
    2023)", "last week" "last week (the week before 8 May 2023)", "two months ago" "two months ago (March
    2023)". The text is unchanged when the timestamp holds no date."""
    from datetime import timedelta

    base = parse_date(ts)
    if base is None:
        return text

    def when(m: re.Match) -> str:
        p = m[1].lower()
        if p in ("today", "tonight", "this morning"):
            return _day(base)
        if p in ("yesterday", "last night"):
            return _day(base - timedelta(days=1))
        if p == "last week":
            return f"the week before {_day(base)}"
        if p == "next week":
            return f"the week after {_day(base)}"
        if p == "last weekend":
            return f"the weekend before {_day(base)}"
        if p in ("last month", "next month"):
            d = _shift_months(base, -1 if p.startswith("last") else 1)
            return f"{_MONTHS[d.month - 1].capitalize()} {d.year}"
        if p in ("last year", "next year"):
            return str(base.year + (-1 if p.startswith("last") else 1))
        if p.startswith("last "):
            wd = _WEEKDAYS.index(p.split()[1])
            back = (base.weekday() - wd) % 7 or 7
            return _day(base - timedelta(days=back))
        n = int(m[2]) if m[2].isdigit() else _NUMBERS[m[2].lower()]
        unit = m[3].lower()
        if unit == "day":
            return _day(base - timedelta(days=n))
        if unit == "week":
            return f"the week of {_day(base - timedelta(weeks=n))}"
        if unit == "month":
            d = _shift_months(base, -n)
            return f"{_MONTHS[d.month - 1].capitalize()} {d.year}"
        return str(base.year - n)

    return _RELATIVE.sub(lambda m: f"{m[0]} ({when(m)})", text)
