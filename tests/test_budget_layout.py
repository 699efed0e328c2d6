"""The budget's layout: the product (engine/budget outside lab/) and its lab.

* The lab (engine/budget/lab/) holds the code that runs a step to measure it. No
  product module imports it when it loads (the CLI imports it inside `--measure`),
  no product module imports torch, transformers, peft or bitsandbytes at all, and
  the front module exports nothing of the lab.
* The front docstring is a file index held to the tree: every module of
  engine/budget and engine/budget/lab is named there, and every file named exists.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGET = ROOT / "engine" / "budget"
LAB = BUDGET / "lab"
TORCH_WORLD = ("torch", "transformers", "peft", "bitsandbytes")


def product_modules() -> list[Path]:
    return sorted(BUDGET.glob("*.py"))


def lab_modules() -> list[Path]:
    return sorted(LAB.glob("*.py"))


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, node: ast.AST) -> set[str]:
    """Absolute module names an import statement names (with `from X import y`,
    both X and X.y, since y may be a module)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        package = _name(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[:len(package) - node.level + 1]
        stem = ".".join(package + ([node.module] if node.module else []))
    else:
        stem = node.module
    return {stem} | {f"{stem}.{a.name}" for a in node.names}


def top_level_imports(path: Path) -> set[str]:
    """What a module imports when it loads: every import outside a function body."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            found.update(_imported(path, child))
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def all_imports(path: Path) -> set[str]:
    return {m for node in ast.walk(ast.parse(path.read_text(), str(path)))
            for m in _imported(path, node)}


def _is_lab(module: str) -> bool:
    return module == "engine.budget.lab" or module.startswith("engine.budget.lab.")


# ------------------------------------------------------------------ the lab
def test_the_lab_holds_the_code_that_runs_a_step_to_measure_it():
    assert {p.name for p in lab_modules()} >= {"__init__.py", "measure.py", "torch_step.py"}
    assert not (BUDGET / "measure.py").exists() and not (BUDGET / "torch_step.py").exists()


@pytest.mark.parametrize("path", product_modules(), ids=lambda p: p.name)
def test_no_product_module_imports_the_lab_when_it_loads(path):
    lab = sorted(m for m in top_level_imports(path) if _is_lab(m))
    assert not lab, (f"engine/budget/{path.name} imports {lab} at its top level: the product "
                     f"must load without its lab; import it inside the function that measures")


@pytest.mark.parametrize("path", product_modules(), ids=lambda p: p.name)
def test_no_product_module_imports_torch_or_its_libraries(path):
    torch_world = sorted(m for m in all_imports(path) if m.split(".")[0] in TORCH_WORLD)
    assert not torch_world, (f"engine/budget/{path.name} imports {torch_world}: code that "
                             f"runs torch belongs in engine/budget/lab/")


@pytest.mark.parametrize("path", lab_modules(), ids=lambda p: p.name)
def test_every_module_the_lab_imports_from_exists(path):
    """The lab's imports climb out of lab/ to the product (and the engine): each
    module they import from, inside functions too, exists."""
    stems = {m for node in ast.walk(ast.parse(path.read_text(), str(path)))
             if isinstance(node, ast.ImportFrom) and node.level
             for m in sorted(_imported(path, node), key=len)[:1]}
    missing = sorted(m for m in stems if importlib.util.find_spec(m) is None)
    assert not missing, f"lab/{path.name} imports from {missing}, which do not exist"


def test_the_lab_imports_the_product():
    product = {_name(p) for p in product_modules()}
    read = {m for p in lab_modules() for m in all_imports(p)} & product
    assert {"engine.budget.config", "engine.budget.real_step"} <= read


def test_the_front_exports_nothing_of_the_lab():
    import engine.budget as bm
    for name in ("measure", "measurable", "MEASURE_MAX_WEIGHT_BYTES", "MEASURE_MAX_FLOPS",
                 "MEASURE_MAX_ACTIVATION_BYTES", "measure_step", "torch_step"):
        assert name not in bm.__all__, name
    front = top_level_imports(BUDGET / "__init__.py")
    assert not any(_is_lab(m) or m.endswith((".measure", ".torch_step")) for m in front)


def test_the_budget_and_its_command_line_load_no_lab_module():
    code = ("import runpy, sys\n"
            "import engine.budget as bm\n"
            "bm.budget(bm.preset('gpt2-small'))\n"
            "sys.argv = ['budget', '--preset', 'tiny']\n"
            "try:\n    runpy.run_module('engine.budget', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('engine.budget.lab')"
            " or m.split('.')[0] in ('torch', 'peft', 'transformers')), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr


def test_the_lab_s_names_are_the_ones_its_callers_use():
    import importlib
    from engine.budget import lab
    measure_module = importlib.import_module("engine.budget.lab.measure")
    torch_step = importlib.import_module("engine.budget.lab.torch_step")
    assert lab.measure is measure_module.measure and lab.measurable is measure_module.measurable
    assert lab.measure_step is torch_step.measure_step
    assert lab.MEASURE_MAX_WEIGHT_BYTES == measure_module.MEASURE_MAX_WEIGHT_BYTES


# --------------------------------------------------------- the file index
def index_names() -> set[str]:
    import engine.budget as bm
    return set(re.findall(r"(?<![\w./])((?:lab/)?[\w]+\.py)\b", bm.__doc__))


def tree_names() -> set[str]:
    return ({p.name for p in product_modules()}
            | {f"lab/{p.name}" for p in lab_modules()})


def test_the_front_docstring_names_every_module_of_the_budget_and_its_lab():
    unnamed = sorted(tree_names() - index_names())
    assert not unnamed, (f"engine/budget/__init__.py's index does not name {unnamed}: add a "
                         f"line for each, on its shelf, saying what it holds")


def test_every_file_the_index_names_exists():
    stale = sorted(index_names() - tree_names())
    assert not stale, f"engine/budget/__init__.py's index names {stale}, which are not files"


def test_each_index_line_says_what_the_file_holds():
    import engine.budget as bm
    lines = [line for line in bm.__doc__.splitlines()
             if re.match(r"\s+(lab/)?\w+\.py\s", line)]
    assert len(lines) == len(tree_names())
    for line in lines:
        name, _, what = line.strip().partition(" ")
        assert len(what.split()) >= 3, f"the index line for {name} says too little: {line!r}"


def test_the_front_docstring_counts_the_activation_models_it_has():
    import engine.budget as bm
    from engine.budget.knobs import ACTIVATION_MODELS
    doc = bm.__doc__ + (BUDGET / "activations.py").read_text()
    assert "Three models of the activation bytes" not in doc
    for model in ACTIVATION_MODELS:
        assert f'"{model}"' in (BUDGET / "activations.py").read_text(), model
