"""Versioned prompt templates shared by the runtime's prompted components, training, and bundles.

A bundle's manifest records ``prompt_template: {name, version}``; the runtime refuses a bundle whose
template version it does not know, so a tuned model is always fed the layout it was trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PROMPT_VERSION = "1"

RERANK_INSTRUCTION = (
    "Given a new turn of a long conversation, judge whether it continues the interaction state in the "
    "Document: the same trajectory, about the same people, plan and topic (not merely a similar one)."
)
RERANK_SYSTEM = (
    'Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
    'Note that the answer can only be "yes" or "no".'
)

EXTRACT_SYSTEM = "You extract memory records from one conversation turn. Output strict JSON only."

EXTRACT_INSTRUCTIONS = {
    "states": (
        "List the mutable states this turn sets or changes, as a JSON list of at most 6 objects with keys "
        '"key" (stable lower_snake_case, e.g. home_city, hometown, pet_name, hobby, workplace, budget), '
        '"value" (short exact value; implied mentions count), "tag" (attribute tag), "entities" (list) and '
        '"evidence" (short snippet). Every string under 180 characters. Output [] when nothing applies. '
        "No markdown fences, no trailing commas."
    ),
    "facts": (
        'List the atomic facts stated in this turn as a JSON list of objects with "text", "entities" (list) '
        'and "tags" (list). Output [] when there are none.'
    ),
    "entities": "List the named entities, amounts and dates in this turn as a JSON list of strings.",
    "artifacts": (
        'List ordered lists defined in this turn (itineraries, agendas, playlists) as a JSON list of objects '
        'with "name", "subject", "items" (in order) and "entities". Output [] when there are none.'
    ),
    "events": (
        'List events reported in this turn as a JSON list of objects with "subject", "action", "category", '
        '"quantity" (number or null), "unit", "date" and "text". Output [] when there are none.'
    ),
    "summary": "Summarise this turn in one short sentence.",
}

# The reader (answer model): the method's evidence-priority rules. Trained readers (task=reader) learn this
# layout; the bundle records READER_TEMPLATE and the harness feeds every answer model the same messages.
ANSWER_SYSTEM = ("Answer the question from the memory context. Computed values and UpdateEvidence come first; "
                 "for 'previous' questions give the old value, otherwise the current one. Reply with the answer only.")
UNKNOWN_ANSWER = "unknown"  # a tuned reader's target where the context lacks the gold answer

TAG_INSTRUCTION = "Which attribute tags from this list does the text ask about or state? Tags: {tags}. Answer with a JSON list."


@dataclass(frozen=True)
class TemplateInfo:
    name: str
    version: str

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version}


RERANK_TEMPLATE = TemplateInfo("qwen3_reranker_layout", PROMPT_VERSION)
EXTRACT_TEMPLATE = TemplateInfo("arbormem_commit_extract", PROMPT_VERSION)
TAG_TEMPLATE = TemplateInfo("arbormem_attribute_tags", PROMPT_VERSION)
READER_TEMPLATE = TemplateInfo("arbormem_answer", PROMPT_VERSION)
KNOWN_TEMPLATES = {t.name: t.version for t in (RERANK_TEMPLATE, EXTRACT_TEMPLATE, TAG_TEMPLATE, READER_TEMPLATE)}
KNOWN_TEMPLATES["cross_encoder_pair"] = PROMPT_VERSION
KNOWN_TEMPLATES["encoder_multilabel"] = PROMPT_VERSION
KNOWN_TEMPLATES["encoder_spans"] = PROMPT_VERSION  # the span extractor reads the turn as text pairs, no prompt


def rerank_messages(query: str, document: str, instruction: str = RERANK_INSTRUCTION) -> list[dict]:
    """Qwen3-Reranker layout: system judge prompt, then <Instruct>/<Query>/<Document> in the user turn."""
    return [
        {"role": "system", "content": RERANK_SYSTEM},
        {"role": "user", "content": f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"},
    ]


def rerank_prompt(tokenizer, query: str, document: str) -> str:
    """Render the reranker prompt so that the next token is the yes/no answer."""
    text = tokenizer.apply_chat_template(
        rerank_messages(query, document), tokenize=False, add_generation_prompt=True
    )
    if "<think>" in (getattr(tokenizer, "chat_template", "") or ""):
        text += "<think>\n\n</think>\n\n"  # Qwen3: answer without thinking
    return text


def cross_encoder_pair(query: str, document: str) -> tuple[str, str]:
    return query, document


def render_turn(user_text: str, assistant_text: str = "", timestamp: str | None = None) -> str:
    """One turn as every extraction prompt shows it: `[timestamp]`, then `User: ...`, then `Assistant: ...`."""
    turn = f"User: {user_text}"
    if assistant_text:
        turn += f"\nAssistant: {assistant_text}"
    if timestamp:
        turn = f"[{timestamp}]\n" + turn
    return turn


def extract_messages(kind: str, user_text: str, assistant_text: str = "", timestamp: str | None = None) -> list[dict]:
    """The kind-conditioned layout: one prompt (and one generation) per kind per turn."""
    return [
        {"role": "system", "content": EXTRACT_SYSTEM},
        {"role": "user", "content": f"{EXTRACT_INSTRUCTIONS[kind]}\n\nTurn:\n{render_turn(user_text, assistant_text, timestamp)}"},
    ]


def extract_all_messages(kinds: list[str], user_text: str, assistant_text: str = "", timestamp: str | None = None) -> list[dict]:
    """The one-generation layout: one prompt holding every kind's instruction, answered as one JSON object."""
    rules = "\n".join(f"- {k}: {EXTRACT_INSTRUCTIONS[k]}" for k in kinds)
    return [
        {"role": "system", "content": EXTRACT_SYSTEM},
        {"role": "user", "content": f"Output one JSON object with these keys:\n{rules}\n\n"
                                    f"Turn:\n{render_turn(user_text, assistant_text, timestamp)}"},
    ]


def extract_target(kind: str, value) -> str:
    """Canonical completion text for a supervision target (compact, key order preserved)."""
    if kind == "summary":
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def extract_all_target(targets: dict) -> str:
    """Canonical completion of the one-generation layout: one JSON object, the kinds in the prompt's order."""
    return json.dumps(targets, ensure_ascii=False, separators=(", ", ": "))


def tag_messages(text: str, tags: list[str]) -> list[dict]:
    return [
        {"role": "system", "content": EXTRACT_SYSTEM},
        {"role": "user", "content": TAG_INSTRUCTION.format(tags=", ".join(tags)) + f"\n\nText: {text}"},
    ]


def answer_messages(context: str, question: str) -> list[dict]:
    """The reader's prompt: evidence-priority system rules, then the memory context and the question."""
    return [{"role": "system", "content": ANSWER_SYSTEM},
            {"role": "user", "content": f"{context}\n\nQuestion: {question}\nAnswer:"}]
