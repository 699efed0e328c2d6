"""What the lessons name, held to the tree.

* Every file or folder path a lesson names in backticks (`engine/budget/measured/README.md`,
  `coursework/slots/lesson08.py`) exists in the repository (or under course/, for the
  start page's `solutions/`); the folder a learner's pieces are saved in is made at run time.
* Every count a lesson states about its own material matches it: "Nine of your exercises
  fill a *slot*" and the table below it, "Ten ... steps were measured" and the measured
  table, "N exercises" and the lesson's checks.
* No heading hides in a code cell as a comment; no widget cell opens with a remark about
  the widget's text form; no lesson leans on "the source texts", which a learner does not
  have; 07.5's questions do not list the tensors the exercise asks for.
"""
from __future__ import annotations

import json
import re

import pytest

from notebook_tools import ROOT, build_course, lesson_stems

SOURCES = {stem: (ROOT / "course" / "source" / f"{stem}.py").read_text()
           for stem in lesson_stems()}
START_PAGE = (ROOT / "course" / "source" / "start_here.md").read_text()
MADE_AT_RUN_TIME = ("my_pieces/", "course/my_pieces/", "backups/")
NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten "
                                      "eleven twelve".split())}
PATH = re.compile(r"`((?:\.\./)?[A-Za-z_][\w.-]*(?:/[\w.-]+)*(?:/|\.(?:py|md|json|toml|cfg|txt|ipynb)))`")


def named_paths(text: str) -> list[str]:
    """The backticked tokens that read as a repository path: a folder ending in "/", or a
    file with a known extension and at least one folder ("`w/256`" is arithmetic)."""
    return [p for p in PATH.findall(text) if "/" in p.rstrip("/") or p.endswith("/")]


def test_the_path_pattern_reads_paths_and_not_arithmetic():
    text = "see `engine/rules.py`, `my_pieces/`, `w/256`, `dL/dw1`, `fc1/matmul` and `x.py`"
    assert named_paths(text) == ["engine/rules.py", "my_pieces/"]


@pytest.mark.parametrize("name", [*SOURCES, "start_here"])
def test_every_path_a_lesson_names_exists(name):
    text = START_PAGE if name == "start_here" else SOURCES[name]
    missing = [p for p in named_paths(text) if p not in MADE_AT_RUN_TIME
               and not (ROOT / p).exists() and not (ROOT / "course" / p).exists()]
    assert not missing, f"{name} names paths that are not in the tree: {missing}"


def _number(word: str) -> int:
    return int(word) if word.isdigit() else NUMBERS[word.lower()]


def _table_rows_after(text: str, start: int) -> int:
    """The body rows of the first markdown table after `start` (header and rule left out)."""
    lines = text[start:].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("# |"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("# |"):
            break
        rows.append(line)
    return len(rows) - 2


def test_the_slot_count_matches_its_table():
    text = SOURCES["13_the_fused_cpu_trainer"]
    found = re.search(r"(\w+) of your exercises fill a \*slot\*", text)
    assert found, "lesson 13 no longer says how many exercises fill a slot"
    assert _number(found.group(1)) == _table_rows_after(text, found.end())


def test_the_count_of_measured_steps_matches_the_measurements():
    text = SOURCES["07_training_step_budget"]
    found = re.search(r"(\w+) Hugging Face transformers\s+(?:#\s+)?steps were measured", text)
    assert found, "lesson 07 no longer says how many real steps were measured"
    rows = json.loads((ROOT / "engine" / "budget" / "measured" /
                       "h200_hf_training_steps.json").read_text())["rows"]
    assert _number(found.group(1)) == len(rows)


@pytest.mark.parametrize("stem", list(SOURCES))
def test_a_count_of_the_lessons_exercises_matches_its_checks(stem):
    text = SOURCES[stem]
    checks = len(build_course.check_ids(text))
    word = "|".join(NUMBERS)
    for found in re.finditer(rf"\b(?:this lesson has|this lesson's) ({word}|\d+) exercises",
                             text, flags=re.IGNORECASE):
        assert _number(found.group(1)) == checks, (stem, found.group(0), checks)


@pytest.mark.parametrize("stem", list(SOURCES))
def test_no_heading_hides_in_a_code_cell(stem):
    for kind, source in build_course.parse_cells(SOURCES[stem]):
        if kind == "code":
            headings = [line for line in source.splitlines() if re.match(r"# #{1,4} \S", line)]
            assert not headings, f"{stem}: a markdown heading inside a code cell: {headings}"


@pytest.mark.parametrize("stem", list(SOURCES))
def test_no_stale_remarks(stem):
    text = SOURCES[stem]
    assert "a widget's text form" not in text, f"{stem}: a widget cell explains its text form"
    assert "source text" not in text.lower(), (
        f"{stem} cites 'the source texts', which a learner does not have: say what they are")


def test_07_5_questions_do_not_list_the_tensors_it_asks_for():
    text = SOURCES["07_training_step_budget"]
    questions = text[text.index("Questions to answer first"):text.index("## Exercise 07.5")]
    for answer in ("receives a gradient of its output", "writes a gradient of its input",
                   "gradient of its output and"):
        assert answer not in questions, answer


DOTTED = re.compile(r"`(engine(?:\.\w+)+)`")


def _home_holds(module, name: str) -> bool:
    """Whether `name` lives in `module` (or a module of its package), not imported there
    from elsewhere: a function's or class's own module, else a top-level assignment."""
    import importlib.util
    import inspect
    obj = getattr(module, name)
    target = getattr(obj, "py_func", obj)
    if inspect.isfunction(target) or inspect.isclass(target):
        home = target.__module__
        return home == module.__name__ or home.startswith(module.__name__ + ".")
    if inspect.ismodule(obj):
        return True
    spec = importlib.util.find_spec(module.__name__)
    return re.search(rf"^{name}\s*[:=]", open(spec.origin).read(), re.M) is not None


@pytest.mark.parametrize("name", SOURCES)
def test_every_engine_name_a_lesson_gives_lives_where_it_says(name):
    """`engine.trainer.model.KERNELS` must be a module and a name defined in it: a name the
    module only imports from another file sends the learner to the wrong file."""
    import importlib
    wrong = []
    for dotted in sorted(set(DOTTED.findall(SOURCES[name]))):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                module = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        rest = parts[cut:]
        if len(rest) > 1 or (rest and (not hasattr(module, rest[0])
                                       or not _home_holds(module, rest[0]))):
            wrong.append(dotted)
    assert not wrong, f"{name} names what does not live there: {wrong}"
