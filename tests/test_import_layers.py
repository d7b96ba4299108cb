"""The package's imports point one way: no import cycle between modules, and no module
imports one of a higher layer. Read from the source (ast), imports inside functions included.

Imports under `if TYPE_CHECKING:` (annotations only) count as well: a type-only import still ties
the two modules together (one cannot be read, type-checked or moved without the other), so a circle
through one is a circle; a protocol or a lower-level module breaks it.

Layers, lowest first (a module may import its own layer and those below):
  base:      errors, checks (small value predicates), setting_rules (how a method declares its settings),
             distributed, tasks/ (the synthetic task generators and their scoring)
  models:    models/ (torch modules, loading, the generated tokenizer of random: models)
  decode:    decode/ (config, presets, policies, engine, generate()), and the package's own
             __init__ (caidllm.load, caidllm.generate; it registers DiffusionLM.generate)
  front end: options (what every command-line front end shares: model flags, load_model, flag checks),
             parallel/ (--tp: the sharded model, its ranks and the engine inputs they follow)
  apps:      bench/, evaluation/, train/, models_cli (`caidllm models`)
  serve:     serve/
  top:       cli, __main__
"""

from __future__ import annotations

import ast
from pathlib import Path

import caidllm

PACKAGE = Path(caidllm.__file__).resolve().parent
LAYERS = [
    ["caidllm.errors", "caidllm.checks", "caidllm.setting_rules", "caidllm.distributed", "caidllm.tasks"],
    ["caidllm.models"],
    ["caidllm.decode", "caidllm"],
    ["caidllm.options", "caidllm.parallel"],
    ["caidllm.bench", "caidllm.evaluation", "caidllm.train", "caidllm.models_cli"],
    ["caidllm.serve"],
    ["caidllm.cli", "caidllm.__main__"],
]


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("caidllm",) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def layer_of(module: str) -> int:
    best, rank = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (module.startswith(prefix + ".") and prefix != "caidllm")
            if inside and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank is not None, f"{module} is in no layer: add it to LAYERS"
    return rank


def imports_of(module: str, path: Path, known: dict) -> set[str]:
    """The package's modules that `module` imports (a name imported from a package counts
    as its submodule when it is one)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks included
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import caidllm.models.loading` -> the module
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_no_module_imports_a_higher_layer():
    upward = sorted(
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
        for a, targets in graph().items()
        for b in targets
        if layer_of(b) > layer_of(a)
    )
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def cycles_of(edges: dict[str, set[str]]) -> list[str]:
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target) :] + [target]))
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return cycles


def test_no_import_cycles():
    cycles = cycles_of(graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_walker_sees_imports_inside_functions(tmp_path):
    known = {"caidllm.a": None, "caidllm.b": None}
    source = tmp_path / "a.py"
    source.write_text("def f():\n    from caidllm import b\n    from . import b as again\n")
    assert imports_of("caidllm.a", source, known) == {"caidllm.b"}


def test_a_type_only_import_counts_and_closes_a_circle(tmp_path):
    known = {"caidllm.a": None, "caidllm.b": None}
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from caidllm import b\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from caidllm.a import Thing\n")
    edges = {"caidllm.a": imports_of("caidllm.a", a, known), "caidllm.b": imports_of("caidllm.b", b, known)}
    assert edges["caidllm.b"] == {"caidllm.a"}
    assert cycles_of(edges) == ["caidllm.a -> caidllm.b -> caidllm.a"]


def test_the_package_map_names_every_module():
    mapped = (Path(__file__).parent.parent / "docs" / "PACKAGE_MAP.md").read_text()
    missing = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and f"`{path.relative_to(PACKAGE).as_posix()}`" not in mapped
    )
    assert not missing, "add these modules to docs/PACKAGE_MAP.md: " + ", ".join(missing)
