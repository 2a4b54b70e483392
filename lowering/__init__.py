"""Lowering: a :class:`normc.Plan` -> Numba CUDA kernels -> self-contained PTX for a compute capability.

``lower(plan)`` generates the kernels' Python source (:mod:`normc.lowering.codegen`), compiles each with
Numba's NVVM backend to PTX, checks the PTX is self-contained (no ``.extern``), and returns
:class:`LoweredKernel` records with the entry name and launch configuration. ``assemble(ptx)`` turns PTX into
an sm_XX cubin with nvJitLink and reports registers, spills and stack, without needing a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import numbers
import os
import re
import threading
from dataclasses import dataclass

from ..errors import CompileError
from .codegen import KernelSource, generate

__all__ = ["LoweredKernel", "lower", "lower_backward", "assemble", "link", "ResourceUsage", "generate", "KernelSource", "arch_cc"]


@dataclass(frozen=True)
class LoweredKernel:
    """One compiled kernel.

    Attributes:
        ptx: PTX text (one ``.visible .entry``, no ``.extern``).
        entry: the entry's (mangled) name in ``ptx``.
        grid: CTAs (1-D); block: threads per CTA (1-D); shared_bytes: static shared memory in bytes.
        params: the 7 pointer parameters' element types (x, out, scale, shift, mean, rstd, workspace).
        source: the generated Python source the PTX came from.
        cluster: CTAs per thread-block cluster (1: no cluster); launch with this cluster shape.
        coop: cooperative kernel (its CTAs wait for each other): launch cooperatively with at most ``grid``
            CTAs, no more than are co-resident (see :class:`normc.lowering.codegen.KernelSource`).
        pdl: launch as a programmatic dependent of the plan's previous kernel (programmatic stream
            serialization); the kernel waits for that one before touching memory.
        cubin: ``ptx`` assembled for the target by nvJitLink when lowering already did so (the launch-bound
            check of :func:`_bound_occupancy` kept the bound), else None. Its code is what a fresh link
            of ``ptx`` gives; only the toolkit note recording ptxas' options (``-v``) differs.
    """

    ptx: str
    entry: str
    grid: int
    block: int
    shared_bytes: int
    params: tuple
    source: str
    cluster: int = 1
    coop: bool = False
    pdl: bool = False
    cubin: bytes | None = None


def arch_cc(arch) -> tuple:
    """``"sm_90"`` / ``"compute_90"`` / ``"90"`` / ``90`` / ``(9, 0)`` -> ``(9, 0)``.

    Raises:
        normc.ArgumentError: ``arch`` is not a compute capability (a tuple's minor must be 0-9), is one older
            than :data:`MIN_CC`, is not one of :func:`supported_ccs` (Numba would compile for another), or is
            arch-specific (``sm_90a``: normc emits portable PTX only).
    """
    from ..errors import ArgumentError

    if isinstance(arch, tuple):
        if not (len(arch) == 2 and all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in arch)
                and arch[0] > 0 and 0 <= arch[1] <= 9):
            raise ArgumentError(f"arch is {arch!r}; expected a compute capability such as 'sm_90' or (9, 0) "
                                "(a major and a minor 0-9)")
        cc = (int(arch[0]), int(arch[1]))
    else:
        m = re.fullmatch(r"(?:sm_|compute_)?(\d+)(\d)([af]?)", str(arch).strip())
        if not m:
            raise ArgumentError(f"arch is {arch!r}; expected a compute capability such as 'sm_90'")
        cc = (int(m.group(1)), int(m.group(2)))
        if m.group(3):
            raise ArgumentError(f"arch is {arch!r}; arch-specific targets (the '{m.group(3)}' suffix) are not "
                                f"supported: normc emits portable PTX, e.g. 'sm_{cc[0]}{cc[1]}'")
    if cc < MIN_CC:
        raise ArgumentError(f"arch sm_{cc[0]}{cc[1]} is not supported; expected compute capability "
                            f"{MIN_CC[0]}.{MIN_CC[1]} or newer (the oldest NVVM supports), e.g. 'sm_90'")
    known = supported_ccs()
    if known and cc not in known:
        raise ArgumentError(f"arch is {arch!r}: compute capability {cc[0]}.{cc[1]} is not one this CUDA toolkit "
                            f"compiles for; expected one of {', '.join(f'sm_{a}{b}' for a, b in known)}")
    return cc


@functools.cache
def supported_ccs() -> tuple:
    """The compute capabilities the installed CUDA toolkit compiles for, ascending: NVRTC's list, the one
    Numba's get_supported_ccs returns (Numba compiles any other for the nearest older one of them), asked
    through cuda.bindings, else through Numba; ``()`` when there is no toolkit to ask (no NVRTC), and then
    :func:`arch_cc` checks the form and :data:`MIN_CC` only."""
    try:  # without Numba's 0.3 s import of numba.cuda: a process whose kernels are all cached needs no Numba
        from cuda.bindings import nvrtc

        err, archs = nvrtc.nvrtcGetSupportedArchs()
        if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return tuple(sorted((a // 10, a % 10) for a in archs))
    except Exception:  # no cuda.bindings, or NVRTC missing or failing to load
        pass
    try:
        from numba.cuda.cudadrv.nvrtc import get_supported_ccs

        return tuple(sorted(get_supported_ccs()))
    except Exception:  # ImportError, the simulator's module without it, or NVRTC missing or failing to load
        return ()


# The oldest target the CUDA 13 NVVM accepts.
MIN_CC = (7, 5)

_NS = None


def _device_namespace():
    global _NS
    if _NS is None:
        from .device import namespace

        _NS = namespace()
    return _NS


def _signature(ptypes):
    from numba import types

    m = {"float32": types.float32, "uint16": types.uint16}
    return tuple(types.CPointer(m[t]) for t in ptypes)


def _bound_occupancy(ptx, min_ctas, cc, max_spill=0):
    """``(ptx, cubin)``: ``ptx`` with the launch bound ``.minnctapersm min_ctas`` (ptxas then keeps registers
    at or under 64K / (min_ctas x block)) and its cubin when that assembles spilling at most ``max_spill``
    bytes (stores, loads and stack each); else ``ptx`` unchanged and None, its occupancy whatever its
    registers give. The directive is added to the text rather than asked of Numba, so trying the bound costs
    one ptxas run (tens of ms), not a second Numba compile (seconds); a kept bound's cubin is returned so
    that the runtime does not assemble the same PTX again (60-70 ms a kernel of a 3-kernel split). Spills
    were seen at the 64-register bound: 8 bytes in a float32 outer partial kernel that used 64 registers
    unbounded."""
    bounded, n = re.subn(r"(\.maxntid[^\n]*\n)", rf"\1.minnctapersm {min_ctas}\n", ptx, count=1)
    if n != 1:
        return ptx, None
    try:
        cubin, use = assemble(bounded, f"sm_{cc[0]}{cc[1]}")
    except Exception:  # no nvJitLink here, or it refused the PTX: the unbounded kernel is still correct
        return ptx, None
    if max(use.spill_stores, use.spill_loads, use.stack) > max_spill:
        return ptx, None
    return bounded, cubin


# Call typing memoized while normc compiles (set NORMC_TYPING_MEMO=0 to compile without it).
#
# Numba types every operator and call of a kernel by asking the callee's function type for a signature
# (``BaseFunction.get_call_type``), which tries its templates one by one (operator.add alone has dozens of
# cases) every time, although a generated kernel repeats the same few hundred (callee, argument types) pairs
# thousands of times: 12,000 of the 12,600 lookups of three anchor rows' kernels were repeats. The answer
# depends only on the callee, the typing context, the argument types and the compile flags (fastmath...), all
# in the key. A lookup also records the callee's implementation key for the signature, which lowering reads:
# the memo stores it with the signature and puts it back on a hit, so the memo returns, and leaves, what the
# lookup would have. Only the thread that entered the memo uses it (other Numba compiles running meanwhile
# look up as usual). Measured on a 2-core CPU (three fresh processes each way, one warm-up
# compile first, lower() without -> with): NDHWC instance norm split (3 kernels) 2.09-2.57 -> 1.28-1.74 s,
# cluster layer norm 2.04-2.09 -> 1.04-1.35 s, NHWC instance norm cluster 1.72-1.91 -> 1.11-1.19 s, NHWC
# group norm split 4.35-5.39 -> 2.97-3.20 s, bfloat16 layer norm 1.01-1.17 -> 0.74-0.90 s. The PTX of all 67
# anchor rows, forward and backward, is the same (tests/test_ptx.py::test_typing_memo_keeps_the_ptx checks
# two). Failed lookups are not memoized.
_TYPING_MEMO = {}
# Entries kept at most; then the memo starts over (each compile adds a few dozen keys of fresh types).
_TYPING_MEMO_MAX = 50_000
_memo_lock = threading.Lock()
_memo_users = 0  # compiles inside _memoized_call_typing, all threads (the patch is installed once)
_memo_tls = threading.local()  # .depth: this thread's nesting; other threads' compiles bypass the memo
_original_get_call_type = None
_config_stacks = ()  # numba's (and numba-cuda's) ConfigStack: the compile flags (fastmath...) are in the key


_flags_seen = {}  # id(flags) -> (flags, its representative): the flags are kept alive, so the id stays theirs
_flags_by_value = {}  # flags -> the first equal flags seen (hashing a CUDAFlags takes ~9 us: done once each)


def _flags_key(flags):
    """A cheap key for a compile's flags: the id of a representative of all equal flags objects."""
    if flags is None:
        return None
    seen = _flags_seen.get(id(flags))
    if seen is None or seen[0] is not flags:
        seen = _flags_seen[id(flags)] = (flags, _flags_by_value.setdefault(flags, flags))
    return id(seen[1])


def _memo_get_call_type(self, context, args, kws):
    """``BaseFunction.get_call_type`` while normc compiles: the memoized signature, or the lookup's."""
    if not getattr(_memo_tls, "depth", 0):  # a Numba compile of someone else's, running meanwhile
        return _original_get_call_type(self, context, args, kws)
    try:
        key = (self, context, tuple(args), tuple(sorted(kws.items())) if kws else (),
               tuple(_flags_key(c.top_or_none()) for c in _config_stacks))
        hit = _TYPING_MEMO.get(key)
    except TypeError:  # an unhashable argument type: look it up
        return _original_get_call_type(self, context, args, kws)
    impl_keys = getattr(self, "_impl_keys", None)
    if hit is not None:
        sig, impl = hit
        if impl is not None and impl_keys is not None:
            impl_keys[sig.args] = impl  # as the lookup would have recorded it
        return sig
    sig = _original_get_call_type(self, context, args, kws)
    if sig is not None:
        if len(_TYPING_MEMO) >= _TYPING_MEMO_MAX:
            _TYPING_MEMO.clear()
            _flags_seen.clear()  # (keys of flags objects that are still alive stay valid in _flags_by_value)
        _TYPING_MEMO[key] = (sig, None if impl_keys is None else impl_keys.get(sig.args))
    return sig


@contextlib.contextmanager
def _memoized_call_typing():
    """Memoize Numba's call typing for this thread's compiles inside the block (see ``_TYPING_MEMO``); a no-op
    where Numba's layout is not the one expected or NORMC_TYPING_MEMO=0."""
    global _memo_users, _original_get_call_type, _config_stacks
    try:
        from numba.core.types.functions import BaseFunction

        from numba.core import targetconfig as core_config

        try:
            from numba.cuda.core import targetconfig as cuda_config
        except ImportError:  # pragma: no cover - numba-cuda releases that use numba's own
            cuda_config = core_config
        stacks = tuple({id(c.ConfigStack): c.ConfigStack for c in (cuda_config, core_config)}.values())
    except ImportError:  # pragma: no cover - another Numba layout: compile without the memo
        BaseFunction = None
    if (BaseFunction is None or "get_call_type" not in BaseFunction.__dict__
            or os.environ.get("NORMC_TYPING_MEMO", "1") == "0"):
        yield
        return
    with _memo_lock:
        if _memo_users == 0:
            _original_get_call_type = BaseFunction.__dict__["get_call_type"]
            _config_stacks = stacks
            BaseFunction.get_call_type = _memo_get_call_type
        _memo_users += 1
    _memo_tls.depth = getattr(_memo_tls, "depth", 0) + 1
    try:
        yield
    finally:
        _memo_tls.depth -= 1
        with _memo_lock:
            _memo_users -= 1
            if _memo_users == 0:
                BaseFunction.get_call_type = _original_get_call_type


# Numba's optional front-end passes skipped while normc compiles (set NORMC_LEAN_PIPELINE=0 to run them).
#
# A generated kernel is straight-line scalar code whose every variable keeps one type, with no array
# expressions, closures or constant branches to fold. Two groups of Numba passes do nothing for it but still
# walk the whole IR: the rewrite passes (``no_rewrites``: semantic-constant and generic rewrites, dead-branch
# pruning before typing, array-expression rewrites after it) and SSA reconstruction (``enable_ssa``: it
# rewrites each variable assigned in several blocks, 80 of them in row 54's kernels, with a pass over every
# block for each, then strips the phis again). Without SSA, a variable assigned an integer in one block and a
# float in another could be typed as their unification (float64). The generator keeps one type per name, and
# a kernel whose lean PTX has float64 in it is compiled again in full (``_compile_ptx``). The check is the
# PTX: all 426 kernels of the 67 anchor rows (forward, forward with statistics, backward) are the same with
# and without these passes (tests/test_ptx.py::test_lean_pipeline_keeps_the_ptx checks a sample on every
# run). Measured on a 2-core CPU (lower() after a warm-up compile, three fresh processes each way, full ->
# lean): row 54's three kernels (the anchor table's slowest first call) 2.16-2.23 -> 1.69-1.79 s, row 66
# 1.53-1.65 -> 1.16-1.23 s, row 1 0.94 -> 0.85 s. On an H100 machine (tests/gpu_compile_time.py, 2026-12-07)
# every anchor row's first call then took at most 1.57 s (row 54; 2.23-2.62 s before).
_LEAN_FLAGS = {"no_rewrites": True, "enable_ssa": False}


@functools.lru_cache(maxsize=None)
def _lean_flags_class(base):
    """A subclass of Numba's flags class ``base`` whose instances start with :data:`_LEAN_FLAGS` set (one
    class per base, so equal flags stay equal across compiles)."""

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        for name, value in _LEAN_FLAGS.items():
            setattr(self, name, value)

    return type(f"Lean{base.__name__}", (base,), {"__init__": __init__})


@contextlib.contextmanager
def _lean_pipeline():
    """Compile this thread's Numba CUDA kernels inside the block with :data:`_LEAN_FLAGS` set on their flags.

    Numba-cuda builds each compile's flags from ``numba.cuda.compiler.CUDAFlags``; the block swaps in a
    subclass that sets the lean flags, while holding Numba's compiler lock, so no other thread's compile
    starts meanwhile and nothing stays swapped afterwards. Yields whether it did: a no-op (``False``) where
    Numba's layout is not the one expected or NORMC_LEAN_PIPELINE=0."""
    try:
        from numba.cuda import compiler as cuda_compiler
        from numba.cuda.core.compiler_lock import global_compiler_lock

        base = cuda_compiler.CUDAFlags
        ok = all(name in base.options for name in _LEAN_FLAGS)
    except (ImportError, AttributeError):  # pragma: no cover - another Numba layout: the full pipeline
        ok = False
    if not ok or os.environ.get("NORMC_LEAN_PIPELINE", "1") == "0":
        yield False
        return

    with global_compiler_lock:
        cuda_compiler.CUDAFlags = _lean_flags_class(base)
        try:
            yield True
        finally:
            cuda_compiler.CUDAFlags = base


def _compile_ptx(fn, sig, cc, block):
    """PTX of the Python function ``fn`` compiled by Numba as a kernel of signature ``sig`` for compute
    capability ``cc`` and at most ``block`` threads, with the typing memo and the lean pipeline.

    Without SSA a name assigned an integer in one place and a float in another is typed as float64
    (``_LEAN_FLAGS``). normc's kernels compute in float32 and integers only, so float64 in the PTX means that
    happened: the kernel is then compiled again with the full pipeline, whose PTX is returned."""
    from numba.cuda import compile_ptx

    kw = dict(cc=cc, fastmath=False, launch_bounds=(block,))
    with _memoized_call_typing(), _lean_pipeline() as lean:
        ptx, _ = compile_ptx(fn, sig, **kw)
    if lean and ".f64" in ptx:
        with _memoized_call_typing():
            ptx, _ = compile_ptx(fn, sig, **kw)
    return ptx


def compile_source(ks: KernelSource, cc) -> LoweredKernel:
    """Compile one generated kernel to PTX for compute capability ``cc``."""
    ns = dict(_device_namespace())
    try:
        exec(compile(ks.source, f"<normc:{ks.name}>", "exec"), ns)
        ptx = _compile_ptx(ns[ks.name], _signature(ks.pointer_types), cc, ks.block)
    except Exception as e:  # NVVM/Numba typing errors are bugs in the generator: report with the source
        raise CompileError(f"compiling {ks.name} failed: {e}\n--- source ---\n{ks.source}") from e
    if ".extern" in ptx:
        raise CompileError(f"PTX of {ks.name} has unresolved .extern declarations")
    cubin = None
    if ks.min_ctas:
        ptx, cubin = _bound_occupancy(ptx, ks.min_ctas, cc, ks.max_spill)
    entries = re.findall(r"\.visible\s+\.entry\s+([\w$]+)\s*\(", ptx)
    if len(entries) != 1:
        raise CompileError(f"PTX of {ks.name} has {len(entries)} entries; expected 1")
    return LoweredKernel(ptx, entries[0], ks.grid, ks.block, ks.shared_bytes, ks.pointer_types, ks.source,
                         ks.cluster, ks.coop, ks.pdl, cubin)


# The oldest target normc's 16-bit kernels assemble for: they round float32 pairs with cvt.rn.{f16,bf16}x2.f32
# (PTX ISA: sm_80 and newer).
MIN_CC_16BIT = (8, 0)


def check_16bit_target(plan, cc):
    """CompileError when a 16-bit dtype of ``plan`` (any ``*_dtype`` field) meets a target older than
    :data:`MIN_CC_16BIT`, rather than PTX that ptxas then refuses."""
    names = [f.name for f in dataclasses.fields(plan) if f.name.endswith("_dtype")]
    half = sorted({getattr(plan, n) for n in names} & {"float16", "bfloat16"})
    if half and cc < MIN_CC_16BIT:
        raise CompileError(f"{' and '.join(half)} kernels need compute capability {MIN_CC_16BIT[0]}.{MIN_CC_16BIT[1]} "
                           f"or newer (they round float32 pairs with cvt.rn.f16x2/bf16x2.f32); the target is "
                           f"sm_{cc[0]}{cc[1]}: use float32 tensors there")


def _check_plan(plan, cls, expected, name="plan"):
    """ArgumentError naming the argument ``name`` unless ``plan`` is a ``cls``."""
    if not isinstance(plan, cls):
        from ..errors import ArgumentError

        raise ArgumentError(f"{name} is a {type(plan).__name__}; expected {expected}")


def lower(plan, arch=None) -> list:
    """Compile ``plan`` to a list of :class:`LoweredKernel` (launch order) for ``arch`` (default plan.arch).

    Raises:
        ArgumentError: ``plan`` is not a :class:`normc.Plan`.
        CompileError: Numba or NVVM failed, or a 16-bit plan targets an arch older than :data:`MIN_CC_16BIT`.
    """
    from ..planner import Plan

    _check_plan(plan, Plan, "a normc.Plan (from normc.plan(...))")
    cc = arch_cc(arch or plan.arch)
    check_16bit_target(plan, cc)
    return [compile_source(ks, cc) for ks in generate(plan)]


def lower_backward(bplan, arch=None) -> list:
    """Compile a :class:`normc.backward_plan.BackwardPlan` to :class:`LoweredKernel` s (launch order; each takes
    the nine pointers of :mod:`normc.lowering.backward`) for ``arch`` (default ``bplan.arch``).

    Raises:
        ArgumentError: ``bplan`` is not a BackwardPlan.
        CompileError: as :func:`lower`.
    """
    from ..backward_plan import BackwardPlan
    from .backward import generate_backward

    _check_plan(bplan, BackwardPlan, "a normc.backward_plan.BackwardPlan", "bplan")

    cc = arch_cc(arch or bplan.arch)
    check_16bit_target(bplan, cc)
    return [compile_source(ks, cc) for ks in generate_backward(bplan)]


@dataclass(frozen=True)
class ResourceUsage:
    """Per-kernel resources reported by ptxas (through nvJitLink): registers per thread, spill bytes, stack."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    log: str


def assemble(ptx: str, arch="sm_90"):
    """Assemble PTX to a cubin with nvJitLink (no GPU needed).

    Returns:
        (cubin bytes, :class:`ResourceUsage`).

    Raises:
        CompileError: the PTX does not assemble (the message carries nvJitLink's log).
    """
    from cuda.core import Linker, LinkerOptions, ObjectCode

    cc = arch_cc(arch)
    try:
        linker = Linker(ObjectCode.from_ptx(ptx.encode()),
                        options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}", ptxas_options=["-v"]))
        cubin = linker.link("cubin")
        log = linker.get_info_log() or ""
    except Exception as e:
        # nvJitLink's message carries ptxas' log over several lines: one line, so that it is not cut off
        detail = " | ".join(s.strip() for s in str(e).splitlines() if s.strip())
        raise CompileError(f"assembling PTX for sm_{cc[0]}{cc[1]} failed: {detail}") from e

    def grab(pat):
        m = re.search(pat, log)
        return int(m.group(1)) if m else 0

    usage = ResourceUsage(
        registers=grab(r"Used (\d+) registers"),
        spill_stores=grab(r"(\d+) bytes spill stores"),
        spill_loads=grab(r"(\d+) bytes spill loads"),
        stack=grab(r"(\d+) bytes stack frame"),
        log=log,
    )
    return bytes(cubin.code), usage


def link(ptxs, arch="sm_90") -> bytes:
    """Link one or more PTX modules (e.g. the kernels of a split plan) into a single cubin with nvJitLink.

    Raises:
        CompileError: nvJitLink failed (message carries its reason).
    """
    from cuda.core import Linker, LinkerOptions, ObjectCode

    cc = arch_cc(arch)
    try:
        objs = [ObjectCode.from_ptx(p.encode()) for p in ptxs]
        return bytes(Linker(*objs, options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}")).link("cubin").code)
    except Exception as e:
        raise CompileError(f"linking PTX for sm_{cc[0]}{cc[1]} failed: {e}") from e
