"""python -m eval.run benchmark=branchmem method=<arbormem|full_context|bm25|dense|fact_store> [overrides]

BranchMemEval protocol: replay each session in order; at a question, freeze the committed prefix,
read the context through the method, answer with the shared answer model, score by normalized
rule-based match; the canonical response (not the prediction) continues the replay.

Answer-model-independent metrics are reported for every run: gold-in-context and confounder-in-context
rates, state-localization accuracy (the selected state lies on the gold branch) at questions and at
every turn, and context tokens. `run(cfg) -> dict` is the importable function.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import (ConfigError, MissingInputError, conf_options, entry_point, parse_bool, parse_choice,
                                parse_float, parse_int)
from arbor_train.paths import CONF_DIR

BENCHMARKS = ("branchmem", "locomo", "longmemeval", "beam", "irc")
LLM_BACKENDS = ("hf", "openai")


def _check_llm(node: dict, option: str) -> None:
    if not isinstance(node, dict):
        raise ConfigError(f"option {option} must be a mapping with backend ({', '.join(LLM_BACKENDS)}) and model")
    parse_choice(node.get("backend", "hf"), f"{option}.backend", LLM_BACKENDS)
    if not isinstance(node.get("model"), str) or not node["model"]:
        raise ConfigError(f"option {option}.model must name a model, got {node.get('model')!r}")
    if node.get("batch_size") is not None:
        parse_int(node["batch_size"], f"{option}.batch_size", minimum=1)


def _set(d: dict, key: str, parsed) -> None:
    """Keep a valid value as the user wrote it (results.json records the config); a string becomes its parse."""
    if isinstance(d.get(key), str):
        d[key] = parsed


def check_options(c: dict) -> None:
    """Refuse, before any model or data is loaded, options that cannot work (numbers and booleans read
    strictly: budget=lots or wandb.enabled=maybe is an error naming the option); a number or boolean
    given as a string is replaced in `c` by its value."""
    from .methods import METHODS

    parse_choice(c["method"], "method", METHODS)
    if c["benchmark"] not in BENCHMARKS:
        raise ConfigError(f"option benchmark={c['benchmark']!r} is unknown; valid: {', '.join(BENCHMARKS)}")
    _set(c, "budget", parse_int(c["budget"], "budget", minimum=1))
    _set(c, "prefilter", parse_float(c["prefilter"], "prefilter", minimum=0.0, exclusive=True))
    if c["max_sessions"] is not None:
        _set(c, "max_sessions", parse_int(c["max_sessions"], "max_sessions", minimum=1))
    parse_choice(c["runtime_profile"], "runtime_profile", conf_options("runtime"))
    ov = c["runtime_overrides"]
    if not isinstance(ov, list) or not all(isinstance(o, str) for o in ov):
        raise ConfigError(f"option runtime_overrides must be a list of override strings (key=value), got {ov!r}")
    for k, v in c["ablation"].items():
        if k != "name":
            _set(c["ablation"], k, parse_bool(v, f"ablation.{k}"))
    _set(c["wandb"], "enabled", parse_bool(c["wandb"]["enabled"], "wandb.enabled"))
    am = c["answer_model"]
    parse_choice(am.get("kind"), "answer_model.kind", ("none", "llm"))
    _set(am, "max_new_tokens", parse_int(am.get("max_new_tokens"), "answer_model.max_new_tokens", minimum=1))
    if am["kind"] == "llm":
        _check_llm(am.get("llm"), "answer_model.llm")
    judge = c.get("judge") or {}
    parse_choice(judge.get("kind", "none"), "judge.kind", ("none", "llm"))
    if judge.get("kind") == "llm":
        _check_llm(judge.get("llm"), "judge.llm")
    b = c["benchmark"]
    if b == "branchmem":
        data = Path(c["data_dir"]) / "jsonl" / "sessions.jsonl"
        if not data.exists():
            raise MissingInputError(f"option data_dir={c['data_dir']!r}: {data} missing (python -m data_gen.branchmem)")
    else:
        node = c.get(b) or {}
        inp = node.get("input")
        if inp in (None, "", "???"):
            raise ConfigError(f"benchmark={b} needs option {b}.input (the {b} file or folder), e.g. {b}.input=PATH")
        if not Path(str(inp)).exists():
            raise MissingInputError(f"option {b}.input={str(inp)!r}: no such file or folder")
    if b == "locomo":
        cats = c["locomo"].get("categories")
        if not isinstance(cats, list) or not cats:
            raise ConfigError(f"option locomo.categories must be a non-empty list of LoCoMo categories (1-5), got {cats!r}")
        for k, x in enumerate(cats):
            parse_choice(parse_int(x, f"locomo.categories[{k}]"), f"locomo.categories[{k}]", (1, 2, 3, 4, 5))


def runtime_config(c: dict) -> dict:
    """The runtime configuration of the run: its profile, the overrides, then the ablation switches."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from arbor_train.runtime import default_config

    try:
        runtime_cfg = default_config(c["runtime_profile"], list(c["runtime_overrides"]))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"option runtime_overrides={c['runtime_overrides']} (runtime_profile="
                          f"{c['runtime_profile']}): {e}") from e
    for k, v in c["ablation"].items():
        if k == "name":
            continue
        if k not in runtime_cfg["ablation"]:
            raise ConfigError(f"option ablation.{k} is not a runtime ablation switch ({sorted(runtime_cfg['ablation'])})")
        runtime_cfg["ablation"][k] = v
    return runtime_cfg


def load_sessions(data_dir: str | Path) -> list[dict]:
    """BranchMemEval sessions (<data_dir>/jsonl/sessions.jsonl), every row schema-checked; ids unique."""
    from data_gen.io import read_rows

    return read_rows(Path(data_dir) / "jsonl" / "sessions.jsonl", "sessions")


def build_answer_model(cfg: dict):
    """None (no generation: answer-independent metrics only), or an LLM backend (hf | openai)."""
    if cfg["kind"] == "none":
        return None
    from arbor_train.runtime.llm import build_llm

    return build_llm(cfg["llm"])


def replay_session(sess: dict, method, answers, budget: int, apply_forget: bool = True) -> tuple[list[dict], list[dict]]:
    """Replay one BranchMemEval session online: (question records, turn records).

    A session with a forget request (data_gen/branchmem/forgetting.py) has the method `forget` the named
    turns at the request (unless apply_forget is false: the no-deletion control), the answer cache
    forget the answers built from them, and every later read is checked for the forgotten value (`leak`).
    """
    from eval.scoring import answer_correct, context_flags, error_category

    branch = {t["index"]: t["branch"] for t in sess["turns"]}
    qinfo = {q["turn"]: q for q in sess["questions"]}
    forget = sess.get("forget")
    unit = f"{method.name}/{sess['session_id']}"
    qrecs, trecs = [], []
    for t in sess["turns"]:
        if t.get("move") == "forget" and apply_forget:
            method.forget(t["forget_turns"])
            if answers is not None:
                answers.forget(unit, t["forget_turns"])
        gold_parent = t["gold_parent"] if t["gold_parent"] >= 0 else None
        if t["is_question"]:
            q = qinfo[t["index"]]
            t0 = time.perf_counter()
            r = method.read(t["user"], t["timestamp"], budget)
            read_s = time.perf_counter() - t0
            flags = context_flags(r.text, q["gold"], q["confounder"])
            rec = {"session_id": sess["session_id"], "turn": t["index"], "question_type": q["type"],
                   "dimension": q["dimension"], "gold": q["gold"], "confounder": q["confounder"],
                   "context_tokens": r.tokens, "read_s": read_s, **flags,
                   "localization_correct": (None if r.selected_turn is None and method.name != "arbormem"
                                            else r.selected_turn is not None and branch.get(r.selected_turn) == q["branch"]),
                   "prediction": None}
            if forget is not None:
                rec["after_forget"] = t["index"] > forget["request_turn"]
                rec["leak"] = rec["after_forget"] and context_flags(r.text, forget["value"], None)["gold_in_context"]
            if answers is not None:
                def done(pred, rec=rec, q=q, text=r.text):
                    rec.update(prediction=pred, correct=answer_correct(pred, q["gold"], q["confounder"]),
                               error=error_category(pred, q["gold"], q["confounder"], text))
                answers.ask(r.text, t["user"], done, sources=(unit, r.turn_ids))
            qrecs.append(rec)
        t0 = time.perf_counter()
        obs = method.observe(t["index"], t["user"], t["assistant"], t["timestamp"], t["is_question"])
        ingest_s = time.perf_counter() - t0
        trecs.append({"ingest_s": ingest_s})
        if method.name == "arbormem":
            chosen = obs["parent_turn"]
            ok = (chosen is None) if gold_parent is None else (chosen is not None and branch.get(chosen) == t["branch"])
            trecs[-1].update({"turn": t["index"], "route": obs["route"], "correct": ok, "gold_new_root": gold_parent is None})
    return qrecs, trecs


def _pct(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of values, rounded; None when empty."""
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], 5) if v else None


def ingest(conv, method) -> tuple[list, dict[str, int]]:
    """Build a method's memory from a whole conversation (every interaction, in order); returns the
    interactions and the map from turn id to interaction index that evidence ids are resolved with."""
    from eval.benchmarks.schema import interactions

    inters = interactions(conv)
    for i, it in enumerate(inters):
        method.observe(i, it.user, it.assistant, it.timestamp, False)
    return inters, {tid: i for i, it in enumerate(inters) for tid in it.turn_ids}


def replay_locomo(conv, method, answers, judge, budget: int, c: dict) -> list[dict]:
    """LoCoMo protocol: the memory is built once per conversation, then each question of the
    categories in `c["locomo"]["categories"]` is read against the finished memory."""
    from eval.scoring import locomo_score

    categories = [int(x) for x in c["locomo"]["categories"]]
    _, idx_of = ingest(conv, method)
    last_date = conv.sessions[-1].date_time if conv.sessions else None
    recs = []
    for q in conv.questions:
        if int(q.category) not in categories:
            continue
        t0 = time.perf_counter()
        r = method.read(q.question, last_date, budget)
        read_s = time.perf_counter() - t0
        ev = {idx_of[e] for e in q.evidence if e in idx_of}
        rec = {"session_id": conv.conversation_id, "question_id": q.question_id, "category": q.category,
               "context_tokens": r.tokens, "read_s": read_s,
               "evidence_recall": (len(ev & set(r.turn_ids)) / len(ev)) if ev else None}
        if answers is not None:
            def done(pred, rec=rec, q=q):
                rec["prediction"] = pred
                rec["score"] = locomo_score(pred, q.answer if q.answer is not None else "", int(q.category))
                if judge is not None:  # Mem0-style J: a lenient CORRECT/WRONG judgement by an LLM
                    rec["judge_correct"] = judge.correct("locomo", q.question, q.answer or "", pred)
            answers.ask(r.text, q.question, done)
        recs.append(rec)
    return recs


def replay_longmemeval(conv, method, answers, judge, budget: int, c: dict) -> list[dict]:
    """LongMemEval protocol: each question has its own haystack, so the memory is built per question;
    retrieval is judged at turn and session level on the evidence (has_answer) turns the context holds,
    answers by the pluggable judge when one is configured."""
    inters, idx_of = ingest(conv, method)
    q = conv.questions[0]
    t0 = time.perf_counter()
    r = method.read(q.question, q.question_date, budget)
    read_s = time.perf_counter() - t0
    ev = {idx_of[e] for e in q.evidence if e in idx_of}
    got = set(r.turn_ids)
    ev_sessions = {inters[i].session_id for i in ev}
    got_sessions = {inters[i].session_id for i in got if 0 <= i < len(inters)}
    rec = {"session_id": conv.conversation_id, "question_id": q.question_id, "question_type": q.category,
           "abstention": bool(q.extra.get("abstention")), "context_tokens": r.tokens, "read_s": read_s,
           "turn_recall_any": (bool(ev & got) if ev else None), "turn_recall_all": (ev <= got if ev else None),
           "session_recall_any": (bool(ev_sessions & got_sessions) if ev_sessions else None),
           "session_recall_all": (ev_sessions <= got_sessions if ev_sessions else None)}
    if answers is not None:
        def done(pred):
            rec["prediction"] = pred
            if judge is not None:
                rec["correct"] = judge.correct(q.category, q.question, q.answer or "", pred, rec["abstention"])
        answers.ask(r.text, q.question, done)
    return [rec]


def summarize_longmemeval(recs: list[dict]) -> dict[str, Any]:
    from eval.scoring import aggregate

    out: dict[str, Any] = {"questions": len(recs),
                           "context_tokens_mean": round(sum(r["context_tokens"] for r in recs) / max(1, len(recs)), 1),
                           "read_s_p50": _pct([r["read_s"] for r in recs], 0.5),
                           "read_s_p95": _pct([r["read_s"] for r in recs], 0.95)}
    for k in ("turn_recall_any", "turn_recall_all", "session_recall_any", "session_recall_all"):
        v = [r[k] for r in recs if r[k] is not None and not r["abstention"]]  # abstention questions skipped
        out[k] = round(sum(v) / len(v), 4) if v else None
    judged = [r for r in recs if "correct" in r]
    if judged:
        agg = aggregate(judged, ["question_type"])
        out["accuracy"] = agg["accuracy"]
        by = {k: v["accuracy"] for k, v in agg["by"]["question_type"]["groups"].items()}
        out["accuracy_by_type"] = by
        out["task_averaged_accuracy"] = round(sum(by.values()) / len(by), 4)
        ab = [r["correct"] for r in judged if r["abstention"]]
        out["abstention_accuracy"] = round(sum(ab) / len(ab), 4) if ab else None
    return out


def replay_beam(conv, method, answers, judge, budget: int, c: dict) -> list[dict]:
    """BEAM protocol: memory built once per conversation, then its probing questions (10 abilities x 2).
    Judge-free: evidence (source_chat_ids) in the context, and Kendall tau for event ordering; rubric
    items are scored by the pluggable judge when one is configured."""
    import ast

    from eval.scoring import kendall_tau_order

    from .judge import rubric_score

    _, idx_of = ingest(conv, method)
    now = conv.sessions[-1].date_time if conv.sessions else None
    recs = []
    for q in conv.questions:
        r = method.read(q.question, now, budget)
        ev = {idx_of[e] for e in q.evidence if e in idx_of}
        rec = {"session_id": conv.conversation_id, "question_id": q.question_id, "ability": q.category,
               "context_tokens": r.tokens, "evidence_recall": (len(ev & set(r.turn_ids)) / len(ev)) if ev else None}
        if answers is not None:
            def done(pred, rec=rec, q=q):
                rec["prediction"] = pred
                order = q.extra.get("answer")
                if q.category == "event_ordering" and isinstance(order, str):
                    try:
                        order = ast.literal_eval(order)
                    except (ValueError, SyntaxError):
                        order = None
                if q.category == "event_ordering" and isinstance(order, list):
                    rec["score"] = kendall_tau_order(pred, [str(x) for x in order])
                elif judge is not None:
                    rec["score"] = rubric_score(judge, q.question, pred, list(q.extra.get("rubric") or []))
            answers.ask(r.text, q.question, done)
        recs.append(rec)
    return recs


def summarize_beam(recs: list[dict]) -> dict[str, Any]:
    ev = [r["evidence_recall"] for r in recs if r["evidence_recall"] is not None]
    out: dict[str, Any] = {"questions": len(recs), "evidence_recall": round(sum(ev) / len(ev), 4) if ev else None,
                           "context_tokens_mean": round(sum(r["context_tokens"] for r in recs) / max(1, len(recs)), 1)}
    scored = [r for r in recs if r.get("score") is not None]
    if scored:
        by: dict[str, list[float]] = {}
        for r in scored:
            by.setdefault(r["ability"], []).append(r["score"])
        out["score_by_ability"] = {k: round(sum(v) / len(v), 4) for k, v in sorted(by.items())}
        out["overall"] = round(sum(out["score_by_ability"].values()) / len(by), 4)  # mean of ability scores
    return out


def summarize_locomo(recs: list[dict]) -> dict[str, Any]:
    from eval.scoring import aggregate

    ev = [r["evidence_recall"] for r in recs if r["evidence_recall"] is not None]
    out: dict[str, Any] = {"questions": len(recs), "evidence_recall": round(sum(ev) / len(ev), 4) if ev else None,
                           "context_tokens_mean": round(sum(r["context_tokens"] for r in recs) / max(1, len(recs)), 1)}
    out["read_s_p50"] = _pct([r["read_s"] for r in recs], 0.5)
    out["read_s_p95"] = _pct([r["read_s"] for r in recs], 0.95)
    if recs and "score" in recs[0]:
        agg = aggregate(recs, ["category"])
        out["f1"] = agg["accuracy"]
        out["f1_by_category"] = {k: v["accuracy"] for k, v in agg["by"]["category"]["groups"].items()}
    judged = [r["judge_correct"] for r in recs if "judge_correct" in r]
    if judged:
        out["judge_accuracy"] = round(sum(judged) / len(judged), 4)
    return out


def _load_locomo(path):
    from eval.benchmarks.locomo import load_locomo

    return load_locomo(path)


def _load_longmemeval(path):
    from eval.benchmarks.longmemeval import load_longmemeval

    return load_longmemeval(path)


def _load_beam(path):
    from eval.benchmarks.beam import load_beam_dir

    return load_beam_dir(path)


def _load_irc(path):
    from eval.benchmarks.irc import load_irc

    return load_irc(path)


def replay_irc(f, method, answers, judge, budget: int, c: dict) -> list[dict]:
    """Ubuntu IRC disentanglement, online: every message (lines 0-999 are context) is routed from the
    committed prefix by `observe`, then committed; the chosen state is the reply-to link (a new root: a
    self-link). System lines are not committed and link to themselves. One record per annotated line."""
    recs = []
    for m in f.messages:
        route, parent = "system", m.line
        if not m.system:
            text = f"{m.speaker}: {m.text}" if m.speaker else m.text
            t0 = time.perf_counter()
            obs = method.observe(m.line, text, "", m.time, False, speaker=m.speaker)
            route = obs["route"]
            parent = obs["parent_turn"] if obs["parent_turn"] is not None else m.line
            ingest_s = time.perf_counter() - t0
        else:
            ingest_s = 0.0
        if m.line in f.parents:
            recs.append({"file": f.name, "line": m.line, "gold": sorted(f.parents[m.line]), "pred": [parent],
                         "route": route, "ingest_s": ingest_s})
    return recs


def summarize_irc(recs: list[dict]) -> dict[str, Any]:
    from eval.benchmarks.irc import score_links

    by_file: dict[str, tuple[dict, dict]] = {}
    for r in recs:
        gold, pred = by_file.setdefault(r["file"], ({}, {}))
        gold[r["line"]], pred[r["line"]] = set(r["gold"]), set(r["pred"])
    out = score_links([(name, g, p) for name, (g, p) in sorted(by_file.items())])
    out["routes"] = dict(Counter(r["route"] for r in recs))
    out["ingest_s_per_turn"] = round(sum(r["ingest_s"] for r in recs) / max(1, len(recs)), 5)
    return out


# benchmark -> (loader of its conversations, replay of one conversation); BranchMemEval replays sessions
CONVERSATION_PROTOCOLS = {"locomo": (_load_locomo, replay_locomo),
                          "longmemeval": (_load_longmemeval, replay_longmemeval),
                          "beam": (_load_beam, replay_beam),
                          "irc": (_load_irc, replay_irc)}


def summarize(qrecs: list[dict], trecs: list[dict]) -> dict[str, Any]:
    from eval.scoring import ERROR_CATEGORIES, aggregate

    n = len(qrecs)
    out: dict[str, Any] = {
        "questions": n,
        "gold_in_context": round(sum(r["gold_in_context"] for r in qrecs) / max(1, n), 4),
        "confounder_in_context": round(sum(r["confounder_in_context"] for r in qrecs) / max(1, n), 4),
        "context_tokens_mean": round(sum(r["context_tokens"] for r in qrecs) / max(1, n), 1),
        "read_s_p50": _pct([r["read_s"] for r in qrecs], 0.5),
        "read_s_p95": _pct([r["read_s"] for r in qrecs], 0.95),
        "ingest_s_per_turn": round(sum(r["ingest_s"] for r in trecs) / len(trecs), 5) if trecs else None,
    }
    routed = [r for r in trecs if "correct" in r]
    loc = [r["localization_correct"] for r in qrecs if r["localization_correct"] is not None]
    out["state_localization_at_questions"] = round(sum(loc) / len(loc), 4) if loc else None
    if routed:
        out["state_localization_every_turn"] = round(sum(r["correct"] for r in routed) / len(routed), 4)
        out["routes"] = dict(Counter(r["route"] for r in routed))
    if qrecs and "correct" in qrecs[0]:
        agg = aggregate(qrecs, ["dimension", "question_type"])
        out["accuracy"] = agg["accuracy"]
        out["accuracy_by_dimension"] = {k: v["accuracy"] for k, v in agg["by"]["dimension"]["groups"].items()}
        out["accuracy_by_type"] = {k: v["accuracy"] for k, v in agg["by"]["question_type"]["groups"].items()}
        out["errors"] = {c: agg["errors"].get(c, 0) for c in ERROR_CATEGORIES}  # every class, hedge included
    return out


def run(cfg: DictConfig) -> dict:
    from arbor_train.runtime import TokenCounter, build_components
    from data_gen.io import quiet

    from .methods import build_method

    c = OmegaConf.to_container(cfg, resolve=True)
    check_options(c)
    runtime_cfg = runtime_config(c)
    counter = TokenCounter(runtime_cfg["context"]["tokenizer"])
    fixed = counter.count("Current time: 2025-01-01T00:00") + 40
    if c["budget"] <= fixed:
        raise ConfigError(f"option budget={c['budget']} is smaller than the fixed prompt ({fixed} tokens)")
    if c["benchmark"] == "branchmem":
        sessions = load_sessions(c["data_dir"])[: c["max_sessions"] or None]
    llm = build_answer_model(c["answer_model"])
    from .answers import Answers

    answers = (Answers(llm, c["answer_model"]["max_new_tokens"], c["answer_model"].get("cache"))
               if llm is not None else None)
    from .judge import build_judge

    judge = build_judge(c["judge"])
    qrecs, trecs = [], []
    t0 = time.perf_counter()
    with quiet():
        comps = build_components(runtime_cfg)
        if c["benchmark"] in CONVERSATION_PROTOCOLS:
            load, replay = CONVERSATION_PROTOCOLS[c["benchmark"]]
            convs = load(c[c["benchmark"]]["input"])[: c["max_sessions"] or None]
            from tqdm import tqdm

            for conv in tqdm(convs, desc=f"{c['benchmark']} {c['method']}", unit="conversation", disable=None):
                m = build_method(c["method"], runtime_cfg, comps, conv.conversation_id, counter, c["prefilter"])
                qrecs += replay(conv, m, answers, judge, c["budget"], c)
                m.close()
            n_units = len(convs)
        else:
            for s in sessions:
                m = build_method(c["method"], runtime_cfg, comps, s["session_id"], counter, c["prefilter"])
                q, t = replay_session(s, m, answers, c["budget"])
                m.close()
                qrecs += q
                trecs += t
            n_units = len(sessions)
    answer_stats = answers.flush() if answers is not None else None
    if answers is not None:
        answers.close()
    elapsed = time.perf_counter() - t0
    summary = {"locomo": lambda: summarize_locomo(qrecs), "longmemeval": lambda: summarize_longmemeval(qrecs),
               "beam": lambda: summarize_beam(qrecs), "irc": lambda: summarize_irc(qrecs),
               "branchmem": lambda: summarize(qrecs, trecs)}[c["benchmark"]]()
    res = {"benchmark": c["benchmark"], "method": c["method"], "ablation": c["ablation"]["name"], "budget": c["budget"],
           "runtime_profile": c["runtime_profile"], "answer_model": c["answer_model"]["kind"],
           "sessions": n_units, "seconds": round(elapsed, 2), "answer_calls": answer_stats,
           "questions_per_hour": round(len(qrecs) / max(elapsed, 1e-9) * 3600, 1), **summary}
    out = Path(c["run_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"results": res, "config": c}, indent=2, sort_keys=True, default=str))
    with open(out / "questions.jsonl", "w", encoding="utf-8") as f:
        for r in qrecs:
            f.write(json.dumps(r, sort_keys=True, default=str) + "\n")
    from .report import plots, table

    (out / "table.md").write_text(table([dict(res, run=str(out))]))
    if c["wandb"]["enabled"]:
        log_wandb(c, res, out, plots([dict(res, run=str(out))], out))
    print(json.dumps(res, sort_keys=True, default=str))
    return res


def log_wandb(c: dict, res: dict, out: Path, pictures: list[Path]) -> None:
    """Results, the table and plots as a W&B run (offline unless WANDB_MODE=online)."""
    import os

    import wandb

    run = wandb.init(project=c["wandb"]["project"], job_type="eval", dir=str(out),
                     mode=os.environ.get("WANDB_MODE", c["wandb"]["mode"]),
                     name=f"{c['benchmark']}-{c['method']}-{c['ablation']['name']}-{c['budget']}", config=c)
    run.log({k: v for k, v in res.items() if isinstance(v, (int, float)) and v is not None})
    run.log({"results_table": wandb.Table(columns=["key", "value"], data=[[k, json.dumps(v, default=str)]
                                                                          for k, v in sorted(res.items())])})
    for p in pictures:
        run.log({p.stem: wandb.Image(str(p))})
    run.finish()


@hydra.main(config_path=str(CONF_DIR), config_name="eval", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
