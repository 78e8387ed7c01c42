"""Architecture guards: the import rule of docs/architecture.md (section 1), checked two ways.

    python -m pytest tests/test_imports.py -q

1. By running imports: the runtime loads without the training stack; the CLI module loads neither torch
   nor transformers.
2. By reading every module's source (AST), function-local imports included: the serving core of
   `draftsmith.runtime` imports neither `draftsmith.train` nor `draftsmith.data_recipes` nor the CLI, demo
   and bench layer; `train`, `data_recipes` and `kernels` never import that layer (it imports them); and
   no import cycle joins any two draftsmith modules. Imports under `if TYPE_CHECKING:` never run and are
   not counted; `importlib.import_module("draftsmith...")` is.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ["accelerate", "deepspeed", "datasets", "wandb"]
PACKAGES = {"runtime": "draftsmith.runtime", "train": "draftsmith.train", "gpu_kernels": "draftsmith.kernels",
            "data_recipes": "draftsmith.data_recipes", "configs": "draftsmith.configs"}  # fmt: skip
# The CLI, demo and bench layer of draftsmith.runtime (runtime/__init__.py names it): its sub-packages
# `cli` and `bench` may import everything. Every other runtime module is the serving core.
FRONT_PACKAGES = ("draftsmith.runtime.cli", "draftsmith.runtime.bench")
FRONT = {
    "draftsmith.train.__main__"
}  # what `accelerate launch -m draftsmith.train` runs: the CLI's train verb


# ---- the import graph, read from the source ---------------------------------------------------------------
def draftsmith_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the five packages."""
    mods = {}
    for folder, package in PACKAGES.items():
        for file in sorted((root / folder).rglob("*.py")):
            parts = file.relative_to(root / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            mods[name.removesuffix(".__init__")] = file
    return mods


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _nodes(tree: ast.AST):
    """Every node, except the bodies of `if TYPE_CHECKING:` (they never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def _dynamic_name(call: ast.Call) -> str | None:
    """The module an `importlib.import_module(...)` call names (an f-string: its constant head)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip(".")
    return None


def imported(name: str, file: Path, mods: dict[str, Path]) -> dict[str, int]:
    """draftsmith modules `name` imports anywhere in its file -> the first line that does."""
    out: dict[str, int] = {}
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]

    def add(target: str, line: int) -> None:
        while target and target not in mods:  # `from pkg import name`: a function, not a module
            target = target.rpartition(".")[0]
        if target.startswith("draftsmith.") and target != name:
            out.setdefault(target, line)

    for node in _nodes(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base, node.lineno)
        elif isinstance(node, ast.Call) and (dynamic := _dynamic_name(node)):
            add(dynamic, node.lineno)
    return out


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    mods = draftsmith_modules(root)
    return {name: imported(name, file, mods) for name, file in mods.items()}


# ---- the rule ---------------------------------------------------------------------------------------------
def layer(module: str) -> str:
    if (
        module in FRONT
        or module.startswith(tuple(f"{p}." for p in FRONT_PACKAGES))
        or module in FRONT_PACKAGES
    ):
        return "front"
    return module.split(".")[1]  # runtime (the serving core), train, data_recipes, kernels, configs


# what each layer must not import: the core none of the others; train, data_recipes and kernels not the front
FORBIDDEN = {
    "runtime": {"train", "data_recipes", "front"},
    "train": {"front"},
    "data_recipes": {"train", "front"},
    "kernels": {"train", "data_recipes", "front"},
    "configs": {"runtime", "train", "data_recipes", "kernels", "front"},
}


def forbidden_edges(graph: dict[str, dict[str, int]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        for target, line in sorted(targets.items()):
            if layer(target) in FORBIDDEN.get(layer(module), set()):
                bad.append(f"{module} (line {line}) -> {target} [{layer(module)} -> {layer(target)}]")
    return bad


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_serving_core_and_trainer_never_import_upward():
    bad = forbidden_edges(import_graph())
    assert not bad, "imports against the layering (docs/architecture.md, section 1):\n" + "\n".join(bad)


# The runtime's layers in import order (runtime/__init__.py): a module imports only its own layer and the
# layers before it, never one after, not even inside a function.
RUNTIME_ORDER = ["errors", "verify", "core", "heads", "drafters", "speculator", "workers", "bench", "cli"]


def runtime_layer(module: str) -> str | None:
    """draftsmith.runtime.X[.Y] -> X (a sub-package or a top module), None outside the runtime's layers."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["draftsmith", "runtime"] and len(parts) > 2 else None


def upward_edges(graph: dict[str, dict[str, int]], order: list[str] = RUNTIME_ORDER) -> list[str]:
    rank = {name: i for i, name in enumerate(order)}
    bad = []
    for module, targets in sorted(graph.items()):
        here = runtime_layer(module)
        for target, line in sorted(targets.items()):
            there = runtime_layer(target)
            if here in rank and there in rank and rank[there] > rank[here]:
                bad.append(f"{module} (line {line}) -> {target} [{here} -> {there}]")
    return bad


def test_runtime_layers_import_in_one_order():
    mods = draftsmith_modules()
    layers = {runtime_layer(m) for m in mods} - {None, "__init__"}
    assert layers == set(RUNTIME_ORDER), f"runtime layers not in RUNTIME_ORDER: {layers ^ set(RUNTIME_ORDER)}"
    bad = upward_edges(import_graph())
    assert not bad, "imports against the runtime's layer order (runtime/__init__.py):\n" + "\n".join(bad)


def test_layer_order_check_sees_an_upward_import():
    """The control: a verify module importing a drafter (even inside a function) is reported."""
    graph = {
        "draftsmith.runtime.verify.tree": {"draftsmith.runtime.drafters.drafter": 7},
        "draftsmith.runtime.drafters.drafter": {"draftsmith.runtime.verify.tree": 3},
    }
    assert upward_edges(graph) == [
        "draftsmith.runtime.verify.tree (line 7) -> draftsmith.runtime.drafters.drafter [verify -> drafters]"
    ]


def test_no_import_cycle_among_draftsmith_modules():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_front_layer_names_real_modules():
    mods = draftsmith_modules()
    assert not sorted(FRONT - set(mods)), "FRONT names modules that do not exist"
    assert all(p in mods for p in FRONT_PACKAGES), "FRONT_PACKAGES names packages that do not exist"


def test_every_package_docstring_names_its_modules():
    """Each package's map (its __init__ docstring) names every module and sub-package in it, as `name`."""
    missing = []
    for init in sorted(ROOT.glob("*/**/__init__.py")):
        if not any(init.is_relative_to(ROOT / folder) for folder in PACKAGES):
            continue
        doc = init.read_text()
        folder = init.parent
        names = [f.stem for f in folder.glob("*.py") if f.stem not in ("__init__", "__main__")]
        names += [d.name for d in folder.iterdir() if (d / "__init__.py").is_file()]
        missing += [f"{folder.relative_to(ROOT)}/{n}" for n in sorted(names) if f"`{n}`" not in doc]
    assert not missing, "not named in their package's docstring: " + ", ".join(missing)


def test_checker_sees_function_local_and_dynamic_imports(tmp_path):
    """The checker itself: a function-local import of the trainer, a dynamic import and a two-module cycle
    are found; a TYPE_CHECKING import is not."""
    for sub in ("runtime/core", "runtime/verify", "train"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "data_recipes").mkdir()
    (tmp_path / "data_recipes" / "vocab.py").write_text("")
    (tmp_path / "runtime" / "core" / "engine.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import draftsmith.train.objectives.heads\n"
        "def f():\n    from draftsmith.train import export\n"
    )
    (tmp_path / "runtime" / "verify" / "tree.py").write_text(
        "import importlib\nimportlib.import_module('draftsmith.data_recipes.vocab')\n"
        "from draftsmith.runtime.core.kv_cache import KVCache\n"
    )
    (tmp_path / "runtime" / "core" / "kv_cache.py").write_text("def g():\n    from ..verify import tree\n")
    (tmp_path / "train" / "export.py").write_text("")
    (tmp_path / "train" / "heads.py").write_text("")
    graph = import_graph(tmp_path)
    assert graph["draftsmith.runtime.core.engine"] == {"draftsmith.train.export": 5}
    assert graph["draftsmith.runtime.verify.tree"] == {
        "draftsmith.data_recipes.vocab": 2,
        "draftsmith.runtime.core.kv_cache": 3,
    }
    assert forbidden_edges(graph) == [
        "draftsmith.runtime.core.engine (line 5) -> draftsmith.train.export [runtime -> train]",
        "draftsmith.runtime.verify.tree (line 2) -> draftsmith.data_recipes.vocab [runtime -> data_recipes]",
    ]
    assert import_cycles(graph) == [["draftsmith.runtime.core.kv_cache", "draftsmith.runtime.verify.tree"]]


# ---- the same rule, by running imports --------------------------------------------------------------------
def modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_runtime_imports_without_training_stack():
    loaded = modules_after(
        "import draftsmith.runtime, draftsmith.runtime.core.target, draftsmith.runtime.core.engine,"
        " draftsmith.runtime.bench.side_by_side, draftsmith.runtime.cli.demo, draftsmith.runtime.cli.main,"
        " draftsmith.runtime.heads.head_kinds, draftsmith.runtime.drafters.drafting"
    )
    assert "draftsmith.runtime.core.target" in loaded
    assert not [m for m in HEAVY if m in loaded]
    assert not [m for m in loaded if m.startswith(("draftsmith.train", "draftsmith.data_recipes"))]


def test_cli_module_is_light():
    loaded = modules_after("import draftsmith.runtime.cli.main")
    assert "torch" not in loaded and "transformers" not in loaded


def test_packages_live_under_one_import_root():
    import draftsmith.configs
    import draftsmith.data_recipes
    import draftsmith.kernels
    import draftsmith.runtime
    import draftsmith.train

    for mod in (draftsmith.runtime, draftsmith.train, draftsmith.kernels, draftsmith.data_recipes):
        assert mod.__doc__
    assert draftsmith.configs.__name__ == "draftsmith.configs"


def shadowing_folders(root: Path = ROOT) -> list[str]:
    """Root folders that are regular packages named like an installed distribution's top-level module:
    `python -m X` / `python -c` from the checkout put the root first on sys.path, so such a folder hides
    the real module (a folder `kernels/` hid Hugging Face's `kernels`, which transformers 5.25 imports)."""
    from importlib.metadata import packages_distributions

    installed = packages_distributions()
    return sorted(d.name for d in root.iterdir() if (d / "__init__.py").is_file() and d.name in installed)


def test_no_root_folder_shadows_an_installed_module(tmp_path):
    assert shadowing_folders() == []
    (tmp_path / "yaml").mkdir()  # the control: a package folder named like PyYAML's module is found
    (tmp_path / "yaml" / "__init__.py").write_text("")
    assert shadowing_folders(tmp_path) == ["yaml"]


def test_transformers_imports_from_the_checkout_root():
    """What `python -m draftsmith...` and `python -m pytest` do from the repository root."""
    code = "import transformers.models.llama.modeling_llama"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
