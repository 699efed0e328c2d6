"""One loop in LLVM IR, for the kernels written as numba intrinsics (lanes,
register_tiles): `for step in range(count)`, carrying values from one step to
the next in registers (LLVM phi nodes).

    step, carried, close = counted_loop(builder, count, [start values], "name")
    ... the body: builds the new values from `step` and `carried` ...
    close([new values])          # the builder continues after the loop

After `close`, `carried` holds the values the loop ended with.
"""
from __future__ import annotations

from llvmlite import ir


def counted_loop(builder, count, initial, label):
    intp = count.type
    entry = builder.block
    head = builder.append_basic_block(f"{label}.head")
    body = builder.append_basic_block(f"{label}.body")
    done = builder.append_basic_block(f"{label}.done")
    builder.branch(head)
    builder.position_at_end(head)
    step = builder.phi(intp)
    step.add_incoming(ir.Constant(intp, 0), entry)
    carried = []
    for value in initial:
        phi = builder.phi(value.type)
        phi.add_incoming(value, entry)
        carried.append(phi)
    builder.cbranch(builder.icmp_signed("<", step, count), body, done)
    builder.position_at_end(body)

    def close(new_values):
        latch = builder.block                  # the body may have added blocks
        step.add_incoming(builder.add(step, ir.Constant(intp, 1)), latch)
        for phi, value in zip(carried, new_values):
            phi.add_incoming(value, latch)
        builder.branch(head)
        builder.position_at_end(done)

    return step, carried, close
