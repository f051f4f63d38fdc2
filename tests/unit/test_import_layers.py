"""The import graph holds: each layer imports only from layers below it (or its own), and no module cycle.

Read with ast from the package's files (imports under `if TYPE_CHECKING:` are types only and skipped), so a
new module is checked without being imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attrib_agent

ROOT = Path(attrib_agent.__file__).resolve().parent
# Lowest first. A module's layer is that of the longest entry its dotted name (under attrib_agent.) starts with.
LAYERS: list[tuple[str, ...]] = [
    ("__init__", "events", "recording", "health", "vllm_ids"),  # the contract
    ("timeline",),
    ("attribution",),  # pure core; lab-only helpers aside
    ("pipeline", "parallel_sampling"),  # (the n>1 client requests: the pipeline's part)
    ("read_model",),
    ("config",),  # a setting's row type, the value parsers and types: what sources and sinks declare rows with
    ("http_server",),  # the one uvicorn set-up: the OTLP/HTTP receiver, the API, the lab's span sink
    ("sources", "sinks"),  # the I/O wings, apart from each other
    ("config.settings", "config.agent_config", "config.load", "config.file"),  # the table, from their rows
    ("agent",),
    ("cli", "__main__", "lab"),
]


def _layer(module: str) -> int:
    found = [(len(name), i) for i, names in enumerate(LAYERS) for name in names
             if module == name or module.startswith(name + ".")]
    if not found:
        raise AssertionError(f"attrib_agent.{module} is in no layer: add it to LAYERS")
    return max(found)[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                 for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attrib_agent"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            out.update(n for n in names if (ROOT / Path(*n.split(".")[1:])).with_suffix(".py").exists()
                       or (ROOT / Path(*n.split(".")[1:])).is_dir())
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("attrib_agent"))
    return {m.removeprefix("attrib_agent").lstrip(".") for m in out if m != "attrib_agent"}


def _modules() -> dict[str, set[str]]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" and len(rel.parts) > 1 else rel.parts)
        mods[name] = _imports(path)
    return mods


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = [f"{m} -> {dep}" for m, deps in _modules().items() for dep in deps if _layer(dep) > _layer(m)]
    assert upward == []


def test_sources_and_sinks_do_not_import_each_other() -> None:
    crossing = [f"{m} -> {dep}" for m, deps in _modules().items() for dep in deps
                if {m.split(".")[0], dep.split(".")[0]} == {"sources", "sinks"}]
    assert crossing == []


def test_no_import_cycle() -> None:
    graph = {m: {d for d in deps if d in _modules_cache} for m, deps in _modules_cache.items()}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(m):], m]))
        if m in done:
            return
        for d in sorted(graph[m]):
            if d != m and not m.startswith(d + "."):  # a package's own __init__ re-exporting is not a cycle
                visit(d, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from attrib_agent.agent.core import AgentCore\n")
    assert _layer(next(iter(_imports(bad)))) > _layer("attribution.tally")


_modules_cache = _modules()
