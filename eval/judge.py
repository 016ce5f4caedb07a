"""A pluggable LLM judge (any backend of arbor_train.runtime.llm: local HF or OpenAI-compatible).

LongMemEval's judging rules (benchmarks.md): a yes/no verdict per question with a type-specific
instruction: temporal questions tolerate off-by-one day counts; knowledge-update answers may mention
the old value if they give the new one; preference questions are judged against the rubric;
abstention questions are correct when the model says it cannot know.
"""

from __future__ import annotations

TYPE_RULES = {
    "temporal-reasoning": "Do not penalize off-by-one errors in the number of days, weeks or months.",
    "knowledge-update": "If the response contains some previous information along with the updated answer, "
                        "it is correct as long as the updated answer is given.",
    "single-session-preference": "The reference is a rubric of the user's preferences: the response is correct "
                                 "if it recalls and uses them correctly; it need not match word for word.",
}
ABSTENTION_RULE = ("This question is unanswerable from the conversation. The response is correct only if it "
                   "says the information is not available or that it cannot know.")


def judge_messages(question_type: str, question: str, reference: str, response: str, abstention: bool) -> list[dict]:
    rule = ABSTENTION_RULE if abstention else TYPE_RULES.get(question_type, "")
    return [
        {"role": "system", "content": "You grade answers. Reply with yes or no only."},
        {"role": "user", "content": (
            f"Question: {question}\nReference answer: {reference}\nModel response: {response}\n"
            f"{rule}\nIs the model response correct? Answer yes or no.")},
    ]


class Judge:
    def __init__(self, llm):
        self.llm = llm

    def correct(self, question_type: str, question: str, reference: str, response: str,
                abstention: bool = False) -> bool:
        out = self.llm.chat([judge_messages(question_type, question, reference, response, abstention)],
                            max_new_tokens=4)[0]
        return out.strip().lower().startswith("yes")


def build_judge(cfg: dict) -> Judge | None:
    if not cfg or cfg.get("kind", "none") == "none":
        return None
    from arbor_train.runtime.llm import build_llm

    return Judge(build_llm(cfg["llm"]))


def rubric_messages(question: str, response: str, item: str) -> list[dict]:
    return [
        {"role": "system", "content": "You grade answers against one rubric item. Reply with yes, partially or no."},
        {"role": "user", "content": f"Question: {question}\nModel response: {response}\nRubric item: {item}\n"
                                    "Does the response satisfy the rubric item? Answer yes, partially or no."},
    ]


def rubric_score(judge: Judge, question: str, response: str, rubric: list[str]) -> float | None:
    """BEAM: each rubric item scores 1 / 0.5 / 0; the question scores their mean."""
    if not rubric:
        return None
    outs = judge.llm.chat([rubric_messages(question, response, item) for item in rubric], max_new_tokens=4)
    vals = []
    for o in outs:
        o = o.strip().lower()
        vals.append(1.0 if o.startswith("yes") else 0.5 if o.startswith("partial") else 0.0)
    return sum(vals) / len(vals)
