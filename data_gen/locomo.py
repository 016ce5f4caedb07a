"""LoCoMo transcripts -> supervision in the generator's formats, and the LoCoMo QA evaluation split.

    python -m data_gen.locomo input=../shared/data/locomo out_dir=outputs/data/locomo

The unit the runtime commits is an interaction: a message and the other speaker's reply
(arbor_train/conversations/schema.py `interactions`); `turn` in every set is the interaction's position in its
conversation. Sets (schemas in arbor_train/conversations/supervision.py):

- conversations  the conversations in the common benchmark schema
- extraction     interaction -> atomic facts: the session observations citing one of its dia_ids
                 (an observation citing several dia_ids attaches to each interaction it cites)
- events         per-speaker events of each session with their dates
- summaries      session transcript -> session summary
- localization   each question (categories 1-4 by default) -> the interactions holding its evidence, with
                 the candidates the runtime's recall returns for it (memory built once per conversation)
- routing        weak labels of which earlier interaction each one continues, by the rules below;
                 interactions no rule labels get no row (no label without a rule)
- reader         each question (the QA split's categories) with the context the runtime assembles for it over
                 the finished memory at each budget of `reader_budgets`, and the gold answer as the target
                 (category 3: its first part, what LoCoMo F1 scores): a reader tuned on the conversations of
                 other folds (eval.locomo_cv) answers in LoCoMo's protocol
- qa             the evaluation split: LoCoMo QA with the data's own categories

Weak-label rules, applied in this order (the first that fires labels the interaction):
  evidence_group       it continues the latest earlier interaction that shares the evidence of some
                       question with it (two dia_ids cited together by one question);
  observation_subject  it continues the latest earlier interaction whose observations name a subject
                       (a capitalised entity other than the two speakers) that its own observations name;
  adjacency            (configurable) it continues the previous interaction of the same session.
A label that points into an earlier session is counted as a temporal return. The first interaction of a
session that neither of the first two rules links is left unlabeled.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, MissingInputError, OutputExistsError, entry_point, parse_bool, parse_int
from arbor_train.paths import CONF_DIR

log = logging.getLogger(__name__)

RULES = ("evidence_group", "observation_subject", "adjacency")



def observation_facts(conv, idx_of: dict[str, int]) -> dict[int, list[dict]]:
    """Extraction targets: interaction index -> the session observations citing one of its dia_ids
    (an observation citing several attaches to each interaction it cites), as fact items."""
    facts_of: dict[int, list[dict]] = defaultdict(list)
    for sid, by_speaker in conv.meta.get("observations", {}).items():
        for speaker, facts in by_speaker.items():
            for fact, ids in facts:
                for i in sorted({idx_of[d] for d in ids if d in idx_of}):
                    f = {"text": fact[:179], "entities": [speaker], "tags": []}
                    if f not in facts_of[i]:
                        facts_of[i].append(f)
    return facts_of


def _subjects(fact: str, speakers: set[str]) -> set[str]:
    from arbor_train.runtime.text import entities

    return {e.lower() for e in entities(fact) if e not in speakers and not any(ch.isdigit() for ch in e)}


def weak_labels(conv, inters, rules: list[str]) -> tuple[dict[int, tuple[int, str]], Counter]:
    """interaction index -> (parent interaction index, rule) for every interaction some rule labels."""
    idx_of = {tid: i for i, it in enumerate(inters) for tid in it.turn_ids}
    groups = []
    for q in conv.questions:
        g = sorted({idx_of[e] for e in q.evidence if e in idx_of})
        if len(g) >= 2:
            groups.append(set(g))
    speakers = set(conv.speakers)
    subj_of: dict[int, set[str]] = defaultdict(set)
    for by_speaker in conv.meta.get("observations", {}).values():
        for facts in by_speaker.values():
            for fact, ids in facts:
                s = _subjects(fact, speakers)
                for d in ids:
                    if d in idx_of:
                        subj_of[idx_of[d]] |= s
    labels: dict[int, tuple[int, str]] = {}
    counts: Counter = Counter()
    for i, it in enumerate(inters):
        parent, rule = None, None
        if "evidence_group" in rules:
            linked = [j for g in groups if i in g for j in g if j < i]
            if linked:
                parent, rule = max(linked), "evidence_group"
        if parent is None and "observation_subject" in rules and subj_of.get(i):
            linked = [j for j in range(i) if subj_of.get(j, set()) & subj_of[i]]
            if linked:
                parent, rule = max(linked), "observation_subject"
        if parent is None and "adjacency" in rules and i > 0 and inters[i - 1].session_id == it.session_id:
            parent, rule = i - 1, "adjacency"
        if parent is None:
            counts["unlabeled"] += 1
            continue
        labels[i] = (parent, rule)
        counts[rule] += 1
        if inters[parent].session_id != it.session_id:
            counts["temporal_return"] += 1
    return labels, counts


def convert(convs, runtime_cfg: dict, categories: list[int], rules: list[str], progress: bool = True,
            reader_budgets: tuple[int, ...] = ()):
    from tqdm import tqdm

    from arbor_train.conversations.schema import interactions
    from arbor_train.runtime import build_components
    from arbor_train.scoring.answers import answer_token_recall, locomo_gold
    from data_gen.replay import replay_routing

    rows: dict[str, list[dict]] = {k: [] for k in ("conversations", "extraction", "events", "summaries",
                                                   "localization", "routing", "reader", "qa")}
    label_counts: Counter = Counter()
    recall = Counter()
    comps = build_components(runtime_cfg)
    for conv in tqdm(convs, desc="LoCoMo conversations", disable=not progress):
        cid = conv.conversation_id
        rows["conversations"].append({"conversation_id": cid, "document": json.dumps(conv.to_json(), sort_keys=True)})
        inters = interactions(conv)
        idx_of = {tid: i for i, it in enumerate(inters) for tid in it.turn_ids}
        facts_of = observation_facts(conv, idx_of)
        for i, it in enumerate(inters):
            target = {"states": [], "facts": facts_of.get(i, []), "entities": [], "artifacts": [], "events": []}
            rows["extraction"].append({"session_id": cid, "turn": i, "input": it.user, "timestamp": it.timestamp,
                                       "assistant": it.assistant, "target": json.dumps(target, separators=(", ", ": ")),
                                       "summary": ""})
        for s in conv.sessions:
            sid = s.session_id.split(":")[-1]
            ev = conv.meta.get("events", {}).get(sid) or {}
            for speaker in conv.speakers:
                for e in ev.get(speaker, []) or []:
                    rows["events"].append({"session_id": s.session_id, "speaker": speaker, "event": str(e),
                                           "date": ev.get("date")})
            summary = conv.meta.get("summaries", {}).get(sid)
            if summary:
                transcript = "\n".join(f"{t.speaker}: {t.content}" for t in s.turns)
                rows["summaries"].append({"session_id": s.session_id, "turn": idx_of[s.turns[-1].turn_id] if s.turns else -1,
                                          "input": transcript, "timestamp": s.date_time, "assistant": "",
                                          "summary": summary})
        # routing: replay through the runtime, committing under the weak label where there is one; then
        # question localization over the finished memory
        labels, counts = weak_labels(conv, inters, rules)
        label_counts.update(counts)
        turns = [{"turn": i, "user": it.user, "assistant": it.assistant, "timestamp": it.timestamp,
                  "parents": (labels[i][0],) if i in labels else None, "label_rule": labels[i][1] if i in labels else None}
                 for i, it in enumerate(inters)]

        def questions(rp, conv=conv, idx_of=idx_of, n=len(inters)):
            now = conv.end_time  # asked after the conversation, as eval's LoCoMo protocol reads it
            for q in conv.questions:
                if int(q.category) not in categories:
                    continue
                gold = sorted({idx_of[e] for e in q.evidence if e in idx_of})
                loc, cands = rp.localize_question(q.question)
                target = locomo_gold(q.answer, q.category)  # what a reader is taught: the gold LoCoMo F1 scores
                for budget in reader_budgets:
                    ctx = rp.mem.assemble(q.question, loc, now=now, budget=budget)
                    rows["reader"].append({
                        "session_id": cid, "turn": n, "input": q.question, "timestamp": now, "context": ctx.text,
                        "answer": target, "gold": target, "confounder": None, "question_type": str(q.category),
                        "dimension": q.extra["category_name"], "budget": budget, "ablation": "full",
                        "gold_in_context": answer_token_recall(ctx.text, target) == 1.0,
                        "confounder_in_context": False, "session_fingerprint": cid})
                recall["questions"] += 1
                recall["evidence_in_candidates"] += any(c["turn"] in gold for c in cands)
                rows["localization"].append({
                    "session_id": cid, "turn": n, "input": q.question, "timestamp": None, "candidates": cands,
                    "gold_states": gold, "gold_tip": None, "runtime_choice": rp.turn_of.get(loc.parent_id, -1),
                    "question_type": q.category, "dimension": q.extra["category_name"], "gold": q.answer or "",
                    "confounder": None, "confounder_states": []})

        rows["routing"] += replay_routing(cid, turns, runtime_cfg, comps, Counter(), route="weak_label", finish=questions)
        for q in conv.questions:
            if int(q.category) in categories:
                rows["qa"].append({"conversation_id": cid, "question_id": q.question_id, "question": q.question,
                                   "answer": q.answer, "category": q.category, "evidence": q.evidence,
                                   "adversarial_answer": q.extra.get("adversarial_answer")})
    return rows, label_counts, recall


def compute_stats(convs, rows, label_counts, recall, categories) -> dict:
    from arbor_train.conversations.schema import interactions

    all_q = Counter(q.category for c in convs for q in c.questions)
    return {
        "conversations": len(convs),
        "sessions": sum(len(c.sessions) for c in convs),
        "turns": sum(len(s.turns) for c in convs for s in c.sessions),
        "image_turns": sum(1 for c in convs for _, t in c.turns() if t.image_caption),
        "interactions": sum(len(interactions(c)) for c in convs),
        "questions_by_category": dict(sorted(all_q.items())),
        "qa_split": {"categories": categories, "questions": len(rows["qa"]),
                     "by_category": dict(sorted(Counter(r["category"] for r in rows["qa"]).items()))},
        "supervision": {k: len(v) for k, v in rows.items() if k not in ("conversations", "qa")},
        "extraction_rows_with_facts": sum(1 for r in rows["extraction"] if json.loads(r["target"])["facts"]),
        "weak_labels_by_rule": {k: label_counts.get(k, 0) for k in (*RULES, "unlabeled", "temporal_return")},
        "skipped": {"evidence_ids_naming_no_turn": sum(c.meta["skipped"]["evidence_ids_naming_no_turn"] for c in convs),
                    "split_questions_without_evidence": sum(1 for r in rows["localization"] if not r["gold_states"])},
        "localization_evidence_recalled": round(recall["evidence_in_candidates"] / recall["questions"], 4)
        if recall["questions"] else None,
    }


def card(stats: dict, source: str) -> str:
    w = stats["weak_labels_by_rule"]
    sv = stats["supervision"]
    lines = [
        "# LoCoMo supervision and QA split",
        "",
        f"Converted by `python -m data_gen.locomo` (ArborTrain) from `{source}`. LoCoMo: Maharana et al., ACL 2024,",
        "CC BY-NC 4.0 (research use; cite the paper).",
        "",
        "| conversations | sessions | turns | image turns | interactions | QA split questions |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {stats['conversations']} | {stats['sessions']} | {stats['turns']:,} | {stats['image_turns']} | "
        f"{stats['interactions']:,} | {stats['qa_split']['questions']:,} |",
        "",
        "Questions by category (the LoCoMo data's numbering: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop,",
        f"5 adversarial); the QA split keeps categories {stats['qa_split']['categories']}:",
        "",
        "| category | all questions | in the QA split |", "|---|---:|---:|",
        *[f"| {k} | {n} | {stats['qa_split']['by_category'].get(k, 0)} |" for k, n in stats["questions_by_category"].items()],
        "",
        "## Supervision",
        "",
        "| set | rows |", "|---|---:|",
        *[f"| {k} | {n:,} |" for k, n in sv.items()],
        "",
        f"{stats['extraction_rows_with_facts']:,} extraction rows carry at least one observation fact.",
        f"Runtime recall put an evidence interaction among the candidates for "
        f"{(stats['localization_evidence_recalled'] or 0):.1%} of QA-split questions.",
        "",
        "## Routing weak labels",
        "",
        "Rules, in order (the first that fires labels the interaction):",
        "",
        "1. `evidence_group`: continue the latest earlier interaction that shares the evidence of some question.",
        "2. `observation_subject`: continue the latest earlier interaction whose observations name a subject (a",
        "   capitalised entity other than the speakers) that this interaction's observations name.",
        "3. `adjacency`: continue the previous interaction of the same session.",
        "",
        "The first interaction of a session that rules 1-2 do not link is left unlabeled (no row).",
        "",
        "| rule | interactions labeled |", "|---|---:|",
        *[f"| {k} | {w[k]:,} |" for k in RULES],
        f"| unlabeled | {w['unlabeled']:,} |",
        f"| (of the labeled) temporal returns into an earlier session | {w['temporal_return']:,} |",
        "",
        f"Evidence ids naming no turn, dropped and counted: {stats['skipped']['evidence_ids_naming_no_turn']}; "
        f"QA-split questions left without evidence: {stats['skipped']['split_questions_without_evidence']}.",
        "",
    ]
    return "\n".join(lines)


def run(cfg: DictConfig) -> dict:
    from arbor_train.conversations.io import quiet

    with quiet():
        return _run(cfg)


def _run(cfg: DictConfig) -> dict:
    from arbor_train.conversations.io import write_sets
    from arbor_train.conversations.locomo import load_locomo
    from arbor_train.runtime.config import runtime_config

    if OmegaConf.is_missing(cfg, "input") or not cfg.input:
        raise ConfigError("option input (a LoCoMo file or folder) is required, e.g. input=../shared/data/locomo")
    if not Path(str(cfg.input)).exists():
        raise MissingInputError(f"option input={str(cfg.input)!r}: no such file or folder")
    if isinstance(cfg.categories, str) or not cfg.categories:
        raise ConfigError(f"option categories must be a non-empty list of LoCoMo categories (1-5), got {cfg.categories!r}")
    categories = [parse_int(c, f"categories[{k}]") for k, c in enumerate(cfg.categories)]
    bad = [c for c in categories if c not in (1, 2, 3, 4, 5)]
    if bad:
        raise ConfigError(f"option categories has unknown LoCoMo categories {bad}; valid: 1-5")
    if isinstance(cfg.rules, str):
        raise ConfigError(f"option rules must be a list of rules ({', '.join(RULES)}), got {cfg.rules!r}")
    rules = list(cfg.rules)
    if set(rules) - set(RULES):
        raise ConfigError(f"option rules has unknown rules {sorted(set(rules) - set(RULES))}; valid: {list(RULES)}")
    overwrite, progress = parse_bool(cfg.overwrite, "overwrite"), parse_bool(cfg.progress, "progress")
    out = Path(str(cfg.out_dir))
    if out.exists() and not overwrite:  # fail before any work
        raise OutputExistsError(f"out_dir={str(out)!r} already exists; pass overwrite=true to replace it")
    budgets = cfg.get("reader_budgets")
    if not OmegaConf.is_list(budgets):
        raise ConfigError(f"option reader_budgets must be a list of read budgets (tokens; [] for none), got {budgets!r}")
    budgets = tuple(dict.fromkeys(parse_int(b, f"reader_budgets[{k}]", minimum=64) for k, b in enumerate(budgets)))
    convs = load_locomo(str(cfg.input))
    rows, label_counts, recall = convert(convs, runtime_config(OmegaConf.to_container(cfg, resolve=True)), categories,
                                         rules, progress, budgets)
    stats = compute_stats(convs, rows, label_counts, recall, categories)
    write_sets(out, rows, stats, card(stats, str(cfg.input)), overwrite)
    print(f"wrote {out}: {stats['conversations']} conversations, {stats['sessions']} sessions, "
          f"{stats['turns']} turns, {stats['qa_split']['questions']} QA questions; weak labels "
          f"{stats['weak_labels_by_rule']}")
    return stats


@hydra.main(config_path=str(CONF_DIR), config_name="locomo", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
