"""The packages' import graph: no cycles between modules, no private names imported across modules."""

import ast
import re
from pathlib import Path

from arbor_train.paths import REPO_ROOT

PACKAGES = ("arbor_train", "data_gen", "eval")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (REPO_ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(REPO_ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(name: str, path: Path, known: dict) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in the file, at any depth (a function's
    lazy import is an edge too)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub, []) if sub in known else (base, [a.name]))
    return [(m, n) for m, n in out if m in known]


def test_no_import_cycle_between_modules():
    known = modules()
    graph = {m: {dep for dep, _ in imports(m, p, known) if dep != m} for m, p in known.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_name_is_imported_from_another_module():
    known = modules()
    bad = [f"{m} imports {n} from {dep}" for m, p in known.items() for dep, names in imports(m, p, known)
           for n in names if n.startswith("_") and not n.startswith("__") and dep != m]
    assert not bad, "\n".join(bad)


SQL = re.compile(r"""(?:f?["'])\s*(?:SELECT|INSERT|UPDATE|DELETE|CREATE|WITH RECURSIVE)\b""")
# the modules that may hold SQL, each with its own database: the memory file's statements all live in the
# store module; the others are separate SQLite files or in-memory indexes, never the memory file
OWN_DATABASES = {
    "arbor_train/runtime/store.py": "the memory file (every statement on it, forgetting's included)",
    "arbor_train/runtime/kvcache.py": "the extraction cache (a key-value file of its own)",
    "eval/answers.py": "the answer cache (a key-value file of its own, with its source index)",
    "arbor_train/replay/methods.py": "the BM25 baseline's in-memory FTS5 index",
}


def test_sql_on_the_memory_file_stays_inside_the_store_module():
    """No module but the store's writes SQL against the memory (forget.py decides what goes; the Store
    runs it), and the other modules holding SQL each own a separate database."""
    found = sorted(str(p.relative_to(REPO_ROOT)) for p in modules().values() if SQL.search(p.read_text()))
    assert found == sorted(OWN_DATABASES), f"SQL outside its owners: {sorted(set(found) - set(OWN_DATABASES))}"
    for f in found:
        if f != "arbor_train/runtime/store.py":
            assert not re.search(r"\b(?:store|st)\.db\b", (REPO_ROOT / f).read_text()), f
    for p in modules().values():
        if p.name != "store.py":
            assert not re.search(r"\b(?:store|st)\.db\.execute", p.read_text()), p
