"""Imports point down the layers (DESIGN.md §3): every module's imports, function-level ones too,
parsed and checked against the layer order; and the plain-math rooms import without Lightning."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "vfl_lightning"
LIGHT_MODULES = (
    "vfl_lightning.errors",
    "vfl_lightning.seeding",
    "vfl_lightning.mechanisms",
    "vfl_lightning.data.partition",
    "vfl_lightning.privacy.analysis",
    "vfl_lightning.algorithms.zoo",
)

LAYERS = (
    ("errors", "files"),
    ("seeding",),
    ("optim",),
    (
        "models",
        "wire",
        "data",
        "parallel",
        "curve",
        "checkpoints",
        "loggers",
        "wandb_names",
        "privacy.analysis",
        "privacy.parameters",
        "lightning_speedups",
        "progress",
        "callbacks",
    ),
    ("mechanisms", "privacy"),
    ("algorithms",),
    ("runtime",),
    ("run", "search", "sweep"),
    (
        "train",
        "cli",
        "data.export",
        "party",
    ),  # entry points (data.export: python -m vfl_lightning.data.export; party: the party program)
    ("report",),
)
"""Layer by layer, bottom up: a module may import its own layer and those below it."""

NEVER = {
    "privacy.accountant": ("mechanisms",),
    "privacy.callback": ("mechanisms",),
    "mechanisms": ("privacy.accountant", "privacy.callback", "privacy.attacks"),
}
"""Same-layer imports refused too: the accountant dispatches on a mechanism's declared
``accounting`` and never imports a mechanism (nor does the mechanism import the accountant).
Attacks may use a mechanism's math (the FedVS collusion attack decodes Lagrange shares)."""

REPORT_MAY_IMPORT = ("report", "curve", "files", "privacy.analysis", "privacy.parameters")
ONLY_STDLIB = {"errors": (), "files": (), "seeding": ("torch",)}
"""Modules that import nothing of the library and, beyond the standard library, only these."""


def module_files(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of ``package`` under ``root``."""
    modules = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(name: str, path: Path) -> list[str]:
    """Every absolute name ``name``'s file imports, at any depth (functions, methods, branches);
    ``from a import b`` gives ``a.b`` (a submodule or an attribute of ``a``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def internal_target(imported: str, modules: dict[str, Path]) -> str | None:
    """The library module an imported name lives in (the longest module prefix), or None."""
    parts = imported.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = module_files(root, package)
    graph = {}
    for name, path in modules.items():
        targets = {internal_target(i, modules) for i in imported_names(name, path)}
        graph[name] = {t for t in targets if t is not None and t != name and t != package}
    return graph


def relative(name: str, package: str) -> str:
    return name[len(package) + 1 :] if name.startswith(package + ".") else name


def under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layer_of(name: str, package: str) -> int:
    """The layer of module ``name``; the package itself is the bottom (it imports nothing)."""
    if name == package:
        return 0
    rel = relative(name, package)
    best = max(
        ((len(p), rank) for rank, layer in enumerate(LAYERS) for p in layer if under(rel, [p])),
        default=None,
    )
    if best is None:
        raise AssertionError(f"module {name} is in no layer: add it to LAYERS")
    return best[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layering_violations(graph: dict[str, set[str]], package: str) -> list[str]:
    """Every import against the layer order, one line each."""
    bad = []
    for source, targets in sorted(graph.items()):
        src = relative(source, package)
        for target in sorted(targets):
            dst = relative(target, package)
            if layer_of(target, package) > layer_of(source, package):
                bad.append(f"{src} imports {dst}, a layer above it")
            for guarded, refused in NEVER.items():
                if under(src, [guarded]) and under(dst, refused):
                    bad.append(f"{src} imports {dst}, which {guarded} must never import")
            if under(src, ["report"]) and not under(dst, REPORT_MAY_IMPORT):
                bad.append(f"{src} imports {dst}; report/ imports only {REPORT_MAY_IMPORT}")
    return bad


def test_no_import_circle_and_no_upward_import():
    graph = import_graph(ROOT, PACKAGE)
    assert len(graph) > 50 and graph[f"{PACKAGE}.run.train"], "the parser found the modules"
    assert cycles(graph) == []
    assert layering_violations(graph, PACKAGE) == []


@pytest.mark.parametrize("module,allowed", sorted(ONLY_STDLIB.items()))
def test_bottom_modules_import_only_the_standard_library(module, allowed):
    path = ROOT / PACKAGE / f"{module}.py"
    imported = {name.split(".")[0] for name in imported_names(f"{PACKAGE}.{module}", path)}
    outside = sorted(imported - set(sys.stdlib_module_names) - {"__future__", *allowed})
    assert outside == []


def test_the_checks_catch_a_circle_an_upward_import_and_a_function_level_one(tmp_path):
    """The checker itself: a toy package with a circle through a function-level import and a
    mechanism that reaches up into the algorithms."""
    package = tmp_path / "toy"
    (package / "mechanisms").mkdir(parents=True)
    (package / "algorithms").mkdir()
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("")
    (package / "mechanisms" / "__init__.py").write_text("")
    (package / "algorithms" / "__init__.py").write_text("")
    (package / "mechanisms" / "pbm.py").write_text(
        "from toy.errors import ConfigError\n\n\ndef f():\n    from ..algorithms import base\n"
    )
    (package / "algorithms" / "base.py").write_text("from toy.mechanisms.pbm import f\n")
    graph = import_graph(tmp_path, "toy")
    assert graph["toy.mechanisms.pbm"] == {"toy.errors", "toy.algorithms.base"}
    assert cycles(graph) == [["toy.algorithms.base", "toy.mechanisms.pbm"]]
    assert layering_violations(graph, "toy") == [
        "mechanisms.pbm imports algorithms.base, a layer above it"
    ]


def test_math_modules_do_not_import_lightning():
    script = (
        "import importlib, json, sys\n"
        f"for name in {LIGHT_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'lightning_fabric', 'hydra'))\n"
        "print(json.dumps({'heavy': heavy, 'loaded': [n for n in "
        f"{LIGHT_MODULES!r} if n in sys.modules]}}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loaded"] == list(LIGHT_MODULES)
    assert report["heavy"] == [], report["heavy"]
