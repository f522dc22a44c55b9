"""The layering (issue #15): kernels and storage depend on nothing above them, importing them loads
neither the engine nor FAISS, and module-level imports inside mvdb form no cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"mvdb": ROOT / "mvdb", "mvdb.kernels": ROOT / "kernels", "mvdb.storage": ROOT / "storage"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if not (pkg == "mvdb" and parts[:1] in (["kernels"], ["storage"])):
                out[name] = f
    return out


def _imports(path: Path, module: str) -> set[str]:
    """Modules a module imports, at module level or lazily inside functions (a lazy import still
    ties the two modules together)."""
    tree = ast.parse(path.read_text())
    out = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out.add(name)
            out |= {f"{name}.{a.name}" for a in node.names}
    return out


def test_kernels_and_storage_import_nothing_above_them():
    mods = _modules()
    bad = []
    for name, path in mods.items():
        layer = "mvdb.kernels" if name.startswith("mvdb.kernels") else "mvdb.storage" if name.startswith("mvdb.storage") else None
        if layer is None:
            continue
        allowed = ("mvdb.kernels",) if layer == "mvdb.kernels" else ("mvdb.kernels", "mvdb.storage")
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # lazy imports count too: a layer never reaches up
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{name} imports {n}" for n in names if n.startswith("mvdb") and not n.startswith(allowed)]
    assert not bad, bad


def test_no_import_cycles_inside_mvdb():
    mods = _modules()
    graph = {m: {i for i in _imports(p, m) if i in mods and i != m} for m, p in mods.items()}
    # a package's __init__ importing its own submodules is how packages work, not a cycle
    graph = {m: {i for i in deps if not i.startswith(m + ".")} for m, deps in graph.items()}
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d):] + [d] if d in stack else [m, d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


@pytest.mark.parametrize("module, absent", [
    ("mvdb.kernels", ["h5py", "faiss", "mvdb.database", "mvdb.engine"]),
    ("mvdb.storage", ["faiss", "mvdb.database", "mvdb.engine"]),
    ("mvdb", ["h5py", "faiss", "mvdb.database", "mvdb.engine", "mvdb.storage"]),
])
def test_importing_a_layer_loads_nothing_above_it(module, absent):
    code = f"import {module}, sys; print([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
