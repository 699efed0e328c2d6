"""Row reductions in vector registers, with the same bits on every compile.

A loop `total += a[j]` is a chain: each addition waits for the one before,
and without fast-math LLVM may not reorder it (that would change the
rounding), so the loop stays scalar. Writing the reordering into the source
as eight scalar partial sums does not help either: LLVM keeps them as eight
scalar chains (one `vaddss` per element, measured at 0.2 ns an element).

So the reordering is written in LLVM's own vector type. `_lane_reduce`
emits a loop over a row in steps of LANES elements: one vector load, one
vector add (or multiply then add, or compare-and-select for the maximum)
into a LANES-wide accumulator, so lane k takes the elements j = k (mod
LANES), in order. The partials are then combined in one fixed tree
(`_combine`), and the tail past the last full step goes into lane 0 first.
The order is part of the program, not a choice of the optimiser: a fresh
compile, the machine code loaded from the cache, an AVX2 CPU (which splits
each 16-wide operation into two 8-wide ones) and an AVX-512 CPU all give
the same bits. No multiply-add is fused either (the IR asks for a multiply
and an add, each rounded).

    row_sum(a, n)     sum of a[:n]
    row_dot(a, b, n)  sum of a[:n] * b[:n]
    row_max(a, n)     max of a[:n] (exact in any order), for n >= 1

A row with unit stride (a row of a C-ordered array, or a slice of one) is
read a vector at a time; a strided view one element at a time into the same
lanes, slower, same bits.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvm_loops import counted_loop
from ....numba_config import row_kernel

LANES = 16            # one AVX-512 register of float32, two of AVX2

_OPS = ("sum", "dot", "max")


@intrinsic
def _lane_reduce(typingctx, op, a, b, n):
    """The LANES partial results over a[:n - n % LANES] (and b, for "dot"),
    as a tuple; `op` is a literal string: "sum", "dot" or "max"."""
    if not isinstance(op, types.StringLiteral) or op.literal_value not in _OPS:
        return None
    if not isinstance(a, types.Array) or a.ndim != 1 or a.dtype not in (types.float32,
                                                                        types.float64):
        return None
    kind = op.literal_value
    result = types.UniTuple(a.dtype, LANES)

    def codegen(context, builder, signature, args):
        _, a_val, b_val, count = args
        element = context.get_value_type(a.dtype)
        vector = ir.VectorType(element, LANES)
        a_array = context.make_array(signature.args[1])(context, builder, a_val)
        b_array = context.make_array(signature.args[2])(context, builder, b_val)
        item = context.get_abi_sizeof(element)
        intp = count.type
        steps = builder.sdiv(count, ir.Constant(intp, LANES))

        def load(array, step, contiguous_type):
            """Elements step*LANES ... step*LANES + LANES-1 as one vector: a vector
            load for a row with unit stride, else one element at a time. (An
            array whose numba type says contiguous gets only the vector load:
            less code to compile.)"""
            index = builder.mul(step, ir.Constant(intp, LANES))
            if contiguous_type:
                pointer = builder.bitcast(builder.gep(array.data, [index]), vector.as_pointer())
                return builder.load(pointer, align=item)
            stride = cgutils.unpack_tuple(builder, array.strides, 1)[0]
            unit = builder.icmp_signed("==", stride, ir.Constant(intp, item))
            with builder.if_else(unit, likely=True) as (contiguous, strided):
                with contiguous:
                    pointer = builder.bitcast(builder.gep(array.data, [index]),
                                              vector.as_pointer())
                    fast = builder.load(pointer, align=item)
                    fast_block = builder.block
                with strided:
                    base = builder.ptrtoint(array.data, intp)
                    slow = ir.Constant(vector, ir.Undefined)
                    for k in range(LANES):
                        offset = builder.mul(builder.add(index, ir.Constant(intp, k)), stride)
                        pointer = builder.inttoptr(builder.add(base, offset),
                                                   element.as_pointer())
                        slow = builder.insert_element(slow, builder.load(pointer),
                                                      ir.Constant(ir.IntType(32), k))
                    slow_block = builder.block
            value = builder.phi(vector)
            value.add_incoming(fast, fast_block)
            value.add_incoming(slow, slow_block)
            return value

        if kind == "max":                        # every lane starts at a[0]
            first = builder.load(a_array.data)
            start = ir.Constant(vector, ir.Undefined)
            for k in range(LANES):
                start = builder.insert_element(start, first, ir.Constant(ir.IntType(32), k))
        else:
            start = ir.Constant(vector, [ir.Constant(element, 0.0)] * LANES)

        step, (acc,), close = counted_loop(builder, steps, [start], "lanes")
        x = load(a_array, step, a.layout == "C")
        if kind == "sum":
            new = builder.fadd(acc, x)
        elif kind == "dot":
            new = builder.fadd(acc, builder.fmul(x, load(b_array, step, b.layout == "C")))
        else:
            new = builder.select(builder.fcmp_ordered(">", x, acc), x, acc)
        close([new])
        out = context.get_constant_undef(result)
        for k in range(LANES):
            out = builder.insert_value(
                out, builder.extract_element(acc, ir.Constant(ir.IntType(32), k)), k)
        return out

    return result(op, a, b, n), codegen


@row_kernel
def _combine(first, p):
    """The LANES partials added pairwise in one fixed tree, lane 0 replaced by `first`."""
    q0 = ((first + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
    q1 = ((p[8] + p[9]) + (p[10] + p[11])) + ((p[12] + p[13]) + (p[14] + p[15]))
    return q0 + q1


@row_kernel
def row_sum(a, n):
    """sum(a[:n]) in LANES partial sums, combined in a fixed order."""
    p = _lane_reduce("sum", a, a, n)
    tail = p[0]
    for j in range(n - n % LANES, n):
        tail += a[j]
    return _combine(tail, p)


@row_kernel
def row_dot(a, b, n):
    """sum(a[:n] * b[:n]) in LANES partial sums, combined in a fixed order."""
    p = _lane_reduce("dot", a, b, n)
    tail = p[0]
    for j in range(n - n % LANES, n):
        tail += a[j] * b[j]
    return _combine(tail, p)


@row_kernel
def _max_tree(p):
    """The largest of the LANES partial maxima, as a tree, not a chain: each
    max waits for its inputs, and fifteen in a row cost more than the vector
    loop over a 64-wide row (measured: a row's maximum 32 ns as a chain)."""
    q0 = max(max(max(p[0], p[1]), max(p[2], p[3])), max(max(p[4], p[5]), max(p[6], p[7])))
    q1 = max(max(max(p[8], p[9]), max(p[10], p[11])), max(max(p[12], p[13]), max(p[14], p[15])))
    return max(q0, q1)


@row_kernel
def row_max(a, n):
    """max(a[:n]) for n >= 1 (the maximum is exact in any order; lanes for speed)."""
    m = _max_tree(_lane_reduce("max", a, a, n))
    for j in range(n - n % LANES, n):
        m = max(m, a[j])
    return m
