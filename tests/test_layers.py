"""The layering (issue #15): kernels and storage depend on nothing above them, importing them loads
neither the engine nor FAISS, and module-level imports inside mvdb form no cycle. Modules stay
small enough to read (issue #46)."""

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


@pytest.mark.heavy
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


def _package(module: str) -> str:
    """The package a module belongs to for the private-name rule: mvdb.kernels, mvdb.storage, a
    subpackage of mvdb (mvdb.engine, mvdb.shards, ...), or mvdb itself for its top-level modules."""
    parts = module.split(".")
    if len(parts) >= 3 or (len(parts) == 2 and (ROOT / "mvdb" / parts[1]).is_dir()) or parts[:2] in (
            ["mvdb", "kernels"], ["mvdb", "storage"]):
        return ".".join(parts[:2])
    return "mvdb"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_crosses_a_package_boundary():
    """``from a.b import _x`` only inside a's package, and ``obj._x`` (obj not self/cls) only for
    a private name some module of the same package defines: the engine does not reach into the
    store's members, nor the facade into the engine's."""
    mods = _modules()
    defined: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        names = defined.setdefault(_package(name), set())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
                names.add(node.id)
    bad = []
    for name, path in mods.items():
        pkg = _package(name)
        tree = ast.parse(path.read_text())
        outside = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for a in node.names if not a.name.startswith("mvdb")}  # os, sys, ...: not ours to police
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                target = node.module if node.module.startswith("mvdb") else None
                for a in node.names:
                    if target and _private(a.name) and _package(target + "." + a.name) != pkg:
                        bad.append(f"{name} imports {target}.{a.name}")
                if target and _private(target.split(".")[-1]) and _package(target) != pkg:
                    bad.append(f"{name} imports the private module {target}")
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", *outside):
                    continue
                if node.attr not in defined.get(pkg, set()):
                    bad.append(f"{name} reads {ast.unparse(node)}, a private name of another package")
    assert not bad, bad


def test_environment_variables_are_read_in_one_module():
    """mvdb.kernels.settings reads every environment variable the library reads (issue #46)."""
    bad = []
    for name, path in _modules().items():
        if name == "mvdb.kernels.settings":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                bad.append(f"{name}:{node.lineno}")
    # setting a variable for a library mvdb calls is not reading one: embed.py's offline switch
    assert [b for b in bad if not b.startswith("mvdb.embed:")] == [], bad


MAX_LINES = 600


def _triton_kernels(tree: ast.Module) -> int:
    """How many functions of a module are ``@triton.jit`` kernels."""
    return sum(any(ast.unparse(d).startswith("triton.jit") for d in node.decorator_list)
               for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))


def test_no_module_over_600_lines():
    """Every module of mvdb, mvdb.kernels and mvdb.storage holds one job in at most 600 lines
    (issue #46). The one exception: a file holding a single ``@triton.jit`` kernel, which cannot be
    split further."""
    bad = []
    for path in sorted(_modules().values()):
        text = path.read_text()
        n = len(text.splitlines())
        if n <= MAX_LINES:
            continue
        kernels = _triton_kernels(ast.parse(text))
        if kernels != 1:
            what = f", {kernels} @triton.jit kernels" if kernels else ""
            bad.append(f"{path.relative_to(ROOT)} ({n} lines{what})")
    assert not bad, f"modules over {MAX_LINES} lines (split them by job): " + ", ".join(bad)
