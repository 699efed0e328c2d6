"""Software prefetch: ask for the lines a kernel will read a little later.

A CPU's own prefetchers follow streams of neighbouring addresses. The
attention kernels read each head's slices of the QKV buffer instead: 32
numbers (two 64-byte lines) from each row of 3C, the rows 1536 bytes apart
at C = 128. Inside a training step those rows, P's rows and the output
gradient's come from memory, not from the caches (the rest of the step ran
in between), and the kernels ran at about half the speed they reach on the
same data in cache (README.md#prefetch).

So while one block of query rows computes, the kernels ask for what comes
next (`prefetch_rows`, called from attention.py and flash_attention.py):
the next block's rows of Q, dY and P (or Y), and, a block's worth of rows
at a time, the next pair's K and V, which that pair transposes whole before
its first block. A block ahead, not a pair ahead: at
long sequences a pair's P is larger than the second-level cache, and asking
for a whole pair evicts what the current block still reads.

The hint goes to the second-level cache (`prefetcht1` on x86): the block
being computed keeps the first-level cache. A prefetch never faults and
changes no number; a line asked for and not yet there is just read late.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....numba_config import row_kernel

LINE = 64            # bytes in a cache line (x86 and most ARM cores)


@intrinsic
def _prefetch_line(typingctx, address):
    """Ask for the line holding `address` (an integer), for reading, into the
    second-level cache. Only a hint: it never faults, and changes no result."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[0], ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [pointer.type, i32, i32, i32]),
            "llvm.prefetch.p0")
        # (address, 0: for reading, 2: locality "moderate" = L2, 1: data, not code)
        builder.call(prefetch, [pointer, ir.Constant(i32, 0), ir.Constant(i32, 2),
                                ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(address), codegen


@row_kernel
def row_lines(start, row_bytes):
    """(first, stop): the addresses of the cache lines that hold bytes start ...
    start + row_bytes - 1 are first, first + LINE, ..., below stop."""
    first = start - start % LINE
    return first, start + row_bytes


@row_kernel
def prefetch_rows(a, r0, r1):
    """Ask for every cache line of rows r0 ... r1-1 of the 2-D view a (a row
    from its first element to its last, whatever the step between them)."""
    if r1 <= r0 or a.shape[1] == 0:
        return
    row_bytes = (a.shape[1] - 1) * a.strides[1] + a.itemsize
    for r in range(r0, r1):
        line, stop = row_lines(a.ctypes.data + r * a.strides[0], row_bytes)
        while line < stop:
            _prefetch_line(line)
            line += LINE
