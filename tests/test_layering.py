"""The layout's promises, checked on the import statements of engine/.

* The library does not know the course: nothing under engine/ imports the
  exercise checks (`coursework`) or anything of `course/`.
* The two engines never import each other: the fused trainer (engine/trainer/
  and its entry modules engine/train.py, engine/bench.py) imports nothing of
  the tape, and the tape nothing of the trainer. Both may use SHARED.
* The trainer's lab (engine/trainer/lab/) is measurement, not the trainer:
  nothing outside it imports it but `python -m engine.bench`, and
  `python -m engine.train` never loads it.
* There is no import cycle among engine modules, and the trainer wing's rooms
  import one way: lab -> trainer -> kernels -> kernels/cpu.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"

# The modules both engines share: exactly those the trainer imports from outside
# its wing (test_the_shared_list_is_what_the_trainer_imports), and every text that
# names them lists these (test_every_copy_of_the_shared_list_names_the_shared_modules).
SHARED_MODULES = {"engine.gpt_config", "engine.timing", "engine.numba_config",
                  "engine.fast_math", "engine.constants", "engine.blas", "engine.fused_buffers"}
# The package itself and the version check its __init__ runs: every import of engine.* loads them.
PACKAGE = {"engine", "engine._versions"}
SHARED = SHARED_MODULES | PACKAGE
# Modules of the trainer wing outside engine/trainer/: the command-line entries.
TRAINER_ENTRIES = {"engine.train", "engine.bench"}
LAB = "engine.trainer.lab"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def engine_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}


def imports_of(name: str, path: Path) -> set[str]:
    """Absolute names of every module `path` imports (at any depth of the file)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module
            found.add(stem)
            for alias in node.names:   # `from . import rules` imports engine.rules
                found.add(f"{stem}.{alias.name}")
    return found


def graph() -> dict[str, set[str]]:
    modules = engine_modules()
    return {name: {m for m in imports_of(name, path) if m in modules and m != name}
            for name, path in modules.items()}


def is_trainer(name: str) -> bool:
    return name.startswith("engine.trainer") or name in TRAINER_ENTRIES


def test_the_library_imports_nothing_of_the_course():
    for name, path in engine_modules().items():
        for imported in imports_of(name, path):
            top = imported.split(".")[0]
            assert top not in ("coursework", "course"), f"{name} imports {imported}"
        text = path.read_text()
        for marker in ("my_pieces", "BACKPROP_PIECES_DIR", "exercises"):
            assert marker not in text, f"{name} mentions {marker!r}, which is course material"


def test_the_trainer_and_the_tape_do_not_import_each_other():
    for name, deps in graph().items():
        for dep in deps - SHARED:
            if name in SHARED:
                assert not dep.startswith("engine.trainer"), f"shared {name} imports {dep}"
                continue
            assert is_trainer(name) == is_trainer(dep), (
                f"{name} ({'trainer' if is_trainer(name) else 'tape'}) imports {dep} "
                f"({'trainer' if is_trainer(dep) else 'tape'})")


def test_the_shared_list_is_what_the_trainer_imports():
    """SHARED_MODULES names no module the trainer has stopped using, and misses none."""
    outside = {dep for name, deps in graph().items() if is_trainer(name)
               for dep in deps if not is_trainer(dep)} - PACKAGE
    assert outside == SHARED_MODULES, (
        f"the trainer imports {sorted(outside - SHARED_MODULES)} beyond SHARED_MODULES and "
        f"no longer imports {sorted(SHARED_MODULES - outside)}; update SHARED_MODULES and "
        f"the texts that list them")


def in_lab(name: str) -> bool:
    return name == LAB or name.startswith(LAB + ".")


def test_nothing_outside_the_lab_imports_it_but_the_bench_command():
    for name, deps in graph().items():
        if in_lab(name) or name == "engine.bench":
            continue
        assert not any(in_lab(d) for d in deps), (
            f"{name} imports {sorted(d for d in deps if in_lab(d))}: the trainer must not "
            f"depend on its lab; move what it needs out of engine/trainer/lab/")


def test_the_training_command_never_loads_the_lab():
    """Importing every module `python -m engine.train` can reach (the trainer
    outside lab/) loads nothing of the lab."""
    trainer = sorted(n for n in engine_modules() if is_trainer(n) and not in_lab(n)
                     and n != "engine.bench")
    code = ("import importlib, sys\n"
            f"for name in {trainer!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.startswith({LAB!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"the trainer loaded {out.stdout.strip()}"


def test_no_import_cycle_among_coursework_modules():
    """The exercise checks, the pieces and the slot contracts import each other in
    one direction, imports inside functions included (lessonNN -> pieces -> slots)."""
    modules = {module_name(p): p for p in sorted((ROOT / "coursework").rglob("*.py"))}
    edges = {name: {m for m in imports_of(name, path) if m in modules and m != name
                    and not m.startswith(name + ".")}
             for name, path in modules.items()}
    edges["coursework"] = set()
    _assert_acyclic(edges)


def _assert_acyclic(edges: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_no_import_cycle_among_engine_modules():
    edges = graph()
    # a package's __init__ importing its own submodules is not a cycle
    edges = {n: {d for d in deps if not (d.startswith(n + ".") and n != "engine")}
             for n, deps in edges.items()}
    edges["engine"] = set()       # the top package re-exports; modules import it lazily
    _assert_acyclic(edges)


# The trainer wing's rooms, most specific first; each may import only the rooms after it.
ROOMS = ("engine.trainer.lab", "engine.trainer", "engine.trainer.kernels",
         "engine.trainer.kernels.cpu")


def room_of(name: str) -> str | None:
    return next((r for r in reversed(ROOMS) if name == r or name.startswith(r + ".")), None)


def test_the_trainer_rooms_import_one_way():
    """The trainer reads its op kernels, which read the CPU back end; the lab reads
    them all. No arrow goes back up: no room imports one listed before it."""
    backwards = sorted(f"{name} -> {dep}" for name, deps in graph().items()
                       for dep in deps if room_of(name) and room_of(dep)
                       and ROOMS.index(room_of(dep)) < ROOMS.index(room_of(name)))
    assert not backwards, "an import against the rooms' order: " + "; ".join(backwards)


def test_the_checks_are_outside_the_library():
    assert not (ENGINE / "exercises").exists()
    assert (ROOT / "coursework" / "pieces.py").exists()


def _anchor(heading: str) -> str:
    """The anchor a Markdown heading gets: lower case, punctuation dropped, spaces as -."""
    text = "".join(c for c in heading.lower() if c.isalnum() or c in " -")
    return text.strip().replace(" ", "-")


def test_docstrings_cite_measurements_that_exist_and_no_history():
    """The trainer's docstrings point to kernels/cpu/README.md for their numbers
    (each cited section exists) and carry no experiment history ("round N")."""
    import re
    readme = ENGINE / "trainer" / "kernels" / "cpu" / "README.md"
    anchors = {_anchor(line.lstrip("#")) for line in readme.read_text().splitlines()
               if line.startswith("#")}
    for path in sorted(ENGINE.rglob("*.py")):
        text = path.read_text()
        for anchor in re.findall(r"README\.md#([a-z0-9-]+)", text):
            assert anchor in anchors, f"{path.relative_to(ROOT)} cites README.md#{anchor}"
        assert not re.search(r"\brounds? [0-9]", text, re.I), (
            f"{path.relative_to(ROOT)} cites a round of the performance log; say what and "
            f"why, and put the numbers in kernels/cpu/README.md")


@pytest.mark.parametrize("command", [
    "import engine",
    "sys.argv = ['budget', '--help']; runpy.run_module('engine.budget', run_name='__main__')",
    "sys.argv = ['budget', '--preset', 'gpt2-small']; "
    "runpy.run_module('engine.budget', run_name='__main__')",
])
def test_the_tape_and_the_budget_load_no_numba(command):
    """`import engine`, `python -m engine.budget --help` and a budget computation
    stay quick: numba (and the SciPy and llvmlite it loads) wait for a kernel."""
    code = ("import runpy, sys\n"
            f"try:\n    exec({command!r})\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numba', 'scipy', 'llvmlite') if m in sys.modules),"
            " file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr


# ------------------------------------------------------------- orientation texts
# Where the list of shared modules is written for a reader: (file, the words that
# open the passage, the words that close it).
SHARED_LIST_COPIES = [
    ("engine/__init__.py", "They share", "The exercise checks"),
    ("engine/trainer/__init__.py", "the two engines share", "\n\n"),
    ("CONTRIBUTING.md", "what both engines may import:", "`SHARED_MODULES` in"),
    ("CONTRIBUTING.md", "Shared by both engines:", "`tests/test_layering.py` checks"),
]


def _passage(relative: str, opening: str, closing: str) -> str:
    text = (ROOT / relative).read_text()
    start = text.index(opening)
    return text[start:text.index(closing, start)]


@pytest.mark.parametrize("relative,opening,closing", SHARED_LIST_COPIES,
                         ids=[f"{c[0]}: {c[1]}" for c in SHARED_LIST_COPIES])
def test_every_copy_of_the_shared_list_names_the_shared_modules(relative, opening, closing):
    import re
    top_level = {p.stem for p in ENGINE.iterdir() if p.suffix == ".py" or
                 (p / "__init__.py").exists()} - {"__init__", "trainer"}
    passage = re.sub(r"\([^)]*\)", "", _passage(relative, opening, closing))  # asides
    named = {w for w in re.findall(r"[a-z_]+", passage) if w in top_level}
    want = {m.rpartition(".")[2] for m in SHARED_MODULES}
    assert named == want, (f"{relative} lists {sorted(named)} as shared; the code shares "
                           f"{sorted(want)} (tests/test_layering.py SHARED_MODULES)")


def _files_named(text: str) -> set[str]:
    """Module and folder names in a cell of a lesson <-> module table."""
    import re
    return set(re.findall(r"(?:[a-z_]+/)*[a-z_]+\.py|[a-z_]+/(?![a-z_])", text))


def lesson_table_of_the_package() -> dict[str, tuple[set, set]]:
    """engine/__init__.py's table: lessons -> (tape files, trainer files)."""
    import re
    text = (ENGINE / "__init__.py").read_text()
    text = text.split("Lesson <-> module:")[1].split("Adding an op")[0]
    rows: dict[str, list[str]] = {}
    lessons = None
    for line in text.splitlines():
        start = re.match(r"\s{4}(\d\d(?:, \d\d)*)\s{2,}", line)
        if start:
            lessons = start.group(1)
            rows[lessons] = []
        if lessons is not None:
            rows[lessons].append(line)
    table = {}
    for lessons, lines in rows.items():
        tape, _, trainer = "\n".join(lines).partition("trainer:")
        table[lessons] = (_files_named(tape.partition("tape:")[2]), _files_named(trainer))
    return table


def lesson_table_of_the_guide() -> dict[str, tuple[set, set]]:
    """CONTRIBUTING.md's table: lessons -> (tape files, trainer files)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    text = text.split("### Lesson <-> module")[1].strip().split("\n\n")[0]
    table = {}
    for line in text.splitlines()[2:]:
        _, tape, trainer, lessons = [c.strip() for c in line.strip().strip("|").split("|")]
        table[lessons] = (_files_named(tape), _files_named(trainer))
    return table


def test_the_lesson_module_tables_agree_and_name_files_that_exist():
    package, guide = lesson_table_of_the_package(), lesson_table_of_the_guide()
    assert package == guide, (
        "engine/__init__.py's and CONTRIBUTING.md's lesson <-> module tables differ: "
        + "; ".join(f"{k}: {package.get(k)} against {guide.get(k)}"
                    for k in sorted(set(package) | set(guide)) if package.get(k) != guide.get(k)))
    for lessons, (tape, trainer) in package.items():
        for folder, names in ((ENGINE, tape), (ENGINE / "trainer", trainer)):
            for name in names:
                assert (folder / name).exists(), (
                    f"lesson {lessons} names {name}, which is not in "
                    f"{folder.relative_to(ROOT)}/")


def test_the_trainers_file_index_lists_every_file():
    """engine/trainer/__init__.py's index names each module and folder of the trainer."""
    import re
    text = (ENGINE / "trainer" / "__init__.py").read_text()
    listed = set(re.findall(r"^    ([a-z_]+\.py|[a-z_]+/)", text, re.M))
    present = ({p.name for p in (ENGINE / "trainer").glob("*.py") if p.name != "__init__.py"}
               | {p.name + "/" for p in (ENGINE / "trainer").iterdir()
                  if (p / "__init__.py").exists()})
    assert listed == present, (f"the index lacks {sorted(present - listed)} and names "
                               f"{sorted(listed - present)}, which do not exist")


def test_measurement_tables_are_cited_where_they_are():
    """A text citing THREADS.md or PERFORMANCE.md by anchor cites a heading that exists,
    in the lab's files."""
    import re
    lab = ENGINE / "trainer" / "lab"
    anchors = {name: {_anchor(line.lstrip("#")) for line in (lab / name).read_text()
                      .splitlines() if line.startswith("#")}
               for name in ("THREADS.md", "PERFORMANCE.md")}
    assert not (ENGINE / "trainer" / "THREADS.md").exists(), "THREADS.md belongs in lab/"
    for path in sorted(ENGINE.rglob("*.py")):
        for name, anchor in re.findall(r"(THREADS\.md|PERFORMANCE\.md)#([a-z0-9-]+)",
                                       path.read_text()):
            assert anchor in anchors[name], f"{path.relative_to(ROOT)} cites {name}#{anchor}"
