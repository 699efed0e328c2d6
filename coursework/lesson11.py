"""Checks for lesson 11, "Embeddings".

11.1 the embedding's backward: a scatter-add of the upstream gradient rows
     into a (V, C) table, with repeated ids summed, untouched rows exactly
     zero, and the result bit-for-bit the same on every run and for any
     number of threads. The check recognises "last write wins" and numpy's
     buffered `d[ids] += g` (both drop repeated ids), garbage in untouched
     rows, a row missing some of its tokens' additions (lost updates), and
     runs that differ (a race). Generated float64 cases of widths around a
     block of 16 columns and lesson 13's C = 128 catch column blocks that stop
     short of C or that each add every column, named when reproduced (the
     latter also race: a run on one thread names the walk before any race).
11.2 the memory of an embedding gradient for one batch: dense, the whole
     (V, C) table, or row-sparse, the distinct rows the batch touched plus
     one id each. The check recognises a row per token (repeats counted
     twice), the ids forgotten, a dense gradient of the batch's shape, and
     elements counted instead of bytes.
11.3 what decoupled weight decay does to one embedding row over a run:
     dense AdamW decays every row at every step, a sparse ("lazy") update
     only on the steps where the row's token appeared.
"""
from __future__ import annotations

import ast
import contextlib
import math

import numpy as np

from engine.timing import median_seconds
from ._core import ExerciseError, attempt, function_syntax, is_call, passed
from ._compiled_stubs import uncompile_stubs
from .pieces import save_piece

EX_SCATTER = "11.1 (embedding_backward)"
EX_SPARSE = "11.2 (gradient_bytes)"
EX_DECAY = "11.3 (decay_factors)"
# what every race hint ends with: why updates are lost, and the split that avoids it
RACE_FIX = ("If threads add into the same row at the same time, one read-modify-write "
            "overwrites the other; give each thread its own columns (prange over column "
            "blocks, tokens in order inside).")


def scatter_add_reference(ids, g, vocab_size):
    """np.add.at adds repeated ids one after another, in token order."""
    d = np.zeros((vocab_size, g.shape[1]), dtype=g.dtype)
    np.add.at(d, np.asarray(ids), g)
    return d


def _set_threads(n):
    try:
        import numba
        numba.set_num_threads(n)
        return True
    except (ImportError, ValueError):
        return False


def _max_threads():
    try:
        import numba
        return numba.config.NUMBA_NUM_THREADS
    except ImportError:
        return 1


@contextlib.contextmanager
def _one_thread():
    """numba's parallel loops run on one thread inside the block; the caller's count is
    put back after. Yields whether there were several (False without numba)."""
    try:
        import numba
        before = numba.get_num_threads()
        numba.set_num_threads(1)
    except (ImportError, ValueError):
        yield False
        return
    try:
        yield before > 1
    finally:
        numba.set_num_threads(before)


def _column_slip_on_one_thread(embedding_backward, ids, g, vocab_size, got, want):
    """`_column_slip_hint` of the learner's table, or else of a run on one thread. Blocks
    that each walk every column also write the same entries at once, so on several
    threads some of their extra additions may be lost and the table is no whole multiple
    of the sums: it would be called a race, or not, by the threads' timing. On one thread
    the slip's table comes out whole every time, and the walk is named first."""
    hint = _column_slip_hint(got, want)
    if hint is not None:
        return hint
    with _one_thread() as several:
        if not several:
            return None
        alone = np.asarray(attempt(EX_SCATTER, embedding_backward, ids, g, vocab_size))
    return _column_slip_hint(alone, want) if alone.shape == want.shape else None


def _diagnose(ids, g, vocab_size, got):
    """Starting from zeros, `d[ids] = g` and numpy's buffered `d[ids] += g` give the
    same table: the last token of each id wins."""
    last = np.zeros((vocab_size, g.shape[1]), g.dtype)
    last[ids] = g
    first = np.zeros((vocab_size, g.shape[1]), g.dtype)
    first[ids[::-1]] = g[::-1]
    if np.allclose(got, last) or np.allclose(got, first):
        return ("each row holds only one of its tokens' gradients: repeated ids were dropped. "
                "Both `d[ids] = g` and numpy's `d[ids] += g` do this (the latter is buffered: "
                "it reads every row before writing any). Use np.add.at(d, ids, g) or a loop "
                "d[ids[t], j] += g[t, j] over every token t.")
    return None


def _check_repeatable(embedding_backward, ids, g, vocab_size, got, runs: int = 4) -> None:
    """A wrong result that changes from run to run is a race, whatever it looks like."""
    for _ in range(runs):
        again = np.asarray(attempt(EX_SCATTER, embedding_backward, ids, g, vocab_size))
        if again.shape == got.shape and again.tobytes() != got.tobytes():
            raise ExerciseError(EX_SCATTER, f"the sums are wrong and differ from run to run on "
                                            f"the same {len(ids)} tokens: updates were lost. "
                                            + RACE_FIX)


def _lost_update_hint(ids, g, got, row, racing: str | None):
    """A row that holds only some of its tokens' gradients lost the others: two threads'
    read-modify-writes of the row collided where the code shows a race (`racing`, the line
    from `racing_rows`), else the loop skipped them."""
    positions = np.flatnonzero(ids == row).tolist()
    if len(positions) > 12:
        return None
    for mask in range((1 << len(positions)) - 1):     # every proper subset, the empty one too
        kept = [t for i, t in enumerate(positions) if mask >> i & 1]
        if np.allclose(got[row], g[kept].sum(axis=0), rtol=1e-12, atol=1e-12):
            missing = sorted(set(positions) - set(kept))
            said = (f"row {row} holds the gradients of tokens at positions {kept} but not "
                    f"{missing}: their additions never arrived. ")
            if racing:
                return said + f"`{racing}` runs inside a prange over the tokens. " + RACE_FIX
            return said + "Check that the loop visits every token."
    return None


def _column_slip_hint(got, want) -> str | None:
    """The slips of a split over column blocks, each named only when its table is the
    learner's: columns at the end that got nothing (blocks that stop short of C), or
    every entry a whole multiple of its sum (each block adding every column)."""
    c = want.shape[1]
    for first in range(c):
        short = want.copy()
        short[:, first:] = 0
        if np.any(want[:, first:]) and np.allclose(got, short, rtol=1e-12, atol=1e-12):
            if first == 0:
                return (f"no column of the table got anything: your column blocks cover none "
                        f"of the C = {c} columns (a width smaller than a block, or not a whole "
                        f"number of blocks, leaves a partial block at the end).")
            return (f"columns {first} to {c - 1} of the table got nothing, columns 0 to "
                    f"{first - 1} are right: your column blocks stop short of the last "
                    f"{c - first} of the C = {c} columns (a width that is not a whole number "
                    f"of blocks leaves a partial block at the end).")
    for times in range(2, 65):
        if np.allclose(got, times * want, rtol=1e-9, atol=1e-12):
            return (f"every entry is {times} times its sum, at C = {c}: each of your "
                    f"{times} column blocks added every column, not its own block's (the "
                    f"inner loop walks all C columns; on several threads the blocks then "
                    f"also write the same entries at once, and some additions are lost).")
    return None


def _where_it_differs(got, want, ids, what) -> str:
    """The neutral hint: the entry that is furthest off, by how much, on which case."""
    err = np.abs(got - want)
    row, col = (int(k) for k in np.unravel_index(int(np.argmax(err)), err.shape))
    return (f"on {what}, entry (row {row}, column {col}) is {got[row, col]:.8g}, the sum of "
            f"its {int(np.sum(ids == row))} tokens' gradients is {want[row, col]:.8g} (off "
            f"by {err[row, col]:.3g}).")


def _check_table_shape(got, want, g) -> None:
    """The result has the table's shape; the forward's shape or a transpose is named."""
    if got.shape == want.shape:
        return
    if got.shape == g.shape:
        raise ExerciseError(EX_SCATTER, f"the result has shape {got.shape}, one row per "
                                        f"token: that is the forward's output. The backward "
                                        f"returns the table's gradient, shape (vocab_size, C) "
                                        f"= {want.shape}.")
    if got.shape == want.T.shape:
        raise ExerciseError(EX_SCATTER, f"the result has shape {got.shape}: transposed. "
                                        f"The table's gradient has the table's shape, "
                                        f"(vocab_size, C) = {want.shape}.")
    raise ExerciseError(EX_SCATTER, f"the result has shape {got.shape}, expected "
                                    f"(vocab_size, C) = {want.shape}.")


def _check_exact_sums(embedding_backward, rng) -> None:
    """A small float64 case: repeated ids summed, untouched rows exactly zero."""
    ids = np.array([3, 1, 3, 3, 0, 5, 1])
    g = rng.normal(size=(ids.size, 4))
    V = 9
    got = attempt(EX_SCATTER, embedding_backward, ids, g, V)
    want = scatter_add_reference(ids, g, V)
    got = np.asarray(got)
    _check_table_shape(got, want, g)
    untouched = np.setdiff1d(np.arange(V), ids)
    if not np.all(got[untouched] == 0):
        raise ExerciseError(EX_SCATTER, f"rows {untouched.tolist()} belong to tokens that never "
                                        f"appeared, so their gradient is exactly zero; yours are "
                                        f"not. Start from np.zeros((vocab_size, C)), not "
                                        f"np.empty.")
    if not np.allclose(got, want, rtol=1e-12, atol=1e-12):
        hint = _column_slip_on_one_thread(embedding_backward, ids, g, V, got, want)
        if hint is None:
            _check_repeatable(embedding_backward, ids, g, V, got)
            hint = _diagnose(ids, g, V, got)
        if hint is None:
            err = np.abs(got - want).max(axis=1)
            row = int(np.argmax(err))
            hint = _lost_update_hint(ids, g, got, row, racing_rows(embedding_backward))
        if hint is None:
            hint = _where_it_differs(got, want, ids, f"the {ids.size} tokens {ids.tolist()}")
        raise ExerciseError(EX_SCATTER, hint)


# widths around a block of 16 columns, and the trainer's C = 128 (lesson 13 runs the
# saved piece there): (tokens, vocab_size, C)
GENERATED_WIDTHS = ((40, 9, 1), (60, 11, 7), (200, 13, 17), (300, 23, 33), (500, 31, 100),
                    (700, 65, 128), (300, 17, 130))


def _check_generated_widths(embedding_backward, seed: int = 1111) -> None:
    """float64 cases of every width in GENERATED_WIDTHS, ids drawn with a fixed seed."""
    rng = np.random.default_rng(seed)
    for case, (n, V, C) in enumerate(GENERATED_WIDTHS, start=1):
        ids = rng.integers(0, V, size=n)
        g = rng.normal(size=(n, C))
        got = np.asarray(attempt(EX_SCATTER, embedding_backward, ids, g, V))
        want = scatter_add_reference(ids, g, V)
        _check_table_shape(got, want, g)
        if np.allclose(got, want, rtol=1e-12, atol=1e-12):
            continue
        what = f"generated case {case} ({n} tokens, vocab_size {V}, C = {C}, float64)"
        hint = (_column_slip_on_one_thread(embedding_backward, ids, g, V, got, want)
                or _diagnose(ids, g, V, got))
        if hint is None:
            _check_repeatable(embedding_backward, ids, g, V, got)
        raise ExerciseError(EX_SCATTER, hint if hint else _where_it_differs(got, want, ids,
                                                                            what))


def _check_same_bits(embedding_backward, rng, repeats: int) -> tuple[int, int]:
    """float32, many repeats, more work than one thread's slice: no lost updates, and the
    same bits on every run and for 1 thread as for all. Returns (runs, threads)."""
    V2, N2, C2 = 37, 200_000, 16
    ids2 = rng.integers(0, V2, size=N2).astype(np.int32)
    g2 = rng.normal(size=(N2, C2)).astype(np.float32)
    runs = [np.asarray(attempt(EX_SCATTER, embedding_backward, ids2, g2, V2))
            for _ in range(max(2, repeats))]
    if runs[0].dtype != np.float32:
        raise ExerciseError(EX_SCATTER, f"float32 gradients gave a {runs[0].dtype} table; "
                                        f"make the table with dtype=g.dtype.")
    want2 = scatter_add_reference(ids2, g2.astype(np.float64), V2)
    # one id for every token: if threads add into one row at once, they collide every time
    same, whole = np.zeros(N2, np.int32), g2.astype(np.float64).sum(axis=0)
    for _ in range(max(2, repeats)):
        one_row = np.asarray(attempt(EX_SCATTER, embedding_backward, same, g2, V2))
        if not np.allclose(one_row[0], whole, rtol=1e-4, atol=1e-2):
            lost = float(np.abs(one_row[0] - whole).max())
            raise ExerciseError(EX_SCATTER, f"with all {N2} tokens on one id the row's sums are "
                                            f"off by up to {lost:.3g}: updates were lost. "
                                            + RACE_FIX)
    if not np.allclose(runs[0], want2, rtol=1e-4, atol=1e-3):
        lost = float(np.abs(runs[0] - want2).max())
        raise ExerciseError(EX_SCATTER, f"with {N2} tokens over {V2} ids the sums are off by up "
                                        f"to {lost:.3g}: updates were lost. " + RACE_FIX)
    if len({r.tobytes() for r in runs}) > 1:
        raise ExerciseError(EX_SCATTER, f"{len(runs)} runs on the same input gave different "
                                        f"bits: the order of the additions changes from run to "
                                        f"run (threads racing on the same rows). Make each "
                                        f"number's additions happen in token order, e.g. each "
                                        f"thread owns a block of columns.")
    threads = _max_threads()
    if threads > 1 and _set_threads(1):
        try:
            one = np.asarray(embedding_backward(ids2, g2, V2))
        finally:
            _set_threads(threads)
        if one.tobytes() != runs[0].tobytes():
            raise ExerciseError(EX_SCATTER, f"1 thread and {threads} threads give different "
                                            f"bits: the additions into a row happen in an order "
                                            f"that depends on how many threads share the "
                                            f"tokens (one table per thread, summed at the end, "
                                            f"does this). Split the columns: each thread owns "
                                            f"whole columns and adds the tokens in order. Or "
                                            f"keep partial tables, but for a fixed number of "
                                            f"token chunks, not one per thread, and add them "
                                            f"in chunk order.")
    return len(runs), threads


def racing_rows(fn) -> str | None:
    """The line of the kernel where threads that split the tokens add into a row picked by
    a token's id, or None. Two tokens with the same id on two threads then update one row
    at once; whether that loses an update in a given run depends on the threads' timing
    (on a busy machine they may not overlap at all), so the code is read, not only run."""
    node = function_syntax(fn)
    if node is None or not node.args.args:
        return None
    ids = node.args.args[0].arg
    for loop in ast.walk(node):
        if not (isinstance(loop, ast.For) and is_call(loop.iter, "prange")
                and isinstance(loop.target, ast.Name)):
            continue
        token, picked = loop.target.id, set()
        for sub in ast.walk(loop):           # names bound to ids[token]: row = ids[t]
            if (isinstance(sub, ast.Assign) and len(sub.targets) == 1
                    and isinstance(sub.targets[0], ast.Name) and _reads_id(sub.value, ids, token)):
                picked.add(sub.targets[0].id)
        for sub in ast.walk(loop):
            target = (sub.target if isinstance(sub, ast.AugAssign) else
                      sub.targets[0] if isinstance(sub, ast.Assign) and len(sub.targets) == 1
                      else None)
            if isinstance(target, ast.Subscript) and _row_by_id(target.slice, picked, ids, token):
                return ast.unparse(sub).strip()
    return None


def _reads_id(node, ids: str, token: str) -> bool:
    """Does `node` read ids[...token...]?"""
    return any(isinstance(s, ast.Subscript) and isinstance(s.value, ast.Name)
               and s.value.id == ids and any(isinstance(n, ast.Name) and n.id == token
                                            for n in ast.walk(s.slice))
               for s in ast.walk(node))


def _row_by_id(index, picked: set, ids: str, token: str) -> bool:
    """Is the written element's row chosen by a token's id (ids[t], or a name set from it)?"""
    first = index.elts[0] if isinstance(index, ast.Tuple) else index
    return _reads_id(first, ids, token) or (isinstance(first, ast.Name) and first.id in picked)


def check_embedding_backward(embedding_backward, repeats: int = 5) -> None:
    """Exact sums of repeated ids, zero untouched rows, bit-for-bit reproducible."""
    rng = np.random.default_rng(11)
    _check_exact_sums(embedding_backward, rng)
    racing = racing_rows(embedding_backward)
    if racing is not None:
        raise ExerciseError(EX_SCATTER, f"the sums came out right this time, but `{racing}` "
                                        f"runs inside a prange over the tokens: two tokens with "
                                        f"the same id, on two threads, update the same row at "
                                        f"once, and one update can overwrite the other (a race: "
                                        f"whether it strikes depends on the threads' timing). "
                                        f"Give each thread its own columns (prange over column "
                                        f"blocks, tokens in order inside).")
    _check_generated_widths(embedding_backward)
    runs, threads = _check_same_bits(embedding_backward, rng, repeats)
    # time it against np.add.at at the tiny trainer's shape: B*T = 2048 tokens, C = 128
    ids3 = rng.integers(0, 100, size=2048)
    g3 = rng.normal(size=(2048, 128)).astype(np.float32)
    embedding_backward(ids3, g3, 100)
    t_yours = median_seconds(lambda: embedding_backward(ids3, g3, 100), repeats)
    t_ref = median_seconds(lambda: scatter_add_reference(ids3, g3, 100), repeats)
    save_piece("embedding_backward", embedding_backward, EX_SCATTER)
    passed(EX_SCATTER, f"exact sums, zero untouched rows, identical bits over {runs} runs"
                       f"{' and 1 vs ' + str(threads) + ' threads' if threads > 1 else ''}. "
                       f"(2048 tokens, C=128): yours {t_yours * 1e3:.3g} ms, "
                       f"np.add.at {t_ref * 1e3:.3g} ms.")


# --------------------------------------------------------------- 11.2
def gradient_bytes_reference(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    """(dense, row-sparse) bytes of one batch's embedding gradient."""
    rows = np.unique(np.asarray(ids)).size
    return vocab_size * width * value_bytes, rows * (width * value_bytes + id_bytes)


def row_sparse_gradient(ids, g):
    """The embedding gradient as a row-sparse pair: (the distinct ids, sorted; their summed
    rows), what a sparse optimizer reads instead of the (V, C) table."""
    rows, inverse = np.unique(np.asarray(ids), return_inverse=True)
    values = np.zeros((rows.size, g.shape[1]), g.dtype)
    np.add.at(values, inverse.reshape(-1), g)
    return rows, values


def _bytes_slips(ids, vocab_size, width, value_bytes, id_bytes, which):
    """(what the slip counts on this case, its name) for the usual slips of one count."""
    n, rows = np.asarray(ids).size, np.unique(np.asarray(ids)).size
    if which == "dense":
        return [
            (n * width * value_bytes, "that is the batch's upstream gradient, one row per "
                                      "token. The dense gradient has the table's shape: "
                                      "vocab_size rows of width values."),
            (vocab_size * width, "that counts values, not bytes: multiply by value_bytes."),
            (vocab_size * width * value_bytes * 8, "that counts bits; count bytes (value_bytes "
                                                   "per value)."),
            (vocab_size * width * 4, f"that counts 4 bytes per value whatever value_bytes says "
                                     f"(here {value_bytes}): the gradient is stored in the "
                                     f"dtype the case gives."),
            (vocab_size * (width * value_bytes + id_bytes),
             "that stores an id beside every row of the dense table; a dense table needs none: "
             "row v is the row of id v."),
            (rows * width * value_bytes, "that counts only the rows the batch touched; the "
                                         "dense gradient is the whole table, every row "
                                         "whether its token appeared or not."),
        ]
    return [
        (n * (width * value_bytes + id_bytes),
         f"that is one row per token ({n} tokens), but only {rows} distinct ids: repeated ids "
         f"are summed into one row, so count np.unique(ids).size rows."),
        (rows * width * value_bytes, "the rows alone do not say which rows they are: add one "
                                     "id of id_bytes per stored row."),
        (rows * (width + 1), "that counts values, not bytes: value_bytes per value, id_bytes "
                             "per id."),
        (n * width * value_bytes, f"that is one row per token without the ids; store the "
                                  f"{rows} distinct rows and one id each."),
        (rows * width * value_bytes + n * id_bytes, "you store one id per token; the ids only "
                                                    "name the stored rows, and repeated ids "
                                                    "share one row."),
        (rows * (width * 4 + 8), f"that counts 4 bytes per value and 8 per id whatever the case "
                                 f"says (here value_bytes={value_bytes}, id_bytes={id_bytes})."),
        (rows * (width + 1) * value_bytes, "each id is counted at value_bytes; an id is an "
                                           "integer of id_bytes, whatever the values' dtype."),
        (rows * width * value_bytes + id_bytes, "that stores one id for all the rows; each "
                                                "stored row needs its own id to be read back."),
        (vocab_size * (width * value_bytes + id_bytes),
         "that stores every row of the table with an id; row-sparse keeps only the rows the "
         "batch touched."),
    ]


def _sparse_hint(got, right, ids, vocab_size, width, value_bytes, id_bytes, which):
    """The slip whose count is yours on this case, when exactly one gives it; else how far
    yours is from the right count, with what the case holds."""
    named = {hint for value, hint in _bytes_slips(ids, vocab_size, width, value_bytes,
                                                   id_bytes, which)
             if value == got and value != right}
    if len(named) == 1:
        return named.pop()
    n, rows = np.asarray(ids).size, np.unique(np.asarray(ids)).size
    return (f"yours is {got / right:.4g} times the right count, and none of the usual slips "
            f"gives it here. The case holds {n} tokens with {rows} distinct ids, a table of "
            f"{vocab_size} rows of {width} values; count what the {which} gradient stores, "
            f"item by item, in bytes.")


def check_gradient_bytes(gradient_bytes) -> None:
    """(dense bytes, row-sparse bytes) of a batch's embedding gradient."""
    rng = np.random.default_rng(112)
    cases = [(np.array([3, 1, 3, 3, 0, 5, 1]), 9, 4, 4, 8),
             (rng.integers(0, 1000, size=(8, 64)), 50_000, 768, 2, 8),
             (rng.integers(0, 40, size=300), 40, 16, 4, 4)]
    for ids, vocab, width, value_bytes, id_bytes in cases:
        try:
            got = attempt(EX_SPARSE, gradient_bytes, ids.copy(), vocab, width, value_bytes,
                          id_bytes)
        except TypeError as err:
            if "unhashable" not in str(err):
                raise
            raise ExerciseError(EX_SPARSE, f"ids here has shape {ids.shape}, a batch of "
                                           f"sequences, and your function stopped with "
                                           f"TypeError: {err}. A set of a 2-D array sees its "
                                           f"rows, which cannot be hashed; count the distinct "
                                           f"ids over all of its elements.") from None
        if not (isinstance(got, tuple) and len(got) == 2):
            raise ExerciseError(EX_SPARSE, f"return a pair (dense_bytes, sparse_bytes), got "
                                           f"{got!r}")
        try:
            dense, sparse = (int(x) for x in got)
        except (TypeError, ValueError):
            raise ExerciseError(EX_SPARSE, f"return two whole numbers of bytes, got "
                                           f"{got!r}") from None
        want = gradient_bytes_reference(ids, vocab, width, value_bytes, id_bytes)
        where = (f"(ids of shape {ids.shape}, vocab_size={vocab}, width={width}, "
                 f"value_bytes={value_bytes}, id_bytes={id_bytes})")
        if (dense, sparse) == want:
            continue
        if (sparse, dense) == want:
            raise ExerciseError(EX_SPARSE, f"the two numbers are swapped {where}: first the "
                                           f"dense table, then the row-sparse gradient.")
        for value, right, which in ((dense, want[0], "dense"), (sparse, want[1], "sparse")):
            if value != right:
                hint = _sparse_hint(value, right, ids, vocab, width, value_bytes, id_bytes,
                                    which)
                raise ExerciseError(EX_SPARSE, f"the {which} gradient is {value:,} bytes, "
                                               f"expected {right:,} {where}; {hint}")
    passed(EX_SPARSE, "dense and row-sparse bytes are right, repeated ids counted once.")


# --------------------------------------------------------------- 11.3
def decay_factors_reference(steps_seen, n_steps, lr, weight_decay):
    shrink = 1.0 - lr * weight_decay
    return shrink ** n_steps, shrink ** len(set(steps_seen))


def _decay_count_hint(value, want, name, count, steps_seen, n_steps, lr_wd) -> str:
    """Names the slip behind a wrong factor: how many decays it stands for (one too many or
    too few, the steps the token is *not* seen, every step up to its last appearance), or
    the float32 rounding of a right rule. Never the rule itself."""
    shrink = 1.0 - lr_wd
    if 0.0 < value <= 1.0:
        decays = math.log(value) / math.log(shrink)
        m = round(decays)
        if abs(decays - m) < 1e-6 * max(1, m):
            if m in (count - 1, count + 1):
                more = "one decay too many" if m > count else "one decay too few"
                return (f"your factor stands for {m} decays, {more}: count the steps the "
                        f"{name} update runs on, no more and no fewer.")
            if name == "lazy" and m == n_steps - count:
                return ("your factor counts the steps on which the token is *not* seen; the "
                        "lazy update decays the row only on the steps it appears.")
            if name == "lazy" and m in (max(steps_seen), max(steps_seen) + 1):
                return ("your factor counts every step up to the token's last appearance; the "
                        "lazy update skips the steps between its appearances.")
    right_in_float32 = float(np.float32(shrink) ** np.float32(count))
    if math.isclose(value, right_in_float32, rel_tol=1e-6) or (
            math.isclose(value, want, rel_tol=1e-4) and value != 0):
        return ("your factor is close but not exact: a float32 factor (7 digits, and the "
                "rounding of 1 - lr * weight_decay grows with every step) or an "
                "approximation. Compute in Python floats (float64).")
    return (f"the {name} update decays the row once on each step it runs; "
            f"count those steps in this case.")


def check_decay_factors(decay_factors) -> None:
    """(dense, lazy) factors by which decoupled weight decay alone shrinks a row."""
    cases = [([0, 50], 100, 1e-3, 0.1), ([3, 4, 5, 90, 200], 1000, 3e-4, 0.1),
             (list(range(0, 500, 7)), 500, 1e-2, 0.05)]
    for steps_seen, n_steps, lr, wd in cases:
        got = attempt(EX_DECAY, decay_factors, list(steps_seen), n_steps, lr, wd)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise ExerciseError(EX_DECAY, f"return a pair (dense_factor, lazy_factor), got "
                                          f"{got!r}")
        dense, lazy = (float(x) for x in got)
        want_dense, want_lazy = decay_factors_reference(steps_seen, n_steps, lr, wd)
        k = len(steps_seen)
        where = f"(token seen at {k} of {n_steps} steps, lr={lr:g}, weight_decay={wd:g})"
        if math.isclose(dense, want_lazy, rel_tol=1e-9) and math.isclose(lazy, want_dense,
                                                                          rel_tol=1e-9):
            raise ExerciseError(EX_DECAY, f"the two factors are swapped {where}: dense AdamW "
                                          f"decays the row at every step, the lazy update only "
                                          f"when the token appears.")
        for value, want, name, count in ((dense, want_dense, "dense", n_steps),
                                         (lazy, want_lazy, "lazy", k)):
            if math.isclose(value, want, rel_tol=1e-9):
                continue
            if math.isclose(value, (1 - wd) ** count, rel_tol=1e-9):
                hint = ("your factor leaves the learning rate out of the decay: in decoupled "
                        "decay the learning rate scales the decay as it scales the update.")
            elif math.isclose(value, 1 - lr * wd * count, rel_tol=1e-9):
                hint = ("your factor takes off the same amount at every step, a share of the "
                        "weight the row had at the start; each step takes its share of the "
                        "weight the row has then, which is already smaller, so the shrinking "
                        "compounds.")
            elif math.isclose(value, math.exp(-lr * wd * count), rel_tol=1e-6) and \
                    not math.isclose(want, math.exp(-lr * wd * count), rel_tol=1e-9):
                hint = ("your factor is the exponential, the limit of infinitely many tiny "
                        "steps; the optimizer takes whole steps, one shrink each, and the two "
                        "differ in the digits the check reads.")
            else:
                hint = _decay_count_hint(value, want, name, count, steps_seen, n_steps,
                                         lr * wd)
            raise ExerciseError(EX_DECAY, f"the {name} factor is {value:.8g}, expected "
                                          f"{want:.8g} {where}; {hint}")
    passed(EX_DECAY)


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"embedding_backward": EX_SCATTER, "gradient_bytes": EX_SPARSE,
                      "decay_factors": EX_DECAY}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
    uncompile_stubs(EXERCISE_FUNCTIONS)
