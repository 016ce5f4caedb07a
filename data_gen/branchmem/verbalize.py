"""Optional verbalizer: rewrite non-question turns through an LLM, keeping the plan intact.

A rewrite is rejected (the canonical turn is kept) when it
- drops or alters a planned value: every slot value, owner name, artifact item and event amount that
  the canonical turn states must appear verbatim;
- leaks an answer: it contains a gold answer or confounder of the session's questions that the
  canonical turn did not contain;
- is empty, multi-paragraph, or more than `max_ratio` times longer than the canonical turn.
Question turns and canonical responses are never rewritten.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from .realize import Turn

PROMPT = ("Rewrite this message from a user to an assistant so it sounds natural and casual. Keep every "
          "name, number, amount, date and list item exactly as written, in the same order. Do not add "
          "facts. Reply with the rewritten message only.\n\nMessage: {text}")


def required_strings(t: Turn) -> list[str]:
    ex = t.extraction
    req = [s["value"] for s in ex["states"]] + list(ex["entities"])
    for a in ex["artifacts"]:
        req += a["items"]
    for e in ex["events"]:
        if e["quantity"] is not None:
            req.append(f"{e['quantity']:g}" if e["unit"] != "$" else f"${e['quantity']:,.0f}")
    return [r for r in dict.fromkeys(req) if r and r in t.user]


@dataclass
class VerbalizeReport:
    attempted: int = 0
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)

    def to_json(self) -> dict:
        return {"attempted": self.attempted, "accepted": self.accepted, "rejected": dict(self.rejected)}


class Verbalizer:
    def __init__(self, llm, max_new_tokens: int = 96, max_ratio: float = 2.5):
        self.llm, self.max_new_tokens, self.max_ratio = llm, max_new_tokens, max_ratio

    def check(self, original: Turn, rewrite: str, answers: list[str]) -> str | None:
        """The reason to reject a rewrite, or None to accept it."""
        text = (rewrite or "").strip().strip('"')
        if not text or "\n\n" in text or len(text) > self.max_ratio * len(original.user):
            return "shape"
        for r in required_strings(original):
            if r not in text:
                return "dropped_or_altered_value"
        for a in answers:
            if a and a not in original.user and re.search(r"(?<![\w$])" + re.escape(a) + r"(?!\w)", text):
                return "leak"
        return None

    def rewrite(self, turns: list[Turn], report: VerbalizeReport) -> list[Turn]:
        answers = [v for t in turns if t.is_question for v in (t.question["gold"], t.question["confounder"]) if v]
        todo = [t for t in turns if not t.is_question and t.move != "distractor"]
        outs = self.llm.chat([[{"role": "user", "content": PROMPT.format(text=t.user)}] for t in todo],
                             max_new_tokens=self.max_new_tokens)
        for t, out in zip(todo, outs):
            report.attempted += 1
            reason = self.check(t, out, answers)
            if reason is None:
                t.user = out.strip().strip('"')
                for st in t.extraction["states"]:
                    st["evidence"] = t.user[:179]
                report.accepted += 1
            else:
                report.rejected[reason] += 1
        return turns
