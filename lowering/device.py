"""GPU implementations of the operations generated kernels call (see :mod:`normc.lowering.codegen`).

Numba has no vector global loads/stores and no half/bfloat16 <-> float32 conversions on raw 16-bit
words, so they are built here as Numba intrinsics emitting LLVM IR with llvmlite:

* ``ld{v}_{t}(p, i)``: one ``v``-wide load (``ld.global.v{v}``, aligned to ``v * itemsize`` bytes) at element
  ``i`` of pointer ``p``, converted to float32; returns a float32 (v = 1) or a UniTuple of float32.
* ``st{v}_{t}(p, i, vals)``: converts float32 values (round to nearest even) and stores them in one access.
* ``ldw{v}_{t}(p, i)`` / ``ldwm{v}_{t}(p, i, ok)`` (16-bit ``t``): the load of ``ld{v}_{t}`` (masked: zeros
  unless ``ok``) left as moved, a UniTuple of ``max(v // 2, 1)`` uint32 words (16-bit elements, the first in
  the low half); ``cvw{v}_{t}(words)`` converts them to ``ld{v}_{t}``'s float32 values. A kernel that loads
  the next row ahead (a prefetch) keeps the words across a barrier and converts them after it: a conversion
  next to its load would stall the warp on the load there.

Cache-hinted forms (``HINTS``; suffix ``_{h}`` on every name above, e.g. ``ld4_f32_ef``, ``stm8_f16_ef``), for
the streaming schedules that read x twice, so that L2 keeps the lines they will read again:

* ``ef`` (evict first): loads ``ld.global.cs`` (x's last use) and stores ``st.global.cs`` (y is not read
  again by the kernel): the lines are allocated evict-first in L1 and L2, so they are replaced before the
  first pass's lines that the second pass still has to read.
* ``el`` (evict last): loads ``ld.global.L2::cache_hint`` with a ``createpolicy.fractional.L2::evict_last``
  policy (the first pass over x, which the second pass re-reads).

float16 uses LLVM's ``half`` (``cvt.f32.f16`` / ``cvt.rn.f16.f32``). bfloat16 widens by a 16-bit shift and
narrows with round-to-nearest-even, NaN kept quiet, as PyTorch's ``c10::BFloat16`` does: a scalar store rounds
with integer operations (NaN 0x7fc0), a vector store rounds pairs with one ``cvt.rn.bf16x2.f32`` (NaN 0x7fff;
float16 pairs likewise with ``cvt.rn.f16x2.f32``).
Thread-block clusters (sm_90+) for reductions spread over several CTAs:

* ``cluster_arrive()`` / ``cluster_wait()``: ``barrier.cluster.arrive.release`` / ``barrier.cluster.wait.acquire``
  (every thread of every CTA of the cluster; writes to shared memory before the arrive are visible to the
  whole cluster after the wait).
* ``dsmem_ld(arr, i, rank)``: element ``i`` of the shared array ``arr`` *of CTA ``rank`` of the cluster*
  (distributed shared memory: ``mapa`` maps the generic address into the peer's window, then a generic load).

Cooperative (coop) kernels, whose CTAs wait for each other's partial statistics through global memory:

* ``arrive_u32(p, i)``: ``red.release.gpu.global.add.u32`` of 1 to the 32-bit word at element ``i`` of ``p``
  (release: the thread's earlier writes are visible to whoever acquires the new count).
* ``acquire_u32(p, i)``: ``ld.acquire.gpu.global.u32`` of that word (re-read from L2 on every call: a spin
  loop on it ends).
* ``ldcg_f32(p, i)``: ``ld.global.cg.f32``, a float32 load cached in L2 only, for values other CTAs wrote
  during the launch (an SM's L1 is not coherent with other SMs' writes).

All of it compiles into the kernel: no external functions.
"""

from __future__ import annotations

import math

from llvmlite import ir
from numba import cuda, float32, int32, int64, types, uint32
from numba.core import cgutils
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


def _raw_type(tag, width):
    """LLVM type of a ``width``-element access of ``tag`` as it is moved: float32 (vectors), one 16-bit word,
    or 16-bit elements in 32-bit words when ``width`` > 1 (PTX has no ``.v8.u16``, and an ``<8 x i16>`` load
    is emitted as two 8-byte ``ld.global.v4.u16``, halving the access width)."""
    if tag == "f32":
        return _f32 if width == 1 else ir.VectorType(_f32, width)
    return _i16 if width == 1 else ir.VectorType(_i32, width // 2)


def _load_raw(builder, p, idx, tag, width, hint=""):
    """One ``width``-element load at element ``idx`` of ``p`` (global space), as moved (:func:`_raw_type`),
    with the cache hint ``hint`` (``HINTS``, through inline PTX) or none."""
    if hint:
        return _load_hinted(builder, p, idx, tag, width, hint)
    ptr = _global_ptr(builder, p, idx, tag, _raw_type(tag, width))
    return builder.load(ptr, align=width * _ITEM[tag])


def _as_floats(context, builder, signature, tag, width, raw):
    """The float32 value (``width`` 1) or UniTuple of ``width`` float32 of a raw access (:func:`_load_raw`)."""
    if width == 1:
        return _to_f32(builder, tag, raw)
    if tag != "f32":
        raw = builder.bitcast(raw, ir.VectorType(_i16, width))  # from words (or from itself: no-op)
    elems = [_to_f32(builder, tag, builder.extract_element(raw, ir.Constant(_i32, k))) for k in range(width)]
    return context.make_tuple(builder, signature.return_type, elems)


def _words_type(width):
    """Numba type of a 16-bit ``width``-element access kept as 32-bit words (one word for width 1 or 2)."""
    return types.UniTuple(types.uint32, max(width // 2, 1))


def _as_words(context, builder, signature, width, raw):
    """A 16-bit raw access (:func:`_raw_type`) as the UniTuple of uint32 words of :func:`_words_type`."""
    if width == 1:
        return context.make_tuple(builder, signature.return_type, [builder.zext(raw, _i32)])
    words = [builder.extract_element(raw, ir.Constant(_i32, k)) for k in range(width // 2)]
    return context.make_tuple(builder, signature.return_type, words)


def _store_raw(builder, raw, p, idx, tag, width, hint=""):
    """Store ``raw`` (a ``width``-element access as moved, :func:`_raw_type`) at element ``idx`` of ``p`` in one
    access, plain or with the cache hint ``hint`` (only ``ef``: ``st.global.cs``, through inline PTX)."""
    if not hint:
        ptr = _global_ptr(builder, p, idx, tag, _raw_type(tag, width))
        builder.store(raw, ptr, align=width * _ITEM[tag])
        return
    assert hint == "ef", hint
    ty, con, n, _ = _hint_regs(tag, width)
    addr = builder.ptrtoint(_global_ptr(builder, p, idx, tag), ir.IntType(64))
    vector = isinstance(raw.type, ir.VectorType)  # two 16-bit values move as a vector of one word
    vals = [builder.extract_element(raw, ir.Constant(_i32, k)) for k in range(n)] if vector else [raw]
    src = "$1" if n == 1 else "{" + ", ".join(f"${k + 1}" for k in range(n)) + "}"
    vec = "" if n == 1 else f".v{n}"
    _asm(builder, f"st.global.cs{vec}.{ty} [$0], {src};", ",".join(["l"] + [con] * n + ["~{memory}"]),
         ir.VoidType(), [addr] + vals)


def _global_ptr(builder, p, idx, tag, rawtype=None):
    """Address of element ``idx`` of ``p`` in the global address space, typed as a pointer to ``rawtype``
    (default: the element type)."""
    g = builder.addrspacecast(builder.gep(p, [idx]), ir.PointerType(_elem_ir(tag), 1))
    return g if rawtype is None else builder.bitcast(g, ir.PointerType(rawtype, 1))


HINTS = ("ef", "el")


def _hint_regs(tag, width):
    """PTX type, inline-asm constraint, register count and LLVM type of a ``width``-element access as it is
    moved (:func:`_raw_type`)."""
    if tag == "f32":
        return "f32", "f", width, _f32
    if width == 1:
        return "u16", "h", 1, _i16
    return "u32", "r", width // 2, _i32


def _load_hinted(builder, p, idx, tag, width, hint):
    """:func:`_load_raw` with the cache hint ``hint`` (``HINTS``), through inline PTX."""
    ty, con, n, lty = _hint_regs(tag, width)
    addr = builder.ptrtoint(_global_ptr(builder, p, idx, tag), ir.IntType(64))
    dst = "$0" if n == 1 else "{" + ", ".join(f"${k}" for k in range(n)) + "}"
    vec = "" if n == 1 else f".v{n}"
    if hint == "ef":
        text = f"ld.global.cs{vec}.{ty} {dst}, [${n}];"
    else:
        text = ("{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
                f"ld.global.L2::cache_hint{vec}.{ty} {dst}, [${n}], pol; }}")
    ret = lty if n == 1 else ir.LiteralStructType([lty] * n)
    # Not side-effecting: LLVM may schedule these loads like plain ones (x is read-only during the launch),
    # and the masked forms stay inside their branch (a call to inline asm is never speculated).
    fnty = ir.FunctionType(ret, [addr.type])
    out = builder.call(ir.InlineAsm(fnty, text, ",".join([f"={con}"] * n + ["l"]), side_effect=False), [addr])
    if not isinstance(_raw_type(tag, width), ir.VectorType):
        return out
    # as moved (_raw_type): a vector even of one word (two 16-bit values), like the plain load's
    words = ir.Constant(ir.VectorType(lty, n), ir.Undefined)
    for k in range(n):
        word = out if n == 1 else builder.extract_value(out, k)
        words = builder.insert_element(words, word, ir.Constant(_i32, k))
    return words


def _make_load(tag, width, hint="", words=False):
    """``ld{width}_{tag}(p, i)``; with ``words``, ``ldw{width}_{tag}`` (16-bit ``tag``): the load left as moved,
    :func:`_as_words` (module docstring)."""
    @intrinsic
    def ld(typingctx, ptr, idx):
        if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
            return None
        ret = _words_type(width) if words else float32 if width == 1 else types.UniTuple(float32, width)
        sig = ret(ptr, idx)

        def codegen(context, builder, signature, args):
            p, i = args
            i = context.cast(builder, i, signature.args[1], int64)
            raw = _load_raw(builder, p, i, tag, width, hint)
            if words:
                return _as_words(context, builder, signature, width, raw)
            return _as_floats(context, builder, signature, tag, width, raw)

        return sig, codegen

    ld.__name__ = f"ld{'w' if words else ''}{width}_{tag}" + (f"_{hint}" if hint else "")
    return ld


def _make_masked_load(tag, width, hint="", words=False):
    """``ldm{width}_{tag}(p, i, ok)``: the load of ``ld{width}_{tag}`` when ``ok``, else zeros. The condition
    becomes an LLVM branch (predicated load), not a Numba basic block: generated kernels stay straight-line
    code, which Numba types and lowers much faster. With ``words``, ``ldwm{width}_{tag}``: the words of
    ``ldw{width}_{tag}``, zero words unless ``ok``."""
    @intrinsic
    def ldm(typingctx, ptr, idx, ok):
        if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
            return None
        ret = _words_type(width) if words else float32 if width == 1 else types.UniTuple(float32, width)
        sig = ret(ptr, idx, ok)

        def codegen(context, builder, signature, args):
            p, i, c = args
            i = context.cast(builder, i, signature.args[1], int64)
            c = context.cast(builder, c, signature.args[2], types.boolean)
            # The merge with zeros: hinted 16-bit loads merge as words (as 16-bit lanes their inline-asm results
            # took 2 registers per word); plain ones as 16-bit lanes, which NVVM already keeps in words.
            plain16 = not (hint or words or tag == "f32" or width == 1)
            merge_t = ir.VectorType(_i16, width) if plain16 else _raw_type(tag, width)
            slot = cgutils.alloca_once_value(builder, ir.Constant(merge_t, None))
            with builder.if_then(c, likely=True):
                builder.store(builder.bitcast(_load_raw(builder, p, i, tag, width, hint), merge_t), slot)
            if words:
                return _as_words(context, builder, signature, width, builder.load(slot))
            return _as_floats(context, builder, signature, tag, width, builder.load(slot))

        return sig, codegen

    ldm.__name__ = f"ld{'w' if words else ''}m{width}_{tag}" + (f"_{hint}" if hint else "")
    return ldm


def _make_word_convert(tag, width):
    """``cvw{width}_{tag}(words)``: the float32 values (a float32 for width 1) of ``ldw{width}_{tag}``'s words."""
    @intrinsic
    def cvw(typingctx, words):
        if not isinstance(words, types.UniTuple) or words.count != max(width // 2, 1):
            return None
        ret = float32 if width == 1 else types.UniTuple(float32, width)
        sig = ret(words)

        def codegen(context, builder, signature, args):
            ws = [builder.extract_value(args[0], k) for k in range(max(width // 2, 1))]
            if width == 1:
                return _as_floats(context, builder, signature, tag, 1, builder.trunc(ws[0], _i16))
            raw = ir.Constant(ir.VectorType(_i32, width // 2), ir.Undefined)
            for k, w in enumerate(ws):
                raw = builder.insert_element(raw, w, ir.Constant(_i32, k))
            return _as_floats(context, builder, signature, tag, width, raw)

        return sig, codegen

    cvw.__name__ = f"cvw{width}_{tag}"
    return cvw


def _pack2(builder, tag, lo, hi):
    """Two float32 rounded to nearest even into one 32-bit word of 16-bit values, ``lo`` in the low half: one
    ``cvt.rn.{f16,bf16}x2.f32`` (sm_80+). For bfloat16 this replaces the integer rounding of
    :func:`_from_f32` (about 6 instructions per value; same results, except that a NaN becomes the canonical
    0x7FFF instead of 0x7FC0: both are quiet NaNs)."""
    ty = "f16x2" if tag == "f16" else "bf16x2"
    fnty = ir.FunctionType(_i32, [_f32, _f32])
    return builder.call(ir.InlineAsm(fnty, f"cvt.rn.{ty}.f32 $0, $1, $2;", "=r,f,f", side_effect=False), [hi, lo])


def _store_codegen(tag, width, hint=""):
    def codegen(context, builder, signature, args):
        p, i, v = args[:3]
        i = context.cast(builder, i, signature.args[1], int64)
        vt = signature.args[2]
        if width == 1:
            _store_raw(builder, _from_f32(builder, tag, context.cast(builder, v, vt, float32)), p, i, tag, 1, hint)
            return context.get_dummy_value()
        fs = [context.cast(builder, builder.extract_value(v, k), vt[k], float32) for k in range(width)]
        if tag == "f32":
            raw, parts = ir.Constant(ir.VectorType(_f32, width), ir.Undefined), fs
        else:  # 16-bit values rounded in pairs into 32-bit words
            raw = ir.Constant(ir.VectorType(_i32, width // 2), ir.Undefined)
            parts = [_pack2(builder, tag, fs[k], fs[k + 1]) for k in range(0, width, 2)]
        for k, part in enumerate(parts):
            raw = builder.insert_element(raw, part, ir.Constant(_i32, k))
        _store_raw(builder, raw, p, i, tag, width, hint)
        return context.get_dummy_value()

    return codegen


def _make_store(tag, width, hint=""):
    @intrinsic
    def st(typingctx, ptr, idx, vals):
        if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
            return None
        return types.void(ptr, idx, vals), _store_codegen(tag, width, hint)

    st.__name__ = f"st{width}_{tag}" + (f"_{hint}" if hint else "")
    return st


def _asm(builder, text, constraints, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)


def _asm_statement(text):
    """Codegen of a void intrinsic that emits the PTX statement ``text`` (volatile, memory clobbered: no load or
    store moves across it)."""
    def codegen(context, builder, signature, args):
        _asm(builder, text, "~{memory}", ir.VoidType(), [])
        return context.get_dummy_value()

    return codegen


@intrinsic
def cluster_arrive(typingctx):
    """Arrive at the cluster barrier (release: this thread's earlier shared-memory writes become visible)."""
    return types.void(), _asm_statement("barrier.cluster.arrive.release.aligned;")


@intrinsic
def cluster_wait(typingctx):
    """Wait until every thread of the cluster has arrived (acquire)."""
    return types.void(), _asm_statement("barrier.cluster.wait.acquire.aligned;")


@intrinsic
def griddep_wait(typingctx):
    """Programmatic dependent launch (sm_90): wait until the grid this one depends on has completed and its
    memory writes are visible (``griddepcontrol.wait``). A no-op in a grid launched without the attribute."""
    return types.void(), _asm_statement("griddepcontrol.wait;")


@intrinsic
def griddep_launch_dependents(typingctx):
    """Programmatic dependent launch (sm_90): let the grid that depends on this one be scheduled once every
    CTA of this grid has issued this (``griddepcontrol.launch_dependents``); it still waits for this grid's
    completion before reading anything (:func:`griddep_wait`). A no-op without a dependent grid."""
    return types.void(), _asm_statement("griddepcontrol.launch_dependents;")


@intrinsic
def smem_base(typingctx, arr):
    """32-bit shared-window address (bytes) of the first element of the float32 shared array ``arr``, for
    :func:`lds_f32` / :func:`sts_f32`. Indexing the array itself costs 64-bit address arithmetic per access
    (Numba's array model); the staged kernel accesses shared memory several times per element."""
    if not isinstance(arr, types.Array) or arr.dtype != float32:
        return None

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        gen = builder.ptrtoint(a.data, ir.IntType(64))
        fnty = ir.FunctionType(_i32, [gen.type])
        text = "{ .reg .u64 t; cvta.to.shared.u64 t, $1; cvt.u32.u64 $0, t; }"
        return builder.call(ir.InlineAsm(fnty, text, "=r,l", side_effect=False), [gen])

    return int32(arr), codegen


def _smem_addr(context, builder, signature, args):
    i = builder.trunc(context.cast(builder, args[1], signature.args[1], int64), _i32)
    return builder.add(args[0], builder.shl(i, ir.Constant(_i32, 2)))


@intrinsic
def lds_f32(typingctx, base, idx):
    """float32 at element ``idx`` (int32 range) of the shared array whose :func:`smem_base` is ``base``. A
    volatile asm: it stays on its side of the barriers around it."""
    if base != int32 or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(_f32, [_i32])
        asm = ir.InlineAsm(fnty, "ld.shared.f32 $0, [$1];", "=f,r,~{memory}", side_effect=True)
        return builder.call(asm, [_smem_addr(context, builder, signature, args)])

    return float32(base, idx), codegen


@intrinsic
def sts_f32(typingctx, base, idx, v):
    """Store the float32 ``v`` at element ``idx`` of the shared array whose :func:`smem_base` is ``base``."""
    if base != int32 or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        val = context.cast(builder, args[2], signature.args[2], float32)
        _asm(builder, "st.shared.f32 [$0], $1;", "r,f,~{memory}", ir.VoidType(),
             [_smem_addr(context, builder, signature, args), val])
        return context.get_dummy_value()

    return types.void(base, idx, v), codegen


@intrinsic
def dsmem_ld(typingctx, arr, idx, rank):
    """float32 element ``idx`` of shared array ``arr`` in the CTA of cluster rank ``rank``."""
    if not isinstance(arr, types.Array) or arr.dtype != float32:
        return None
    sig = float32(arr, idx, rank)

    def codegen(context, builder, signature, args):
        a, i, r = args
        ary = context.make_array(signature.args[0])(context, builder, value=a)
        i = context.cast(builder, i, signature.args[1], int64)
        r = builder.trunc(context.cast(builder, r, signature.args[2], int64), _i32)
        addr = builder.ptrtoint(builder.gep(ary.data, [i]), ir.IntType(64))
        peer = _asm(builder, "mapa.u64 $0, $1, $2;", "=l,l,r", ir.IntType(64), [addr, r])
        return builder.load(builder.inttoptr(peer, ir.PointerType(_f32)), align=4)

    return sig, codegen


def _word_addr(context, builder, signature, args):
    """Global-space address (i64) of element ``args[1]`` of float32 pointer ``args[0]``."""
    p, i = args
    i = context.cast(builder, i, signature.args[1], int64)
    return builder.ptrtoint(_global_ptr(builder, p, i, "f32"), ir.IntType(64))


@intrinsic
def arrive_u32(typingctx, ptr, idx):
    """Add 1 to the u32 word at element ``idx`` of float32 pointer ``ptr`` (release, GPU scope)."""
    if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        _asm(builder, "red.release.gpu.global.add.u32 [$0], 1;", "l,~{memory}", ir.VoidType(),
             [_word_addr(context, builder, signature, args)])
        return context.get_dummy_value()

    return types.void(ptr, idx), codegen


@intrinsic
def acquire_u32(typingctx, ptr, idx):
    """The u32 word at element ``idx`` of float32 pointer ``ptr`` (acquire load, GPU scope), as int64."""
    if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = _asm(builder, "ld.acquire.gpu.global.u32 $0, [$1];", "=r,l,~{memory}", _i32,
                 [_word_addr(context, builder, signature, args)])
        return builder.zext(v, ir.IntType(64))

    return int64(ptr, idx), codegen


@intrinsic
def ldcg_f32(typingctx, ptr, idx):
    """float32 element ``idx`` of ``ptr``, loaded through L2 only (``ld.global.cg``)."""
    if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return _asm(builder, "ld.global.cg.f32 $0, [$1];", "=f,l,~{memory}", _f32,
                    [_word_addr(context, builder, signature, args)])

    return float32(ptr, idx), codegen


def _make_masked_store(tag, width, hint=""):
    """``stm{width}_{tag}(p, i, vals, ok)``: the store of ``st{width}_{tag}`` when ``ok`` (an LLVM branch)."""

    @intrinsic
    def stm(typingctx, ptr, idx, vals, ok):
        if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
            return None
        sig = types.void(ptr, idx, vals, ok)
        store = _store_codegen(tag, width, hint)

        def codegen(context, builder, signature, args):
            c = context.cast(builder, args[3], signature.args[3], types.boolean)
            with builder.if_then(c, likely=True):
                store(context, builder, signature, args)
            return context.get_dummy_value()

        return sig, codegen

    stm.__name__ = f"stm{width}_{tag}" + (f"_{hint}" if hint else "")
    return stm


@intrinsic
def sel(typingctx, cond, a, b):
    """``a if cond else b`` for float32 values, as one LLVM ``select`` (no branch)."""
    sig = float32(cond, a, b)

    def codegen(context, builder, signature, args):
        c, x, y = args
        c = context.cast(builder, c, signature.args[0], types.boolean)
        x = context.cast(builder, x, signature.args[1], float32)
        y = context.cast(builder, y, signature.args[2], float32)
        return builder.select(c, x, y)

    return sig, codegen


@cuda.jit(device=True, inline=True)
def shfl_xor(v, m):
    """Butterfly exchange of a float32 with lane ``lane ^ m`` of the full warp."""
    return cuda.shfl_xor_sync(0xFFFFFFFF, v, m)


@cuda.jit(device=True, inline=True)
def shfl_idx(v, src):
    """The float32 ``v`` of lane ``src`` of the full warp."""
    return cuda.shfl_sync(0xFFFFFFFF, v, src)


@cuda.jit(device=True, inline=True)
def sqrtf(v):
    """sqrt(v) in float32 (IEEE, correctly rounded)."""
    return math.sqrt(v)


@cuda.jit(device=True, inline=True)
def rsqrt(v):
    """1 / sqrt(v) in float32 (IEEE sqrt and division, as the reference computes it)."""
    return float32(1.0) / math.sqrt(v)


def namespace() -> dict:
    """Globals for exec'ing generated kernel source for the GPU."""
    ns = {
        "cuda": cuda, "I64": int64, "I32": int32, "U32": uint32, "F32": float32, "F32T": float32, "rsqrt": rsqrt,
        "sqrtf": sqrtf, "shfl_xor": shfl_xor, "shfl_idx": shfl_idx, "cluster_arrive": cluster_arrive,
        "cluster_wait": cluster_wait,
        "dsmem_ld": dsmem_ld, "griddep_wait": griddep_wait, "griddep_launch_dependents": griddep_launch_dependents,
        "smem_base": smem_base, "lds_f32": lds_f32, "sts_f32": sts_f32,
        "arrive_u32": arrive_u32, "acquire_u32": acquire_u32, "ldcg_f32": ldcg_f32,
        "min": min, "max": max, "range": range,
    }
    for tag in TAGS:
        for w in WIDTHS[tag]:
            ns[f"ld{w}_{tag}"] = _make_load(tag, w)
            ns[f"st{w}_{tag}"] = _make_store(tag, w)
            ns[f"ldm{w}_{tag}"] = _make_masked_load(tag, w)
            ns[f"stm{w}_{tag}"] = _make_masked_store(tag, w)
            if tag != "f32":
                ns[f"ldw{w}_{tag}"] = _make_load(tag, w, words=True)
                ns[f"ldwm{w}_{tag}"] = _make_masked_load(tag, w, words=True)
                ns[f"cvw{w}_{tag}"] = _make_word_convert(tag, w)
            for h in HINTS:
                ns[f"ld{w}_{tag}_{h}"] = _make_load(tag, w, h)
                ns[f"ldm{w}_{tag}_{h}"] = _make_masked_load(tag, w, h)
                if h == "ef":
                    ns[f"st{w}_{tag}_{h}"] = _make_store(tag, w, h)
                    ns[f"stm{w}_{tag}_{h}"] = _make_masked_store(tag, w, h)
    ns["sel"] = sel
    return ns
