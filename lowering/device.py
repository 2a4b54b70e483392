"""GPU implementations of the operations generated kernels call (see :mod:`normc.lowering.codegen`).

Numba has no vector global loads/stores and no half/bfloat16 <-> float32 conversions on raw 16-bit
words, so they are built here as Numba intrinsics emitting LLVM IR with llvmlite:

* ``ld{v}_{t}(p, i)``: one ``v``-wide load (``ld.global.v{v}``, aligned to ``v * itemsize`` bytes) at element
  ``i`` of pointer ``p``, converted to float32; returns a float32 (v = 1) or a UniTuple of float32.
* ``st{v}_{t}(p, i, vals)``: converts float32 values (round to nearest even) and stores them in one access.

float16 uses LLVM's ``half`` (``cvt.f32.f16`` / ``cvt.rn.f16.f32``). bfloat16 widens by a 16-bit shift and
narrows with integer round-to-nearest-even, NaN kept quiet (0x7fc0), as PyTorch's ``c10::BFloat16`` does.
All of it compiles into the kernel: no external functions.
"""

from __future__ import annotations

import math

from llvmlite import ir
from numba import cuda, float32, int64, types
from numba.core.extending import intrinsic

TAGS = ("f32", "f16", "bf16")
WIDTHS = {"f32": (1, 2, 4), "f16": (1, 2, 4, 8), "bf16": (1, 2, 4, 8)}
_ITEM = {"f32": 4, "f16": 2, "bf16": 2}

_f32 = ir.FloatType()
_i16 = ir.IntType(16)
_i32 = ir.IntType(32)


def _elem_ir(tag):
    return _f32 if tag == "f32" else _i16


def _to_f32(builder, tag, v):
    if tag == "f32":
        return v
    if tag == "f16":
        return builder.fpext(builder.bitcast(v, ir.HalfType()), _f32)
    wide = builder.shl(builder.zext(v, _i32), ir.Constant(_i32, 16))
    return builder.bitcast(wide, _f32)


def _from_f32(builder, tag, v):
    if tag == "f32":
        return v
    if tag == "f16":
        return builder.bitcast(builder.fptrunc(v, ir.HalfType()), _i16)
    u = builder.bitcast(v, _i32)
    lsb = builder.and_(builder.lshr(u, ir.Constant(_i32, 16)), ir.Constant(_i32, 1))
    rounded = builder.lshr(builder.add(builder.add(u, ir.Constant(_i32, 0x7FFF)), lsb), ir.Constant(_i32, 16))
    isnan = builder.fcmp_unordered("uno", v, v)
    res = builder.select(isnan, ir.Constant(_i32, 0x7FC0), rounded)
    return builder.trunc(res, _i16)


def _global_ptr(builder, p, idx, tag, width):
    """Address of element ``idx`` of ``p`` in the global address space, typed as a ``width``-vector."""
    elem = _elem_ir(tag)
    addr = builder.gep(p, [idx])
    g = builder.addrspacecast(addr, ir.PointerType(elem, 1))
    if width == 1:
        return g
    return builder.bitcast(g, ir.PointerType(ir.VectorType(elem, width), 1))


def _make_load(tag, width):
    @intrinsic
    def ld(typingctx, ptr, idx):
        if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
            return None
        ret = float32 if width == 1 else types.UniTuple(float32, width)
        sig = ret(ptr, idx)

        def codegen(context, builder, signature, args):
            p, i = args
            i = context.cast(builder, i, signature.args[1], int64)
            addr = _global_ptr(builder, p, i, tag, width)
            val = builder.load(addr, align=width * _ITEM[tag])
            if width == 1:
                return _to_f32(builder, tag, val)
            elems = [_to_f32(builder, tag, builder.extract_element(val, ir.Constant(_i32, k)))
                     for k in range(width)]
            return context.make_tuple(builder, signature.return_type, elems)

        return sig, codegen

    ld.__name__ = f"ld{width}_{tag}"
    return ld


def _make_store(tag, width):
    @intrinsic
    def st(typingctx, ptr, idx, vals):
        if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
            return None
        sig = types.void(ptr, idx, vals)

        def codegen(context, builder, signature, args):
            p, i, v = args
            i = context.cast(builder, i, signature.args[1], int64)
            vt = signature.args[2]
            if width == 1:
                f = context.cast(builder, v, vt, float32)
                builder.store(_from_f32(builder, tag, f), _global_ptr(builder, p, i, tag, 1), align=_ITEM[tag])
                return context.get_dummy_value()
            vec = ir.Constant(ir.VectorType(_elem_ir(tag), width), None)
            vec = ir.Constant(ir.VectorType(_elem_ir(tag), width), ir.Undefined)
            for k in range(width):
                f = context.cast(builder, builder.extract_value(v, k), vt[k], float32)
                vec = builder.insert_element(vec, _from_f32(builder, tag, f), ir.Constant(_i32, k))
            builder.store(vec, _global_ptr(builder, p, i, tag, width), align=width * _ITEM[tag])
            return context.get_dummy_value()

        return sig, codegen

    st.__name__ = f"st{width}_{tag}"
    return st


@cuda.jit(device=True, inline=True)
def shfl_xor(v, m):
    """Butterfly exchange of a float32 with lane ``lane ^ m`` of the full warp."""
    return cuda.shfl_xor_sync(0xFFFFFFFF, v, m)


@cuda.jit(device=True, inline=True)
def shfl_idx(v, src):
    """The float32 ``v`` of lane ``src`` of the full warp."""
    return cuda.shfl_sync(0xFFFFFFFF, v, src)


@cuda.jit(device=True, inline=True)
def rsqrt(v):
    """1 / sqrt(v) in float32 (IEEE sqrt and division, as the reference computes it)."""
    return float32(1.0) / math.sqrt(v)


def namespace() -> dict:
    """Globals for exec'ing generated kernel source for the GPU."""
    ns = {
        "cuda": cuda, "I64": int64, "F32": float32, "F32T": float32, "rsqrt": rsqrt,
        "shfl_xor": shfl_xor, "shfl_idx": shfl_idx, "min": min, "max": max, "range": range,
    }
    for tag in TAGS:
        for w in WIDTHS[tag]:
            ns[f"ld{w}_{tag}"] = _make_load(tag, w)
            ns[f"st{w}_{tag}"] = _make_store(tag, w)
    return ns
