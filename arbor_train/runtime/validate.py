"""Strict validation of extractor output: the only gate between a model and the evidence store.

The paper's mutable-state contract: strict JSON (no markdown fences, no trailing commas), a list of at
most 6 slots, `[]` when nothing applies; each slot has a stable lower_snake_case key, a short exact
value, an attribute tag, entities and an evidence snippet; every string under 180 characters.

Policy (each case logs a warning and is counted in `ValidationReport`):
- markdown fences, trailing commas          -> repaired
- invalid JSON after repair, wrong top type -> rejected (nothing stored)
- unknown fields                            -> dropped from the slot
- key not lower_snake_case                  -> normalised when that is unambiguous, else slot rejected
- missing key/value, over-long string        -> that slot rejected
- more than 6 slots                         -> first 6 kept
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from .text import snake_case

log = logging.getLogger(__name__)

MAX_SLOTS = 6
MAX_CHARS = 180
SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")

STATE_FIELDS = {"key": str, "value": str, "tag": str, "entities": list, "evidence": str}
FACT_FIELDS = {"text": str, "entities": list, "tags": list}
ARTIFACT_FIELDS = {"name": str, "subject": str, "items": list, "entities": list}
EVENT_FIELDS = {
    "subject": str, "action": str, "category": str, "quantity": (int, float, type(None)),
    "unit": (str, type(None)), "date": (str, type(None)), "text": str, "entities": list,
}
REQUIRED = {
    "states": ("key", "value"),
    "facts": ("text",),
    "artifacts": ("name", "items"),
    "events": ("action", "text"),
}
FIELDS = {"states": STATE_FIELDS, "facts": FACT_FIELDS, "artifacts": ARTIFACT_FIELDS, "events": EVENT_FIELDS}
MAX_ITEMS = {"states": MAX_SLOTS, "facts": 12, "artifacts": 4, "events": 8}


class ExtractionRejected(ValueError):
    """Raised when model output cannot be repaired into the schema."""


@dataclass
class ValidationReport:
    repaired: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def warn(self, kind: str, msg: str, rejected: bool = False) -> None:
        (self.rejected if rejected else self.repaired).append(f"{kind}: {msg}")
        log.warning("extractor output %s (%s): %s", "rejected" if rejected else "repaired", kind, msg)

    @property
    def clean(self) -> bool:
        return not self.repaired and not self.rejected


_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n?(.*?)\n?\s*```\s*$", re.S)
_TRAILING_COMMA = re.compile(r",\s*([\]}])")


def parse_json_output(text: str | Any, kind: str, report: ValidationReport) -> Any:
    """Parse model text as JSON, repairing fences and trailing commas. Non-strings pass through."""
    if not isinstance(text, str):
        return text
    s = text.strip()
    m = _FENCE.match(s)
    if m:
        s = m.group(1).strip()
        report.warn(kind, "markdown fence removed")
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        pass
    fixed = _TRAILING_COMMA.sub(r"\1", s)
    if fixed != s:
        try:
            out = json.loads(fixed)
            report.warn(kind, "trailing comma removed")
            return out
        except json.JSONDecodeError:
            pass
    # a model that writes prose around one JSON array/object: take the outermost bracketed span
    for open_, close in (("[", "]"), ("{", "}")):
        i, j = s.find(open_), s.rfind(close)
        if 0 <= i < j and (i > 0 or j < len(s) - 1):
            try:
                out = json.loads(_TRAILING_COMMA.sub(r"\1", s[i : j + 1]))
                report.warn(kind, "text around the JSON removed")
                return out
            except json.JSONDecodeError:
                continue
    report.warn(kind, f"invalid JSON: {text[:80]!r}", rejected=True)
    raise ExtractionRejected(f"{kind}: invalid JSON")


def _check_str(value: Any, where: str, kind: str, report: ValidationReport) -> str | None:
    if not isinstance(value, str):
        report.warn(kind, f"{where} is not a string", rejected=True)
        return None
    if len(value) >= MAX_CHARS:
        report.warn(kind, f"{where} has {len(value)} characters (limit {MAX_CHARS - 1})", rejected=True)
        return None
    return value.strip()


def validate_items(raw: Any, kind: str, report: ValidationReport | None = None) -> list[dict[str, Any]]:
    """Validate a list of items of one kind (states, facts, artifacts, events)."""
    report = report if report is not None else ValidationReport()
    fields = FIELDS[kind]
    try:
        data = parse_json_output(raw, kind, report)
    except ExtractionRejected:
        return []
    if isinstance(data, dict) and kind in data and isinstance(data[kind], list):
        report.warn(kind, f"wrapped in an object under {kind!r}; unwrapped")
        data = data[kind]
    if not isinstance(data, list):
        report.warn(kind, f"top level is {type(data).__name__}, not a list", rejected=True)
        return []
    limit = MAX_ITEMS[kind]
    if len(data) > limit:
        report.warn(kind, f"{len(data)} items, only the first {limit} kept")
        data = data[:limit]
    out: list[dict[str, Any]] = []
    for n, item in enumerate(data):
        item_out = _validate_item(item, n, kind, fields, report)
        if item_out is not None:
            out.append(item_out)
    return out


def _validate_item(item: Any, n: int, kind: str, fields: dict, report: ValidationReport) -> dict | None:
    if not isinstance(item, dict):
        report.warn(kind, f"item {n} is {type(item).__name__}, not an object", rejected=True)
        return None
    unknown = sorted(set(item) - set(fields))
    if unknown:
        report.warn(kind, f"item {n}: unknown fields {unknown} dropped")
    for req in REQUIRED[kind]:
        if item.get(req) in (None, "", []):
            report.warn(kind, f"item {n}: missing {req!r}", rejected=True)
            return None
    clean: dict[str, Any] = {}
    for name, typ in fields.items():
        if name not in item:
            continue
        v = item[name]
        if isinstance(typ, tuple) and float in typ and isinstance(v, str):
            try:
                v = float(v.replace(",", "").lstrip("$€£"))
            except ValueError:
                report.warn(kind, f"item {n}: {name} {v!r} is not a number", rejected=True)
                return None
        if typ is list:
            if not isinstance(v, list):
                report.warn(kind, f"item {n}: {name} is not a list", rejected=True)
                return None
            vals = []
            for j, e in enumerate(v):
                s = _check_str(e if isinstance(e, str) else str(e), f"item {n} {name}[{j}]", kind, report)
                if s is None:
                    return None
                vals.append(s)
            clean[name] = vals
        elif typ is str:
            s = _check_str(v if not isinstance(v, (int, float)) else str(v), f"item {n} {name}", kind, report)
            if s is None:
                return None
            clean[name] = s
        else:
            if not isinstance(v, typ):
                report.warn(kind, f"item {n}: {name} has type {type(v).__name__}", rejected=True)
                return None
            clean[name] = v
    if kind == "states":
        key = clean["key"]
        if not SNAKE.match(key):
            fixed = snake_case(key)
            if not SNAKE.match(fixed):
                report.warn(kind, f"item {n}: key {key!r} is not lower_snake_case", rejected=True)
                return None
            report.warn(kind, f"item {n}: key {key!r} normalised to {fixed!r}")
            clean["key"] = fixed
        clean.setdefault("tag", "")
        clean.setdefault("entities", [])
        clean.setdefault("evidence", "")
    else:
        clean.setdefault("entities", [])
        if kind == "facts":
            clean.setdefault("tags", [])
        if kind == "artifacts":
            clean.setdefault("subject", "")
        if kind == "events":
            for k in ("subject", "category", "text"):
                clean.setdefault(k, "")
            for k in ("quantity", "unit", "date"):
                clean.setdefault(k, None)
            if clean["quantity"] is not None:
                clean["quantity"] = float(clean["quantity"])
    return clean


def validate_strings(raw: Any, kind: str, report: ValidationReport, limit: int = 16) -> list[str]:
    """Validate a JSON list of short strings (entities, keywords, tags)."""
    try:
        data = parse_json_output(raw, kind, report)
    except ExtractionRejected:
        return []
    if not isinstance(data, list):
        report.warn(kind, "top level is not a list", rejected=True)
        return []
    out = []
    for j, e in enumerate(data[:limit]):
        s = _check_str(e if isinstance(e, str) else str(e), f"{kind}[{j}]", kind, report)
        if s:
            out.append(s)
    return out


def validate_kind(raw: Any, kind: str, report: ValidationReport) -> list:
    """One list kind's raw output as the store receives it: `entities` as short strings, the others as items."""
    return validate_strings(raw, kind, report) if kind == "entities" else validate_items(raw, kind, report)
