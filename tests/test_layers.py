"""The direction of imports: every layer points down (docs/reference/layout.md draws it).

    eval.{pipeline, pipeline_report, locomo_cv}    orchestration: runs everything below as stages
    eval                                           evaluation: protocols, compare, report, benchmarks
    data_gen                                       supervision: BranchMemEval plans, miners
    arbor_train                                    the library: runtime, conversations, scoring, replay,
                                                   roles and training

Every import statement counts, also those inside functions, read from the source (AST), so a lazy
import cannot hide an upward edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from arbor_train.paths import REPO_ROOT

PACKAGES = ("arbor_train", "data_gen", "eval")
ORCHESTRATION = {"eval.pipeline", "eval.pipeline_report", "eval.locomo_cv"}
# the only modules of the library outside itself that the runtime may import
RUNTIME_REACHES = {"arbor_train.errors", "arbor_train.paths", "arbor_train.prompts", "arbor_train.modelref",
                   "arbor_train.conversations.files"}


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> set[str]:
    """The project modules a source file imports (absolute names; relative imports resolved)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in out if m.split(".")[0] in PACKAGES}


def graph(root: Path = REPO_ROOT) -> dict[str, set[str]]:
    known = {module_name(p, root) for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    edges = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            # `from pkg import name` adds pkg.name: keep it only where it names a module
            edges[module_name(p, root)] = {m for m in imports_of(p, root) if m in known}
    return edges


def violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for src, dsts in sorted(edges.items()):
        top = src.split(".")[0]
        for dst in sorted(dsts):
            dtop = dst.split(".")[0]
            if top == "arbor_train" and dtop != "arbor_train":
                out.append(f"{src} -> {dst}: the library imports nothing above it")
            elif top == "data_gen" and dtop == "eval":
                out.append(f"{src} -> {dst}: data generation does not import evaluation")
            elif dst in ORCHESTRATION and src not in ORCHESTRATION:
                out.append(f"{src} -> {dst}: orchestration is imported by nothing it runs")
            elif (src.startswith("arbor_train.runtime") and not dst.startswith("arbor_train.runtime")
                  and dst not in RUNTIME_REACHES):
                out.append(f"{src} -> {dst}: the runtime reaches outside itself only to {sorted(RUNTIME_REACHES)}")
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (strongly connected)."""

    def reach(a: str) -> set[str]:
        seen, todo = set(), [a]
        while todo:
            for n in edges.get(todo.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    r = {m: reach(m) for m in edges}
    groups = {frozenset([a, *(b for b in r[a] if a in r.get(b, ()))]) for a in r}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def test_every_import_points_down():
    bad = violations(graph())
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, f"units that import each other: {found}"


@pytest.mark.parametrize("src, line, expect", [
    ("arbor_train/roles/reader.py", "from eval.report import table", "the library imports nothing above it"),
    ("arbor_train/runtime/memory.py", "from arbor_train.scoring.answers import mentions", "the runtime reaches"),
    ("data_gen/reader.py", "from eval.run import main", "data generation does not import evaluation"),
    ("eval/run.py", "from eval.pipeline import plan", "orchestration is imported by nothing it runs"),
])
def test_an_upward_import_added_back_is_caught(tmp_path, src, line, expect):
    """The checker on a copy of the tree with one upward import added inside a function (lazy)."""
    import shutil

    for pkg in PACKAGES:
        shutil.copytree(REPO_ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    f = tmp_path / src
    f.write_text(f.read_text() + f"\n\ndef _added():\n    {line}\n")
    bad = violations(graph(tmp_path))
    assert any(expect in b and b.startswith(module_name(f, tmp_path)) for b in bad), bad


def test_a_cycle_is_caught(tmp_path):
    import shutil

    for pkg in PACKAGES:
        shutil.copytree(REPO_ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    f = tmp_path / "arbor_train" / "scoring" / "answers.py"  # answers -> replay.sessions, which scores with answers
    f.write_text(f.read_text() + "\n\ndef _added():\n    from arbor_train.replay.sessions import replay_session\n")
    assert ["arbor_train.replay.sessions", "arbor_train.scoring.answers"] in cycles(graph(tmp_path))


# the memory file's SQL lives in the store; forget.py's cascade moves into it with the forget rework (issue #39)
SQL_OUTSIDE_THE_STORE = {"arbor_train/runtime/forget.py"}


def test_the_memory_files_sql_stays_in_the_store():
    """No module runs SQL on a memory store's connection (`store.db`) but store.py (and the listed one)."""
    import re

    found = sorted(str(p.relative_to(REPO_ROOT)) for pkg in PACKAGES for p in (REPO_ROOT / pkg).rglob("*.py")
                   if re.search(r"\b(store|st)\.db\b", p.read_text()))
    allowed = {"arbor_train/runtime/store.py", *SQL_OUTSIDE_THE_STORE}
    assert set(found) <= allowed, f"SQL on the memory store outside store.py: {sorted(set(found) - allowed)}"


def test_evidence_layers_see_sources_not_the_memory():
    """A read layer gets `Sources` (store, conversation, config, ablations, tagger, index, embedder), never
    the ArborMemory object."""
    text = (REPO_ROOT / "arbor_train" / "runtime" / "layers.py").read_text()
    assert ".mem." not in text and "mem: Any" not in text and "src: Sources" in text
