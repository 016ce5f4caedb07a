"""The packages' import graph: no cycles between modules, no private names imported across modules."""

import ast
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
