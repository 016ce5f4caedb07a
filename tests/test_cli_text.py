"""Text in and out of the runtime CLI (issue #39): stored text is printed with control characters and bidi
overrides escaped, and a question needs no Hydra quoting after `--`."""

import subprocess
import sys

from test_runtime_cli import make_cfg, write_json
from test_runtime_reliability import ingest

from arbor_train.runtime.cli import plain_argv, run


def test_control_characters_and_bidi_overrides_in_stored_text_are_escaped_when_printed(tmp_path, capsys):
    """Before: `ask` and `show` wrote stored text as it was, so a turn could send terminal escapes, or a bidi
    override that makes a line read other than it is."""
    mem = tmp_path / "m.sqlite"
    evil = "Maria's budget is 900 \x1b[2J\x1b]0;owned\x07 euros \u202eoruе 009\u202c and Lisbon \u2066ok\u2069."
    ingest(write_json(tmp_path / "c.json", {"turns": [{"user": evil, "assistant": "Noted."}]}), mem)
    capsys.readouterr()
    run(make_cfg("command=ask", f"memory={mem}", "question=budget"))
    run(make_cfg("command=show", f"memory={mem}"))
    out = capsys.readouterr().out
    for bad in ("\x1b", "\x07", "\u202e", "\u202c", "\u2066", "\u2069"):
        assert bad not in out
    assert "\\x1b[2J" in out and "\\u202e" in out and "Maria's budget is 900" in out


def test_a_question_after_double_dash_needs_no_hydra_quoting(tmp_path):
    """Before: `question="What is Bob's venue?"` (the README's own example) failed in Hydra's parser."""
    assert plain_argv(["ask", "memory=m", "--", "What", "is", "Bob's", "venue", "(new)?", "a=b,c"]) == \
        ["command=ask", "memory=m", "question='What is Bob\\'s venue (new)? a=b,c'"]
    mem = tmp_path / "m.sqlite"
    ingest(write_json(tmp_path / "c.json", {"turns": [{"user": "Bob's venue is Hotel Infante (Porto).",
                                                      "assistant": "Noted."}]}), mem)
    q = "What is Bob's venue (the hotel), = ?"
    p = subprocess.run([sys.executable, "-m", "arbor_train.runtime.cli", "ask", f"memory={mem}", "--", q],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Hotel Infante" in p.stdout
    p = subprocess.run([sys.executable, "-m", "arbor_train.runtime.cli", "forget", f"memory={mem}", "dry_run=true",
                        "--", q], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0 and "would forget 1 nodes" in p.stdout, p.stderr[-2000:]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c.json", "m.sqlite", "m.sqlite.hnsw", "m.sqlite.lock"]
