"""Forest invariants (property-based), persistence, reopen after a kill mid-commit, index catch-up."""

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbor_train.runtime import ArborMemory, Localization

WORDS = ["Alice", "Bob", "Lisbon", "Porto", "budget", "venue", "trip", "agenda", "$500", "June", "hotel", "run"]


def check_invariants(mem: ArborMemory) -> None:
    nodes = {n.id: n for n in mem.nodes()}
    seqs = sorted(n.seq for n in nodes.values())
    assert seqs == list(range(len(nodes))), "sequence positions are gap-free"
    for n in nodes.values():
        if n.parent_id is None:
            assert n.depth == 0 and n.root_id == n.id
        else:
            p = nodes[n.parent_id]  # the parent exists, in the same conversation
            assert p.seq < n.seq, "a parent is committed before its child"
            assert n.depth == p.depth + 1 and n.root_id == p.root_id
        # no cycles: walking up reaches a root in exactly `depth` steps
        cur, steps = n, 0
        while cur.parent_id is not None:
            cur = nodes[cur.parent_id]
            steps += 1
            assert steps <= len(nodes)
        assert steps == n.depth and cur.id == n.root_id
        path = mem.store.trajectory(n.id)
        assert [x.depth for x in path] == list(range(n.depth + 1))
        assert path[0].id == n.root_id and path[-1].id == n.id


turn_text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
ops = st.lists(
    st.tuples(turn_text, st.one_of(st.none(), st.integers(min_value=0, max_value=10_000), st.just("auto"))),
    min_size=1, max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_forest_invariants_hold_for_any_commit_sequence(ops, runtime_cfg, tmp_path_factory):
    path = tmp_path_factory.mktemp("forest") / "m.sqlite"
    mem = ArborMemory.open(path, "c", runtime_cfg)
    for text, choice in ops:
        existing = [n.id for n in mem.nodes()]
        if choice == "auto":
            loc = mem.localize(text)
        elif choice is None or not existing:
            loc = Localization(None, "test", 1.0)
        else:
            loc = Localization(existing[choice % len(existing)], "test", 1.0)
        mem.commit(text, "ok", loc)
    check_invariants(mem)
    before = [n.to_json() for n in mem.nodes()]
    mem.close()
    mem = ArborMemory.open(path, "c", runtime_cfg)
    assert [n.to_json() for n in mem.nodes()] == before
    check_invariants(mem)
    mem.close()


def test_commit_rejects_parent_from_another_conversation(runtime_cfg, tmp_path):
    mem = ArborMemory.open(tmp_path / "m.sqlite", "a", runtime_cfg)
    node, _ = mem.step("Alice plans a trip to Lisbon.", "ok")
    other = mem.for_conversation("b")
    with pytest.raises(ValueError, match="not in conversation 'b'"):
        other.commit("hello", "hi", Localization(node.id, "test", 1.0))
    assert other.stats()["nodes"] == 0 and mem.stats()["nodes"] == 1
    mem.close()


def test_conversations_are_isolated(runtime_cfg, tmp_path, turns):
    mem = ArborMemory.open(tmp_path / "m.sqlite", "a", runtime_cfg)
    for u, a in turns:
        mem.step(u, a)
    other = mem.for_conversation("b")
    other.step("Carol is repainting her kitchen in green.", "Nice.")
    loc, ctx = other.read("What is Alice's budget?")
    assert "Alice" not in ctx.text
    assert all(c.node_id in {n.id for n in other.nodes()} for c in loc.candidates)
    mem.close()


def _questions():
    return ["What is Alice's current budget?", "What was Alice's previous budget?",
            "What is the order of stops in Alice's itinerary?", "How many km did I run in total?",
            "What is Bob's venue?"]


def _answers(mem):
    out = []
    for q in _questions():
        loc, ctx = mem.read(q, now="2024-06-01")
        out.append((loc.parent_id, loc.route, round(loc.score, 6), ctx.text))
    return out


def test_close_and_reopen_answers_exactly_as_before(runtime_cfg, tmp_path, turns):
    path = tmp_path / "m.sqlite"
    mem = ArborMemory.open(path, "c", runtime_cfg)
    for u, a in turns:
        mem.step(u, a, "2024-05-01")
    before = _answers(mem)
    mem.close()
    mem = ArborMemory.open(path, "c", runtime_cfg)
    assert _answers(mem) == before
    mem.close()


def test_index_is_rebuilt_when_missing_or_ahead_of_the_database(runtime_cfg, tmp_path, turns):
    path = tmp_path / "m.sqlite"
    mem = ArborMemory.open(path, "c", runtime_cfg)
    for u, a in turns:
        mem.step(u, a)
    before = _answers(mem)
    index_file = mem.index.path
    mem.close()
    index_file.unlink()
    mem = ArborMemory.open(path, "c", runtime_cfg)
    assert len(mem.index) == len(turns) and _answers(mem) == before
    mem.close()
    # an index file from a bigger memory (ahead of this database) is not trusted
    big = tmp_path / "big.sqlite"
    mem = ArborMemory.open(big, "c", runtime_cfg)
    for u, a in turns + turns:
        mem.step(u, a)
    mem.close()
    small = tmp_path / "small.sqlite"
    mem = ArborMemory.open(small, "c", runtime_cfg)
    for u, a in turns[:3]:
        mem.step(u, a)
    mem.close()
    from arbor_train.runtime.index import index_path

    index_path(str(small), "c").write_bytes(index_path(str(big), "c").read_bytes())
    mem = ArborMemory.open(small, "c", runtime_cfg)
    assert len(mem.index) == 3
    mem.close()


KILL_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from arbor_train.runtime import ArborMemory, default_config
    from arbor_train.runtime.store import Store
    turns = json.loads(sys.argv[2])
    mem = ArborMemory.open(sys.argv[1], "c", default_config())
    for u, a in turns[:-1]:
        mem.step(u, a, "2024-05-01")
    mem.index.save()
    original = Store.add_fact
    def slow_add_fact(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        print("IN_TRANSACTION", flush=True)   # the node row and its first fact are written, not committed
        time.sleep(60)
        return out
    Store.add_fact = slow_add_fact
    u, a = turns[-1]
    mem.step(u, a, "2024-05-01")
    print("COMMITTED", flush=True)
    """
)


def test_reopen_is_consistent_after_kill_during_commit(runtime_cfg, tmp_path, turns):
    path = tmp_path / "m.sqlite"
    script = tmp_path / "killme.py"
    script.write_text(KILL_SCRIPT)
    last = ("Change Alice's budget to $1900. Alice also booked the Pena Palace tour.", "Updated.")
    proc = subprocess.Popen([sys.executable, str(script), str(path), json.dumps(turns + [last])],
                            stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    line = ""
    while time.time() < deadline:
        line = proc.stdout.readline()
        if "IN_TRANSACTION" in line or not line:
            break
    assert "IN_TRANSACTION" in line, "the child never reached the middle of a commit"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    reference = ArborMemory.open(tmp_path / "ref.sqlite", "c", runtime_cfg)
    for u, a in turns:
        reference.step(u, a, "2024-05-01")
    mem = ArborMemory.open(path, "c", runtime_cfg)
    assert mem.stats() == reference.stats(), "the killed commit left nothing behind"
    assert "$1900" not in json.dumps([r.value for r in mem.store.records("c")])
    check_invariants(mem)
    assert _answers(mem) == _answers(reference)
    # the memory keeps working: the same turn commits normally now
    mem.step(*last, "2024-05-01")
    assert mem.stats()["nodes"] == len(turns) + 1
    mem.close()
    reference.close()
