"""The package's layout stays as ARCHITECTURE.md draws it (issue 20), read from the source
with `ast`: imports run from higher layers to lower ones only, no import circle (counting
the package `__init__` that importing a submodule runs), no private name of ours used from
another module, no module over 300 lines, and every subpackage says what it owns."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import dist_resume

PACKAGE = Path(dist_resume.__file__).resolve().parent

# Lowest first. A part may import parts of lower layers and its own subpackage's modules;
# parts of one layer stand side by side and never import each other. "" is the package's
# public face (dist_resume/__init__.py).
LAYERS: list[set[str]] = [
    {"errors", "process_group"},
    {"storage"},
    {"arguments"},
    {"randomness"},
    {"state"},
    {"positions"},
    {"workers"},
    {"streams"},
    {"packing"},
    {"mixtures"},
    {"loader", "checkpoint"},
    {"integrations"},
    {""},
    {"demo"},
    {"cli"},
    {"__main__", "launched"},
]
MAX_LINES = 300

# Private attributes of other libraries that we read on purpose, each with its reason.
FOREIGN_PRIVATES = {
    "_dtype_to_storage_type_map",  # torch: the storage type names torch.save writes
    "_inst",  # random: the global generator behind random.random()
    "_rand",  # numpy: the global RandomState behind numpy.random
    "_bit_generator",  # numpy: the RandomState's bit generator, to read its state
    "_is_sharding_datapipe",  # torch: which DataPipes split data over readers
    "_worker_info",  # torch: the WorkerInfo that get_worker_info() returns
    "_is_accelerate_prepared",  # accelerate: marks a loader it prepared
    "_replace",  # NamedTuple's public API, despite the underscore
    "_get_backend",  # torch: a process group's backend, whose options hold its timeout
    "_timeout",  # torch: that timeout (no public getter), which the checkpoint group inherits
    "_use_async_quorum",  # torchft: whether a Manager heals during a step (no public getter) ...
    "_init_sync",  # ... and heals at step 0 groups it counts as participants: ManagedLoader refuses both
}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modules of the package that importing ``name`` runs: each import it names (at
    any depth: lazy and TYPE_CHECKING imports are dependencies too), and the packages whose
    `__init__` that import runs, unless ``name`` is inside them."""
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base.split(".")[: len(base.split(".")) - node.level + 1]
                module = ".".join(parent + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                       for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for depth in range(2, len(parts) + 1):
                enclosing = ".".join(parts[:depth])
                if enclosing in MODULES and not (name + ".").startswith(enclosing + ".") and enclosing != name:
                    found.add(enclosing)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _part(module: str) -> str:
    """The top-level part of the package a module belongs to ("" for the package itself)."""
    return module.split(".")[1] if "." in module else ""


def _layer(part: str) -> int:
    for level, parts in enumerate(LAYERS):
        if part in parts:
            return level
    raise AssertionError(f"dist_resume.{part} is in no layer of LAYERS: add it where it belongs")


def test_every_part_has_a_layer() -> None:
    for module in MODULES:
        _layer(_part(module))


def test_imports_run_from_higher_layers_to_lower_ones() -> None:
    upward = []
    for module, targets in sorted(GRAPH.items()):
        source = _part(module)
        for target in sorted(targets):
            if _part(target) != source and _layer(_part(target)) >= _layer(source):
                upward.append(f"{module} imports {target}")
    assert upward == []


def test_no_import_circle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert circles == []


def test_no_private_name_is_used_across_modules() -> None:
    used = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dist_resume") or (
                    isinstance(node, ast.ImportFrom) and node.level):
                used += [f"{module} imports {alias.name}" for alias in node.names
                         if alias.name.startswith("_") and not alias.name.startswith("__")]
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                if node.attr not in FOREIGN_PRIVATES:
                    used.append(f"{module}:{node.lineno} reads {ast.unparse(node)}")
    assert used == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_is_short(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines"


def test_every_subpackage_says_what_it_owns_and_may_import() -> None:
    for module, path in sorted(MODULES.items()):
        if path.name == "__init__.py":
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "import" in doc.lower(), f"{module}/__init__.py does not say what it may import"


def test_the_loader_side_does_not_import_dcp_and_the_checkpoint_api_comes_on_first_use() -> None:
    """A DataLoader worker started with spawn or forkserver imports the package to unpickle its
    dataset: that must not pull in torch.distributed.checkpoint (about a second and 50 MB per
    worker), while every public name still imports as before."""
    script = (
        "import sys\n"
        "import dist_resume, dist_resume.loader, dist_resume.mixtures, dist_resume.streams\n"
        "print('torch.distributed.checkpoint' in sys.modules)\n"
        "from dist_resume import *\n"
        "import dist_resume.checkpoint as checkpoint\n"
        "print(sorted(name for name in dist_resume.__all__ if name not in globals()),\n"
        "      load_checkpoint is checkpoint.load_checkpoint, 'save_checkpoint' in dir(dist_resume))\n"
        "try:\n"
        "    dist_resume.no_such_name\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.splitlines() == ["False", "[] True True", "module 'dist_resume' has no attribute 'no_such_name'"]
