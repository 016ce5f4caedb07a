"""Answer scoring for the evaluation harness: LoCoMo F1 and BranchMemEval rule-based accuracy.

Everything here is plain Python over strings, numbers and dicts; every returned number is a Python
``float``/``int``/``bool``.

LoCoMo (``locomo_normalize``, ``locomo_f1``, ``locomo_score``)
    The F1 of the LoCoMo release (``task_eval/evaluation.py`` of snap-research/locomo), rule for rule:

    * normalization: remove commas, lowercase, delete ASCII punctuation (``string.punctuation``,
      deleted, not replaced by a space: ``"don't"`` becomes ``"dont"``), replace the words
      a / an / the / and by a space, collapse whitespace;
    * every token is Porter-stemmed;
    * F1 over the *multiset* overlap of stemmed tokens; an overlap of zero scores 0.0, which includes
      the case of two empty strings (LoCoMo returns 0 there, unlike the SQuAD convention of
      ``arbor_train.scoring.training.token_f1``);
    * per category (LoCoMo numbering: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop,
      5 adversarial): 3 cuts the gold at its first ``";"``; 1 splits prediction and gold on ``","``
      and averages, over gold parts, the best F1 against any prediction part; 2 and 4 are plain F1;
      5 scores 1.0 when the output says the information is not available (a case-insensitive
      substring test against ``ABSTENTION_PHRASES``) and 0.0 otherwise.

    Stemmer: LoCoMo uses ``nltk.stem.PorterStemmer()``, whose default mode (``NLTK_EXTENSIONS``)
    adds a few departures from Porter's 1980 algorithm. This module uses PyStemmer's ``"porter"``
    algorithm (the Snowball implementation of the original Porter stemmer; PyStemmer's ``"english"``
    is the different Porter2 algorithm), so nltk is not needed. The two agree on ordinary
    inflections (``running``/``runs`` -> ``run``, ``hiking`` -> ``hike``) and differ on a handful of
    irregular words nltk special-cases (``dying`` -> ``dy`` here, ``die`` in nltk; ``skies`` ->
    ``ski`` here, ``sky`` in nltk). Such words are rare in LoCoMo answers; scores can differ from the
    official script in those cases only.

    Category 5: LoCoMo's own script accepts only ``"no information available"`` and
    ``"not mentioned"`` (``LOCOMO_CODE_ABSTENTION_PHRASES``); the default ``ABSTENTION_PHRASES`` is a
    broader list (answer models phrase abstention in many ways). Pass
    ``abstention_phrases=LOCOMO_CODE_ABSTENTION_PHRASES`` to reproduce the script exactly.

BranchMemEval (``normalize_answer``, ``mentions``, ``is_hedge``, ``answer_correct``)
    Normalized rule-based accuracy. ``normalize_answer`` lowercases (after Unicode NFKC), turns
    ``"$"`` into a space, removes thousands separators (a comma between a digit and exactly three
    digits: ``"1,200,000"`` -> ``"1200000"``; ``"3,4"`` is not a number and becomes ``"3 4"``), drops
    a trailing zero fraction (``"1200.0"``, ``"1200.00"`` -> ``"1200"``), drops ordinal suffixes
    after digits (``"3rd"`` -> ``"3"``, so ``"June 3rd"`` matches ``"June 3"``), replaces every other
    punctuation character by a space while keeping a ``"."`` between two digits (``"12.5"`` stays),
    drops the articles a / an / the (the planner's landmarks read ``"the old cathedral"``; an answer
    ``"Old Cathedral"`` is right), and collapses whitespace. So ``"$1,200"``, ``"1200"``,
    ``"$1200.00"`` all normalize to ``"1200"``, and ``"1200 dollars"`` contains it.

    A value is *mentioned* in a text when its normalized token sequence occurs in the normalized
    text as a contiguous run of whole tokens: ``"3"`` is not found in ``"13"`` or ``"3.5"``,
    ``"1200"`` is not found in ``"12000"``, ``"june 3"`` is not found in ``"june 30"``. With
    ``ignore_inside=other``, occurrences lying entirely inside an occurrence of ``other`` do not
    count (gold ``"Maria"`` is not answered by ``"Maria Lopez"`` when that is the confounder).
    A value that normalizes to nothing is never mentioned.

    ``answer_correct(pred, gold, confounder)`` is ``mentions(pred, gold, ignore_inside=confounder)``
    and not ``is_hedge(pred, gold, confounder)``: a prediction is correct when it states the gold
    answer and offers no other answer beside it. Accuracy must not pay for naming every candidate.

    A prediction that mentions the gold is a *hedge* when any of these holds:

    1. it states the confounder: ``mentions(pred, confounder, ignore_inside=gold)``, so a confounder
       occurrence inside the gold (confounder ``"Maria"``, gold ``"Maria Lopez"``) does not count,
       and neither does a gold occurrence inside the confounder (``mentions`` of the gold already
       ignores those). ``"$1,200, not $900"`` names the confounder and is a hedge too: the rule does
       not read negations;
    2. it names two or more other distinct values of the gold's kind;
    3. it joins the gold to another value of its kind with "or" or "/" (``"either $1200 or $1500"``,
       ``"$1,500/$1,800"``, ``"June 3 or 4"``, ``"Marble Hall or Engine Room"``).

    The gold's kind and its values (read from the text after the first steps of ``normalize_answer``,
    so ``"$1,500"`` is the amount 1500 and ``"3rd"`` the number 3):

    * a *date* gold (month name and day, e.g. ``"June 3"``, ``"3 June"``, ``"Jun 3, 2024"``): the
      other values are dates of that form; for rule 3 a bare day number also counts (``"June 3 or 4"``);
    * a *money* gold (``"$1,500"``, ``"1500 dollars"``): the other values are money amounts
      (a ``"$"`` before or ``"dollars"`` / ``"usd"`` / ``"bucks"`` after a number); for rule 3 a
      bare number also counts (``"$1,200 or 1,500"``). Other numbers are incidental: ``"The budget is
      $1,500 for 3 nights"`` is correct;
    * a *number* gold (a count ``"4"``, or a quantity ``"60 km"``): the other values are numbers
      (not inside a date, a money amount or a timestamp) followed by the same unit word as the gold
      (``"km"``; for a count, the word after the gold in the prediction, as ``"rides"`` in ``"4
      rides"``) or by no word at all (``"4, 5 or 6"``, and list enumerators ``"1."``, ``"2."``, so an
      enumerated dump of items is a hedge). ``"4 rides over 2 days, 60 km in total"`` is correct:
      ``2`` and ``60`` count other things. Connectives (``or``, ``and``, ``to``, ``then``,
      ``maybe``, ...) are not unit words. For rule 3 any number counts;
    * any *other* gold (names, places, items, and golds such as ``"Room 12"`` that are not exactly
      one date, amount or number): the prediction is split into items at commas,
      semicolons, slashes, line breaks and the words ``or`` and ``either`` (not ``and``, which joins
      facts as often as alternatives), after the gold's own occurrences are taken as one item and
      list enumerators (``"1."``, ``"-"``) at line starts are dropped. The other values are the
      items without the gold of 1 to max(3, tokens of the gold) normalized tokens: short enough to
      be a bare value, so ``"Marble Hall, Engine Room, Chapel Loft"`` is a hedge while ``"The venue
      is Marble Hall, which is located in Munich and seats 107 guests."`` is not (its item after
      the comma has 9 tokens). Rule 3 needs one such item next to the gold's item with an ``or`` or ``/`` between them.

    For every kind, values equal to the gold are not "other", ISO dates and timestamps
    (``"2025-01-03T18:58"``, the turn stamps of the context format) and clock times (``"18:58"``)
    are never values, and the operands of arithmetic are not candidates: two values joined by
    ``+``, ``=``, ``*``, ``×``, ``x``, ``plus`` or ``times`` do not count for rule 2, so ``"$180 +
    $110 = $290"`` is correct for gold ``"$290"``, while a breakdown written out in words
    (``"$290: $180 for tickets, $110 for food"``) names two other amounts and is a hedge. The rules
    read no meaning: a prediction listing incidental values of the gold's kind for another purpose is
    a hedge as well.

BranchMemEval error categories (``context_flags``, ``error_category``)
    See ``error_category`` for the decision order: ``"correct"``, then ``"hedge"`` (the gold stated
    with the confounder or other candidates, as defined above), then the three kinds of miss.
    "Context" is the answer-time evidence the answer model read: either its text, or a
    ``arbor_train.runtime.context.Context`` object, in which case only the rendered blocks are
    searched (its header holds the current time, not evidence). The context is searched line by
    line (a value never matches across a line break); a value's *position* is (line index, offset
    in the normalized line) of its first occurrence. Blocks are rendered in priority order
    (computed answers, update evidence, primary path, facts, states, structured blocks,
    supplemental turns), so an earlier position is read first, with higher priority.

Aggregation (``aggregate``)
    Overall and grouped accuracy (or mean score) over per-question records, with error counts.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import Stemmer

from arbor_train.scoring.training import multiset_counts

if TYPE_CHECKING:
    from arbor_train.runtime.context import Context

__all__ = [
    "ABSTENTION_PHRASES",
    "ERROR_CATEGORIES",
    "LOCOMO_CODE_ABSTENTION_PHRASES",
    "STEMMER_ALGORITHM",
    "aggregate",
    "answer_correct",
    "context_flags",
    "error_category",
    "is_hedge",
    "locomo_f1",
    "locomo_gold",
    "locomo_normalize",
    "locomo_score",
    "locomo_stem",
    "locomo_tokens",
    "mentions",
    "normalize_answer",
]

# --------------------------------------------------------------------------------------------------
# LoCoMo F1

#: PyStemmer algorithm used for LoCoMo's Porter stemming (the original Porter algorithm).
STEMMER_ALGORITHM = "porter"

#: Phrases (lowercase, matched as case-insensitive substrings) that make a category-5 output correct.
ABSTENTION_PHRASES: tuple[str, ...] = (
    "not mentioned",
    "no information",  # covers LoCoMo's "no information available"
    "not available",
    "cannot be determined",
    "can't be determined",
    "cannot be answered",
    "not answerable",
    "unanswerable",
    "unknown",
    "not specified",
    "not stated",
    "not provided",
    "no mention",
    "not enough information",
    "insufficient information",
    "does not say",
    "doesn't say",
    "not in the conversation",
    "don't know",
    "do not know",
)

#: The two phrases LoCoMo's ``eval_question_answering`` checks for category 5.
LOCOMO_CODE_ABSTENTION_PHRASES: tuple[str, ...] = ("no information available", "not mentioned")

_ASCII_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"  # == string.punctuation
_LOCOMO_PUNCT_TABLE = str.maketrans("", "", _ASCII_PUNCT)
_LOCOMO_STOPWORDS = re.compile(r"\b(a|an|the|and)\b")

# PyStemmer objects must not be shared between threads: one per thread.
_stemmers = threading.local()


def _text(value: Any) -> str:
    """``str(value)``, with ``None`` as the empty string (answers can be ints)."""
    return "" if value is None else str(value)


def _stemmer() -> Stemmer.Stemmer:
    stemmer = getattr(_stemmers, "stemmer", None)
    if stemmer is None:
        stemmer = _stemmers.stemmer = Stemmer.Stemmer(STEMMER_ALGORITHM)
    return stemmer


def locomo_normalize(s: Any) -> str:
    """LoCoMo's answer normalization.

    Removes commas, lowercases, deletes ASCII punctuation, replaces the whole words a / an / the /
    and by a space, and collapses whitespace. ``None`` gives ``""``; other non-strings are
    stringified (``2022`` -> ``"2022"``).
    """
    text = _text(s).replace(",", "").lower().translate(_LOCOMO_PUNCT_TABLE)
    return " ".join(_LOCOMO_STOPWORDS.sub(" ", text).split())


def locomo_stem(word: str) -> str:
    """Porter stem of one (already lowercased) token, via PyStemmer's ``"porter"`` algorithm."""
    return _stemmer().stemWord(word)


def locomo_tokens(s: Any) -> list[str]:
    """The stemmed tokens LoCoMo's F1 compares: ``locomo_normalize`` split on spaces, each stemmed."""
    normalized = locomo_normalize(s)
    return _stemmer().stemWords(normalized.split()) if normalized else []


def locomo_f1(pred: Any, gold: Any) -> float:
    """LoCoMo's ``f1_score``: F1 of the multiset overlap of stemmed, normalized tokens.

    0.0 when nothing overlaps (including when either side, or both, has no tokens).
    """
    overlap, n_pred, n_gold = multiset_counts(locomo_tokens(pred), locomo_tokens(gold))
    if overlap == 0:
        return 0.0
    # = 2PR / (P + R) with P = overlap / n_pred and R = overlap / n_gold
    return 2 * overlap / (n_pred + n_gold)


def answer_token_recall(context: Any, gold: Any) -> float | None:
    """The share of the gold answer's LoCoMo-normalized tokens (stemmed, articles and punctuation
    dropped; a multiset) that the context holds: what a reader could copy from it, whatever the
    provenance. None when the gold answer has no tokens."""
    gold_toks = locomo_tokens(gold)
    if not gold_toks:
        return None
    overlap, _, n_gold = multiset_counts(locomo_tokens(context), gold_toks)
    return overlap / n_gold


def _locomo_multi_f1(pred: str, gold: str) -> float:
    """LoCoMo's ``f1`` (category 1): mean over gold parts of the best F1 against prediction parts."""
    pred_parts = [p.strip() for p in pred.split(",")]
    gold_parts = [g.strip() for g in gold.split(",")]
    return sum(max(locomo_f1(p, g) for p in pred_parts) for g in gold_parts) / len(gold_parts)


def _says_abstain(pred: str, phrases: Iterable[str]) -> bool:
    low = pred.lower()
    return any(phrase.lower() in low for phrase in phrases)


def locomo_gold(gold: Any, category: int) -> str:
    """The part of a gold answer LoCoMo's F1 compares against (category 3, open-domain: the first of its
    ";"-separated parts; otherwise the whole answer, stringified)."""
    gold_text = _text(gold)
    return gold_text.split(";")[0].strip() if int(category) == 3 else gold_text


def locomo_score(
    pred: Any,
    gold: Any,
    category: int,
    abstention_phrases: Sequence[str] = ABSTENTION_PHRASES,
) -> float:
    """Score one LoCoMo answer with the rule of its category (LoCoMo numbering).

    Args:
        pred: the model's output (stringified; ``None`` counts as ``""``).
        gold: the gold answer (stringified: answers can be ints); ignored for category 5, whose
            items usually carry only an ``adversarial_answer``.
        category: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.
        abstention_phrases: category 5 only; an output containing any of them (case-insensitive)
            scores 1.0. ``LOCOMO_CODE_ABSTENTION_PHRASES`` reproduces the official script.

    Returns:
        A score in ``[0, 1]``.

    Raises:
        ValueError: for a category outside 1..5.
    """
    pred_text = _text(pred)
    if category == 5:
        return float(_says_abstain(pred_text, abstention_phrases))
    gold_text = locomo_gold(gold, category)
    if category == 3:
        return locomo_f1(pred_text, gold_text)
    if category in (2, 4):
        return locomo_f1(pred_text, gold_text)
    if category == 1:
        return _locomo_multi_f1(pred_text, gold_text)
    raise ValueError(f"unknown LoCoMo category {category!r} (expected 1..5)")


# --------------------------------------------------------------------------------------------------
# BranchMemEval rule-based accuracy

_THOUSANDS_SEP = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_ZERO_FRACTION = re.compile(r"(?<=\d)\.0+(?!\d|\.\d)")
_ORDINAL = re.compile(r"(?<=\d)(?:st|nd|rd|th)\b")
_NON_WORD = re.compile(r"[^\w\s.]|_")
_STRAY_DOT = re.compile(r"(?<!\d)\.|\.(?!\d)")
_ANSWER_ARTICLES = frozenset({"a", "an", "the"})


def normalize_answer(s: Any) -> str:
    """Normalize a BranchMemEval answer or prediction (rules in the module docstring).

    ``"The budget is $1,200."`` -> ``"budget is 1200"``; ``"June 3rd"`` -> ``"june 3"``;
    ``12.50`` -> ``"12.50"``; ``None`` -> ``""``.
    """
    text = unicodedata.normalize("NFKC", _text(s)).lower().replace("$", " ")
    text = _THOUSANDS_SEP.sub("", text)
    text = _ZERO_FRACTION.sub("", text)
    text = _ORDINAL.sub("", text)
    text = _NON_WORD.sub(" ", text)
    text = _STRAY_DOT.sub(" ", text)
    return " ".join(tok for tok in text.split() if tok not in _ANSWER_ARTICLES)


def _spans(norm_text: str, norm_value: str) -> list[tuple[int, int]]:
    """Character spans of every whole-token occurrence (overlaps included) of a normalized value."""
    if not norm_value:
        return []
    spans = []
    start = norm_text.find(norm_value)
    while start != -1:
        end = start + len(norm_value)
        if (start == 0 or norm_text[start - 1] == " ") and (end == len(norm_text) or norm_text[end] == " "):
            spans.append((start, end))
        start = norm_text.find(norm_value, start + 1)
    return spans


def _first_match(norm_text: str, norm_value: str, norm_other: str) -> int | None:
    """Offset of the first occurrence of ``norm_value`` not lying inside one of ``norm_other``."""
    spans = _spans(norm_text, norm_value)
    if not spans:
        return None
    blockers = _spans(norm_text, norm_other) if norm_other and norm_other != norm_value else []
    for start, end in spans:
        if not any(b_start <= start and end <= b_end for b_start, b_end in blockers):
            return start
    return None


def mentions(text: Any, value: Any, ignore_inside: Any = None) -> bool:
    """Whether ``text`` mentions ``value`` as a whole-token match after ``normalize_answer``.

    Args:
        text: the text searched (a prediction, a context line, ...).
        value: the value looked for; one that normalizes to ``""`` (or ``None``) is never mentioned.
        ignore_inside: optional other value; occurrences of ``value`` lying entirely within an
            occurrence of it are not counted (ignored when it normalizes to the same string).

    ``mentions("The budget is $1,200.", "$1,200")`` is true; ``mentions("$12,000", "$1,200")``,
    ``mentions("13 payments", "3")`` and ``mentions("June 30", "June 3")`` are false.
    """
    return _first_match(normalize_answer(text), normalize_answer(value), normalize_answer(ignore_inside)) is not None


# --- hedges -----------------------------------------------------------------------------------------

_MONTHS = {
    "january": "january", "jan": "january", "february": "february", "feb": "february", "march": "march",
    "mar": "march", "april": "april", "apr": "april", "may": "may", "june": "june", "jun": "june",
    "july": "july", "jul": "july", "august": "august", "aug": "august", "september": "september",
    "sep": "september", "sept": "september", "october": "october", "oct": "october", "november": "november",
    "nov": "november", "december": "december", "dec": "december",
}
_MONTH = r"(?P<{g}>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\b\.?"
_NUM = r"\d+(?:\.\d+)?"
# ISO dates / timestamps ("2025-01-03", "2025-01-03T18:58") and clock times ("18:58", "6:30 pm"): the
# turn timestamps of the context format, never candidate values; their digits are not numbers.
_TIMESTAMP = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}(?:[t ]\d{1,2}:\d{2}(?::\d{2})?)?"
    r"|(?<![\d.])\d{1,2}:\d{2}(?::\d{2})?(?:\s*[ap]\.?m\b\.?)?"
)
_DATE = re.compile(
    r"\b" + _MONTH.format(g="m1") + r"\s*(?P<d1>\d{1,2})(?![\d:]|\.\d)(?:,?\s+\d{4}(?!\d))?"
    r"|(?<![\d.])(?P<d2>\d{1,2})\s+(?:of\s+)?" + _MONTH.format(g="m2") + r"(?:,?\s+\d{4}(?!\d))?"
)
_MONEY = re.compile(r"\$\s*(?P<a>" + _NUM + r")(?!\d|\.\d)|(?<![\d.])(?P<b>" + _NUM + r")\s*(?:dollars?|usd|bucks)\b")
_NUMBER = re.compile(r"(?<![\d.])" + _NUM + r"(?!\d|\.\d)")
_UNIT_AFTER = re.compile(r"[ \t]*([a-z]+)")
_NOT_UNITS = frozenset({"or", "and", "nor", "either", "to", "then", "maybe", "perhaps", "possibly", "probably",
                        "x", "plus", "minus", "times"})
# between two values: "X or Y", "X / Y", "X, or maybe Y" (an explicit alternative)
_ALTERNATIVE_JOIN = re.compile(r"\s*,?\s*(?:or|/)(?:\s+(?:maybe|perhaps|possibly|probably))?\s*")
# between two values: arithmetic ("$180 + $110 = $290"): operands are working, not alternatives
_ARITHMETIC_JOIN = re.compile(r"\s*(?:[+=×*]|plus|times|x)\s*")
# list separators for golds that are not numbers or dates; "and" is not one (it joins facts as often
# as alternatives), "or" and "either" are
_PUNCT_SEPARATOR = re.compile(r"([,;\n/])")
_SEP, _ALT, _GOLD = "\x00sep", "\x00alt", "\x00gold"  # never normalized tokens (no NUL survives)
_ENUMERATOR = re.compile(r"(?m)^[ \t]*(?:\d{1,2}[.)]|[-*•])[ \t]+")
_SHORT_SEGMENT = 3  # a list item has 1 .. max(3, tokens of the gold) normalized tokens


def _prepare(s: Any) -> str:
    """The first steps of ``normalize_answer`` (NFKC, lowercase, thousands separators, zero fractions,
    ordinal suffixes), punctuation kept: the text values are extracted from."""
    text = unicodedata.normalize("NFKC", _text(s)).lower()
    text = _THOUSANDS_SEP.sub("", text)
    text = _ZERO_FRACTION.sub("", text)
    return _ORDINAL.sub("", text)


def _values(text: str) -> list[tuple[int, int, str, Any, str | None]]:
    """Values in prepared text, in order: ``(start, end, kind, key, unit)``.

    ``kind`` is ``"date"`` (key ``"june 3"``), ``"money"`` (key the amount as a float) or ``"number"``
    (key a float; ``unit`` the word right after it, which the span includes, ``None`` for a bare
    number such as ``"90,"`` or a list enumerator ``"2."``). Timestamps and clock times are skipped,
    and numbers inside dates, money amounts and timestamps are not numbers of their own.
    """
    taken: list[tuple[int, int]] = [m.span() for m in _TIMESTAMP.finditer(text)]

    def free(a: int, b: int) -> bool:
        return not any(a < e and s < b for s, e in taken)

    found: list[tuple[int, int, str, Any, str | None]] = []
    for m in _DATE.finditer(text):
        if free(*m.span()):
            month = _MONTHS[(m.group("m1") or m.group("m2")).rstrip(".")]
            day = int(m.group("d1") or m.group("d2"))
            if 1 <= day <= 31:
                found.append((m.start(), m.end(), "date", f"{month} {day}", None))
                taken.append(m.span())
    for m in _MONEY.finditer(text):
        if free(*m.span()):
            found.append((m.start(), m.end(), "money", float(m.group("a") or m.group("b")), None))
            taken.append(m.span())
    for m in _NUMBER.finditer(text):
        if free(*m.span()):
            unit = _UNIT_AFTER.match(text, m.end())
            if unit and unit.group(1) not in _NOT_UNITS:  # the span takes the unit: "60 km or 90 km"
                found.append((m.start(), unit.end(), "number", float(m.group()), unit.group(1)))
            else:
                found.append((m.start(), m.end(), "number", float(m.group()), None))
    return sorted(found)


def _gold_kind(gold: Any) -> tuple[str, Any, str | None]:
    """``(kind, key, unit)`` of a gold answer: ``"date"``, ``"money"``, ``"number"`` (a count, or a
    quantity such as ``"60 km"`` whose ``unit`` is ``"km"``) when the gold is exactly one such value,
    else ``("other", None, None)``."""
    text = _prepare(gold).strip()
    vals = _values(text)
    if len(vals) == 1:
        start, end, kind, key, unit = vals[0]
        if not (text[:start] + text[end:]).strip(" ."):
            return kind, key, unit
    return "other", None, None


def _numeric_hedge(pred: str, kind: str, key: Any, unit: str | None) -> bool:
    """Rules 2 and 3 of a hedge for a date, money or number gold (module docstring)."""
    vals = _values(pred)
    if unit is None and kind == "number":  # a count: its unit is the word after it in the prediction
        unit = next((u for _, _, k, v, u in vals if k == "number" and v == key), None)

    def same_kind(k: str, v: Any, u: str | None) -> bool:
        if kind == "number":
            return k == "number" and (u is None or u == unit)
        return k == kind

    def alternative_of_kind(k: str, v: Any, u: str | None) -> bool:
        if kind == "date":  # "June 3 or 4"
            return k == "date" or (k == "number" and float(v).is_integer() and 1 <= v <= 31 and u is None)
        if kind == "money":  # "$1,200 or 1,500"
            return k in ("money", "number")
        return k == "number"

    def is_gold(k: str, v: Any) -> bool:  # a money gold may be stated as a bare number
        return v == key and (k == kind or (kind == "money" and k == "number"))

    # 3. an explicit alternative: the gold and another value of its kind joined by "or" / "/"
    for (_, a_end, a_k, a_v, a_u), (b_start, _, b_k, b_v, b_u) in zip(vals, vals[1:]):
        if _ALTERNATIVE_JOIN.fullmatch(pred[a_end:b_start]):
            if (is_gold(a_k, a_v) and alternative_of_kind(b_k, b_v, b_u) and b_v != key) or (
                is_gold(b_k, b_v) and alternative_of_kind(a_k, a_v, a_u) and a_v != key
            ):
                return True
    # 2. two or more other distinct values of the gold's kind; arithmetic operands do not count
    operands = set()
    for i, ((_, a_end, *_), (b_start, *_)) in enumerate(zip(vals, vals[1:])):
        if _ARITHMETIC_JOIN.fullmatch(pred[a_end:b_start]):
            operands.update((i, i + 1))
    others = {v for i, (_, _, k, v, u) in enumerate(vals) if i not in operands and same_kind(k, v, u) and v != key}
    return len(others) >= 2


def _list_hedge(pred: str, gold: Any) -> bool:
    """Rules 2 and 3 of a hedge for any other gold (names, places, items): list alternatives."""
    gold_tokens = normalize_answer(gold).split()
    if not gold_tokens:
        return False
    tokens: list[str] = []  # normalized tokens and _SEP / _ALT separator marks
    for i, piece in enumerate(_PUNCT_SEPARATOR.split(_ENUMERATOR.sub("", _prepare(pred)))):
        if i % 2:  # a separator
            tokens.append(_ALT if piece == "/" else _SEP)
        else:
            tokens.extend(normalize_answer(piece).split())
    # the gold's occurrences become one item first, so a gold holding "or" stays whole
    masked: list[str] = []
    i, n = 0, len(gold_tokens)
    while i < len(tokens):
        if tokens[i : i + n] == gold_tokens:
            masked.append(_GOLD)
            i += n
        else:
            masked.append({"or": _ALT, "either": _SEP}.get(tokens[i], tokens[i]))
            i += 1
    # segments between separators, each with the separators that lead to the next one
    segments: list[tuple[bool, int]] = []  # (holds the gold, number of tokens)
    joins: list[bool] = []  # joins[k]: an "or" / "/" lies between segments k and k + 1
    current: list[str] = []
    pending_alt = False
    for tok in masked + [_SEP]:
        if tok in (_SEP, _ALT):
            if current:
                if segments:
                    joins.append(pending_alt)
                segments.append((_GOLD in current, sum(t != _GOLD for t in current)))
                current, pending_alt = [], False
            pending_alt = pending_alt or tok == _ALT
        else:
            current.append(tok)
    limit = max(_SHORT_SEGMENT, n)

    def item(k: int) -> bool:
        has_gold, size = segments[k]
        return not has_gold and 1 <= size <= limit

    if sum(item(k) for k in range(len(segments))) >= 2:
        return True
    return any(joins[k] and ((segments[k][0] and item(k + 1)) or (segments[k + 1][0] and item(k)))
               for k in range(len(joins)))


def is_hedge(pred: Any, gold: Any, confounder: Any = None) -> bool:
    """Whether a prediction that mentions the gold also offers other answers (rules in the module docstring).

    ``True`` when the prediction states the confounder (``mentions(pred, confounder,
    ignore_inside=gold)``), or names two or more other distinct values of the gold's kind, or joins
    the gold to another value of its kind with "or" / "/". It does not check that the gold is
    mentioned (``answer_correct`` and ``error_category`` do).
    """
    if mentions(pred, confounder, ignore_inside=gold):
        return True
    kind, key, unit = _gold_kind(gold)
    if kind == "other":
        return _list_hedge(_text(pred), gold)
    return _numeric_hedge(_prepare(pred), kind, key, unit)


def answer_correct(pred: Any, gold: Any, confounder: Any = None) -> bool:
    """BranchMemEval rule-based correctness: the prediction states the gold, and only the gold.

    The normalized gold occurs in the normalized prediction (whole-token matching as in ``mentions``;
    with ``confounder`` given, a gold occurrence that is only part of a mention of the confounder does
    not count: gold ``"Maria"``, confounder ``"Maria Lopez"``, prediction ``"Maria Lopez"`` is wrong),
    and the prediction is not a hedge (``is_hedge``): ``"either $1200 or $1500"`` is wrong for gold
    ``"$1500"`` with confounder ``"$1200"``.
    """
    return mentions(pred, gold, ignore_inside=confounder) and not is_hedge(pred, gold, confounder)


# --------------------------------------------------------------------------------------------------
# BranchMemEval error categories

#: Values ``error_category`` returns, "correct" first, then "hedge" (the decision order's first two).
ERROR_CATEGORIES: tuple[str, ...] = ("correct", "hedge", "retrieval_failure", "trajectory_confusion", "other")


def _context_lines(context: str | Context) -> list[str]:
    """The lines of the answer-time evidence: a string as given, a ``Context`` without its header."""
    if isinstance(context, str):
        text = context
    else:
        text = "\n\n".join(block.render() for block in context.blocks if block.lines)
    return text.splitlines()


def _context_position(lines: list[str], value: Any, ignore_inside: Any) -> tuple[int, int] | None:
    """(line index, offset) of the first occurrence of ``value`` in the context, or ``None``."""
    norm_value = normalize_answer(value)
    if not norm_value:
        return None
    norm_other = normalize_answer(ignore_inside)
    for i, line in enumerate(lines):
        offset = _first_match(normalize_answer(line), norm_value, norm_other)
        if offset is not None:
            return i, offset
    return None


def context_flags(context: str | Context, gold: Any, confounder: Any) -> dict[str, bool]:
    """Whether the gold answer and the confounder occur in the answer-time context.

    Args:
        context: the context text, or a ``Context`` (its blocks are searched, not its header).
        gold: the gold answer.
        confounder: the confounder (``None`` when the question has none: never in the context).

    Returns:
        ``{"gold_in_context": bool, "confounder_in_context": bool}``. Matching is ``mentions``'s,
        per line; an occurrence of one value inside an occurrence of the other does not count.
    """
    lines = _context_lines(context)
    return {
        "gold_in_context": _context_position(lines, gold, confounder) is not None,
        "confounder_in_context": _context_position(lines, confounder, gold) is not None,
    }


def error_category(pred: Any, gold: Any, confounder: Any, context: str | Context) -> str:
    """Classify one BranchMemEval answer: ``"correct"`` or one of four error categories.

    Decision order (the first rule that applies wins):

    1. ``"correct"``: ``answer_correct(pred, gold, confounder)``.
    2. ``"hedge"``: the prediction states the gold, but together with the confounder or other
       candidate values (``mentions(pred, gold, ignore_inside=confounder)`` and ``is_hedge``).
    3. ``"trajectory_confusion"``: the prediction mentions the confounder (the confounder answered;
       a mention inside a mention of the gold does not count).
    4. ``"retrieval_failure"``: the gold does not occur in the context (the evidence never reached
       the answer model).
    5. ``"trajectory_confusion"``: the confounder occurs in the context *before* the gold, i.e. at
       an earlier (line, offset) position; blocks are rendered in priority order, so the
       confounder was presented with higher priority than the gold (present and preferred).
    6. ``"other"``: the gold was in the context with priority and the answer still missed it
       (reading, reasoning or abstention error).

    Args:
        pred: the model's answer.
        gold: the gold answer.
        confounder: the parallel trajectory's answer to the same question, or ``None``.
        context: the answer-time context text, or a ``Context`` (blocks only, header excluded).

    Returns:
        One of ``ERROR_CATEGORIES``.
    """
    if mentions(pred, gold, ignore_inside=confounder):
        return "hedge" if is_hedge(pred, gold, confounder) else "correct"
    if mentions(pred, confounder, ignore_inside=gold):
        return "trajectory_confusion"
    lines = _context_lines(context)
    gold_pos = _context_position(lines, gold, confounder)
    if gold_pos is None:
        return "retrieval_failure"
    conf_pos = _context_position(lines, confounder, gold)
    if conf_pos is not None and conf_pos < gold_pos:
        return "trajectory_confusion"
    return "other"


# --------------------------------------------------------------------------------------------------
# aggregation


def _record_value(record: Mapping[str, Any], index: int) -> float:
    if "score" in record and record["score"] is not None:
        return float(record["score"])
    if "correct" in record and record["correct"] is not None:
        return float(bool(record["correct"]))
    raise ValueError(f"record {index} has neither 'score' nor 'correct': {dict(record)!r}")


def _summary(values: list[float], errors: list[str]) -> dict[str, Any]:
    return {
        "n": len(values),
        "accuracy": sum(values) / len(values) if values else None,
        "errors": dict(sorted(Counter(errors).items())),
    }


def _sorted_groups(groups: dict[Any, Any]) -> list[Any]:
    try:
        return sorted(groups)
    except TypeError:  # mixed types: order by their text
        return sorted(groups, key=repr)


def aggregate(records: list[dict], keys: list[str]) -> dict[str, Any]:
    """Overall and per-group accuracy of per-question records, with error-category counts.

    Args:
        records: one dict per question with ``"score"`` (a float, e.g. a LoCoMo F1) or ``"correct"``
            (a bool); ``"score"`` wins when both are present. An optional ``"error"`` field (an
            ``error_category`` result) is counted. Grouping fields are read by ``keys``.
        keys: the fields to group by (e.g. ``["dimension", "question_type"]`` or ``["category"]``).
            A record without a key (or with ``None`` there) is left out of that key's groups only.

    Returns:
        ``{"n", "accuracy", "errors", "by"}``: ``accuracy`` is the mean score (``None`` for no
        records); ``errors`` maps each ``"error"`` value to its count; ``by[key]`` is
        ``{"groups": {value: {"n", "accuracy", "errors"}}, "macro_accuracy"}`` with groups in sorted
        order and ``macro_accuracy`` the unweighted mean of the group accuracies (``None`` when there
        are no groups).

    Raises:
        ValueError: for a record with neither ``"score"`` nor ``"correct"``.
    """
    values = [_record_value(r, i) for i, r in enumerate(records)]
    errors = [r["error"] for r in records if r.get("error") is not None]
    result = _summary(values, errors)
    by: dict[str, Any] = {}
    for key in keys:
        grouped: dict[Any, tuple[list[float], list[str]]] = {}
        for record, value in zip(records, values):
            group = record.get(key)
            if group is None:
                continue
            g_values, g_errors = grouped.setdefault(group, ([], []))
            g_values.append(value)
            if record.get("error") is not None:
                g_errors.append(record["error"])
        groups = {g: _summary(*grouped[g]) for g in _sorted_groups(grouped)}
        accs = [s["accuracy"] for s in groups.values()]
        by[key] = {"groups": groups, "macro_accuracy": sum(accs) / len(accs) if accs else None}
    result["by"] = by
    return result


def kendall_tau_order(prediction: str, reference: list[str]) -> float:
    """BEAM event ordering, judge-free: the order in which the reference items appear in the prediction,
    compared with the reference order by Kendall's tau, normalised to [0, 1] (1 = same order). Items the
    prediction never mentions are placed after all mentioned ones, in reference order."""
    low = (prediction or "").lower()
    n = len(reference)
    if n < 2:
        return 1.0
    pos = []
    for i, item in enumerate(reference):
        k = low.find(str(item).lower())
        pos.append((k if k >= 0 else len(low) + i))
    concordant = discordant = 0
    for i in range(n):
        for j in range(i + 1, n):
            if pos[i] < pos[j]:
                concordant += 1
            elif pos[i] > pos[j]:
                discordant += 1
    tau = (concordant - discordant) / (n * (n - 1) / 2)
    return (tau + 1) / 2
