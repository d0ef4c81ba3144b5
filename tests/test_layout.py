"""The package's module graph: no module imports a module that imports it."""

from __future__ import annotations

import ast
import pathlib

import dask_mcpca

PACKAGE = pathlib.Path(dask_mcpca.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Modules of the package that ``path`` imports, at module level or inside functions."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("dask_mcpca"):
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dask_mcpca"))
    return found


def test_no_import_cycle_between_modules():
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: {i for i in _imports(p) if i in files and i != m} for m, p in files.items()}
    # The package's __init__ files re-export; a module importing its package is a cycle only through them.
    packages = {m for m, p in files.items() if p.name == "__init__.py"}

    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return path + [nxt]
                if nxt not in seen and nxt not in packages:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [c for m in graph if m not in packages and (c := cycle_from(m))]
    assert not cycles, cycles


def test_persistence_is_a_codec_that_does_not_know_the_estimator():
    assert "dask_mcpca._estimator" not in _imports(PACKAGE / "_persist.py")


def test_only_the_estimator_uses_its_private_methods():
    """The report, the command line and the demo use public methods and :mod:`dask_mcpca._model`'s functions."""
    from dask_mcpca._base import _BaseMCPCA
    from dask_mcpca._estimator import MCPCA

    private = {name for cls in (MCPCA, _BaseMCPCA) for name in vars(cls)
               if name.startswith("_") and not name.startswith("__")} | {"_robust_state", "_robust_unit"}
    owners = {PACKAGE / "_estimator.py", PACKAGE / "_base.py"}
    used = {
        (str(path.relative_to(PACKAGE)), node.attr)
        for path in PACKAGE.rglob("*.py") if path not in owners
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in private
    }
    assert not used, sorted(used)
