"""Imports point one way: down the README's layer table (pipelines/ at the top, sandbox/ at the
bottom), down the order of training's subpackages (training/__init__.py), and never in a cycle.
Every import counts, the ones inside functions too: a deferred import is still a dependency."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# training/__init__.py's order: each subpackage may import those before it, never those after.
TRAINING_ORDER = ("progress", "policy", "optim", "inference", "agent", "rl", "sft", "evaluation", "experiment", "base_policy", "iteration",
                  "model_eval", "continuation")
# Imported only by the steps that sample or train: ~9 s of every process start on 2 cores otherwise.
HEAVY = ("torch", "transformers", "safetensors", "vllm")
NO_DAGSTER = ("statuses", "sandbox", "environments", "task_sets", "grading", "training", "datastore", "commands")


def layers() -> list[str]:
    """The top-level packages in the order of the README's Layout table, top first."""
    section = ROOT.joinpath("README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)/` \|", section, flags=re.M)


def product_modules() -> dict[str, Path]:
    modules = {}
    for package in layers():
        for path in sorted((ROOT / package).rglob("*.py")):
            if "builtin" in path.parts:  # task data (a bundled repository), not product code
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The product modules (or packages) `path` imports, anywhere in it."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {module: imports(path, module, set(modules)) for module, path in modules.items()}


def rank(module: str) -> tuple[int, int]:
    """Lower is further down: (layer from the bottom, training subpackage)."""
    top, _, rest = module.partition(".")
    order = list(reversed(layers()))
    sub = TRAINING_ORDER.index(rest.split(".")[0]) if top == "training" and rest else len(TRAINING_ORDER)
    return order.index(top), sub


def test_the_layer_table_names_every_package():
    assert layers() == ["pipelines", "assets", "commands", "training", "datastore", "grading", "task_sets", "environments", "sandbox",
                        "statuses"]


@pytest.mark.unit
def test_the_project_image_takes_every_package():
    """Run containers and pods import the code location from the image: a package it lacks fails
    them all, and its tag would not change with that package's files."""
    copied = re.findall(r"^COPY (\w+) /opt/crucible/src/\1$", ROOT.joinpath("Dockerfile").read_text(), flags=re.M)
    let_in = re.findall(r"^!(\w+)$", ROOT.joinpath(".dockerignore").read_text(), flags=re.M)
    hashed = re.search(r"^packages=\(([^)]*)\)", ROOT.joinpath("scripts", "build-project-image").read_text(),
                       flags=re.M).group(1).split()
    assert sorted(copied) == sorted(let_in) == sorted(hashed) == sorted(layers())


def points_up(module: str, target: str) -> bool:
    (layer, sub), (target_layer, target_sub) = rank(module), rank(target)
    return target_layer > layer or (module.startswith("training.") and target_layer == layer and target_sub > sub)


def test_no_import_points_up_the_layers():
    upward = sorted(f"{module} imports {target}" for module, targets in graph().items() for target in targets
                    if points_up(module, target))
    assert not upward


def test_no_import_cycle():
    edges, cycles, state = graph(), [], {}

    def visit(module: str) -> None:
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                cycles.append(f"{module} -> {target}")  # closes a cycle through `target`
            elif target not in state:
                visit(target)
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert not cycles


def test_the_libraries_never_import_dagster():
    offenders = []
    for module, path in product_modules().items():
        if module.split(".")[0] in NO_DAGSTER:
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{module}: {name}" for name in names if name.split(".")[0] == "dagster"]
    assert not offenders


@pytest.mark.parametrize("module", ["pipelines.definitions", "pipelines.experiment_runner", "pipelines.eval_cli"])
def test_the_code_location_and_the_cli_load_without_the_training_libraries(module):
    """Every run's process, the daemon, the UI and each CLI command load these first: a model
    library imported at module level costs them seconds each before any work starts."""
    loaded = subprocess.run([sys.executable, "-c", f"import sys, {module}; print(*(m for m in {HEAVY} if m in sys.modules))"],
                            capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    assert loaded == []
