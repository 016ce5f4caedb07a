"""The written schema of every supervision set, in one place (Hugging Face `datasets.Features`).

Generators build rows to these features; loaders (training, evaluation) call `validate_rows` or
`check_dataset` so a set written by an older or foreign tool fails with the set, row and field named.
The LoCoMo converter writes the same sets (its `turn` is the turn's position in the conversation).
"""

from __future__ import annotations

from typing import Any

from datasets import Features, Sequence, Value

from arbor_train.errors import InputError, unencodable

CANDIDATE = {
    "turn": Value("int32"),            # turn index of the candidate state in its session
    "topic_key": Value("string"),
    "path_summary": Value("string"),
    "node_summary": Value("string"),
    "entities": Sequence(Value("string")),
    "channels": Value("string"),       # JSON: recall channel -> score (semantic, keyword, topic, recency, fused)
    "runtime_score": Value("float32"),
    "recalled": Value("bool"),         # False: the gold state, added because recall missed it
    # group chats (null elsewhere): who wrote the candidate, messages back (1 = latest), minutes since it
    "speaker": Value("string"),
    "back": Value("int32"),
    "minutes": Value("int32"),
    # the state's own turn and time (a question's document: Candidate.question_document)
    "state_text": Value("string"),
    "state_time": Value("string"),
    # distilled rows (data_gen.distill): the teacher's own score of the candidate (its soft target)
    "teacher_score": Value("float32"),
}
# candidate fields a row may leave out or null (sets written before group chats read as one-user rows)
# (and questions may leave out their specificity: sets written before levels existed are all explicit;
# only multi-intent turns, their questions and routing rows carry the secondary fields)
OPTIONAL = {"speaker", "back", "minutes", "state_text", "state_time", "specificity", "gold_secondary", "secondary_branch",
            "secondary_states", "teacher_score", "teacher_new_root"}
_BASE = {"session_id": Value("string"), "turn": Value("int32"), "input": Value("string"),
         "timestamp": Value("string")}

SCHEMAS: dict[str, Features] = {
    "sessions": Features({
        "session_id": Value("string"), "seed": Value("int64"), "n_branches": Value("int32"),
        "turns": [{"index": Value("int32"), "user": Value("string"), "assistant": Value("string"),
                   "timestamp": Value("string"), "branch": Value("int32"), "move": Value("string"),
                   "is_question": Value("bool"), "gold_parent": Value("int32"),
                   "gold_secondary": Value("int32")}],  # a multi-intent turn: the other branch's latest turn
        "questions": [{"turn": Value("int32"), "type": Value("string"), "dimension": Value("string"),
                       "gold": Value("string"), "confounder": Value("string"), "branch": Value("int32"),
                       "confounder_branch": Value("int32"), "specificity": Value("string"),
                       "secondary_branch": Value("int32")}],  # linked_fact: the branch stating the value
        "plan": Value("string"),       # JSON of the full plan (branches, slots, moves)
    }),
    # label_rule: "plan" for generated sets; the weak-label rule that produced gold_parent for LoCoMo
    # gold_states: every earlier state of the gold trajectory (attaching to any of them resumes it, the
    # runtime attaches at the tip); empty for a new root
    "routing": Features({**_BASE, "candidates": [CANDIDATE], "gold_parent": Value("int32"),  # -1 = new root
                         "gold_states": Sequence(Value("int32")),
                         # multi-intent turns: the secondary gold (the other branch's latest turn) and its branch's states
                         "gold_secondary": Value("int32"), "secondary_states": Sequence(Value("int32")),
                         "runtime_choice": Value("int32"), "route": Value("string"), "gold_recalled": Value("bool"),
                         "label_rule": Value("string"),
                         # distilled rows: the teacher's new-root threshold (the score of the new-root option)
                         "teacher_new_root": Value("float32")}),
    "localization": Features({**_BASE, "candidates": [CANDIDATE], "gold_states": Sequence(Value("int32")),
                              "gold_tip": Value("int32"), "runtime_choice": Value("int32"),
                              "question_type": Value("string"), "dimension": Value("string"),
                              "gold": Value("string"), "confounder": Value("string"),
                              "confounder_states": Sequence(Value("int32"))}),
    # target: JSON object {"states": [...], "facts": [...], "entities": [...], "artifacts": [...], "events": [...]}
    # in the shapes of arbor_train.runtime.validate (states: key, value, tag, entities, evidence; <= 6 slots)
    "extraction": Features({**_BASE, "assistant": Value("string"), "target": Value("string"),
                            "summary": Value("string")}),
    "tags": Features({**_BASE, "source": Value("string"), "tags": Sequence(Value("string"))}),
    "summaries": Features({**_BASE, "assistant": Value("string"), "summary": Value("string")}),
    # LoCoMo: per-speaker events of a session with their date (event_summary)
    "events": Features({"session_id": Value("string"), "speaker": Value("string"), "event": Value("string"),
                        "date": Value("string")}),
    # reader supervision (python -m data_gen.reader): a question, the context the runtime assembled for it
    # under one read setting (budget, ablation), and the target: the gold where the context holds it, else
    # "unknown". session_fingerprint identifies the session by content (data_gen.reader.session_fingerprint)
    "reader": Features({**_BASE, "context": Value("string"), "answer": Value("string"), "gold": Value("string"),
                        "confounder": Value("string"), "question_type": Value("string"),
                        "dimension": Value("string"), "budget": Value("int32"), "ablation": Value("string"),
                        "gold_in_context": Value("bool"), "confounder_in_context": Value("bool"),
                        "session_fingerprint": Value("string")}),
    # an evaluation split (LoCoMo QA): category as the data defines it, evidence as turn ids
    "qa": Features({"conversation_id": Value("string"), "question_id": Value("string"), "question": Value("string"),
                    "answer": Value("string"), "category": Value("string"), "evidence": Sequence(Value("string")),
                    "adversarial_answer": Value("string")}),
    # conversations in the common benchmark schema (arbor_train/conversations/schema.py), one JSON document each
    "conversations": Features({"conversation_id": Value("string"), "document": Value("string")}),
}


class SchemaError(InputError):
    """A row that does not fit its set's schema: the message names the set, the row and the field."""


# set -> the field whose value identifies a row (unique within a set); nested lists whose key must be
# unique within one row: (list field, key field)
ROW_IDS = {"sessions": "session_id", "qa": "question_id", "conversations": "conversation_id"}
NESTED_IDS = {"sessions": [("turns", "index"), ("questions", "turn")]}


def _check(value: Any, feat: Any, where: str) -> None:
    if isinstance(feat, dict):
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected an object")
        missing = set(feat) - set(value) - OPTIONAL
        extra = set(value) - set(feat)
        if missing or extra:
            raise SchemaError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}")
        for k, f in feat.items():
            if k in value and not (k in OPTIONAL and value[k] is None):
                _check(value[k], f, f"{where}.{k}")
    elif isinstance(feat, list):
        if not isinstance(value, list):
            raise SchemaError(f"{where}: expected a list")
        for i, v in enumerate(value):
            _check(v, feat[0], f"{where}[{i}]")
    elif isinstance(feat, Sequence):
        if not isinstance(value, list):
            raise SchemaError(f"{where}: expected a list")
        for i, v in enumerate(value):
            _check(v, feat.feature, f"{where}[{i}]")
    elif isinstance(feat, Value):
        if value is None:
            if feat.dtype in ("string", "int32", "int64") and where.endswith(
                    ("timestamp", "confounder", "gold_tip", "date", "answer", "adversarial_answer")):
                return
            raise SchemaError(f"{where}: null is not allowed")
        ok = {"string": str, "bool": bool, "int32": int, "int64": int, "float32": (int, float)}[feat.dtype]
        if not isinstance(value, ok) or (ok is not bool and isinstance(value, bool)):
            raise SchemaError(f"{where}: expected {feat.dtype}, got {type(value).__name__}")
        if ok is str and (e := unencodable(value)) is not None:
            raise SchemaError(f"{where}: not valid UTF-8 text ({e.reason} at character {e.start})")


def validate_row(name: str, row: Any, where: str) -> None:
    """One row against the named schema (types, nulls, UTF-8 text, ids unique within the row); `where`
    names the row in errors."""
    if name not in SCHEMAS:
        raise SchemaError(f"unknown supervision set {name!r}; known: {sorted(SCHEMAS)}")
    _check(row, dict(SCHEMAS[name]), where)
    for field, key in NESTED_IDS.get(name, []):
        first: dict = {}
        for j, item in enumerate(row[field]):
            if item[key] in first:
                raise SchemaError(f"{where}.{field}: duplicate {key} {item[key]!r} at {field}[{first[item[key]]}] "
                                  f"and {field}[{j}]")
            first[item[key]] = j


def validate_rows(name: str, rows: list[dict], source: str = "") -> None:
    """Check rows against the named schema; the error names the set, the row and the field."""
    if name not in SCHEMAS:
        raise SchemaError(f"unknown supervision set {name!r}; known: {sorted(SCHEMAS)}")
    seen: dict = {}
    for i, row in enumerate(rows):
        validate_row(name, row, f"{source}{name}[{i}]")
        if name in ROW_IDS:
            rid = row[ROW_IDS[name]]
            if rid in seen:
                raise SchemaError(f"{source}{name}: duplicate {ROW_IDS[name]} {rid!r} at rows {seen[rid]} and {i}")
            seen[rid] = i


def _without_optional(feats) -> dict:
    """A schema with the optional candidate fields left out (how sets written before them look)."""
    def strip(f):
        if isinstance(f, dict):
            return {k: strip(v) for k, v in f.items() if k not in OPTIONAL}
        if isinstance(f, list):
            return [strip(x) for x in f]
        if isinstance(f, Sequence) and isinstance(f.feature, dict):  # a list of records (datasets' List)
            return ("list", strip(f.feature))
        return f
    return strip(dict(feats))


def check_dataset(name: str, ds) -> None:
    """A loaded datasets.Dataset has exactly the schema of its set."""
    if name not in SCHEMAS:
        raise SchemaError(f"unknown supervision set {name!r}; known: {sorted(SCHEMAS)}")
    if ds.features != SCHEMAS[name] and _without_optional(ds.features) != _without_optional(SCHEMAS[name]):
        want, got = set(SCHEMAS[name]), set(ds.features)
        raise SchemaError(f"set {name!r}: features differ from the schema (missing {sorted(want - got)}, "
                          f"unknown {sorted(got - want)}, or a field's type changed)")
