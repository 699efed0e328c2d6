"""Streaming stores: write a row to memory without first reading its lines.

An ordinary store to a line that is not in the caches makes the core read the
line from memory before it writes into it (a read for ownership), and write
it back later: two trips for one, which can limit a kernel writing a large
buffer to a quarter of what non-temporal stores (`vmovntps`) reach; those send
whole lines to memory without reading them and without keeping them in the
caches (README.md#streaming-stores).

So a kernel that writes a buffer the step reads back only much later (the
attention probabilities P, written by the forward, read by the backward) can
stream it: `stream_row(src, dst)` copies a row whose values are in the
caches (a block's scratch) into such a buffer. The copy is exact; where a
line of `dst` is only partly covered, or on a CPU that is not x86, those
elements are copied with ordinary stores.

Streamed lines leave the caches, so streaming suits buffers nobody reads
soon; a buffer the next kernel reads would then come back from memory.

Streaming stores are weakly ordered: another core may see them late. A
kernel that streams calls `stream_fence()` before it returns (`sfence` on
x86), so whatever it wrote is visible to the next kernel on any thread.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....numba_config import row_kernel

LINE = 64            # bytes in a cache line
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _nontemporal(builder, store):
    store.set_metadata("nontemporal",
                       builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


@intrinsic
def _stream_line(typingctx, src, s, dst, d):
    """dst[d:d+W] = src[s:s+W], W elements making one line (64 bytes), both rows
    with unit stride and dst + d on a line boundary: one unaligned vector load,
    one non-temporal store of the whole line (an ordinary one off x86)."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)
            and src.dtype == dst.dtype and src.dtype in (types.float32, types.float64)):
        return None

    def codegen(context, builder, signature, args):
        src_val, s_val, dst_val, d_val = args
        element = context.get_value_type(signature.args[0].dtype)
        item = context.get_abi_sizeof(element)
        vector = ir.VectorType(element, LINE // item)
        src_array = context.make_array(signature.args[0])(context, builder, src_val)
        dst_array = context.make_array(signature.args[2])(context, builder, dst_val)
        load_from = builder.bitcast(builder.gep(src_array.data, [s_val]), vector.as_pointer())
        store_to = builder.bitcast(builder.gep(dst_array.data, [d_val]), vector.as_pointer())
        store = builder.store(builder.load(load_from, align=item), store_to, align=LINE)
        if X86:
            _nontemporal(builder, store)
        return context.get_dummy_value()

    return types.void(src, s, dst, d), codegen


@intrinsic
def stream_fence(typingctx):
    """Make every streaming store this thread issued visible before what follows
    (x86 `sfence`; nothing to do where stream_row used ordinary stores)."""
    def codegen(context, builder, signature, args):
        if X86:
            fence = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence")
            builder.call(fence, [])
        return context.get_dummy_value()

    return types.void(), codegen


@row_kernel
def stream_row(src, dst):
    """dst[:] = src[:dst.shape[0]], the whole lines of dst written by streaming
    stores (see the module's docstring), the rest with ordinary ones. Both are
    1-D; a row with another stride than one element is copied plainly."""
    n = dst.shape[0]
    item = dst.itemsize
    per_line = LINE // item
    start = 0
    if dst.strides[0] == item and src.strides[0] == item and dst.ctypes.data % item == 0:
        start = min(n, (-dst.ctypes.data) % LINE // item)       # up to the first boundary
        for j in range(start):
            dst[j] = src[j]
        while start + per_line <= n:
            _stream_line(src, start, dst, start)
            start += per_line
    for j in range(start, n):
        dst[j] = src[j]
