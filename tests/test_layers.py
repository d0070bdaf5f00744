"""The layers of `segments/` are kept: each module imports only its own layer and the ones below, with no cycle.

Layers, bottom up (docs/design.md, "Code map"): `codec` (bytes) → `files` (one segment's files) → `partition`
(a partition directory) → `tools` (dump, verify, kraft, generate); `spark` is a client of all of them and
nothing below it imports it. `segments.codec.errors` imports nothing of ours. Every import is counted,
including one written inside a function: such an import may delay loading a heavy library (numba, pyspark),
never hide a cycle, so the module graph as a whole has none.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["codec", "files", "partition", "tools", "spark"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str | None = None) -> set[str]:
    """Every `segments...` module `path` (module `name`) imports, relative imports resolved, wherever the
    import is written."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "segments")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "segments":
                continue
            for alias in node.names:  # `from segments.codec import format` imports a module
                candidate = f"{module}.{alias.name}"
                found.add(candidate if _source(candidate) is not None else module)
    return found


def _source(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in (ROOT / "segments").rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_layer():
    loose = [name for name in _graph() if name != "segments" and _layer(name) is None]
    assert loose == [], f"modules of segments/ outside the layer packages {LAYERS}: {loose}"


def test_no_module_imports_a_layer_above_its_own():
    wrong = []
    for name, targets in _graph().items():
        own = _layer(name)
        if own is None:  # the package's facade, `segments/__init__.py`, re-exports the public API
            continue
        wrong += [f"{name} imports {t}" for t in targets if t == "segments" or (_layer(t) or 0) > own]
    assert wrong == []


def test_errors_import_nothing_of_ours():
    assert _graph()["segments.codec.errors"] == set()


def test_the_module_graph_has_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " → ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_layer_check_sees_an_upward_import_inside_a_function(tmp_path):
    """The checker itself: an import of `partition` written inside a function of a `codec` module is found."""
    probe = tmp_path / "records.py"
    probe.write_text((ROOT / "segments" / "codec" / "records.py").read_text()
                     + "\n\ndef _late():\n    from ..partition.log import PartitionLog\n    return PartitionLog\n")
    assert "segments.partition.log" in _imports(probe, "segments.codec.records")
    assert "segments.partition.log" not in _imports(ROOT / "segments" / "codec" / "records.py")
