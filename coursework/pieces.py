"""The learner's pieces: where passed exercises are kept, how they are checked and loaded.

A passed check calls `save_piece(name, fn, exercise)`. Before the piece is
kept it is checked where it will run: its source is loaded again in a fresh
namespace (a piece that needs a name from the notebook fails here, saying
which), and a piece with a slot in the trainer is run on the buffers that
slot hands it, beside the engine's version (`coursework.slots`). Only then is
it stored, atomically, in `course/my_pieces/` (or $BACKPROP_PIECES_DIR);
saving is best effort: an unwritable folder costs the piece, never the
passed answer, and says so.

Later lessons call `piece_for_slot(name)`: the learner's function, or None
and the reason the engine's version runs instead (never saved, does not
load, breaks its slot's contract); `tape_rules()` runs the learner's lesson
03 rules inside the tape for a block. The library never looks here: a lesson
loads a piece and hands it to the engine explicitly (`engine.rules.override_vjp`,
`engine.trainer.model.use_kernel`, the clip and optimizer of a training step).

A solution notebook (run from course/solutions, as `make course`, `make test`
and a learner opening one do) keeps its pieces in a temporary folder, even
with $BACKPROP_PIECES_DIR set, so the reference solutions never replace the
learner's own. A damaged `index.json` is kept aside and rebuilt from the piece
files. A piece is loaded and checked first in a child process that is killed at its
deadline (`_vetting`: a piece that hangs, exits, forks, floods the output or changes
shared state is refused there, with the reason); only a piece that passed is loaded
into the notebook's kernel, under `_piece_guard.guarded`: a deadline, bounded output,
whatever it changed in the kernel put back (`_kernel_state`).
"""
from __future__ import annotations

import builtins
import dis
import importlib
import inspect
import json
import linecache
import math
import os
import re
import stat
import tempfile
import textwrap
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:          # Windows: one notebook at a time
    fcntl = None

import numpy as np

from ._core import ExerciseError
from ._piece_guard import PieceRefused, _Deadline, guarded
from ._vetting import UNVETTED, read_piece, vet, vet_ahead

COURSE = Path(__file__).resolve().parents[1] / "course"
_SOLUTION_RUN_DIR: Path | None = None


def pieces_dir() -> Path:
    """Where passed exercises are kept: a temporary folder when a solution notebook runs
    (cwd course/solutions, as `make course` and `make test` run them), else
    $BACKPROP_PIECES_DIR, else course/my_pieces. The solution run is decided first, so
    the reference solutions never replace the learner's pieces wherever those are kept."""
    global _SOLUTION_RUN_DIR
    try:
        in_solutions = Path.cwd().resolve() == (COURSE / "solutions").resolve()
    except OSError:
        in_solutions = False
    if in_solutions:
        if _SOLUTION_RUN_DIR is None:
            _SOLUTION_RUN_DIR = Path(tempfile.mkdtemp(prefix="backprop-solution-pieces-"))
        return _SOLUTION_RUN_DIR
    env = os.environ.get("BACKPROP_PIECES_DIR")
    return Path(env) if env else COURSE / "my_pieces"


def _fresh_namespace() -> dict:
    """The names a lesson's exercise cell may use without importing them itself:
    saved numba kernels keep their @njit decorator."""
    import numba
    return {"np": np, "math": math, "numba": numba, "njit": numba.njit,
            "prange": numba.prange, "__builtins__": builtins}


def _code_names(code) -> tuple[set[str], set[str]]:
    """(names read as globals anywhere in `code`, names bound at its top level)."""
    read, bound, todo = set(), set(), [(code, True)]
    while todo:
        c, top = todo.pop()
        for ins in dis.get_instructions(c):
            name = str(ins.argval).removeprefix("NULL + ").removesuffix(" + NULL")
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                read.add(name)
            elif top and ins.opname in ("STORE_NAME", "STORE_GLOBAL", "IMPORT_NAME"):
                bound.add(name)
        todo.extend((k, False) for k in c.co_consts if inspect.iscode(k))
    return read, bound


def missing_names(fn, namespace: dict) -> list[str]:
    """Global names `fn`'s code reads that neither `namespace` nor the builtins define."""
    code = getattr(getattr(fn, "py_func", fn), "__code__", None)
    if code is None:
        return []
    read, _ = _code_names(code)
    return sorted(n for n in read if n not in namespace and not hasattr(builtins, n))


def _import_line(name: str, value) -> str | None:
    """An import statement that binds `name` to `value`, if one exists."""
    if inspect.ismodule(value):
        return f"import {value.__name__}" if value.__name__ == name else \
            f"import {value.__name__} as {name}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "." in qualname:
        return None
    try:
        if getattr(importlib.import_module(module), qualname) is not value:
            return None
    except (ImportError, AttributeError):
        return None
    return f"from {module} import {qualname}" + ("" if qualname == name else f" as {name}")


def _helper_source(name: str, value, cell_file: str) -> str | None:
    """The source of a notebook's own function or class `name`, or None."""
    if not (inspect.isfunction(value) or inspect.isclass(value)) or value.__name__ != name:
        return None
    try:
        return textwrap.dedent(inspect.getsource(value))
    except (OSError, TypeError):   # a class of a notebook cell: look in the piece's cell
        lines = linecache.getlines(cell_file)
        for i, line in enumerate(lines):
            if re.match(rf"class {re.escape(name)}\b", line):
                return "".join(inspect.getblock(lines[i:]))
    return None


def standalone_source(fn) -> tuple[str, list[str]]:
    """The source of `fn` with what it takes from its notebook: import lines for modules
    and library objects, the source of the notebook's own helpers (a class, a function).
    Returns (source, the names that cannot travel: plain values of the notebook)."""
    py = getattr(fn, "py_func", fn)
    source = textwrap.dedent(inspect.getsource(py))
    notebook = getattr(py, "__globals__", {})
    fresh = _fresh_namespace()
    imports: list[str] = []
    helpers: list[str] = []
    stuck: list[str] = []
    for _ in range(8):                                 # helpers may need helpers
        text = "\n".join(imports + helpers + [source])
        read, bound = _code_names(compile(text, "<piece>", "exec"))
        missing = sorted(n for n in read - bound - set(fresh) if not hasattr(builtins, n))
        todo = [n for n in missing if n not in stuck]
        if not todo:
            break
        for name in todo:
            if name not in notebook:
                stuck.append(name)
                continue
            value = notebook[name]
            line = _import_line(name, value)
            if line is not None:
                imports.append(line)
                continue
            helper = _helper_source(name, value, py.__code__.co_filename)
            if helper is None:
                stuck.append(name)
            else:
                helpers.insert(0, helper)
    parts = (["\n".join(imports) + "\n"] if imports else []) + helpers + [source]
    return "\n\n".join(p.rstrip("\n") + "\n" for p in parts).replace("\n\n\n", "\n\n"), stuck


def _load_file(path: Path, function: str, source: bytes | None = None):
    """Execute a piece's file (`source`, its bytes, when already read: the file is not
    read again) in a fresh namespace; (function or None, namespace)."""
    source = read_piece(path) if source is None else source
    namespace = _fresh_namespace()
    exec(compile(source, str(path), "exec"), namespace)
    return namespace.get(function), namespace


def _checked(name: str, fn, namespace: dict, at_save: bool = False):
    """None if `fn` (loaded fresh) fits its slot, else the reason it does not."""
    if fn is None:
        return "the saved file does not define the function"
    needs = missing_names(fn, namespace)
    if needs:
        return (f"it uses {', '.join(repr(n) for n in needs)} from the notebook, which a "
                f"piece loaded on its own does not have")
    from .slots import SlotError, check
    try:
        check(name, fn, at_save=at_save)
    except SlotError as err:
        return str(err)
    return None


def attempt_piece(name: str, path: Path, function: str, at_save: bool = False,
                  timer: bool = True, check: bool = True, source: bytes | None = None,
                  threads: bool = True):
    """Load the piece file `path` (`source`, its bytes, when already read) and (when
    `check`) check `function` in the slot of `name`, in this process, under `guarded`. Returns (fn, None, None) when it fits, else
    (None, kind, text): kind "load" (it does not load: text is the error), "refused" (it
    broke a bound of `guarded`: text says which) or "slot" (it breaks its slot's
    contract). Never raises: SystemExit, KeyboardInterrupt and GeneratorExit are
    answers too."""
    try:
        with guarded(f"your piece '{name}'", timer=timer, threads=threads):
            try:
                fn, namespace = _load_file(path, function, source)
            except _Deadline:
                raise
            except BaseException as err:        # SystemExit, KeyboardInterrupt too
                return None, "load", f"{type(err).__name__}: {err}"
            try:
                why = _checked(name, fn, namespace, at_save=at_save) if check else \
                    None if fn is not None else "the saved file does not define the function"
            except _Deadline:
                raise
            except BaseException as err:
                why = f"it raised {type(err).__name__} where the engine runs it: {err}"
    except PieceRefused as err:
        return None, "refused", str(err)
    return (fn, None, None) if why is None else (None, "slot", why)


def vetted_piece(name: str, path: Path, function: str, at_save: bool = False):
    """`attempt_piece`, run first in a child process (`_vetting.vet`, killed at its
    deadline). The file is read once: the child vets those bytes and the kernel loads
    the same bytes, so a file changed meanwhile (by the piece, or by anyone) is not
    what runs here. A piece the child refused is not run here; one it passed is loaded
    and checked in its slot again here, under `guarded` (a piece that behaves otherwise
    outside the child meets the same contract and bounds)."""
    try:
        source = read_piece(path)
    except OSError as err:
        return None, "load", f"OSError: {err}"
    verdict = vet(name, path, function, at_save=at_save, source=source)
    if verdict not in (None, UNVETTED):
        return None, *verdict
    return attempt_piece(name, path, function, at_save=at_save, source=source)


@contextmanager
def index_lock(folder: Path):
    """Hold the pieces folder's lock (an flock on the folder itself, so no file is added):
    two notebooks saving at once read, change and write the index one after the other,
    and neither loses the other's entry. Re-entrant within a process."""
    if fcntl is None or _LOCKS_HELD.get(folder):
        _LOCKS_HELD[folder] = _LOCKS_HELD.get(folder, 0) + 1
        try:
            yield
        finally:
            _LOCKS_HELD[folder] -= 1
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _LOCKS_HELD[folder] = 1
        try:
            yield
        finally:
            _LOCKS_HELD[folder] = 0
    finally:
        os.close(fd)            # closing the descriptor releases the lock


_LOCKS_HELD: dict = {}


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` all at once (a temporary file renamed over it); temporary
    files a killed save of the same file left behind are removed first."""
    for stale in path.parent.glob(f".{path.stem}-*.tmp"):
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


INDEX = "index.json"
INDEX_LIMIT = 1_000_000        # bytes; the index of every piece of the course is about 2 kB
_HEADER = re.compile(r"# Your solution to exercise (?P<exercise>\S+), saved when its check "
                     r"passed\.\n# Later lessons load `(?P<function>\w+)` from here as the "
                     r"piece '(?P<name>\w+)'\.\n")


def _piece_header(name: str, function: str, exercise: str) -> str:
    """The two comment lines a piece's file starts with (the index is rebuilt from them)."""
    return (f"# Your solution to exercise {exercise}, saved when its check passed.\n"
            f"# Later lessons load `{function}` from here as the piece '{name}'.\n")


def _index_problem(index) -> str | None:
    """None when `index` maps piece names to {"function": ..., "exercise": ...}, else
    what is wrong with it."""
    if not isinstance(index, dict):
        return f"it holds a JSON {type(index).__name__}, not an object of pieces"
    for name, entry in index.items():
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(function, str) or not function.isidentifier():
            text = json.dumps(entry)
            return (f"its entry {name!r} is {text if len(text) < 60 else text[:57] + '...'}, "
                    f'not {{"function": ..., "exercise": ...}}')
    return None


def _index_from_files(folder: Path) -> dict:
    """The index the piece files in `folder` describe, read from their first two lines."""
    index = {}
    for path in sorted(folder.glob("*.py")):
        if not path.is_file():
            continue
        try:
            with path.open(encoding="utf-8") as f:
                head = f.readline(400) + f.readline(400)
        except (OSError, ValueError):
            continue
        found = _HEADER.match(head)
        if found and found["name"] == path.stem:
            index[path.stem] = {"function": found["function"], "exercise": found["exercise"]}
    return index


def _rebuild_index(folder: Path, problem: str) -> dict:
    """Move the damaged index aside, write one rebuilt from the piece files, say so."""
    index = _index_from_files(folder)
    meta = folder / INDEX
    aside = folder / f"index.damaged-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for n in range(2, 100):
        if not aside.exists():
            break
        aside = folder / f"index.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{n}.json"
    try:
        os.replace(meta, aside)
        _write_atomic(meta, json.dumps(index, indent=1, sort_keys=True))
        done = f"It was kept as {aside.name} and a new index was written"
    except OSError as err:
        done = (f"It could not be replaced ({err.strerror or err}), so this time the pieces "
                f"are read")
    print(f"(The index of your pieces, {meta}, is damaged: {problem}. {done} from the "
          f"piece files there: {', '.join(sorted(index)) or 'none'}.)")
    return index


def _read_index(folder: Path) -> dict:
    """The index of the pieces in `folder`: {name: {"function": ..., "exercise": ...}}.
    A damaged index (not JSON, JSON of another shape, not a regular file) is moved aside
    and rebuilt from the piece files, with a line saying so; a missing one is empty."""
    meta = folder / INDEX
    try:
        info = meta.stat()
    except OSError:
        return {}
    if not stat.S_ISREG(info.st_mode):
        return _rebuild_index(folder, "it is not a regular file")
    if info.st_size > INDEX_LIMIT:
        return _rebuild_index(folder, f"it is {info.st_size:,} bytes, far more than an "
                                      f"index of pieces holds")
    try:
        index = json.loads(meta.read_text(encoding="utf-8"))
    except OSError:
        return {}
    except (ValueError, RecursionError) as err:      # UnicodeDecodeError is a ValueError
        return _rebuild_index(folder, f"it is not valid JSON ({err})")
    problem = _index_problem(index)
    return index if problem is None else _rebuild_index(folder, problem)


def save_piece(name: str, fn, exercise: str) -> Path | None:
    """Check the learner's function where it will run, then store it as the piece `name`.

    Raises ExerciseError when the piece would misbehave in its slot (needs a notebook
    name, breaks the slot's contract). Returns the file written, or None when the
    source cannot stand alone (a function typed into a plain Python prompt, or made
    inside another function) or the
    folder is not writable (a message says so; the passed answer stands)."""
    made = _piece_text(name, fn, exercise)
    if made is None:
        return None
    function, text = made
    with tempfile.TemporaryDirectory(prefix="backprop-piece-check-") as scratch:
        candidate = Path(scratch) / f"{name}.py"
        candidate.write_text(text)
        verdict = vet(name, candidate, function, at_save=True)
        if verdict is UNVETTED:     # no child: the check runs here, as the only line
            verdict = attempt_piece(name, candidate, function, at_save=True)[1:]
    kind, why = verdict or (None, None)
    if kind == "load":
        raise ExerciseError(exercise, f"your answer is right in the notebook, but loaded on "
                                      f"its own, as later lessons load it, it fails: {why}")
    if kind == "refused":
        raise ExerciseError(exercise, f"your answer is right in the notebook, but {why}.")
    if kind == "slot":
        fix = ("Make the function stand alone (define or import what it uses inside the "
               "cell)" if "from the notebook" in why else "Fix that")
        raise ExerciseError(exercise, f"your answer is right in the notebook, but it would "
                                      f"not work where the engine runs it: {why}. {fix} and "
                                      f"run the check again.")
    folder = pieces_dir()
    path = folder / f"{name}.py"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, text)
        with index_lock(folder):
            index = _read_index(folder)
            index[name] = {"function": function, "exercise": exercise}
            _write_atomic(folder / INDEX, json.dumps(index, indent=1, sort_keys=True))
    except OSError as err:
        print(f"(Your answer passed, but it could not be saved as the piece '{name}': "
              f"{err.strerror or err} in {folder}. Later lessons will run the engine's "
              f"version; set BACKPROP_PIECES_DIR to a writable folder to keep your pieces.)")
        return None
    return path


def vet_before_saving(items) -> None:
    """Vet the pieces of `items` ((name, function, exercise) each), about to be saved one
    after the other, together in one child (`_vetting.vet_ahead`): each `save_piece` then
    finds its verdict ready. A piece that cannot be saved is left for its save to say why."""
    with tempfile.TemporaryDirectory(prefix="backprop-piece-check-") as scratch:
        requests = []
        for name, fn, exercise in items:
            try:
                made = _piece_text(name, fn, exercise)
            except ExerciseError:
                continue
            if made is not None:
                candidate = Path(scratch) / f"{name}.py"
                candidate.write_text(made[1])
                requests.append((name, candidate, made[0]))
        vet_ahead(requests, at_save=True)


def _piece_text(name: str, fn, exercise: str) -> tuple[str, str] | None:
    """(the function's name, the piece file's text) for `fn`, or None when its source
    cannot stand alone; ExerciseError when it reads a value from the notebook."""
    if "<locals>" in getattr(getattr(fn, "py_func", fn), "__qualname__", ""):
        return None                    # a function made inside another one: no piece
    try:
        source, stuck = standalone_source(fn)
    except (OSError, TypeError):
        return None
    if stuck:
        raise ExerciseError(exercise, f"your answer is right in the notebook, but it reads "
                                      f"{', '.join(repr(n) for n in stuck)} from the notebook "
                                      f"(a value set in another cell). Later lessons and the "
                                      f"trainer load the piece on its own, where "
                                      f"{'that name does' if len(stuck) == 1 else 'those names do'}"
                                      f" not exist (a numba kernel would fail with a NameError "
                                      f"at its first call). Define the value inside the "
                                      f"function and run the check again.")
    function = getattr(getattr(fn, "py_func", fn), "__name__", name)
    return function, _piece_header(name, function, exercise) + source


def load_piece(name: str):
    """Return the learner's saved function for `name` (loaded fresh), or None if not saved.
    It is vetted in a child process first (`_vetting`), then loaded here under `guarded`:
    PieceRefused when it loops, exits, forks, changes the kernel or does not load (its
    slot's contract is not checked: that is `piece_for_slot`)."""
    folder = pieces_dir()
    entry = _read_index(folder).get(name)
    path = folder / f"{name}.py"
    if entry is None or not path.exists():
        return None
    try:
        source = read_piece(path)
    except OSError as err:
        raise PieceRefused(f"your piece '{name}' does not load: {err}") from None
    verdict = vet(name, path, entry["function"], source=source)
    if verdict not in (None, UNVETTED) and verdict[0] != "slot":
        kind, text = verdict
        raise PieceRefused(text if kind == "refused" else
                           f"your piece '{name}' does not load: {text}")
    with guarded(f"your piece '{name}'"):
        return _load_file(path, entry["function"], source)[0]


def piece_for_slot(name: str):
    """(the learner's function, None) when the saved piece loads and keeps its slot's
    contract, else (None, why the engine's version runs). Never raises. The piece is
    vetted in a child process first, killed at its deadline (`_vetting`); only one that
    passed there is loaded here, under `guarded` (a deadline, bounded output, the
    kernel's state put back)."""
    folder = pieces_dir()
    entry = _read_index(folder).get(name)
    path = folder / f"{name}.py"
    if entry is None or not path.exists():
        return None, "not written yet"
    fn, kind, text = vetted_piece(name, path, entry["function"])
    if kind is None:
        return fn, None
    return None, f"yours does not load: {text}" if kind == "load" else f"yours was skipped: {text}"


def vet_saved_pieces(names) -> None:
    """Vet the saved pieces among `names` together, in one child process
    (`_vetting.vet_ahead`), so that the loads that follow find their verdicts ready: a
    lesson that plugs in several pieces starts the engine's imports once, not per piece."""
    folder = pieces_dir()
    index = _read_index(folder)
    vet_ahead([(name, folder / f"{name}.py", index[name]["function"]) for name in names
               if name in index and (folder / f"{name}.py").is_file()])


def piece_or_engine(name: str, exercise: str, engine_version, fallback: str = "the engine's"):
    """(function, owner) for a slot a lesson runs: the learner's saved piece `name` when it
    loads and keeps its slot's contract, owner "yours (NN.k)"; else `engine_version`, owner
    "the engine's, because <why>" (`fallback` names it when it is not the engine's).
    Never raises."""
    fn, why = piece_for_slot(name)
    if fn is not None:
        return fn, f"yours ({exercise})"
    return engine_version, f"{fallback}, because {why}"


class TapeRun:
    """Which of the learner's lesson 03 rules ran inside the tape, and how often."""

    def __init__(self):
        self.pieces: dict = {}
        self.skipped: dict = {}
        self.calls: dict = {}

    def report(self) -> list[str]:
        from .slots import TAPE_SLOTS
        lines = []
        for name, (exercise, rule, _) in TAPE_SLOTS.items():
            if name in self.pieces:
                who = f"yours ({exercise}), ran {self.calls.get(name, 0)} times"
            else:
                who = f"the engine's: {self.skipped[name]}"
            lines.append(f"{rule}: {who}")
        return lines


@contextmanager
def tape_rules():
    """Inside the block the tape runs the learner's saved `matmul_vjp` and `unbroadcast`
    (each checked in its slot first) in place of its own rules; yields a TapeRun."""
    from engine.rules import override_vjp
    from .slots import TAPE_SLOTS, tape_rule
    run = TapeRun()
    with ExitStack() as stack:
        for name, (_, _, op_name) in TAPE_SLOTS.items():
            fn, why = piece_for_slot(name)
            if fn is None:
                run.skipped[name] = why
                continue
            run.pieces[name] = fn
            stack.enter_context(override_vjp(op_name, tape_rule(name, fn, run.calls)))
        yield run


def gradient_checker():
    """(spot_check, owner): the learner's 04.3 `spot_check`, else the engine's
    (`slots.engine_spot_check`, the same calling convention and rows)."""
    from .slots import engine_spot_check
    return piece_or_engine("spot_check", "04.3", engine_spot_check)


def block_count():
    """(block_saved_elements, owner): the learner's 06.2 count of what one GPT block keeps,
    else the engine's (`slots.engine_block_saved_elements`, the same calling convention)."""
    from .slots import engine_block_saved_elements
    return piece_or_engine("block_saved_elements", "06.2", engine_block_saved_elements)

def central_difference():
    """(central_difference_gradient, owner): the learner's 00.1 function, else the
    engine's (`slots.engine_central_difference`, the same calling convention)."""
    from .slots import engine_central_difference
    return piece_or_engine("central_difference_gradient", "00.1", engine_central_difference)


def scalar_engine():
    """(leaf, backward, owner): a scalar engine to run one computation on. The learner's
    lesson 02 walk and rules (piece `scalar_backward`, run on `slots.ScalarNode`) when
    saved and keeping the slot's contract, else `engine.scalar` (`Value`, whose
    `.backward()` does the same). `leaf(x)` makes an input; `backward(root)` fills the
    gradients; `owner` says whose code runs, and why the engine's."""
    from .slots import ScalarNode
    fn, why = piece_for_slot("scalar_backward")
    if fn is not None:
        return ScalarNode, fn, "yours (02.1-02.2)"
    from engine.scalar import Value
    return Value, Value.backward, f"the engine's (engine.scalar), because {why}"
