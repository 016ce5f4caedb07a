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
      ``arbor_train.metrics.token_f1``);
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

BranchMemEval (``normalize_answer``, ``mentions``, ``answer_correct``)
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

    ``answer_correct(pred, gold)`` is ``mentions(pred, gold)``: a prediction that states the gold
    answer is correct, whatever else it says.

BranchMemEval error categories (``context_flags``, ``error_category``)
    See ``error_category`` for the decision order. "Context" is the answer-time evidence the answer
    model read: either its text, or a ``arbor_train.runtime.context.Context`` object, in which case
    only the rendered blocks are searched (its header holds the current time, not evidence). The
    context is searched line by line (a value never matches across a line break); a value's
    *position* is (line index, offset in the normalized line) of its first occurrence. Blocks are
    rendered in priority order (computed answers, update evidence, primary path, facts, states,
    structured blocks, supplemental turns), so an earlier position is read first, with higher
    priority.

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

from arbor_train.metrics import multiset_counts

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
    "locomo_f1",
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


def _locomo_multi_f1(pred: str, gold: str) -> float:
    """LoCoMo's ``f1`` (category 1): mean over gold parts of the best F1 against prediction parts."""
    pred_parts = [p.strip() for p in pred.split(",")]
    gold_parts = [g.strip() for g in gold.split(",")]
    return sum(max(locomo_f1(p, g) for p in pred_parts) for g in gold_parts) / len(gold_parts)


def _says_abstain(pred: str, phrases: Iterable[str]) -> bool:
    low = pred.lower()
    return any(phrase.lower() in low for phrase in phrases)


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
    gold_text = _text(gold)
    if category == 3:
        return locomo_f1(pred_text, gold_text.split(";")[0].strip())
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


def answer_correct(pred: Any, gold: Any, confounder: Any = None) -> bool:
    """BranchMemEval rule-based correctness: the normalized gold occurs in the normalized prediction.

    Whole-token matching as in ``mentions``. With ``confounder`` given, a gold occurrence that is
    only part of a mention of the confounder does not count (gold ``"Maria"``, confounder
    ``"Maria Lopez"``, prediction ``"Maria Lopez"`` is wrong).
    """
    return mentions(pred, gold, ignore_inside=confounder)


# --------------------------------------------------------------------------------------------------
# BranchMemEval error categories

#: Values ``error_category`` returns, "correct" first.
ERROR_CATEGORIES: tuple[str, ...] = ("correct", "retrieval_failure", "trajectory_confusion", "other")


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
    """Classify one BranchMemEval answer: ``"correct"`` or one of three error categories.

    Decision order (the first rule that applies wins):

    1. ``"correct"``: ``answer_correct(pred, gold, confounder)``.
    2. ``"trajectory_confusion"``: the prediction mentions the confounder (the confounder answered;
       a mention inside a mention of the gold does not count).
    3. ``"retrieval_failure"``: the gold does not occur in the context (the evidence never reached
       the answer model).
    4. ``"trajectory_confusion"``: the confounder occurs in the context *before* the gold, i.e. at
       an earlier (line, offset) position; blocks are rendered in priority order, so the
       confounder was presented with higher priority than the gold (present and preferred).
    5. ``"other"``: the gold was in the context with priority and the answer still missed it
       (reading, reasoning or abstention error).

    Args:
        pred: the model's answer.
        gold: the gold answer.
        confounder: the parallel trajectory's answer to the same question, or ``None``.
        context: the answer-time context text, or a ``Context`` (blocks only, header excluded).

    Returns:
        One of ``ERROR_CATEGORIES``.
    """
    if answer_correct(pred, gold, confounder):
        return "correct"
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
