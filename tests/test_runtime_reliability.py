"""Nothing lost, nothing leaked: the runtime under bad input, kills and concurrent writers (issue #14).

Each failure the issue lists has a named test here; the fuzz and crash tests print what they tried.
"""

import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_runtime_cli import CONVERSATION, make_cfg, write_json

from arbor_train.conversations.files import load_conversation
from arbor_train.errors import UserError
from arbor_train.paths import REPO_ROOT
from arbor_train.runtime import ArborMemory
from arbor_train.runtime.cli import hydra_quote, run
from arbor_train.runtime.turnkeys import turn_keys
from arbor_train.runtime.index import index_path
from arbor_train.runtime.store import SCHEMA_VERSION, MemoryBusy, Store, conv_token

LOCOMO = REPO_ROOT.parent / "shared" / "data" / "locomo"
FORK = multiprocessing.get_context("fork")


def content(path: Path) -> str:
    s = Store(str(path))
    try:
        return s.content_hash()
    finally:
        s.close()


def problems(path: Path) -> list[str]:
    s = Store(str(path))
    try:
        return s.check()
    finally:
        s.close()


def ingest(conv_file: Path, mem: Path, *overrides: str) -> dict:
    return run(make_cfg("command=ingest", f"input={conv_file}", f"memory={mem}", *overrides))


quoted = hydra_quote  # a Hydra override value that keeps any characters (spaces, '/', non-ASCII)


def ask(mem: Path, question: str, conv: str) -> dict:
    return run(make_cfg("command=ask", f"question={quoted(question)}", f"memory={mem}",
                        f"conversation_id={quoted(conv)}"))


def long_conversation(n: int = 36) -> dict:
    """Three interleaved agendas with updates: routing, facts, records and artifacts all get written."""
    topics = [
        ("Maria", "Lisbon trip", ["hotel budget is {} euros", "itinerary: Belem Tower, then Alfama, then {}"]),
        ("Dr. Chen", "NeurIPS talk", ["talk length is {} minutes", "slides: intro, method, {}"]),
        ("Bob", "Porto conference", ["venue budget is ${}", "schedule: keynote, lunch, {}"]),
    ]
    turns = []
    for i in range(n):
        who, what, tmpl = topics[i % 3]
        fill = ["150", "200", "LX Factory", "results", "panel", "5000"][i % 6] + (str(i) if i % 4 == 0 else "")
        turns.append({"user": f"For {who}'s {what}: {who}'s {tmpl[(i // 3) % 2].format(fill)}.",
                      "assistant": f"Noted for the {what}.", "timestamp": f"2024-03-{1 + i % 28:02d}"})
    return {"turns": turns}


# ---------------------------------------------------------------------- booleans parsed strictly
@pytest.mark.parametrize("value", ["no", "off", "false", "0", "False"])
def test_reset_no_keeps_the_memory(tmp_path, value):
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    mem = tmp_path / "m.sqlite"
    ingest(conv, mem)
    more = write_json(tmp_path / "more.json", {"turns": [{"user": "Maria also wants to see Sintra.",
                                                          "assistant": "Sintra is a day trip."}]})
    res = ingest(more, mem, f"reset={value}")
    assert res["counts"]["nodes"] == 7, f"reset={value} deleted the memory"


@pytest.mark.parametrize("value", ["maybe", "2", "yes please", "nein"])
def test_reset_with_a_non_boolean_is_refused_and_changes_nothing(tmp_path, value):
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    mem = tmp_path / "m.sqlite"
    ingest(conv, mem)
    before = content(mem)
    with pytest.raises(UserError, match=r"option reset must be true or false"):
        ingest(conv, mem, f"reset={value}")
    assert content(mem) == before


def test_a_bad_read_path_is_refused_before_a_reset_touches_the_file(tmp_path):
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    mem = tmp_path / "m.sqlite"
    ingest(conv, mem)
    before = content(mem)
    with pytest.raises(UserError, match=r"context\.layers\[1\] must name a layer"):
        ingest(conv, mem, "reset=true", "runtime.context.layers=[primary_path,gossip]")
    assert content(mem) == before


def test_reset_true_starts_the_file_over(tmp_path, capsys):
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    mem = tmp_path / "m.sqlite"
    ingest(conv, mem)
    ingest(conv, mem, "conversation_id=other")
    res = ingest(conv, mem, "reset=true")
    assert res["counts"]["nodes"] == 6 and res["skipped"] == 0
    assert "'default': 6 nodes" in capsys.readouterr().out
    s = Store(str(mem))
    assert s.count_nodes("other") == 0 and s.check() == []
    s.close()


# ---------------------------------------------------------------------- conversation ids
NEAR_IDS = ["a-b", "a_b", "a/b", "a b", "A-b", "a.b", unicodedata.normalize("NFC", "café"),
            unicodedata.normalize("NFD", "café"), "ca\u0301fe", "日本"]


def test_ids_that_differ_in_punctuation_case_or_unicode_map_to_distinct_tokens_and_files(tmp_path):
    assert len(set(NEAR_IDS)) == len(NEAR_IDS)
    assert len({conv_token(c) for c in NEAR_IDS}) == len(NEAR_IDS)
    files = {index_path(str(tmp_path / "m.sqlite"), c) for c in NEAR_IDS}
    assert len(files) == len(NEAR_IDS)
    assert len({str(f).lower() for f in files}) == len(NEAR_IDS), "distinct on a case-insensitive file system too"
    for c in NEAR_IDS:  # an FTS5 unicode61 token: one run of [0-9a-z]
        assert re.fullmatch(r'"c[0-9a-f]+"', conv_token(c))


def test_conversations_with_near_ids_do_not_leak_into_each_other(tmp_path):
    mem = tmp_path / "m.sqlite"
    places = ["Lisbon", "Oslo", "Kyoto", "Quito", "Accra", "Hanoi", "Lima", "Porto", "Riga", "Tunis"]
    for cid, place in zip(NEAR_IDS, places):
        conv = write_json(tmp_path / "c.json", {"turns": [
            {"user": f"I'm planning a trip to {place} with Maria. My budget for {place} is $1{len(place)}00.",
             "assistant": f"{place} sounds great."},
            {"user": f"Maria wants to visit the old town of {place}.", "assistant": "Noted."}]})
        res = ingest(conv, mem, f"conversation_id={quoted(cid)}")
        assert res["counts"]["nodes"] == 2, f"{cid!r} saw another conversation's nodes"
    s = Store(str(mem))
    assert s.check() == []
    for cid, place in zip(NEAR_IDS, places):
        facts = " ".join(f.text for f in s.facts(cid))
        assert place in facts and not any(p in facts for p in places if p != place)
        assert [n for n, _ in s.keyword_search(cid, "trip budget old town", 10)]
        assert all(s.get_node(n).conversation_id == cid for n, _ in s.keyword_search(cid, "trip budget town", 10))
    s.close()
    for cid, place in zip(NEAR_IDS, places):
        out = ask(mem, f"What is my budget for {place}?", cid)
        text = json.dumps(out["context"]["blocks"], ensure_ascii=False)
        assert place in text and not any(p in text for p in places if p != place), (cid, text)


def test_a_v1_memory_is_migrated_and_its_colliding_ids_separated(tmp_path):
    """A file written by the v1 runtime (lossy tokens: `a-b` and `a_b` shared one) reads correctly."""
    from arbor_train.runtime import store as store_mod

    mem = tmp_path / "m.sqlite"
    for cid, place in (("a-b", "Lisbon"), ("a_b", "Oslo")):
        conv = write_json(tmp_path / "c.json", {"turns": [{"user": f"My trip to {place} costs $900.",
                                                            "assistant": "Noted."}]})
        ingest(conv, mem, f"conversation_id={cid}")
    # rewrite the file as v1 wrote it: the lossy token in every FTS table, no turn_key column
    db = store_mod.sqlite3.connect(mem)
    for fts, base in store_mod.FTS_TABLES.items():
        for (cid,) in db.execute(f"SELECT DISTINCT conversation_id FROM {base}").fetchall():
            db.execute(f"UPDATE {fts} SET conv=? WHERE rowid IN (SELECT id FROM {base} WHERE conversation_id=?)",
                       (store_mod._v1_conv_token(cid), cid))
    db.execute("DROP INDEX nodes_turn")
    db.execute("ALTER TABLE nodes DROP COLUMN turn_key")
    db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    db.commit()
    db.close()
    s = Store(str(mem))
    assert s.get_meta("schema_version") == str(SCHEMA_VERSION) and s.check() == []
    assert [s.get_node(n).conversation_id for n, _ in s.keyword_search("a-b", "trip", 5)] == ["a-b"]
    s.close()


# ---------------------------------------------------------------------- whole file validated first
def test_lone_surrogate_is_refused_before_anything_is_written(tmp_path):
    turns = [dict(t) for t in CONVERSATION["turns"]]
    turns[2] = {**turns[2], "user": "broken \ud800 text"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"turns": turns}), encoding="utf-8")  # ensure_ascii: written as \\ud800
    mem = tmp_path / "m.sqlite"
    with pytest.raises(UserError, match=r"bad\.json: turn 3: field 'user' holds '\\ud800' at character 7"):
        ingest(bad, mem)
    assert not mem.exists(), "nothing may be written for a file that does not validate"
    # into an existing memory: unchanged
    ingest(write_json(tmp_path / "good.json", CONVERSATION), mem)
    before = content(mem)
    with pytest.raises(UserError, match="turn 3"):
        ingest(bad, mem)
    assert content(mem) == before


def test_oversized_turn_is_refused_naming_the_limit(tmp_path):
    big = write_json(tmp_path / "big.json", {"turns": [{"user": "x" * 2_000_001, "assistant": ""}]})
    with pytest.raises(UserError, match=r"big\.json: turn 1: field 'user' has 2,000,001 characters, over the "
                                        r"limit of 200,000 \(runtime\.limits\)"):
        ingest(big, tmp_path / "m.sqlite")
    assert not (tmp_path / "m.sqlite").exists()


def test_pathological_turns_are_handled_in_linear_time():
    """The artifact pattern rescanned a long letter run once per position (100k chars: 14 s)."""
    from arbor_train.runtime.extract import HeuristicExtractor, TurnInput

    h = HeuristicExtractor()

    def cost(n: int) -> float:
        best = float("inf")
        for _ in range(3):
            t = TurnInput("A" + "a" * n, "ok", None)
            t0 = time.perf_counter()
            for kind in ("summary", "entities", "facts", "states", "artifacts", "events"):
                h.run(kind, [t])
            best = min(best, time.perf_counter() - t0)
        return best

    small, large = cost(20_000), cost(200_000)
    # 10x the input: linear work grows ~10x, the old quadratic pattern ~100x
    assert large / small < 35, f"20k chars {small:.4f} s, 200k chars {large:.4f} s"


@pytest.mark.parametrize("obj, match", [
    ({"turns": [{"user": "hi", "assistant": None}]}, r"turn 1: field 'assistant' must be a string, got null"),
    ({"turns": [{"user": "hi", "assistant": "ok", "timestamp": 5}]}, r"turn 1: field 'timestamp' must be a string"),
    ({"conversation_id": "x\u0000y", "turns": [{"user": "hi", "assistant": "ok"}]}, r"'conversation_id' holds a NUL"),
    ({"conversation_id": "", "turns": [{"user": "hi", "assistant": "ok"}]}, r"'conversation_id' is empty"),
    ({"conversation_id": 7, "turns": [{"user": "hi", "assistant": "ok"}]}, r"'conversation_id' must be a string"),
    ({"turns": [{"user": "  ", "assistant": "ok"}]}, r"turn 1: field 'user' is empty"),
])
def test_malformed_fields_name_file_turn_and_field(tmp_path, obj, match):
    with pytest.raises(UserError, match=match):
        load_conversation(write_json(tmp_path / "c.json", obj))


def test_duplicated_field_is_refused(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"turns": [{"user": "hi", "user": "again", "assistant": "ok"}]}')
    with pytest.raises(UserError, match=r"field 'user' appears twice"):
        load_conversation(p)


def test_cli_user_errors_print_error_and_exit_2_without_traceback(tmp_path):
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    r = subprocess.run([sys.executable, "-m", "arbor_train.runtime.cli", "command=ingest", f"input={conv}",
                        f"memory={tmp_path / 'm.sqlite'}", "reset=maybe", "hydra.run.dir=" + str(tmp_path / "h")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "error: option reset must be true or false, got 'maybe'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "m.sqlite").exists()


# ---------------------------------------------------------------------- idempotent, resumable ingest
def test_ingesting_a_file_twice_stores_each_turn_once(tmp_path, capsys):
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    mem = tmp_path / "m.sqlite"
    ingest(conv, mem)
    once = content(mem)
    res = ingest(conv, mem)
    assert res["skipped"] == 6 and res["counts"]["nodes"] == 6
    assert "6 turns in the file: 6 already stored, 0 forgotten on request (skipped), 0 to add" in capsys.readouterr().out
    assert content(mem) == once


def test_a_grown_transcript_appends_only_its_new_turns(tmp_path):
    mem = tmp_path / "m.sqlite"
    ingest(write_json(tmp_path / "a.json", {"turns": CONVERSATION["turns"][:4]}), mem)
    res = ingest(write_json(tmp_path / "b.json", CONVERSATION), mem)
    assert res["skipped"] == 4 and [r["turn"] for r in res["routes"]] == [5, 6]
    assert content(mem) == content_of_one_ingest(tmp_path, CONVERSATION)


def test_repeated_identical_turns_keep_their_own_identity(tmp_path):
    turns = [{"user": "ok", "assistant": "ok"}] * 3
    assert len(set(turn_keys(turns))) == 3
    res = ingest(write_json(tmp_path / "c.json", {"turns": turns}), tmp_path / "m.sqlite")
    assert res["counts"]["nodes"] == 3


def content_of_one_ingest(tmp_path: Path, conversation: dict, name: str = "ref") -> str:
    ref = tmp_path / f"{name}.sqlite"
    if not ref.exists():
        ingest(write_json(tmp_path / f"{name}.json", conversation), ref)
    return content(ref)


# ---------------------------------------------------------------------- kills at random points
def _child_ingest(conv_file: str, mem: str, overrides: tuple = (), conn=None) -> None:
    """A forked ingest. It reports each commit on `conn`, so the parent can kill it at a chosen point."""
    import threading

    from tqdm import tqdm

    # tqdm's default lock is a multiprocessing semaphore inherited across fork: a child killed while
    # holding it would leave the parent waiting on it forever. This child gets a lock of its own.
    tqdm.set_lock(threading.RLock())
    sys.stdout = open(os.devnull, "w")
    sys.stderr = open(os.devnull, "w")
    if conn is not None:
        commit = ArborMemory.commit

        def reporting_commit(self, *args, **kwargs):
            node = commit(self, *args, **kwargs)
            conn.send(node.id)
            return node

        ArborMemory.commit = reporting_commit
    try:
        ingest(Path(conv_file), Path(mem), *overrides)
    finally:
        os._exit(0)


def stored_nodes(mem: Path) -> int:
    if not mem.exists():
        return 0
    s = Store(str(mem))
    try:
        return s.count_nodes("default")
    finally:
        s.close()


def kill_after(target, args: tuple, reports: int, rng: random.Random, timeout_s: float = 120) -> bool:
    """Fork `target(*args, conn)`, wait for `reports` messages on conn (or its end), then 0-4 ms, then
    SIGKILL it if it still runs. Returns whether it was killed."""
    receiver, sender = FORK.Pipe(duplex=False)
    p = FORK.Process(target=target, args=(*args, sender))
    p.start()
    seen, deadline = 0, time.monotonic() + timeout_s
    while seen < reports and p.is_alive() and time.monotonic() < deadline:
        if receiver.poll(0.1):
            receiver.recv()
            seen += 1
    time.sleep(rng.uniform(0.0, 0.004))
    killed = p.is_alive()
    if killed:
        os.kill(p.pid, signal.SIGKILL)
    p.join()
    receiver.close()
    sender.close()
    return killed


def kill_trials(tmp_path: Path, want: int, max_trials: int, seed: int) -> dict:
    """Kill ingests at random times until `want` kills cut one short (at most max_trials tries), four per
    file in a row; check every reopened memory, and resume each file to the end."""
    conversation = long_conversation()
    conv = write_json(tmp_path / "long.json", conversation)
    n = len(conversation["turns"])
    reference = content_of_one_ingest(tmp_path, conversation, "long_ref")
    rng = random.Random(seed)
    stats = {"trials": 0, "kills": 0, "mid_ingest": 0, "resumes": 0, "files": 0}
    mem = tmp_path / "killed_0.sqlite"
    trial = -1
    while stats["mid_ingest"] < want and trial + 1 < max_trials:
        trial += 1
        if trial % 4 == 0:  # a fresh file every 4 kills: kills pile up on one file, then it resumes
            mem = tmp_path / f"killed_{trial}.sqlite"
            stats["files"] += 1
        stats["trials"] += 1
        had = stored_nodes(mem)
        # kill after a random number of this child's commits, then a random few ms: inside the next
        # commit, between two, or (no turns left) anywhere in its start-up
        killed = kill_after(_child_ingest, (str(conv), str(mem), ()), rng.randrange(max(1, n - had)), rng)
        stats["kills"] += killed
        if mem.exists():
            assert problems(mem) == [], f"trial {trial}: memory inconsistent after a kill"
            k = stored_nodes(mem)
            # the kill cut an ingest short: it had turns left to store and did not store them all
            stats["mid_ingest"] += killed and had < n and k < n
        if trial % 4 == 3 or stats["mid_ingest"] >= want or trial + 1 == max_trials:
            res = ingest(conv, mem)
            stats["resumes"] += 1
            assert res["counts"]["nodes"] == n and res["skipped"] + len(res["routes"]) == n
            assert content(mem) == reference, f"trial {trial}: resumed memory differs from an uninterrupted ingest"
    return stats


def test_killed_ingests_reopen_consistent_and_resume_to_the_same_content(tmp_path):
    stats = kill_trials(tmp_path, want=8, max_trials=30, seed=0)
    print(f"\nkill trials: {stats}")
    assert stats["mid_ingest"] >= 8, stats


@pytest.mark.slow
def test_killed_ingests_many_times(tmp_path):
    stats = kill_trials(tmp_path, want=60, max_trials=200, seed=1)
    print(f"\nkill trials: {stats}")
    assert stats["mid_ingest"] >= 60, stats


# ---------------------------------------------------------------------- one writer, consistent readers
def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    mem = tmp_path / "m.sqlite"
    holder = Store(str(mem))
    holder.lock_for_writing()
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    t0 = time.perf_counter()
    with pytest.raises(MemoryBusy, match=rf"being written by another process \(pid {os.getpid()}\); waited 0\.3 s"):
        ingest(conv, mem, "runtime.store.lock_timeout_s=0.3")
    assert time.perf_counter() - t0 >= 0.3
    assert Store(str(mem)).count_nodes("default") == 0
    holder.close()
    assert ingest(conv, mem)["counts"]["nodes"] == 6  # released on close


def test_two_writers_on_one_conversation_end_as_one_ingest(tmp_path):
    conversation = long_conversation()
    conv = write_json(tmp_path / "long.json", conversation)
    mem = tmp_path / "m.sqlite"
    procs = [FORK.Process(target=_child_ingest, args=(str(conv), str(mem), ("runtime.store.lock_timeout_s=120",)))
             for _ in range(2)]
    for p in procs:
        p.start()
    # a reader polls while they run: every snapshot is a whole number of commits, never a half-commit
    reads = 0
    while any(p.is_alive() for p in procs):
        if mem.exists():
            s = Store(str(mem))
            with s.snapshot():
                nodes = s.count_nodes("default")
                fts = s.db.execute("SELECT COUNT(*) FROM node_fts").fetchone()[0]
                facts_ok = all(s.get_node(src) is not None for f in s.facts("default") for src in f.sources)
            s.close()
            assert nodes == fts and facts_ok
            reads += 1
        time.sleep(0.02)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert reads > 0
    assert problems(mem) == []
    assert content(mem) == content_of_one_ingest(tmp_path, conversation, "long_ref")


# ---------------------------------------------------------------------- fuzzed input never changes the memory
TEXT = st.one_of(st.text(max_size=40), st.just("\ud800"), st.just("a\x00b"), st.just("x" * 600), st.just(""),
                 st.just("   "))
VALUE = st.one_of(TEXT, st.none(), st.integers(), st.booleans(), st.floats(allow_nan=True),
                  st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
WORDS = st.lists(st.sampled_from(["Maria", "Lisbon", "budget", "is", "$1200", "the", "hotel", "Dr.", "Chen",
                                  "talk", "ok", "itinerary:", "Belem,", "then", "Alfama"]), min_size=1, max_size=12)
VALID_TURN = st.fixed_dictionaries({"user": WORDS.map(" ".join), "assistant": WORDS.map(" ".join)},
                                   optional={"timestamp": st.sampled_from(["2024-03-01", "May 2", ""])})
TURN = st.one_of(
    VALID_TURN, VALID_TURN,
    st.fixed_dictionaries({"user": TEXT, "assistant": TEXT}, optional={"timestamp": st.one_of(TEXT, st.integers())}),
    st.dictionaries(st.sampled_from(["user", "assistant", "timestamp", "speaker"]), VALUE, max_size=4),
    VALUE,
)
FILE = st.one_of(
    st.fixed_dictionaries({"turns": st.lists(VALID_TURN, min_size=1, max_size=4)}),
    st.fixed_dictionaries({"turns": st.lists(TURN, max_size=4)}, optional={"conversation_id": VALUE}),
    st.lists(TURN, max_size=4),
    VALUE,
    st.text(max_size=60).map(lambda t: ("raw", t)),  # not JSON at all
)
OPTIONS = st.fixed_dictionaries({
    "reset": st.sampled_from([None, None, "false", "no", "maybe", "2", "off", "true"]),
    "conversation_id": st.sampled_from([None, None, "default", "a-b", "a_b", "x" * 300, "''"]),
    "suffix": st.sampled_from([".json", ".jsonl", ".txt"]),
})
FUZZ_STATS = {"inputs": 0, "refused": 0, "ingested": 0}
FUZZ_MESSAGES: list[str] = []


def fuzz_body(data, options, base: Path, work: Path) -> None:
    import shutil

    work.mkdir(exist_ok=True)
    mem = work / "m.sqlite"
    for f in work.iterdir():
        if f.is_file():
            f.unlink()
    shutil.copy(base, mem)
    before = content(mem)
    src = work / f"in{options['suffix']}"
    if isinstance(data, tuple):
        src.write_text(data[1], encoding="utf-8", errors="surrogatepass")
    elif options["suffix"] == ".jsonl" and isinstance(data, dict) and isinstance(data.get("turns"), list):
        src.write_text("\n".join(json.dumps(t) for t in data["turns"]), encoding="utf-8")
    else:
        src.write_text(json.dumps(data), encoding="utf-8")
    overrides = ["runtime.limits.max_field_chars=500", "runtime.store.lock_timeout_s=0"]
    if options["reset"] is not None:
        overrides.append(f"reset={options['reset']}")
    if options["conversation_id"] is not None:
        overrides.append(f"conversation_id={options['conversation_id']}")
    FUZZ_STATS["inputs"] += 1
    try:
        res = ingest(src, mem, *overrides)
    except UserError as e:
        FUZZ_STATS["refused"] += 1
        FUZZ_MESSAGES.append(str(e))
        assert content(mem) == before, "a refused input changed the stored memory"
        return
    FUZZ_STATS["ingested"] += 1
    assert problems(mem) == []
    assert res["counts"]["nodes"] >= res["turns"] - res["skipped"]


@pytest.fixture(scope="module")
def fuzz_base(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzbase")
    mem = d / "base.sqlite"
    ingest(write_json(d / "conv.json", CONVERSATION), mem)
    ingest(write_json(d / "conv.json", CONVERSATION), mem, "conversation_id=a-b")
    return mem


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=FILE, options=OPTIONS)
def test_fuzzed_files_and_options_are_refused_clearly_or_ingested(data, options, fuzz_base, tmp_path_factory):
    fuzz_body(data, options, fuzz_base, fuzz_base.parent / "work")


@pytest.mark.slow
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=FILE, options=OPTIONS)
def test_fuzzed_files_and_options_long_profile(data, options, fuzz_base, tmp_path_factory):
    fuzz_body(data, options, fuzz_base, fuzz_base.parent / "work_long")


def test_zz_fuzz_report():
    """Prints how many generated inputs the fuzz tests above tried (run with -s to see it)."""
    print(f"\nfuzz: {FUZZ_STATS}")
    for m in sorted({re.sub(r"/\S+/", "…/", m)[:140] for m in FUZZ_MESSAGES})[:40]:
        print("  refused:", m)
    if FUZZ_STATS["inputs"]:
        assert FUZZ_STATS["refused"] > 0 and FUZZ_STATS["ingested"] > 0, FUZZ_STATS


# ---------------------------------------------------------------------- the tuned router reads real text
def _locomo_turns(limit: int = 120) -> list[dict]:
    from arbor_train.conversations.locomo import load_locomo

    files = sorted(LOCOMO.glob("*.json"))
    conv = load_locomo(files[0])[0]
    raw = [t for _, t in conv.turns()]
    longest = max(range(len(raw)), key=lambda i: len(raw[i].content))
    start = max(0, min(longest - limit // 2, len(raw) - limit))
    raw = raw[start:start + limit]
    return [{"user": raw[i].content, "assistant": raw[i + 1].content if i + 1 < len(raw) else ""}
            for i in range(0, len(raw), 2)]


@pytest.mark.skipif(not LOCOMO.exists(), reason="../shared/data/locomo is not beside the repository")
def test_a_tuned_cross_encoder_bundle_ingests_a_real_conversation(tmp_path):
    """LoCoMo turns longer than the 64-token pair stopped the tuned reranker ("Sequence to truncate too
    short"); a LoRA bundle of the cross-encoder kind now routes a whole real slice with its longest turn."""
    from peft import LoraConfig, get_peft_model
    from test_runtime_models import MINILM, manifest, tiny_bert
    from transformers import AutoTokenizer

    from arbor_train.modelref import resolve
    from arbor_train.runtime import write_manifest

    base, base_dir = tiny_bert(tmp_path)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["query", "value"], modules_to_save=["classifier"],
                                            task_type="SEQ_CLS", init_lora_weights=False))
    bundle = tmp_path / "bundle"
    model.save_pretrained(bundle / "adapter")
    tok = AutoTokenizer.from_pretrained(resolve(MINILM))
    tok.save_pretrained(bundle / "tokenizer")
    write_manifest(bundle, manifest("reranker", "cross_encoder", base_dir, {"name": "cross_encoder_pair", "version": "1"}))
    turns = _locomo_turns()
    assert max(len(tok(t["user"])["input_ids"]) for t in turns) > 64, "the slice must hold a turn over 64 tokens"
    conv = write_json(tmp_path / "locomo.json", {"turns": turns})
    res = ingest(conv, tmp_path / "m.sqlite", "runtime.reranker.kind=bundle", f"runtime.reranker.bundle.path={bundle}",
                 "runtime.reranker.bundle.quantize=null")
    assert res["counts"]["nodes"] == len(turns)
    assert any(r["route"] == "rerank" for r in res["routes"]), "the bundle reranker was never consulted"


@pytest.mark.slow
@pytest.mark.skipif(not LOCOMO.exists(), reason="../shared/data/locomo is not beside the repository")
def test_the_minilm_profile_ingests_a_real_conversation(tmp_path):
    turns = _locomo_turns(80)
    conv = write_json(tmp_path / "locomo.json", {"turns": turns})
    res = ingest(conv, tmp_path / "m.sqlite", "runtime/components=minilm")
    assert res["counts"]["nodes"] == len(turns)
    assert any(r["route"] == "rerank" for r in res["routes"])
