"""Distillation (python -m data_gen.distill): a teacher's labels for conversation files, its call cache and
resume, the dropped outputs, the reranker's soft targets, and the loopback OpenAI-compatible server
(python -m arbor_train.serve) the tutorial runs against."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from arbor_train.paths import REPO_ROOT
from arbor_train.prompts import EXTRACT_INSTRUCTIONS, TAG_INSTRUCTION

EXAMPLE = REPO_ROOT / "docs" / "examples" / "chats.jsonl"
ENV = dict(os.environ, WANDB_MODE="offline")


# ---------------------------------------------------------------------- a scripted teacher on loopback
class ScriptedTeacher(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that answers by prompt kind: the router's p(yes) from logprobs, valid JSON
    for every extraction kind except `facts` (not JSON at all) and `events` (an item without its fields),
    and tags with one label outside the ontology. `GET /v1/models` names the checkpoint (`server.root`)."""

    def do_GET(self):
        body = json.dumps({"data": [{"id": "smollm2", "root": self.server.root}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(req)
        text = req["messages"][-1]["content"]
        if req.get("logprobs"):
            yes = -0.1 if "budget" in text.lower() else -2.0
            choice = {"message": {"content": "yes"}, "logprobs": {"content": [
                {"token": "yes", "logprob": yes, "top_logprobs": [{"token": "yes", "logprob": yes},
                                                                  {"token": "no", "logprob": -1.0}]}]}}
        else:
            if text.startswith(EXTRACT_INSTRUCTIONS["facts"]) and req.get("response_format"):
                # inside the schema: one fact for a turn about the support group, none otherwise
                out = '[{"text": "Caroline went to a LGBTQ support group"}]' if "support group" in text else "[]"
            elif text.startswith(EXTRACT_INSTRUCTIONS["facts"]):
                out = "Sure! The facts are: Ana likes tea."
            elif text.startswith(EXTRACT_INSTRUCTIONS["events"]):
                out = '[{"note": "no fields"}]'
            elif text.startswith(EXTRACT_INSTRUCTIONS["summary"]):
                out = "The user talks about a plan."
            elif text.startswith(TAG_INSTRUCTION.split("{")[0]):
                out = '["money", "weather"]'
            elif text.startswith(EXTRACT_INSTRUCTIONS["entities"]):
                out = '["Ana"]'
            else:
                out = "[]"
            choice = {"message": {"content": out}}
        body = json.dumps({"choices": [choice], "usage": {"prompt_tokens": 10, "completion_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def scripted():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedTeacher)
    srv.requests, srv.root = [], "scripted-v1"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def distill_cfg(*overrides: str):
    from arbor_train.runtime.config import compose

    return compose("distill", ["progress=false", *overrides])


def small_file(tmp_path: Path, turns: int = 5) -> Path:
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    keep = [r for r in rows if r["conversation_id"] in ("smoke-000000", "smoke-000001")]
    by: dict = {}
    for r in keep:
        if len(by.setdefault(r["conversation_id"], [])) < turns:
            by[r["conversation_id"]].append(r)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for rs in by.values() for r in rs))
    return path


def test_teacher_outputs_become_rows_and_rejected_ones_are_dropped_with_their_reason(tmp_path, scripted):
    from data_gen.distill import run

    out = tmp_path / "out"
    stats = run(distill_cfg(f"input={small_file(tmp_path)}", f"out_dir={out}", "heldout=0.5",
                            f"runtime.teacher_llm.base_url=http://127.0.0.1:{scripted.server_port}/v1"))
    rows = {s: [json.loads(x) for x in (out / "train" / "jsonl" / f"{s}.jsonl").read_text().splitlines()]
            for s in ("routing", "extraction", "tags")}
    # every turn: an extraction row without the rejected kinds; the valid ones as the runtime validated them
    assert len(rows["extraction"]) == 5
    for r in rows["extraction"]:
        target = json.loads(r["target"])
        assert set(target) == {"entities", "states", "artifacts"} and target["entities"] == ["Ana"]
        assert r["summary"] == "The user talks about a plan."
    # tags: the label outside the ontology is dropped from the row (a repair, not a rejection)
    assert [r["tags"] for r in rows["tags"]] == [["money"]] * 5
    # routing: the turns the teacher scored, each candidate with the teacher's score, the best one the label
    assert rows["routing"] and all(r["label_rule"] == "teacher" for r in rows["routing"])
    for r in rows["routing"]:
        if r["route"] == "temporal_return":  # attached to the best whatever its score: no soft targets
            assert r["teacher_new_root"] is None and r["gold_parent"] == r["candidates"][0]["turn"]
            continue
        scores = [c["teacher_score"] for c in r["candidates"]]
        assert scores == sorted(scores, reverse=True)
        best = r["candidates"][0]
        assert r["gold_parent"] == (best["turn"] if best["teacher_score"] >= r["teacher_new_root"] else -1)
    budget = math.exp(-0.1) / (math.exp(-0.1) + math.exp(-1.0))
    assert any(c["teacher_score"] == pytest.approx(budget, abs=1e-5) for r in rows["routing"] for c in r["candidates"])
    # the drops: every turn of both splits, facts (not JSON) and events (fields missing), named and counted
    drops = [json.loads(x) for x in (out / "dropped.jsonl").read_text().splitlines()]
    assert Counter(d["kind"] for d in drops) == {"facts": 10, "events": 10}
    assert all(d["session_id"].startswith("smoke-") and d["turn"] >= 1 for d in drops)
    assert Counter(d["split"] for d in drops) == {"train": 10, "heldout": 10}
    assert stats["dropped"] == {"extraction / facts: invalid JSON": 10, "extraction / events: missing 'action'": 10}
    card = (out / "README.md").read_text()
    assert "| extraction / facts: invalid JSON | 10 |" in card
    # each distinct prompt was asked once: the requests the endpoint saw are the calls the card counts
    assert stats["calls"]["calls"] == len(scripted.requests) == len({json.dumps(r, sort_keys=True)
                                                                     for r in scripted.requests})
    assert stats["calls"]["prompt_tokens"] == 10 * len(scripted.requests)


def test_a_cache_from_another_checkpoint_or_a_dead_endpoint_is_refused_in_one_line(tmp_path, scripted):
    from arbor_train.errors import ConfigError
    from data_gen.distill import run

    url = f"runtime.teacher_llm.base_url=http://127.0.0.1:{scripted.server_port}/v1"
    run(distill_cfg(f"input={small_file(tmp_path, 2)}", f"out_dir={tmp_path / 'a'}", url))
    scripted.root = "scripted-v2"  # another checkpoint behind the same name and URL
    with pytest.raises(ConfigError, match="answered by 'scripted-v1', and the endpoint now serves 'scripted-v2'"):
        run(distill_cfg(f"input={small_file(tmp_path, 2)}", f"out_dir={tmp_path / 'a'}", url, "overwrite=true"))
    p = subprocess.run([sys.executable, "-m", "data_gen.distill", f"input={small_file(tmp_path, 2)}",
                        f"out_dir={tmp_path / 'b'}", "runtime.teacher_llm.base_url=http://127.0.0.1:9/v1",
                        "runtime.teacher_llm.max_retries=0", "runtime.teacher_llm.timeout_s=2"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout
    assert p.stderr.strip().splitlines()[-1].startswith("error: the teacher (runtime.teacher_llm.base_url / model)")


def test_a_finished_run_is_kept_and_a_bad_file_writes_nothing(tmp_path, scripted):
    from arbor_train.errors import InputError, OutputExistsError
    from data_gen.distill import run

    out = tmp_path / "out"
    url = f"runtime.teacher_llm.base_url=http://127.0.0.1:{scripted.server_port}/v1"
    run(distill_cfg(f"input={small_file(tmp_path, 3)}", f"out_dir={out}", url))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.suffix != ".sqlite"}
    with pytest.raises(OutputExistsError, match="finished distillation"):
        run(distill_cfg(f"input={small_file(tmp_path, 3)}", f"out_dir={out}", url))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"user": "hi"}\n{"user": 3}\n')
    p = subprocess.run([sys.executable, "-m", "data_gen.distill", f"input={bad}", f"out_dir={out}", "overwrite=true",
                        url], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout
    assert p.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: turn 2 (line 2): field 'user'")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.suffix != ".sqlite"} == before
    with pytest.raises(InputError):
        run(distill_cfg(f"input={bad}", f"out_dir={tmp_path / 'other'}", url))
    assert not (tmp_path / "other").exists()


LOCOMO = REPO_ROOT.parent / "shared" / "data" / "locomo"


@pytest.mark.skipif(not LOCOMO.exists(), reason="../shared/data/locomo is not beside the repository")
def test_a_facts_only_teacher_labels_locomo_interactions_inside_the_schema_and_is_scored_from_its_rows(tmp_path,
                                                                                                      scripted):
    from arbor_train.errors import ConfigError
    from arbor_train.runtime.constrain import SCHEMAS
    from data_gen.distill import run
    from eval.extraction import run as score
    from hydra import compose, initialize_config_dir

    from arbor_train.paths import CONF_DIR

    out = tmp_path / "out"
    stats = run(distill_cfg(f"input={LOCOMO / '26.json'}", "input_format=locomo", "roles=[facts]", "max_turns=6",
                            "runtime.extractors.facts.constrained=true", f"out_dir={out}",
                            f"runtime.teacher_llm.base_url=http://127.0.0.1:{scripted.server_port}/v1"))
    # one request per interaction, each a facts prompt with the facts schema as OpenAI's response_format; the
    # router, the tagger and the other kinds are heuristic: no call, no row
    assert len(scripted.requests) == 6 == stats["calls"]["calls"]
    for r in scripted.requests:
        assert r["messages"][-1]["content"].startswith(EXTRACT_INSTRUCTIONS["facts"])
        assert r["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMAS["facts"]}}
    rows = {s: [json.loads(x) for x in (out / "train" / "jsonl" / f"{s}.jsonl").read_text().splitlines()]
            for s in ("routing", "extraction", "tags")}
    assert not rows["routing"] and not rows["tags"] and len(rows["extraction"]) == 6
    assert all(set(json.loads(r["target"])) == {"facts"} and r["session_id"] == "26" for r in rows["extraction"])
    # the interaction's text as the evaluation reads it: the speaker's name, the reply after it, the session date
    assert rows["extraction"][1]["input"].startswith("Caroline: ") and rows["extraction"][1]["assistant"].startswith("Melanie: ")
    labelled = [r["turn"] for r in rows["extraction"] if json.loads(r["target"])["facts"]]
    assert labelled and "labelling facts only" in (out / "README.md").read_text()
    # the teacher's labels scored against the observations without calling it again
    def xcfg(*o):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="extraction", overrides=[f"input={LOCOMO}", f"run_dir={tmp_path / 'x'}",
                                                                "extractor=recorded", f"recorded.dir={out}", *o])
    n = len(scripted.requests)
    res = score(xcfg("conversations=[26]", "max_interactions=6"))
    assert len(scripted.requests) == n and res["interactions"] == 6
    assert res["predicted_facts"] == len(labelled) and res["json_validity"] == 1.0
    assert res["seconds_per_interaction"] == stats["teacher_s_per_turn"]
    with pytest.raises(ConfigError, match="no row for conversation 26 interaction 7"):
        score(xcfg("conversations=[26]", "max_interactions=7"))
    with pytest.raises(ConfigError, match=r"option roles must be null or a non-empty list of routing, tags, summary"):
        run(distill_cfg(f"input={LOCOMO / '26.json'}", "input_format=locomo", "roles=[fact]", f"out_dir={tmp_path / 'y'}"))


@pytest.mark.slow
@pytest.mark.skipif(not LOCOMO.exists(), reason="../shared/data/locomo is not beside the repository")
def test_the_distill_locomo_table_runs_at_smoke_size(tmp_path, scripted, smoke_data, locomo_two, branchmem_needs_here):
    """conf/table/distill_locomo.yaml on two LoCoMo conversations (2 folds, fold 0): the scripted teacher labels
    the facts, and the teacher's rows, the distilled and the gold-trained adapters (2 steps) and the heuristic
    are scored on the held-out conversation's first interactions."""
    from data_gen.distill import run
    from eval.tables import load, run_table

    run(distill_cfg(f"input={tmp_path / 'in'}", "input_format=locomo", "roles=[facts]", "max_turns=12",
                    "runtime.extractors.facts.constrained=true", f"out_dir={tmp_path / 'dist'}",
                    f"runtime.teacher_llm.base_url=http://127.0.0.1:{scripted.server_port}/v1"))
    t = load("distill_locomo")
    branchmem_needs_here(t)  # (the adapters' own data is set to the smoke set below)
    tiny = ("extractor.overrides=['trainer.max_steps=2','data.max_train_examples=8','data.max_val_examples=4',"
            f"'task.gen_examples=2','task.compare_baselines=false','logger=csv','data.train_dir={smoke_data}',"
            f"'data.val_dir={smoke_data}']")
    smoke = [o for o in t["smoke"] if not o.startswith("extractor.overrides=")]
    res = run_table("distill_locomo", [*smoke, tiny, f"input={tmp_path / 'in'}", f"supervision={tmp_path / 'sup'}",
                                       f"distilled={tmp_path / 'dist'}", "folds=2"], tmp_path / "table")
    assert [r["row"] for r in res["rows"]] == list(t["row_names"].values())
    by = {r["row"]: r for r in res["rows"]}
    assert by["heuristic"]["seconds_per_interaction"] is not None and by["distilled student"]["f1"] is not None
    # the held-out conversation's second interaction is the one the scripted teacher gave a fact
    teacher = json.loads((tmp_path / "table" / "runs" / "facts_teacher_f0" / "results.json").read_text())["results"]
    assert teacher["conversations"] == ["26"] and teacher["interactions"] == 3 and teacher["predicted_facts"] == 1
    dist = json.loads((tmp_path / "table" / "runs" / "fold0" / "bundle_distilled" / "manifest.json").read_text())
    assert dist["training_sessions"] == ["30"]  # the teacher's labels of the other fold only
    assert (tmp_path / "table" / "locomo_cv_facts.png").exists()


def irc_split(tmp_path: Path) -> Path:
    """A one-file IRC split: 5 messages and a system line."""
    d = tmp_path / "irc" / "train"
    d.mkdir(parents=True)
    lines = ["[10:00] <alice> how do I raise my budget quota?", "=== bob has joined #ubuntu",
             "[10:01] <carol> anyone using pulseaudio on 9.04?", "[10:02] <dave> alice: the budget is in quota.conf",
             "[10:03] <alice> dave: thanks, the budget works", "[10:04] <erin> carol: yes, pulseaudio is fine"]
    (d / "2009-01-01_00.ascii.txt").write_text("\n".join(lines) + "\n")
    (d / "2009-01-01_00.annotation.txt").write_text("0 3 -\n")
    return d


def test_a_routing_only_teacher_labels_irc_messages_as_the_benchmark_reads_them(tmp_path, scripted):
    from data_gen.distill import run

    d = irc_split(tmp_path)
    out = tmp_path / "out"
    stats = run(distill_cfg(f"input={d}", "input_format=irc", "roles=[routing]", "runtime/domain=group_chat_wide",
                            f"out_dir={out}", f"runtime.teacher_llm.base_url=http://127.0.0.1:{scripted.server_port}/v1"))
    # only the router's p(yes) was asked; no extraction, no tags
    assert scripted.requests and all(r.get("logprobs") for r in scripted.requests)
    rows = {s: [json.loads(x) for x in (out / "train" / "jsonl" / f"{s}.jsonl").read_text().splitlines()]
            for s in ("routing", "extraction", "tags")}
    assert not rows["extraction"] and not rows["tags"] and rows["routing"]
    assert stats["splits"]["train"]["turns"] == 5  # the system line is not a turn
    # a message reads as the benchmark replays it, `nick: text`, and its candidates say who wrote them
    by_input = {r["input"]: r for r in rows["routing"]}
    assert "dave: alice: the budget is in quota.conf" in by_input
    r = by_input["alice: dave: thanks, the budget works"]
    assert all(c["teacher_score"] is not None for c in r["candidates"]) and any(c.get("speaker") for c in r["candidates"])


def test_a_teacher_without_llm_calls_is_costed_by_its_replay(tmp_path):
    """teacher=components (here the heuristic router; a tuned bundle alike) makes no endpoint call: its cost per
    turn is the replay's wall seconds over its turns, and the card says so."""
    from data_gen.distill import run

    out = tmp_path / "out"
    stats = run(distill_cfg(f"input={irc_split(tmp_path)}", "input_format=irc", "roles=[routing]", "teacher=components",
                            "runtime/domain=group_chat_wide", f"out_dir={out}"))
    assert stats["calls"]["distinct"] == 0 and stats["splits"]["train"]["routing"] > 0
    assert stats["teacher_s_per_turn"] > 0 and abs(stats["teacher_s_per_turn"] - stats["wall_s"] / 5) <= 0.011
    assert "makes no LLM calls" in (out / "README.md").read_text()


def test_the_locomo_distillation_page_says_what_its_generated_table_holds():
    """docs/results/distill.md reads the distill_locomo table: a teacher and student at 0, the gold-trained
    adapter ahead of the heuristic, with the numbers the page quotes."""
    rows = {r["row"]: r for r in json.loads((REPO_ROOT / "docs" / "results" / "generated" / "distill_locomo"
                                             / "results.json").read_text())}
    teacher = next(r for n, r in rows.items() if n.startswith("teacher"))
    assert teacher["f1"] == 0 and rows["distilled student"]["f1"] == 0
    gold, heur = rows["gold-trained student"]["f1"], rows["heuristic"]["f1"]
    assert gold > heur
    page = (REPO_ROOT / "docs" / "results" / "distill.md").read_text()
    assert f"scores {gold:.3f}" in page and f"the heuristic {heur:.3f}" in page


def test_the_irc_distillation_page_says_what_its_generated_table_holds():
    """docs/results/distill.md reads the distill_irc table: the distilled student within 2 link F points of its
    teacher, both below the previous-message baseline, and the gold-trained student far above the heuristic,
    with the numbers the page quotes."""
    rows = {r["row"]: r for r in json.loads((REPO_ROOT / "docs" / "results" / "generated" / "distill_irc"
                                             / "results.json").read_text())}
    teacher = next(r for n, r in rows.items() if n.startswith("teacher"))["link_f1"]
    dist, gold = rows["distilled student"]["link_f1"], rows["gold-trained student"]["link_f1"]
    prev, heur = rows["previous message"]["link_f1"], rows["heuristic"]["link_f1"]
    assert abs(dist - teacher) < 2 and max(dist, teacher) < prev and gold - heur > 15
    page = (REPO_ROOT / "docs" / "results" / "distill.md").read_text()
    for n in (teacher, dist, gold, prev, heur):
        assert f"{n:.2f}" in page
    assert f"{gold - heur:.1f} points above the heuristic" in page


def test_the_server_reads_response_format_and_names_what_is_wrong():
    from arbor_train.serve import BadRequest, parse_request

    def body(fmt):
        return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                           "response_format": fmt}).encode()

    schema = {"type": "array", "items": {"type": "object"}}
    assert json.loads(parse_request(body({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}),
                                    "m", 8).schema) == schema
    assert json.loads(parse_request(body({"type": "json_object"}), "m", 8).schema) == {"type": "object"}
    assert parse_request(body({"type": "text"}), "m", 8).schema is None
    with pytest.raises(BadRequest, match=r"field 'response_format.type' must be text, json_object or json_schema"):
        parse_request(body({"type": "yaml"}), "m", 8)
    with pytest.raises(BadRequest, match=r"field 'response_format.json_schema.schema' must be a JSON schema object"):
        parse_request(body({"type": "json_schema", "json_schema": {"name": "x"}}), "m", 8)


# ---------------------------------------------------------------------- soft targets in the reranker's loss
def test_distilled_rows_carry_the_teachers_distribution_into_the_listwise_loss():
    from arbor_train import data as D
    from arbor_train.roles.reranker import teacher_targets

    cand = {"topic_key": "t", "path_summary": "p", "node_summary": "n", "entities": [], "channels": "{}",
            "recalled": True}
    row = {"input": "q", "gold_parent": 2, "gold_states": [2], "teacher_new_root": 0.2,
           "candidates": [dict(cand, turn=2, runtime_score=0.9, teacher_score=0.9),
                          dict(cand, turn=1, runtime_score=0.5, teacher_score=0.5)]}
    g = D.rerank_groups([row], "routing", 8)[0]
    assert g.soft == pytest.approx([0.5, 0.9]) and g.soft_root == pytest.approx(0.2)  # docs in turn order
    plain = D.rerank_groups([{**row, "teacher_new_root": None}], "routing", 8)[0]
    assert plain.soft is None
    batch = D.collate_groups([{"input_ids": [[1], [1]], "gold": g.gold, **D.soft_fields(g)},
                              {"input_ids": [[1]], "gold": -1}], 0)
    t = teacher_targets(batch, 1.0)
    logit = [math.log(p / (1 - p)) for p in (0.5, 0.9, 0.2)]
    z = [math.exp(x) for x in logit]
    assert t[0].tolist() == pytest.approx([x / sum(z) for x in z], abs=1e-5) and t[1] is None
    assert teacher_targets(batch, 2.0)[0].max() < t[0].max()  # a higher temperature flattens it


def test_the_reranker_loss_mixes_the_teachers_kl_with_its_choice():
    from arbor_train import data as D
    from arbor_train.roles.reranker import RerankerModule

    module = RerankerModule.__new__(RerankerModule)
    torch.nn.Module.__init__(module)
    logits = torch.tensor([0.3, 1.2, -0.5])  # two candidates and the new-root option

    def cfg(weight):
        return {"task": {"secondary_weight": 0.0, "distill": {"weight": weight, "temperature": 1.0}}}

    module.group_logits = lambda batch: [logits]
    batch = D.collate_groups([{"input_ids": [[1], [1]], "gold": 1, "soft": [0.5, 0.9], "soft_root": 0.2}], 0)
    logp = torch.log_softmax(logits, 0)
    teacher = torch.softmax(torch.tensor([0.0, math.log(9), math.log(0.25)]), 0)
    kl = float((teacher * (teacher.log() - logp)).sum())
    for w, expect in ((0.0, -float(logp[1])), (1.0, kl), (0.5, 0.5 * -float(logp[1]) + 0.5 * kl)):
        module.cfg = cfg(w)
        assert float(module.step_loss(batch)[0]) == pytest.approx(expect, abs=1e-5)


# ---------------------------------------------------------------------- the loopback server
def start_server(tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    """`python -m arbor_train.serve port=0`, once it prints its ready line (log lines may come first)."""
    log, err = tmp_path / "requests.jsonl", tmp_path / "serve.err"
    with open(err, "w") as errf:
        proc = subprocess.Popen([sys.executable, "-m", "arbor_train.serve", "port=0", f"request_log={log}"],
                                cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=errf, text=True, env=ENV)
    seen = []
    for line in proc.stdout:
        if line.startswith("serving smollm2") and " on http://" in line:  # then keep its stdout drained
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, line.split(" on ", 1)[1].strip(), log
        seen.append(line)
    proc.wait(timeout=30)
    raise AssertionError(f"the server exited ({proc.returncode}) before its ready line: {''.join(seen)[-2000:]}"
                         f"{err.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory):
    proc, url, log = start_server(tmp_path_factory.mktemp("serve"))
    yield url, log
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.slow
def test_the_loopback_server_speaks_the_openai_api_the_runtime_calls(smollm2_server):
    from arbor_train.prompts import rerank_messages
    from arbor_train.runtime.llm import OpenAIEndpoint

    url, _ = smollm2_server
    ep = OpenAIEndpoint(url, "smollm2", concurrency=3)
    msgs = [[{"role": "user", "content": f"Name the number {i}."}] for i in range(3)]
    a = ep.chat(msgs, max_new_tokens=8)
    assert ep.chat(msgs[:1], max_new_tokens=8) == a[:1]  # greedy: a batch-mate changes nothing
    p = ep.yes_probability([rerank_messages("Where is Bob's venue?", "Bob booked Heron Hall.")])[0]
    assert 0.01 < p < 0.99 and ep.usage["requests"] == 5 and ep.usage["completion_tokens"] >= 4
    with pytest.raises(ConnectionError, match="HTTP 404.*not served"):
        OpenAIEndpoint(url, "gpt-9").chat(msgs[:1])
    with pytest.raises(ConnectionError, match="HTTP 400.*temperature"):
        ep._post({"model": "smollm2", "messages": msgs[0], "temperature": 0.7})
    # OpenAI's structured output: decoded inside the schema, so the text is JSON of that shape
    schema = {"type": "array", "maxItems": 2, "items": {"type": "object", "required": ["name"],
                                                       "properties": {"name": {"type": "string", "maxLength": 12}}}}
    outs = ep.chat([[{"role": "user", "content": "List two cities as JSON."}]] * 2, max_new_tokens=40, json_schema=schema)
    for o in outs:
        items = json.loads(o)
        assert isinstance(items, list) and all(isinstance(x, dict) and isinstance(x["name"], str) for x in items)


# ---------------------------------------------------------------------- the tutorial, end to end at smoke size
TUTORIAL = REPO_ROOT / "docs" / "tutorials" / "distill.md"
SMOKE = {  # replaces the tutorial's own values of these options, so the loop runs in minutes
    "data_gen.distill": ["max_conversations=2", "max_turns=3", "runtime.extractors.facts.max_new_tokens=48",
                         "runtime.extractors.states.max_new_tokens=48", "progress=false"],
    "data_gen.conversations": ["progress=false"],
    "arbor_train.train": ["trainer.max_steps=2", "data.max_val_examples=16", "task.compare_baselines=false",
                          "logger=csv"],
    "eval.distill": ["max_turns=4"],
}


def smoke(line: str, url: str) -> list[str]:
    import shlex

    argv = shlex.split(line, comments=True)
    assert argv[:2] == ["python", "-m"], line
    extra = list(SMOKE.get(argv[2], []))
    if argv[2] == "data_gen.distill":
        extra.append(f"runtime.teacher_llm.base_url={url}")
    if argv[2] == "arbor_train.train" and any("experiment=extractor" in a for a in argv):
        extra.append("task.gen_examples=2")
    keys = {e.split("=", 1)[0] for e in extra}
    return [sys.executable, *argv[1:2], argv[2], *[a for a in argv[3:] if a.split("=", 1)[0] not in keys], *extra]


def tutorial_lines(path: Path, lang: str = "bash") -> list[str]:
    return [line for block in re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)
            for line in block.strip().splitlines() if line.strip() and not line.startswith("#")]


def cache_rows(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(path) as db:
            return db.execute("SELECT count(*) FROM calls").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def request_hashes(log: Path) -> list[str]:
    return [json.loads(x)["sha256"] for x in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.slow
def test_the_distill_tutorial_runs_end_to_end_with_a_kill_and_resume(tmp_path, smollm2_server):
    """Every command of docs/tutorials/distill.md at smoke size against the loopback SmolLM2 server. The
    distillation is SIGKILLed mid-run and started again with the same command: no call whose answer the
    first run stored is asked again (a request in flight at the kill, whose answer never arrived, is the only
    kind that may be). Then the students train, export, run in the runtime, and the report and its table run."""
    url, log = smollm2_server
    (tmp_path / "docs").symlink_to(REPO_ROOT / "docs")
    env = dict(ENV, ARBOR_OUTPUT_ROOT=str(tmp_path / "outputs"))
    lines = tutorial_lines(TUTORIAL)
    assert lines[0].startswith("python -m arbor_train.serve") and lines[0].endswith("&")  # the fixture serves it
    # the gold-trained row's router: the own-conversations tutorial's section 2
    own = [x for x in tutorial_lines(REPO_ROOT / "docs" / "tutorials" / "own_conversations.md")
           if "my_router" in x or "data_gen.conversations" in x]
    cache = tmp_path / "outputs" / "data" / "distilled" / "teacher_calls.sqlite"
    for line in own + lines[1:]:
        cmd = smoke(line, url)
        if "data_gen.distill" in line:
            seen0 = len(request_hashes(log))
            proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            deadline = time.time() + 300
            while cache_rows(cache) < 10 and proc.poll() is None and time.time() < deadline:
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            stored = cache_rows(cache)
            assert stored >= 10 and not (cache.parent / "README.md").exists(), "killed too late"
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"{line}\n{p.stderr[-3000:]}"
        if "data_gen.distill" in line:
            stats = json.loads((cache.parent / "stats.json").read_text())
            sent = request_hashes(log)[seen0:]
            assert len(set(sent)) == stored + stats["calls"]["calls"]  # nothing stored was asked again
            assert stats["calls"]["reused"] == stored and cache_rows(cache) == len(set(sent))
            assert stats["splits"]["train"]["turns"] == 3 and stats["splits"]["heldout"]["turns"] == 3
    for code in re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S):
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((tmp_path / "outputs" / "reports" / "distill" / "results.json").read_text())
    names = [r["row"] for r in report["rows"]]
    assert names == ["teacher", "distilled student", "gold-trained student", "heuristic"]
    assert report["rows"][0]["routing_agreement"] == 1.0 and "routing_agreement" in report["rows"][1]
    assert (tmp_path / "outputs" / "reports" / "distill" / "agreement.png").read_bytes()[:4] == b"\x89PNG"
    # the published table's config runs on what the tutorial made
    out = tmp_path / "tables" / "distill_student"
    p = subprocess.run([sys.executable, "-m", "eval.compare", "table=distill_student", "--out", str(out),
                        "max_turns=4", "rows.gold.extractor=outputs/bundles/distilled_extractor"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert [r["row"] for r in rows] == names and (out / "agreement.png").exists()


@pytest.mark.parametrize("dist, msg", [({"weight": 1.5}, "task.distill.weight"), ({"weight": "half"}, "task.distill.weight"),
                                       ({"temperature": 0}, "task.distill.temperature")])
def test_distill_loss_options_out_of_range_are_refused(dist, msg):
    from arbor_train.errors import ConfigError
    from arbor_train.roles.reranker import ROLE

    c = {"task": {"name": "reranker", "head": "classifier", "distill": dist}, "model": {"family": "encoder", "name": "m"}}
    with pytest.raises(ConfigError, match=msg):
        ROLE.check(c)


def test_a_damaged_recorded_distillation_is_refused_naming_the_file_and_line(tmp_path):
    """eval.extraction extractor=recorded over a folder that is not a finished distillation, or whose rows or
    drops are damaged: a user error naming the option, or the file and line, never a traceback."""
    from arbor_train.errors import ConfigError, InputError
    from eval.extraction import RecordedFacts

    with pytest.raises(ConfigError, match="recorded.dir.*stats.json"):
        RecordedFacts(str(tmp_path))
    (tmp_path / "stats.json").write_text(json.dumps({"input_format": "locomo"}))
    (tmp_path / "train" / "jsonl").mkdir(parents=True)
    rows = tmp_path / "train" / "jsonl" / "extraction.jsonl"
    rows.write_text('{"session_id": "26", "turn": 1, "input": "hi", "target": "{\\"facts\\": []}"}\n\n')
    (tmp_path / "dropped.jsonl").write_text('{"session_id": "26", "turn": 2, "kind": "facts"}\n{"session_id": \n')
    with pytest.raises(InputError, match=r"dropped.jsonl line 2: invalid JSON"):
        RecordedFacts(str(tmp_path))
    (tmp_path / "dropped.jsonl").write_text('{"session_id": "26", "turn": 2, "kind": "facts"}\n')
    rec = RecordedFacts(str(tmp_path))
    assert rec.rejected == {("26", 2)} and set(rec.rows) == {("26", 1)}
    rows.write_text('["26", 1]\n')
    with pytest.raises(InputError, match=r"extraction.jsonl line 1: a JSON list, not an object"):
        RecordedFacts(str(tmp_path))
