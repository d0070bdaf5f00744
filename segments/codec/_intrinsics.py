"""LLVM intrinsics that kernel modules of more than one layer inline (`prefetch`), and the address computation every
intrinsic that takes an array element shares (`element_pointer`, used in their code generation).

Owns nothing but the instructions they emit; a kernel module imports them by name (`from segments.codec._intrinsics
import prefetch`). They are `compiled.intrinsic`s: placeholders while the built module serves the process, typed
and emitted when numba compiles a caller. Layer-specific intrinsics stay in their kernel module (the SSE4.2 CRC
instructions in `_crc_kernels`, the offset map's atomics and loads in `offsetmap._kernels`).
"""

from __future__ import annotations

from . import compiled

__all__ = ["element_pointer", "prefetch"]


def element_pointer(context, builder, sig, args):
    """(compile time, inside an intrinsic's codegen) The address of `array[index]` for an intrinsic whose first two
    arguments are an array and an integer index: no bounds check, as numba's own indexing compiles."""
    from numba import types
    from numba.core import cgutils

    array_type, index_type = sig.args[0], sig.args[1]
    array_struct = context.make_array(array_type)(context, builder, args[0])
    index_value = context.cast(builder, args[1], index_type, types.intp)
    return cgutils.get_item_pointer(context, builder, array_type, array_struct, [index_value])


@compiled.intrinsic
def prefetch(typingctx, array, index):
    """Emit `llvm.prefetch` (read, keep in all cache levels) for the address of `array[index]`: a hint that never
    faults and changes no result. The caller keeps `index` within the array (clamping costs one `min`)."""
    from llvmlite import ir  # compile time only: the body runs when numba types a caller
    from numba import types
    from numba.core import cgutils

    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None
    signature = types.void(array, index)

    def codegen(context, builder, sig, args):
        address = builder.bitcast(element_pointer(context, builder, sig, args), cgutils.voidptr_t)
        i32 = ir.IntType(32)
        function_type = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32])
        # The typed-pointer name; LLVM >= 15 (opaque pointers) auto-upgrades it to llvm.prefetch.p0.
        function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.prefetch.p0i8")
        builder.call(function, [address, i32(0), i32(3), i32(1)])  # read, locality 3, data cache
        return context.get_dummy_value()

    return signature, codegen
