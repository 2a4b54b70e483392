"""Plan -> Python source of Numba CUDA kernels.

Every extent, stride and tiling constant of the plan is baked into the source as a literal, so NVVM folds
the index arithmetic (divisions by constants become multiply-shifts) and unrolled loops hold their values
in registers. The same source runs on the GPU (compiled by Numba/NVVM) and on Numba's CUDA simulator: the
few operations they do differently (vector loads/stores with conversions, warp shuffles, int/float
constructors) are names the source calls and the caller supplies (``normc.lowering.device`` on the GPU,
``normc.lowering.sim`` on the simulator).

Kernel parameters are always seven pointers, in this order::

    x, out, scale, shift, mean, rstd, workspace

x/out/scale/shift point to float32 (``float*``) or to 16-bit words (``uint16*``: float16/bfloat16 bits);
mean, rstd and workspace point to float32. Unused pointers may be null.

Names the source expects in its globals: ``cuda``, ``I64``, ``F32``, ``F32T``, ``rsqrt``, ``shfl_xor``,
``shfl_idx``, ``sel(c, a, b)`` (a select), the cluster operations ``cluster_arrive()``, ``cluster_wait()`` and
``dsmem_ld(shared_array, i, rank)`` (distributed shared memory), and for each dtype tag ``t`` in
{f32, f16, bf16} and width ``v``: ``ld{v}_{t}(p, i)`` returning a tuple of ``v`` float32 (``v`` = 1 returns a
float32), ``st{v}_{t}(p, i, tuple)`` (``v`` = 1 takes a scalar), and their masked forms ``ldm{v}_{t}(p, i, ok)``
(zeros when not ok) and ``stm{v}_{t}(p, i, vals, ok)``. Conditions go to the masked forms rather than to
``if`` blocks: straight-line source keeps Numba's compile time low (its SSA and typing passes grow with the
number of blocks; a 64-value persistent kernel went from 8.3 s to 1.6 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

TAG = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
# Vectors (or rows) loaded per loop trip in streaming loops before any is used (memory-level parallelism);
# the planner's LOOP_UNROLL, repeated here so the generator does not import the planner.
LOOP_UNROLL = 4
PARAMS = "xp, op, sp, hp, mp, rp, wp"
# Threads per SM that streaming kernels (looped and split schedules) are compiled to keep resident: their
# launch bounds ask for 1024 / threads CTAs per SM, which caps registers at 64 per thread (64K registers per
# SM). Uncapped, ptxas gave the split kernels 55-80 registers (sm_90), so 512-thread CTAs ran 1 or 2 per SM,
# 256-thread ones 3, and grids planned for 4 x 512 threads per SM ran 2.2-4.4 waves, the last one mostly idle.
# Grids of split schedules are sized in these slots (see _fill_splits).
STREAM_THREADS_PER_SM = 1024
# Spill stores (bytes) the streaming kernels' launch bound may cost and still be kept (else it is dropped and
# the kernel keeps fewer CTAs per SM than its grid was sized for). NHWC group norm (8, 320, 64, 64) float16
# (mixed split): under the bound its partial kernel spills 12 bytes and its normalize kernel 20; unbounded
# they took 72 registers (3 CTAs of 256 per SM for a grid sized for 4). Measured on an H100 (2026-12-05, one
# process, CUDA-graph replay, two rounds): 0 bytes 39.6-40.0 us, 32 bytes 35.9-36.0 us, outputs
# identical. No other anchor row's streaming kernel spills under its bound.
STREAM_MAX_SPILL = 32
# Launch bound of the coop schedule's cooperative kernel: threads resident per SM (0: none). 1024 (four
# 256-thread CTAs, planner COOP_CTAS_PER_SM) fits the float32 kernels in 64 registers without spills; the
# 16-bit ones spill under it and keep their 104 (two CTAs per SM: the runtime's co-resident grid).
COOP_SM_THREADS = 1024
# Threads per SM a persistent inner kernel whose threads hold more than 32 values is compiled to keep resident
# (launch bounds, when ptxas then spills nothing): 512, at most 128 registers per thread.
PERSISTENT_SM_THREADS = 512
# Spill stores (bytes) such a bound may cost and still be kept: a few words through L1 cost less than half the
# SM's CTAs (a 256-thread cluster CTA of 52 float32 values spilled 24 bytes at 128 registers).
PERSISTENT_MAX_SPILL = 64
# Inner persistent rows over a cluster of C CTAs: 1 interleaves the CTAs' vectors (thread vector e of CTA rank r
# is the row's vector (e*C + r)*tpr + lane), so only the last one or two vectors of each thread may fall past
# the row end and carry a mask; 0 gives each CTA a contiguous chunk, where the last CTA of a cluster, holding
# the remainder, needs a mask on every vector (a peeled 4 x 400,001 float32 row: 13 masked vectors, 112 bytes
# spilled at 128 registers; interleaved, none). Measured: docs/performance.md.
CLUSTER_INTERLEAVE = 1
# Inner rows held over a co-resident grid (planner GRID_PERSISTENT), norm: 1 exchanges each CTA's (count, mean,
# M2) once per row (Chan merge), 0 the row's sum and then its squared deviations from the row's mean (two
# exchanges, plain sums). Measured on an H100 (2026-12-06, two machines, both versions with every warp reading
# the partials): one exchange 1.0-3.6 us slower on all seven long-row layer norms (4 x 400,001 float32 14.9 vs
# 13.9 us); docs/performance.md.
GRID_ONE_EXCHANGE = 0
# Inner persistent rows whose scale/shift are constant along the row (NCHW instance norm: kept-only params): 1 loads
# them beside x, 0 after the row's statistics (one more dependent round trip before the first store). H100,
# 2026-12-07 (tests/gpu_sweep.py --case codegen.PRELOAD_ROW_PARAMS=0), 1 / 0: row 17 1.8 / 2.1 us, row 8
# 14.2 / 14.7, row 14 27.4 / 27.8, rows 0, 2 and 63 within 0.2 us.
PRELOAD_ROW_PARAMS = 1
# Outer/mixed kernels: 1 writes a column loop over a tile of no more columns than the CTA has threads as
# ``if tid < T:`` (lc = tid) instead of ``for lc in range(tid, T, threads):``. NVVM does not see that the loop
# runs at most once and unrolls it with remainder checks: for NHWC group norm (8, 640, 32, 32) float16 the
# PTX goes from 2,876 to 2,296 instructions and ptxas from 126 to 114 registers. H100, 2026-12-07
# (tests/gpu_sweep.py --rows 56,58,54,1,3,16,5,11,66 --case codegen.COLUMN_IF=1), 1 / 0 in us: row 56 26.9 /
# 27.8, row 1 89.5 / 92.9, row 16 3.2 / 3.5, row 58 10.7 / 11.1; rows 3, 5, 11 and 66 within 0.4 us.
COLUMN_IF = 1
# Mixed kernels whose group size G is not a multiple of the vector width V (V <= G): 1 loads two pivots per
# thread (the groups of its first and last column) and picks one per column, where 0 computes each column's
# group and loads its pivot (V loads, each after a 64-bit division and remainder by G): row 56's PTX 2,876
# -> 2,697 instructions. H100, 2026-12-07, same sweep, 1 / 0 in us: row 56 26.0 / 27.8 (24.9 with COLUMN_IF),
# row 54 34.2 / 36.3 (34.0 with both); rows 58 and 1 within 0.4 us.
MIXED_TWO_PIVOTS = 1
# Threads per SM the outer/mixed persistent kernels are compiled to keep resident (launch bounds, kept when
# ptxas spills at most PERSISTENT_MAX_SPILL bytes); 0: registers uncapped. Measured on the H200
# (tests/gpu_sweep.py, 2026-12-02) with 768 and a 512-byte spill allowance: NHWC instance norm (256, 128, 28,
# 28) float32 76.4 -> 73.0 us, but NHWC group norm (8, 640, 32, 32) float16 27.0 -> 29.1 and (8, 1280, 16,
# 16) 10.2 -> 13.1 (their spills): left off. Again on an H100 (2026-12-07) with the 64-byte allowance, which
# keeps row 1's bound (36 bytes) and should drop the group norm rows' (172-260 bytes): row 1 89.9 -> 90.1 and
# 90.9 -> 90.5 us (no gain), docs/performance.md.
OUTER_PERSISTENT_SM_THREADS = 0
# Outer/mixed persistent kernels, norm statistic: the statistics take two exact rounds over the registers (sums,
# then squared deviations from the mean), two CTA exchanges. Two ways to save one were timed and dropped
# (docs/performance.md). One round of sums of x - pivot and of its square (E[d^2] - E[d]^2; H100 2026-12-07:
# row 56 20.6 against 22.9 us, row 58 9.0 / 10.2, row 1 82.6 / 89.2) lost digits: 8-bit integer data put rstd
# off by 2.5e-5 to 1.6e-4 against 1.6e-7, even with an exact round redone where the pivot lay > 8 sigma out,
# and float32 near 5e17 overflowed its sum of squares. Each thread's exact (count, mean, M2) over its own
# registers merged exactly over the y-threads and the cluster (Chan's formula; two rounds' accuracy on those
# inputs) was slower on the H200 the same day: row 56 23.9 against 20.2 us, row 58 10.5 / 9.0, row 16 4.2 / 3.2,
# row 1 72.0 / 71.6 (94 -> 120 registers on row 56, and a serial merge of 25 partials per column).
# Every kernel's thread and block index: 1 zero-extends the 32-bit special registers to the int64 the source
# computes in (``I64(U32(cuda.threadIdx.x))``), 0 sign-extends them (Numba types them int32). Zero-extended,
# LLVM knows every index derived from them is non-negative, so it drops what Python semantics cost on signed
# integers: the floor correction of ``//`` and ``%`` (a shift, an add, a select each) and Numba's
# negative-index wrap on every shared-array access (a compare and a select). PTX instructions of the default
# kernels (sm_90), 0 -> 1: NHWC group norm (8, 640, 32, 32) float16 2,118 -> 1,727, (8, 1280, 16, 16) 2,324 ->
# 1,930, (8, 320, 64, 64) 2,095 -> 1,840, NDHWC instance norm 2 x 32 x 6^3 947 -> 477, NHWC (256, 128, 28, 28)
# float32 891 -> 661, NHWC batch statistics 1,505 -> 1,246; ptxas registers: row 56 114 -> 94, row 58 127 -> 95,
# NCHW group norm (8, 640, 32, 32) 96 -> 66, and row 54's partial kernel no longer spills. H100, 2026-12-07
# (tests/gpu_sweep.py --rows 56,58,54,16,1,3,66,55,0 --case codegen.UNSIGNED_INDEX=1; outputs equal to the
# sign-extended kernels'), 0 -> 1 in us: row 56 25.7 -> 23.3, row 58 11.1 -> 10.3, row 55 11.4 -> 10.8, row 16
# 3.5 -> 3.2, row 54 34.8 -> 34.0; rows 1, 3, 66 and 0 within 0.7 us. The backward (tests/gpu_backward_ab.py
# rows 1,3,5,66,56,0) within 0.9 us either way.
UNSIGNED_INDEX = 1
# Staged kernel (inner, short rows): threads per SM its launch bound asks for (0: no bound). Unbounded it
# takes 64-80 registers per thread on float32 rows of 10-16 values (3 CTAs of 256 per SM); bounded, at most 64
# (4 CTAs per SM; ptxas, sm_90: 10M x 10 spills nothing, rows of 16 values up to 16 bytes). Measured on the H200
# (tests/gpu_sweep.py, 2026-12-02, unbounded -> 1024): 10,000,001 x 10 float32 213.8 -> 192.6 us, 6M x 16
# 198.9 -> 189.1; 10M x 10, 16M x 6, 12M x 3 and 20M x 5 float16 within 0.5%.
STAGED_SM_THREADS = 1024
# Programmatic dependent launch between the kernels of a split schedule (1: on, 0: off): each kernel but the
# first is launched so that it may be scheduled once every CTA of the kernel before it has started, and waits
# (griddepcontrol.wait) as its first statement until that kernel has completed and its writes are visible.
# Its CTAs then take the SM slots the previous kernel's last wave frees instead of being launched after the
# whole grid drains (CUDA programming guide, "Programmatic Dependent Launch and Synchronization"). Measured on
# the H200 (2026-12-02, one run, NORMC_PDL=0 -> 1): NDHWC instance norm (2, 128, 32^3) float16 26.2 -> 25.0
# us, (2, 64, 64^3) float32 114.5 -> 114.0, NHWC group norm (8, 320, 64, 64) float16 39.4 -> 38.5, NHWC
# (1, 128, 160, 160) float32 20.5 -> 19.7.
PDL = 1
# Streaming loops (looped, split, coop) accumulate, per thread and column, the sum and the sum of squares of x
# minus the thread's first value of that column (1), turned into a mean and M2 once after the loop, instead of
# a Welford step per value (0: a reciprocal per loaded vector and two dependent FMAs per value). Shifting by a
# value of the thread's own data ("shifted data", Chan, Golub and LeVeque 1983) keeps var = q/n - (s/n)^2
# from cancelling digits; the reduction's pivot would not: it can lie far from one thread's values. Measured
# on the H200 (tests/gpu_sweep.py, 2026-12-02, 0 -> 1, us): NCDHW (2, 32, 128^3) float16 236.4 -> 211.2, NDHWC
# (2, 32, 128^3) float16 234.7 -> 220.9, (2, 64, 64^3) float16 73.5 -> 67.6, (2, 128, 32^3) float16 25.1 ->
# 22.0, NHWC batch statistics (256, 256, 28, 28) float16 104.6 -> 99.5, float32 rows within 1%.
SHIFTED_SUMS = 1
# Split, column-major second kernel (layer/RMS norm): at most this many rows, whose means and factors it
# keeps in shared memory (3 floats each); split plans have fewer rows than SMs unless forced.
FINISH_COLUMNS_MAX_ROWS = 1024
# ... and only where each of its CTAs gets a column slice of at least this fraction of its threads (see
# columns_finish; tests set it to 0 to run the column-major kernel on the simulator's small rows).
FINISH_COLUMNS_MIN_FILL = 0.5
# Threads per CTA of the inner split's middle kernel (a thread per row merges its partials: flat normalize
# kernels only, planner INNER_FINISH_TRIPS).
STATS_THREADS = 256
# CTAs of the kernel that zeroes the coop schedule's arrival counters (one per reduction; coop plans have
# fewer reductions than SMs, so one CTA's loop is enough).
COUNTER_ZERO_GRID = 1
# Looped schedules (one CTA reads its row or column tile twice, inner and outer): the normalize pass walks the
# rows last-first (1), starting on what the statistics pass read last (see stream_loop), or in order (0).
# Each CTA's share of L2 is what it read last; read forwards, that share is evicted before it is reached.
# Off: no clear gain on the forward. Measured on the H200 (tests/gpu_sweep.py, 2026-12-03, one run), us,
# 0 / 1: NCHW batch statistics f16 (256, 256, 28, 28) 84.4 / 82.7, NHWC instance norm f16 (256, 128, 28, 28)
# 43.1 / 42.7, NCDHW f16 (2, 64, 64^3) 53.8 / 53.8, NCHW group norm f16 (8, 320, 64, 64) 17.0 / 17.7. (The
# backward's unsplit dx kernel gains from it: normc.backward_plan.REVERSE_LOOPED.)
LOOPED_REVERSE = 0

# Power-of-two scaling of the statistics (issue 5). Squares are taken in float32, so |x - pivot| above about
# 1.8e19 (sqrt(FLT_MAX)) overflows the variance. float16 cannot get there (65504^2 fits easily); bfloat16
# has float32's exponent range, so its values can (up to 3.4e38). For x dtypes in SCALED_DTYPES, each
# reduction's statistics are accumulated over x * scl - pivot * scl, with scl a power of two chosen from
# |pivot|: the products are exact (only the exponent changes), so every sum rounds as the unscaled sum would,
# scaled. scl steps by 2^-32 (SCALE_STEPS: |pivot| >= 2^32, 2^64, 2^96), so |pivot * scl| < 2^32: a
# reduction of n values up to C times its pivot's magnitude stays finite while (C + 1) * sqrt(n) < 2^32
# (C ~ 2^16 for n = 2^31). |pivot| < 2^32 keeps scl = 1 (NaN too): those reductions compute bit for bit
# what they computed unscaled, with the unscaled headroom (|x - pivot| * sqrt(n) < 2^64). A pivot of +-Inf
# gives scl = 2^-96 and pivot * scl = +-Inf: the reduction is NaN, as unscaled. Cost: a few
# compare-and-selects per reduction (per column for outer/mixed), none per element for norm (x * scl - pvs
# is one FMA, as x - pv was one add), one multiply per element of the sum of squares for rms.
# float32 inputs are not scaled: measured on the float32 anchors, scaling cost +4 to +8 registers per thread
# in inner-persistent and outer-split kernels (e.g. 64 -> 72, 46 -> 54), for inputs beyond 1.8e19.
SCALED_DTYPES = ("bfloat16",)
SCALE_STEPS = tuple((2.0**k, 2.0**-k) for k in (32, 64, 96))
# Floor of eps * scl^2 (eps > 0): for scl = 2^-96, eps * scl^2 underflows to 0, and a constant reduction
# (scaled variance exactly 0) would get rsqrt(0) = inf and y = 0 * inf = NaN. max(eps * scl^2, FLT_MIN)
# keeps its scaled rstd finite, so y = 0 * a + b = shift as unscaled (its written rstd is 1/sqrt(eps): see
# emit_scaled_rstd). The floor changes nothing else: it is eps * scl^2 whenever that is a normal float
# (scl = 1 keeps any eps >= FLT_MIN exactly), and FLT_MIN is below 2^-49 of the smallest non-zero scaled
# variance of a scaled reduction (|pivot * scl| >= 1, a deviation >= one float32 ulp of it, n <= 2^31).
FLT_MIN = 2.0**-126
FLT_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class KernelSource:
    """One kernel to compile: its Python source, function name, launch shape and pointer element types.

    Attributes:
        name: Python function name (the PTX entry is Numba's mangling of it; read it from the PTX).
        source: Python source text defining ``name``.
        grid: CTAs (1-D).
        block: threads per CTA (1-D).
        shared_bytes: static shared memory the kernel declares (bytes), for reporting.
        pointer_types: element type of each of the 7 pointer parameters: ``"float32"`` or ``"uint16"``.
        cluster: CTAs per thread-block cluster (1: launched without clusters). ``grid`` counts CTAs and is a
            multiple of it; CTA ``bid`` has rank ``bid % cluster`` in its cluster.
        coop: a cooperative kernel: its CTAs wait for each other, so all must be co-resident. ``grid`` is the
            most it uses; the runtime launches ``min(grid, co-resident CTAs)`` (a cooperative launch), rounded
            down to a multiple of the reduction's splits, and the kernel loops over its work ``gridDim`` apart.
        min_ctas: CTAs of ``block`` threads that must fit one SM (the second launch bound, PTX
            ``.minnctapersm``: ptxas caps registers at 64K / (min_ctas x block)); 0 leaves registers uncapped.
        max_spill: bytes of spill stores the bound may cost and still be kept (else it is dropped).
        pdl: launch as a programmatic dependent of the previous kernel of the plan (sm_90: it may be scheduled
            before that one completes; its first statement waits for it, see :func:`_chain`).
    """

    name: str
    source: str
    grid: int
    block: int
    shared_bytes: int
    pointer_types: tuple
    cluster: int = 1
    coop: bool = False
    min_ctas: int = 0
    max_spill: int = 0
    pdl: bool = False


class _Src:
    def __init__(self):
        self.lines = []
        self.ind = 0
        self.tmp = 0
        self.decls = []  # shared-memory declarations, hoisted to the top of the kernel body
        self.decl_at = None

    def __call__(self, text):
        for ln in text.split("\n"):
            self.lines.append("    " * self.ind + ln)

    def new(self, prefix):
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    def block(self, head):
        self(head)
        return _Indent(self)

    def mark_decls(self):
        """Shared arrays declared later are placed here (every thread must see them)."""
        self.decl_at = len(self.lines)
        self.decl_ind = self.ind

    def text(self):
        lines = list(self.lines)
        if self.decls:
            pad = "    " * self.decl_ind
            lines[self.decl_at:self.decl_at] = [pad + d for d in self.decls]
        return "\n".join(lines) + "\n"


class _Indent:
    def __init__(self, src):
        self.src = src

    def __enter__(self):
        self.src.ind += 1

    def __exit__(self, *a):
        self.src.ind -= 1


def _ptr_type(dtype):
    return "float32" if dtype in (None, "float32") else "uint16"


def _coords(g, var, axes, prefix):
    """Emit mixed-radix decomposition of linear index ``var`` over ``axes`` (outermost-first).

    Returns coordinate expressions aligned with ``axes``. The outermost coordinate is not reduced modulo
    its extent (the caller guarantees the index is in range).
    """
    if not axes:
        return []
    if len(axes) == 1:
        return [var]
    coords = [None] * len(axes)
    t = var
    for j in range(len(axes) - 1, 0, -1):
        c = g.new(prefix)
        g(f"{c} = {t} % {axes[j].size}")
        coords[j] = c
        q = g.new(prefix + "q")
        g(f"{q} = {t} // {axes[j].size}")
        t = q
    coords[0] = t
    return coords


def _offset(coords, axes, tensor, scale_by=1):
    terms = []
    for c, a in zip(coords, axes):
        s = a.stride(tensor) * scale_by
        if s == 0:
            continue
        terms.append(c if s == 1 else f"{c} * {s}")
    return " + ".join(terms) if terms else "0"


def vector_offsets(g, c, red, V, tensors):
    """Emit the element offsets, per tensor in ``tensors``, of vector ``c`` (V elements along the innermost
    axis) of one reduction over the axes ``red`` (outermost-first, the last one contiguous), relative to
    the reduction's base. Returns {tensor: offset expression}."""
    if len(red) == 1:
        coords = [f"({c} * {V})" if V > 1 else c]
    else:
        iv = red[-1].size // V  # vectors along the innermost reduced axis
        if iv == 1:
            inner_c, rest = "0", c
        else:
            inner_c, rest = g.new("ic"), g.new("rc")
            g(f"{inner_c} = ({c} % {iv}) * {V}")
            g(f"{rest} = {c} // {iv}")
        coords = _coords(g, rest, red[:-1], "r") + [inner_c]
    return {t: _offset(coords, red, t) for t in tensors}


def _chan(g, n, m, m2, on, om, om2):
    """Emit the Chan et al. merge of (on, om, om2) into (n, m, m2) (float32, safe for empty sides)."""
    nn, d, w = g.new("nn"), g.new("d"), g.new("w")
    g(f"{nn} = {n} + {on}")
    g(f"{d} = {om} - {m}")
    g(f"{w} = {on} / max({nn}, F32(1.0))")
    g(f"{m} = {m} + {d} * {w}")
    # (d w)(d n), not d d n w: against an empty side (w = 0 or n = 0) the product is 0 even where d^2 n would
    # overflow float32 (|d| sqrt(n) > 1.8e19)
    g(f"{m2} = {m2} + {om2} + ({d} * {w}) * ({d} * {n})")
    g(f"{n} = {nn}")


class _Emitter:
    """What every kernel generator (forward here, backward in :mod:`normc.lowering.backward`) shares: the
    kernel prologue (signature ``params``, thread and block index, the place shared arrays are declared) and
    float32 shared-memory declarations, counted in ``self.shared`` (bytes)."""

    params = PARAMS
    shared = 0

    def smem(self, g, name, n):
        g.decls.append(f"{name} = cuda.shared.array({n}, F32T)")
        self.shared += 4 * n

    def prologue(self, g, name, reverse_grid=0):
        """``reverse_grid`` (the kernel's grid, > 0): CTA ``blockIdx.x`` takes the work item ``grid - 1 -
        blockIdx.x`` (see :func:`stream_loop`)."""
        g(f"def {name}({self.params}):")
        g.ind += 1
        g(f"tid = {special_index('threadIdx')}")
        blk = special_index("blockIdx")
        g(f"bid = I64({reverse_grid - 1}) - {blk}" if reverse_grid else f"bid = {blk}")
        g.mark_decls()


def special_index(reg):
    """Source of the int64 value of ``cuda.<reg>.x`` (``threadIdx``, ``blockIdx``), zero-extended where
    :data:`UNSIGNED_INDEX` says so."""
    return f"I64(U32(cuda.{reg}.x))" if UNSIGNED_INDEX else f"I64(cuda.{reg}.x)"


def column_block(T, threads, as_if):
    """Header of a block that thread ``lc`` runs for column lc of ``T`` columns in a CTA of ``threads``: the loop
    ``for lc in range(tid, T, threads):``, or, when ``as_if`` and ``T <= threads``, ``if tid < T:`` (NVVM does not
    see that the loop runs at most once and unrolls it with remainder checks; the kernel must then set
    ``lc = tid`` before). Shared by the forward's outer/mixed kernels and the backward's outer reduce kernels."""
    if as_if and T <= threads:
        return f"if tid < {T}:"
    return f"for lc in range(tid, {T}, {threads}):"


def stream_loop(g, start, stop, step, backwards=False):
    """Open ``for base in range(start, stop, step):`` (indenting ``g``; the caller dedents), run backwards,
    the last trip first, when ``backwards``.

    Split schedules re-read x in their last kernel. Its first kernel streamed every slice forwards, CTAs
    dispatched in index order, so when it ends L2 holds the ends of the slices of its last CTAs. The last
    kernel starts there (its CTAs take the work items in reverse, each slice walked backwards), so the first
    part of its re-read, up to L2's size, hits L2 instead of having been evicted by the rest of the pass (a
    forward re-read of a tensor a little larger than L2 misses almost everywhere: LRU under a cyclic scan)."""
    if not backwards:
        g(f"for base in range({start}, {stop}, {step}):")
        g.ind += 1
        return
    g(f"ntrip = ({stop} - ({start}) + {step - 1}) // {step}")
    g("for trip in range(ntrip - 1, -1, -1):")
    g.ind += 1
    g(f"base = {start} + trip * {step}")


class _Kernel(_Emitter):
    """Shared helpers for the inner and outer generators."""

    def __init__(self, plan):
        self.p = plan
        self.V = plan.vec
        self.xt = TAG[plan.x_dtype]
        self.ot = TAG[plan.out_dtype]
        self.shared = 0
        # statistics over power-of-two scaled values (SCALED_DTYPES); other dtypes' sources are unchanged
        self.scaled = plan.x_dtype in SCALED_DTYPES
        # Cache hints of the schedules that read x twice (plan.cache_hints, 0 for the others; see the planner's
        # CACHE_HINTS): suffixes of the load/store names (normc.lowering.device) for x's first read (which a
        # second pass reads again), x's last read, and y.
        self.h_first = "_el" if plan.cache_hints >= 2 else ""
        self.h_last = self.h_y = "_ef" if plan.cache_hints >= 1 else ""

    def ptypes(self):
        p = self.p
        return (_ptr_type(p.x_dtype), _ptr_type(p.out_dtype), _ptr_type(p.scale_dtype),
                _ptr_type(p.shift_dtype), "float32", "float32", "float32")

    def emit_scale(self, g, pv, scl, iscl=None):
        """Emit ``scl``, the power of two the statistics of a reduction with pivot ``pv`` are scaled by
        (SCALE_STEPS: 1 for |pv| < 2^32, NaN included), and ``iscl`` = 1 / scl (exact) when named."""
        av = g.new("av")
        g(f"{av} = abs({pv})")
        g(f"{scl} = F32(1.0)")
        if iscl:
            g(f"{iscl} = F32(1.0)")
        for lim, sv in SCALE_STEPS:
            big = g.new("big")
            g(f"{big} = {av} >= F32({lim!r})")
            g(f"{scl} = sel({big}, F32({sv!r}), {scl})")
            if iscl:
                g(f"{iscl} = sel({big}, F32({lim!r}), {iscl})")

    def eps_scaled(self, scl):
        """Expression of eps * scl^2, the eps of the scaled variance (floored at FLT_MIN when eps > 0)."""
        eps = self.p.eps
        if eps == 0:
            return "F32(0.0)"
        return f"max(F32({eps!r}) * {scl} * {scl}, F32({FLT_MIN!r}))"

    def rstd_of(self, g, var, eps):
        """Emit ``rstd = rsqrt(var + eps)`` for the variance (or mean square) expression ``var``; leaves it
        in ``v``.

        For ``norm``, a variance of +inf can only come from finite inputs whose squared deviations summed
        past FLT_MAX (float32 above ~1.8e19, or bfloat16 whose scale came from a far smaller pivot,
        docs/accuracy.md "Known limits"): an Inf input makes the mean infinite and the deviations NaN. Such
        a variance becomes NaN (``v > FLT_MAX`` holds only for +inf, and ``v - v`` is then NaN), so that
        reduction's y and rstd are NaN rather than a silent rstd = 0, y = shift.

        For ``rms`` the same +inf mean square also comes from an Inf input, where the reference (and
        torch) give rstd = 0, y = 0 at finite x and NaN at the Inf; the two cannot be told apart from the
        mean square alone, so rms keeps rsqrt(inf) = 0 and the reference's semantics for Inf inputs."""
        g(f"v = {var}")
        if self.p.stat == "norm":
            g(f"v = sel(v > F32({FLT_MAX!r}), v - v, v)  # an overflowed variance: NaN, not rstd = 0")
        g(f"rstd = rsqrt(v + {eps})")

    def emit_scaled_rstd(self, g, var, scl):
        """Scaled statistics -> ``ra`` (the factor y applies to scaled deviations: rstd / scl) and ``rstd``
        (unscaled, what is written), from ``var``, the variance (norm) or mean square (rms) of the values
        times ``scl``. rms applies the unscaled rstd (|x * rstd| <= sqrt(n) cannot overflow), so it needs
        only ``rstd``. For norm, rstd = ra * scl except for a constant reduction (var == 0: ra is only
        finite through the FLT_MIN floor), whose rstd is 1/sqrt(eps) (inf for eps = 0), as unscaled."""
        p = self.p
        if p.stat == "rms":
            self.rstd_of(g, var, self.eps_scaled(scl))
            g(f"rstd = rstd * {scl}")
            return
        self.rstd_of(g, var, self.eps_scaled(scl))
        g("ra = rstd")
        g(f"rstd = sel(v == F32(0.0), rsqrt(F32({p.eps!r})), ra * {scl})")

    def acc_init(self, g):
        """Zero the per-thread accumulators: a shared count and V (mean, M2) pairs (SHIFTED_SUMS: V (sum,
        sum of squares) pairs, turned into (mean, M2) by :meth:`acc_finish`)."""
        g("cnt = F32(0.0)")
        for j in range(self.V):
            g(f"wm{j} = F32(0.0)")
            g(f"wq{j} = F32(0.0)")

    def acc_start(self, g, names, piv):
        """SHIFTED_SUMS: each column's shift k{j} = the thread's first value of it (``names``, raw x as
        loaded; 0 where the thread has none). Summing x - k for a k taken from the summed data itself (the
        "shifted data" algorithm) keeps the cancellation in q - s^2/n small; the reduction's pivot may lie
        far from this thread's values. ``piv(j)`` = (pivot, scale) names of column
        j: the scale is None for unscaled dtypes; with one, ks{j} = k{j} * scale (exact: a power of two)."""
        if not SHIFTED_SUMS:
            return
        for j, nm in enumerate(names):
            g(f"k{j} = {nm}")
            _, scl = piv(j)
            if scl:
                g(f"ks{j} = k{j} * {scl}")

    def acc_shift(self, g, names, piv, rms=False):
        """Shift V loaded values before :meth:`acc_update`: by the thread's k{j} (SHIFTED_SUMS), else by
        the reduction's pivot (norm); rms values are only scaled (scaled dtypes)."""
        for j, nm in enumerate(names):
            pv, scl = piv(j)
            if rms:
                if scl:
                    g(f"{nm} = {nm} * {scl}")
            elif SHIFTED_SUMS:
                g(f"{nm} = {nm} * {scl} - ks{j}" if scl else f"{nm} = {nm} - k{j}")
            else:
                g(f"{nm} = {nm} * {scl} - {pv} * {scl}" if scl else f"{nm} = {nm} - {pv}")

    def acc_update(self, g, names, rms=False):
        """One step of the V accumulators with V new values (shifted by :meth:`acc_shift`): sums and sums of
        squares (SHIFTED_SUMS), else a Welford step (one reciprocal for all of them); for rms only the sums
        of squares (in wq) are kept."""
        g("cnt += F32(1.0)")
        if rms or SHIFTED_SUMS:
            for j, nm in enumerate(names):
                if not rms:
                    g(f"wm{j} = wm{j} + {nm}")
                g(f"wq{j} = wq{j} + {nm} * {nm}")
            return
        g("rc = F32(1.0) / cnt")
        for j, nm in enumerate(names):
            g(f"dd = {nm} - wm{j}")
            g(f"wm{j} = wm{j} + dd * rc")
            g(f"wq{j} = wq{j} + dd * ({nm} - wm{j})")

    def acc_finish(self, g, piv, rms=False):
        """After the streaming loop (SHIFTED_SUMS, norm): turn each column's (sum s, sum of squares q) of its
        cnt values shifted by k{j} into the (mean, M2) of x - pivot that the merges expect: mean = (k{j} -
        pivot) + s / cnt, M2 = q - s^2 / cnt (scaled dtypes: in scaled units). A thread that saw no value
        keeps a count of 0 and a mean of 0, which the Chan merges ignore."""
        if rms or not SHIFTED_SUMS:
            return
        g("rc = F32(1.0) / max(cnt, F32(1.0))")
        for j in range(self.V):
            pv, scl = piv(j)
            g(f"dm = wm{j} * rc")
            g(f"wq{j} = max(wq{j} - wm{j} * dm, F32(0.0))")
            # an empty thread's mean is 0 (as Welford's): k{j} - pivot there is -pivot, and a merge's
            # d * d * n * w with d ~ pivot overflows to inf before w = 0 zeroes it (inf * 0 = NaN)
            m = f"(ks{j} - {pv} * {scl}) + dm" if scl else f"(k{j} - {pv}) + dm"
            g(f"wm{j} = sel(cnt > F32(0.0), {m}, F32(0.0))")

    def stream_loads(self, g, U, step, valid, clamp, offsets, x_at, prefixes, hint=""):
        """U loads of one streaming-loop trip (inside ``for base in range(...)``): index ``base + u * step``,
        condition ``valid(index)``, offsets of the index clamped to ``clamp`` (always in bounds, so a masked
        lane still forms a legal address), x at ``x_at(offsets)``. All U loads are issued before any value is
        used. ``prefixes`` names the index and clamped-index variables; ``hint``: the loads' cache-hint suffix.
        Returns [(names, offsets, ok, index)]."""
        items = []
        for u in range(U):
            i, ok, ic = g.new(prefixes[0]), g.new("ok"), g.new(prefixes[1])
            g(f"{i} = base + {u * step}")
            g(f"{ok} = {valid(i)}")
            g(f"{ic} = min({i}, {clamp})")
            o = offsets(g, ic)
            names = [g.new("x") for _ in range(self.V)]
            self.load_x(g, names, x_at(o), ok, hint)
            items.append((names, o, ok, i))
        return items

    def load_x(self, g, names, off, ok, hint=""):
        """Emit loading V x-values at element offset ``off`` into ``names`` (zeros when not ``ok``), with the
        cache-hint suffix ``hint`` ("", "_ef", "_el").

        A condition is passed to a masked load (``ldm``: predicated in PTX) rather than emitted as an ``if``:
        straight-line source keeps Numba's compile time low (its SSA and typing passes grow with blocks)."""
        V = self.V
        fn = (f"ld{V}_{self.xt}" if ok == "True" else f"ldm{V}_{self.xt}") + hint
        cond = "" if ok == "True" else f", {ok}"
        g(f"{', '.join(names)} = {fn}(xp, {off}{cond})")

    def store_out(self, g, vals, off, ok="True", hint=""):
        """Emit storing V values at element offset ``off`` of out (only when ``ok``: a masked store), with the
        cache-hint suffix ``hint``."""
        V = self.V
        v = vals[0] if V == 1 else f"({', '.join(vals)},)"
        if ok == "True":
            g(f"st{V}_{self.ot}{hint}(op, {off}, {v})")
        else:
            g(f"stm{V}_{self.ot}{hint}(op, {off}, {v}, {ok})")

    def load_param(self, g, which, off, step, vec_ok, count):
        """Emit loads of ``count`` affine values at ``off`` + j*``step``; returns their names."""
        dt = getattr(self.p, f"{which}_dtype")
        tag = TAG[dt]
        ptr = "sp" if which == "scale" else "hp"
        names = [g.new(which[:2]) for _ in range(count)]
        if step == 0:
            g(f"{names[0]} = ld1_{tag}({ptr}, {off})")
            return [names[0]] * count
        if vec_ok and count > 1 and step == 1:
            g(f"{', '.join(names)} = ld{count}_{tag}({ptr}, {off})")
            return names
        for j, nm in enumerate(names):
            g(f"{nm} = ld1_{tag}({ptr}, {off} + {j * step})")
        return names


# ----------------------------------------------------------------------------------------------------------
# inner: lanes along the reduction


class _Inner(_Kernel):
    def __init__(self, plan):
        super().__init__(plan)
        p = plan
        self.red = [a for a in p.axes if a.reduced]
        self.kep = [a for a in p.axes if not a.reduced]
        self.inner = p.axes[-1]
        self.NC = p.reduced // self.V  # vectors per row (peeled: the most whole vectors a row has)
        self.IV = self.inner.size // self.V  # vectors along the innermost reduced axis
        self.TPR = p.tpr
        self.RPC = p.rows_per_cta
        # Peeled rows (plan.peel): row_setup moves the bases to the row's first vector boundary and names its
        # whole vectors nf (a run-time bound); the values around them are the edges (emit_edge_*).
        self.peel = p.peel
        self.nvec = "nf" if p.peel else str(self.NC)

    # index helpers -------------------------------------------------------------------------------------
    def row_setup(self, g, row_expr, clamp):
        """Kept coordinates of the row -> base offsets xb, ob, sb, hb, mb."""
        p = self.p
        g(f"row = {row_expr}")
        if clamp:
            g(f"rowc = min(row, {p.kept - 1})")
            r = "rowc"
        else:
            r = "row"
        cs = _coords(g, r, self.kep, "k")
        for t, nm in (("x", "xb"), ("out", "ob"), ("scale", "sb"), ("shift", "hb"), ("stat", "mb")):
            g(f"{nm} = I64({_offset(cs, self.kep, t)})")
        if p.stat == "norm" or self.scaled:
            # Pivot: the row's first value. Statistics are accumulated over x - pivot, so a row whose mean is
            # large against its spread (mean 1e4 x std) loses no digits to cancellation (shifted data).
            g(f"pv = ld1_{self.xt}(xp, xb)")
        if self.scaled:
            # scaled dtypes: x * scl - pivot * scl (exact products) instead, scl from the pivot (SCALED_DTYPES)
            self.emit_scale(g, "pv", "scl", "iscl" if p.stats else None)
            if p.stat == "norm":
                g("pvs = pv * scl")
        if self.peel:
            # hl values before the row's first vector boundary (x and out share it: the planner's PEEL), then
            # nf whole vectors; the bases move to the boundary, xe/oe keep the row's start for the edges (whose
            # scale and shift are indexed back from the moved bases, by d - hl)
            V, L, inner = self.V, self.inner.size, self.inner
            g(f"hl = ({V} - xb % {V}) % {V}")
            g(f"nf = ({L} - hl) // {V}")
            g("xe = xb")
            g("oe = ob")
            for nm, step in (("xb", 1), ("ob", 1), ("sb", inner.scale), ("hb", inner.shift)):
                if step:
                    g(f"{nm} = {nm} + hl * {step}")

    def edges(self, g, who):
        """Peeled rows: the up to 2 (V - 1) values around the whole vectors, [(in-row index clamped into the
        row, condition)], the condition true for values of the row when ``who`` (the thread handling them)."""
        V, L = self.V, self.inner.size
        out = []
        for k in range(V - 1):
            d, ok = g.new("d"), g.new("ok")
            g(f"{d} = I64({k})")
            g(f"{ok} = ({who}) and {k} < hl")
            out.append((d, ok))
        for k in range(V - 1):
            d, ok = g.new("d"), g.new("ok")
            g(f"{d} = min(hl + nf * {V} + {k}, {L - 1})")
            g(f"{ok} = ({who}) and hl + nf * {V} + {k} < {L}")
            out.append((d, ok))
        return out

    def emit_edge_stats(self, g, who, rms=False):
        """Peeled rows: fold the edge values into this thread's statistics: norm, the triple (n, mean, m2)
        of x - pivot (their own two-pass triple, Chan-merged); rms, the sum of squares q."""
        if not self.peel:
            return
        vals = []
        for d, ok in self.edges(g, who):
            e = g.new("e")
            g(f"{e} = ldm1_{self.xt}(xp, xe + {d}, {ok})")
            vals.append((e, ok))
        if rms:
            for e, ok in vals:
                g(f"q = q + ({e} * scl) * ({e} * scl)" if self.scaled else f"q = q + {e} * {e}")
            return
        g("ne = F32(0.0)")
        g("se_ = F32(0.0)")
        for e, ok in vals:
            sh = f"{e} * scl - pvs" if self.scaled else f"{e} - pv"
            g(f"{e} = sel({ok}, {sh}, F32(0.0))")
            g(f"ne = ne + F32({ok})")
            g(f"se_ = se_ + {e}")
        g("me = se_ / max(ne, F32(1.0))")
        g("qe = F32(0.0)")
        for e, ok in vals:
            g(f"qe = qe + sel({ok}, ({e} - me) * ({e} - me), F32(0.0))")
        _chan(g, "n", "mean", "m2", "ne", "me", "qe")

    def emit_edge_normalize(self, g, var, who=None, held=None):
        """Peeled rows: normalize and store the edge values (one at a time, by ``who``). ``held``: the
        persistent kernel's edges as ``[(value, d, ok)]``, shifted as its registers are (normalized as they are);
        else they are loaded from x here and normalized as loaded."""
        if not self.peel:
            return
        inner, V = self.inner, self.V
        edges = held if held is not None else [(None, d, ok) for d, ok in self.edges(g, who)]
        self.V = 1  # emit_normalize_vec on single values
        try:
            for e, d, ok in edges:
                if e is None:
                    e = g.new("e")
                    g(f"{e} = ldm1_{self.xt}(xp, xe + {d}, {ok})")
                offs = {"out": d, "scale": f"({d} - hl) * {inner.scale}", "shift": f"({d} - hl) * {inner.shift}"}
                self.emit_normalize_vec(g, [e], offs, var, ok, raw=held is None, ob="oe", hint=self.h_y)
        finally:
            self.V = V

    def chunk_offsets(self, g, c):
        """Offsets (x, out, scale, shift) of vector ``c`` of a row, relative to the row bases."""
        return vector_offsets(g, c, self.red, self.V, ("x", "out", "scale", "shift"))

    def params_for_row(self):
        """Whether scale/shift vary along the reduction (else one value per row, folded into a, b)."""
        p = self.p
        var = {}
        for w in ("scale", "shift"):
            if getattr(p, f"{w}_dtype") is None:
                var[w] = None
            else:
                var[w] = any(a.stride(w) for a in self.red)
        return var

    def emit_row_param_loads(self, g):
        """Load the row's scale and shift where they are constant along it (``sv``, ``hv``), ahead of use.

        The persistent kernel issues them beside the row's x loads: after the reductions they would be one
        more dependent global-memory round trip between the statistics and the first store (the shuffles
        and barriers in between are not crossed by the compiler), which is most of a launch-bound row's
        time on top of x's load (e.g. 2 x 32 x 6^3 instance norm: 8 CTAs). Two registers."""
        var = self.params_for_row()
        if var["scale"] is False:
            g("sv = ld1_%s(sp, sb)" % TAG[self.p.scale_dtype])
        if var["shift"] is False:
            g("hv = ld1_%s(hp, hb)" % TAG[self.p.shift_dtype])

    def emit_row_affine(self, g, loaded=False):
        """a, b such that y = (x - mean)*a + b, folding per-row (kept-only) scale/shift (``loaded``: their
        values are already in ``sv``/``hv``, from :meth:`emit_row_param_loads`).

        Subtracting the mean before scaling (rather than y = x*a' + b' with b' = shift - mean*a') keeps
        constant rows exact: y == shift. Scaled norm: y = (x*scl - mean)*a + b, mean and a scaled."""
        if not loaded:
            self.emit_row_param_loads(g)
        var = self.params_for_row()
        g("a = ra" if self.scaled and self.p.stat == "norm" else "a = rstd")
        g("b = F32(0.0)")
        if var["scale"] is False:
            g("a = a * sv")
        if var["shift"] is False:
            g("b = b + hv")
        return var

    def emit_normalize_vec(self, g, xs, offs, var, ok="True", raw=False, params=None, ob="ob", hint=""):
        """Normalize and store V values ``xs``: the shifted (and scaled) registers of the persistent kernel,
        or x as loaded (``raw``: scaled norm multiplies it by scl first; an exact product, one FMA).
        ``params``: names of the V scale and V shift values along the row when already loaded (else they are
        loaded here); ``ob``: the expression of the row's base offset in out; ``hint``: the store's cache hint."""
        V = self.V
        inner = self.inner
        ys = [g.new("y") for _ in range(V)]
        xsc = " * scl" if raw and self.scaled and self.p.stat == "norm" else ""
        # b is a per-row shift (or 0): with a scale along the row it comes after that scale, y = x^ * s + b
        late_b = " + b" if var["scale"] and var["shift"] is False else ""
        for j in range(V):
            g(f"{ys[j]} = ({xs[j]}{xsc} - mean) * a" + ("" if var["scale"] else " + b"))
        if var["scale"]:
            sc = params[0] if params else self.load_param(g, "scale", f"sb + {offs['scale']}", inner.scale,
                                                         self.p.scale_vec, V)
            for j in range(V):
                g(f"{ys[j]} = {ys[j]} * {sc[j]}{late_b}")
        if var["shift"]:
            sh = params[1] if params else self.load_param(g, "shift", f"hb + {offs['shift']}", inner.shift,
                                                         self.p.shift_vec, V)
            for j in range(V):
                g(f"{ys[j]} = {ys[j]} + {sh[j]}")
        self.store_out(g, ys, f"{ob} + {offs['out']}", ok, hint)

    # reductions ----------------------------------------------------------------------------------------
    def reduce_triple(self, g, n, m, m2, tag):
        """Merge (n, m, m2) across the TPR threads of a row; every thread ends with the same result."""
        TPR = self.TPR
        width = min(TPR, 32)
        off = width // 2
        while off >= 1:
            on, om, om2 = g.new("on"), g.new("om"), g.new("om2")
            g(f"{on} = shfl_xor({n}, {off})")
            g(f"{om} = shfl_xor({m}, {off})")
            g(f"{om2} = shfl_xor({m2}, {off})")
            _chan(g, n, m, m2, on, om, om2)
            off //= 2
        if TPR <= 32:
            if TPR > 1:
                # xor merges are not symmetric in rounding: take the first lane's result for the whole row
                src = f"(tid % 32) - (tid % 32) % {TPR}"
                g(f"{n} = shfl_idx({n}, {src})")
                g(f"{m} = shfl_idx({m}, {src})")
                g(f"{m2} = shfl_idx({m2}, {src})")
            return
        NW = TPR // 32
        tot = self.RPC * NW
        self.smem(g, f"sn{tag}", tot)
        self.smem(g, f"sm{tag}", tot)
        self.smem(g, f"sq{tag}", tot)
        with g.block("if tid % 32 == 0:"):
            g(f"sn{tag}[rloc * {NW} + lane // 32] = {n}")
            g(f"sm{tag}[rloc * {NW} + lane // 32] = {m}")
            g(f"sq{tag}[rloc * {NW} + lane // 32] = {m2}")
        g("cuda.syncthreads()")
        g(f"{n} = sn{tag}[rloc * {NW}]")
        g(f"{m} = sm{tag}[rloc * {NW}]")
        g(f"{m2} = sq{tag}[rloc * {NW}]")
        with g.block(f"for wi in range(1, {NW}):"):
            _chan(g, n, m, m2, f"sn{tag}[rloc * {NW} + wi]", f"sm{tag}[rloc * {NW} + wi]",
                  f"sq{tag}[rloc * {NW} + wi]")

    def reduce_sum(self, g, s, tag):
        TPR = self.TPR
        width = min(TPR, 32)
        off = width // 2
        while off >= 1:
            g(f"{s} = {s} + shfl_xor({s}, {off})")
            off //= 2
        if TPR <= 32:
            return
        NW = TPR // 32
        self.smem(g, f"ss{tag}", self.RPC * NW)
        with g.block("if tid % 32 == 0:"):
            g(f"ss{tag}[rloc * {NW} + lane // 32] = {s}")
        g("cuda.syncthreads()")
        g(f"{s} = ss{tag}[rloc * {NW}]")
        with g.block(f"for wi in range(1, {NW}):"):
            g(f"{s} = {s} + ss{tag}[rloc * {NW} + wi]")

    def finish_stats(self, g, write_cond, shifted=False):
        """rstd from (n, m2) or q; write mean and rstd where ``write_cond``. ``shifted``: ``mean`` is of
        x - pv (the persistent kernel keeps its registers shifted); the true mean pv + mean is written.
        Scaled dtypes: the statistics are of values times scl; ``ra`` = rstd / scl is what normalizes them
        (norm), and the written mean and rstd are unscaled."""
        p = self.p
        if self.scaled:
            if p.stat == "norm":
                self.emit_scaled_rstd(g, "m2 / n", "scl")
                wmean = "(mean + pvs) * iscl" if shifted else "mean * iscl"
            else:
                self.emit_scaled_rstd(g, f"q / F32({float(p.reduced)!r})", "scl")
                g("mean = F32(0.0)")
                wmean = "mean"
            if p.stats:
                with g.block(f"if {write_cond}:"):
                    g(f"st1_f32(mp, mb, {wmean})")
                    g("st1_f32(rp, mb, rstd)")
            return
        if p.stat == "norm":
            self.rstd_of(g, "m2 / n", f"F32({p.eps!r})")
        else:
            self.rstd_of(g, f"q / F32({float(p.reduced)!r})", f"F32({p.eps!r})")
            g("mean = F32(0.0)")
        if p.stats:
            with g.block(f"if {write_cond}:"):
                g("st1_f32(mp, mb, mean + pv)" if shifted and p.stat == "norm" else "st1_f32(mp, mb, mean)")
                g("st1_f32(rp, mb, rstd)")

    # kernels -------------------------------------------------------------------------------------------
    def persistent(self):
        """x held in registers: each row's values are loaded once, reduced (two passes over registers), then
        normalized and stored. With ``plan.cluster`` = C > 1 a row is spread over the C CTAs of a cluster:
        the e-th slab of tpr vectors of CTA rank r is the row's slab e*C + r (CLUSTER_INTERLEAVE; else rank r
        holds vectors [r*CH, (r+1)*CH), CH = per_thread * tpr), and the CTAs' partial statistics are merged
        through distributed shared memory, in rank order (every CTA gets the same result). Peeled rows
        (plan.peel) hold their whole vectors so; their edge values are folded in by one thread."""
        p, V, TPR, NC, E = self.p, self.V, self.TPR, self.NC, self.p.per_thread
        # CTAs a row is spread over: a cluster's (partial sums through distributed shared memory) or a
        # co-resident grid's (plan.splits > 1: through the workspace, grid_merge)
        G = p.splits if p.grid_persistent else 1
        C = p.cluster * G
        CH = E * TPR
        interleave = C > 1 and CLUSTER_INTERLEAVE
        kernels = [self.counter_zero(3 * C * p.kept)] if G > 1 else []
        g = _Src()
        self.prologue(g, "normc_inner")
        g(f"lane = tid % {TPR}" if self.RPC > 1 else "lane = tid")
        g(f"rloc = tid // {TPR}" if self.RPC > 1 else "rloc = 0")
        ragged_rows = p.kept % self.RPC != 0
        if C > 1:
            g(f"crank = bid % {C}")
            self.row_setup(g, f"bid // {C}", False)
        else:
            g("crank = 0")
            self.row_setup(g, f"bid * {self.RPC} + rloc", ragged_rows)
        rv = f"row < {p.kept}" if ragged_rows else "True"
        g(f"rv = {rv}")
        # vectors of the row certainly present: peeled rows have nf whole vectors, NC or NC - 1
        sure = NC - 1 if self.peel else NC
        last = sure - (C - 1) * CH  # contiguous chunks: those held by the last CTA (all of them when C == 1)
        xs, oks, offs = [], [], []
        for e in range(E):
            c = g.new("c")
            if interleave:
                g(f"{c} = crank * {TPR} + lane + {e * C * TPR}")
                need = (e + 1) * C * TPR > sure
            else:
                g(f"{c} = crank * {CH} + lane + {e * TPR}" if C > 1 else f"{c} = lane + {e * TPR}")
                need = (e + 1) * TPR > last
            ok = g.new("ok")
            if need:
                g(f"{ok} = rv & ({c} < {self.nvec})")
                cc = g.new("cc")
                g(f"{cc} = min({c}, {self.nvec} - 1)")
            elif rv == "True":
                ok = "True"  # every lane holds a valid vector: no branch (fewer blocks: faster compiles)
                cc = c
            else:
                g(f"{ok} = rv")
                cc = c
            o = self.chunk_offsets(g, cc)
            names = [g.new("x") for _ in range(V)]
            self.load_x(g, names, f"xb + {o['x']}", ok, self.h_last)
            xs.append(names)
            oks.append(ok)
            offs.append(o)
        # Peeled rows: the up to 2 (V - 1) values around the whole vectors, handled by one thread of the row (of
        # the cluster's first CTA) as single values. Loaded again where each pass needs them (a masked load is a
        # no-op on the other threads) rather than held across the reductions beside the row's vectors.
        if PRELOAD_ROW_PARAMS:
            self.emit_row_param_loads(g)  # in flight with x's loads, not after the reductions
        edge_at = []
        if self.peel:
            who = "lane == 0 and rv" + (" and crank == 0" if C > 1 else "")
            edge_at = self.edges(g, who)

        def edges(shift):
            """[(value, d, ok)]: the edges loaded (0 where not this thread's), ``shift``: as the registers are
            (x - pivot, masked to 0; scaled: x * scl - pivot * scl)."""
            out = []
            for d, ok in edge_at:
                ev = g.new("ev")
                g(f"{ev} = ldm1_{self.xt}(xp, xe + {d}, {ok})")
                if shift:
                    sh = f"{ev} * scl - pvs" if self.scaled else f"{ev} - pv"
                    g(f"{ev} = ({sh}) * F32({ok})")
                out.append((ev, d, ok))
            return out

        if p.stat == "norm":
            # Two passes over the registers, each a plain sum across the CTA (cheaper than merging Welford
            # triples at every shuffle step): the CTA's mean, then squared deviations from it. The registers
            # hold x - pivot (masked lanes 0); mean is of the shifted values until the statistics are written.
            # A masked vector's lanes are multiplied by its 0/1 mask (one F32() per vector instead of a select
            # per value: fewer calls for Numba to type), made again from its predicate in the second pass. A
            # NaN/Inf pivot means the row holds one: NaN anyway.
            for names, ok in zip(xs, oks):
                if ok != "True":
                    mk = g.new("mk")
                    g(f"{mk} = F32({ok})")
                for nm in names:
                    d = f"{nm} * scl - pvs" if self.scaled else f"{nm} - pv"
                    g(f"{nm} = {d}" if ok == "True" else f"{nm} = ({d}) * {mk}")
            g(f"n = F32({float(p.reduced)!r})")
            g("s = F32(0.0)")
            for names in xs:
                for nm in names:
                    g(f"s = s + {nm}")
            for ev, _, _ in edges(True):
                g(f"s = s + {ev}")
            self.reduce_sum(g, "s", "a")
            one_exchange = G > 1 and GRID_ONE_EXCHANGE
            if G > 1 and not one_exchange:
                self.grid_merge(g, ("s",))  # the row's sum, then (below) its squared deviations: two exchanges
            elif one_exchange:
                # over a grid: the CTA's own mean and M2 (its count cn), merged once across the row's CTAs
                # (grid_merge): one exchange through the workspace instead of one per pass
                unmasked = sum(ok == "True" for ok in oks)
                g(f"cn = F32({float(unmasked * V)!r})")
                for ok in oks:
                    if ok != "True":
                        g(f"cn = cn + F32({ok}) * F32({float(V)!r})")
                for _, _, ok in edges(True):
                    g(f"cn = cn + F32({ok})")
                self.reduce_sum(g, "cn", "c")
                g("mean = s / max(cn, F32(1.0))")
            elif C > 1:
                self.cluster_sum(g, "s", 1)
            if not one_exchange:
                g("mean = s / n")
            g("m2 = F32(0.0)")
            for names, ok in zip(xs, oks):
                t = g.new("t")
                g(f"{t} = " + " + ".join(f"({nm} - mean) * ({nm} - mean)" for nm in names))
                g(f"m2 = m2 + {t}" if ok == "True" else f"m2 = m2 + {t} * F32({ok})")
            for ev, _, ok in edges(True):
                g(f"m2 = m2 + ({ev} - mean) * ({ev} - mean) * F32({ok})")
            self.reduce_sum(g, "m2", "b")
            if one_exchange:
                self.grid_merge(g, ("cn", "mean", "m2"))
            elif G > 1:
                self.grid_merge(g, ("m2",), rnd=2)
            elif C > 1:
                self.cluster_sum(g, "m2", 2)
        else:
            g("q = F32(0.0)")
            for names in xs:
                for nm in names:
                    # scaled: the registers stay unscaled (y uses the unscaled rstd), only the squares see scl
                    g(f"q = q + ({nm} * scl) * ({nm} * scl)" if self.scaled else f"q = q + {nm} * {nm}")
            for ev, _, _ in edges(False):  # 0 where not this thread's (masked loads)
                g(f"q = q + ({ev} * scl) * ({ev} * scl)" if self.scaled else f"q = q + {ev} * {ev}")
            self.reduce_sum(g, "q", "a")
            if G > 1:
                self.grid_merge(g, ("q",))
            elif C > 1:
                self.cluster_sum(g, "q", 1)
        if p.cluster > 1:
            g("cluster_arrive()  # done reading the peers' shared memory (the wait is at kernel end)")
        self.finish_stats(g, "lane == 0 and rv and crank == 0", shifted=True)
        var = self.emit_row_affine(g, loaded=bool(PRELOAD_ROW_PARAMS))
        for names, ok, o in zip(xs, oks, offs):
            self.emit_normalize_vec(g, names, o, var, ok, hint=self.h_y)
        if edge_at:  # shifted as the registers are (RMS: as loaded), normalized as they are
            self.emit_edge_normalize(g, var, held=edges(p.stat == "norm"))
        if p.cluster > 1:
            g("cluster_wait()  # peers may still read this CTA's shared memory until they arrive")
        # CTAs under 512 threads holding more than 32 values per thread: keep two of them per SM (at most 128
        # registers per thread, what a 512-thread CTA gets), so one's loads overlap the other's reduction
        wide = p.threads < PERSISTENT_SM_THREADS and E * V > 32
        main = KernelSource("normc_inner", g.text(), p.grid, p.threads, self.shared, self.ptypes(), p.cluster,
                            min_ctas=PERSISTENT_SM_THREADS // p.threads if wide else 0,
                            max_spill=PERSISTENT_MAX_SPILL if wide else 0, coop=G > 1)
        return kernels + [main]

    def staged(self):
        """Short contiguous rows (planner's STAGED_MAX_ROW_BYTES) through shared memory. CTA ``bid`` owns the
        flat chunk of R whole rows starting at element ``bid * R * L`` (16-byte aligned: R * L is whole vectors).

        1. Each thread loads its E flat V-wide vectors (vector ``e * T + tid`` of the chunk: a warp reads 32
           consecutive vectors) and stores the float32 values to shared memory; a tensor whose size is not
           whole vectors has its last few elements loaded one by one.
        2. One thread per row reads the row's L values, takes its mean and variance in two passes over them,
           shifted by the row's first value (or its mean square), writes the statistics, and writes y back in
           place: ``(x - mean) * rstd``, then the scale and shift of its column (staged in shared memory too:
           they vary along the row only).
        3. Each thread stores its E vectors of y from shared memory, as it loaded them.

        Shared memory is padded by one word every 32 (word ``i`` at ``i + i // 32``), so the V-word runs of
        steps 1 and 3 hit 32 distinct banks per warp access, and step 2's rows of L words at most two. It is
        accessed through 32-bit addresses (``smem_base``, ``lds_f32``, ``sts_f32``) and int32 indices (``I32``,
        constants included: an int64 operand would widen the arithmetic); global indices are int64."""
        p = self.p
        V, T, E, R, L = p.vec, p.threads, p.per_thread, p.rows_per_cta, p.reduced
        W = T * E * V
        g = _Src()
        self.prologue(g, "normc_inner_staged")
        self.smem(g, "sx", W + W // 32)

        def at(i):  # padded shared index of word i
            return f"{i} + ({i} >> I32(5))"

        def vector_at(e):  # chunk element of this thread's vector e
            return f"(t32 + I32({e * T})) * I32({V})"

        def x_at(li):  # global element offset of a vector (clamped into the chunk when masked off)
            return f"f0 + max(min({li}, lim - {V}), 0)"

        g("sb = smem_base(sx)")
        # scale and shift (the planner admits none varying along the kept axis) in shared memory where they
        # vary along the row: the row step reads column j of every row at once (one broadcast word), and they
        # take no registers; one that varies along neither (every axis it names has size 1) is one value
        var = self.params_for_row()
        params, consts = {}, {}
        for w in ("scale", "shift"):
            if var[w] is False:
                consts[w] = g.new("sv" if w == "scale" else "hv")
                ptr, tag = ("sp" if w == "scale" else "hp"), TAG[getattr(p, f"{w}_dtype")]
                g(f"{consts[w]} = ld1_{tag}({ptr}, 0)  # the parameter's only element")
            elif var[w]:
                name = "sS" if w == "scale" else "sH"
                self.smem(g, name, L)
                params[w] = f"{name}b"
                g(f"{name}b = smem_base({name})")
                ptr, tag = ("sp" if w == "scale" else "hp"), TAG[getattr(p, f"{w}_dtype")]
                with g.block(f"for j in range(tid, {L}, {T}):"):
                    g(f"sts_f32({name}b, j, ld1_{tag}({ptr}, j * {self.red[0].stride(w)}))")
        g(f"f0 = bid * {R * L}")
        g(f"lim = min(I64({R * L}), I64({p.kept * L}) - f0)  # elements of this chunk")
        g(f"rem = I32(lim % {V})  # a ragged last vector (the tensor is not whole vectors): loaded one by one")
        g("t32 = I32(tid)")
        pbs, oks = [], []
        for e in range(E):
            li, ok = g.new("li"), g.new("ok")
            g(f"{li} = {vector_at(e)}")
            g(f"{ok} = {li} + {V} <= lim")
            names = [g.new("x") for _ in range(V)]
            self.load_x(g, names, x_at(li), ok)
            pb = g.new("pb")
            g(f"{pb} = {at(li)}  # V-aligned: the V words share one padding")
            for j, nm in enumerate(names):
                g(f"sts_f32(sb, {pb} + I32({j}), {nm})")
            pbs.append(pb)
            oks.append(ok)
        g("cuda.syncthreads()")
        with g.block("if rem != 0:  # CTA-uniform"):
            with g.block("if t32 < rem:"):
                g("k = I32(lim) - rem + t32")
                g(f"sts_f32(sb, {at('k')}, ld1_{self.xt}(xp, f0 + k))")
            g("cuda.syncthreads()")
        with g.block(f"for rr in range({-(-R // T)}):"):
            g(f"r = t32 + I32(rr * {T})")
            g(f"row = bid * {R} + r")
            g(f"rb = r * I32({L})")
            with g.block(f"if r < {R} and row < {p.kept}:"):
                cs = _coords(g, "row", self.kep, "k")
                g(f"mb = I64({_offset(cs, self.kep, 'stat')})")
                vs = [g.new("v") for _ in range(L)]
                ks = [g.new("k") for _ in range(L)]
                for j, (nm, k) in enumerate(zip(vs, ks)):
                    g(f"{k} = rb + I32({j})")
                    g(f"{k} = {at(k)}")
                    g(f"{nm} = lds_f32(sb, {k})")
                if p.stat == "norm":
                    # shifted by the row's first value (the pivot), as the persistent kernel: a mean far
                    # from the spread (1e4 + N(0, 1)) and values near FLT_MAX lose nothing to the sums
                    g(f"pv = {vs[0]}")
                    for nm in vs:
                        g(f"{nm} = {nm} - pv")
                    g(f"n = F32({float(L)!r})")
                    g("mean = (" + " + ".join(vs) + ") / n")
                    g("m2 = " + " + ".join(f"({nm} - mean) * ({nm} - mean)" for nm in vs))
                else:
                    g("q = " + " + ".join(f"{nm} * {nm}" for nm in vs))
                self.finish_stats(g, "True", shifted=True)
                for j, (nm, k) in enumerate(zip(vs, ks)):
                    y = f"({nm} - mean) * rstd"
                    if "scale" in params:
                        y = f"({y}) * lds_f32({params['scale']}, I32({j}))"
                    elif "scale" in consts:
                        y = f"({y}) * {consts['scale']}"
                    if "shift" in params:
                        y = f"{y} + lds_f32({params['shift']}, I32({j}))"
                    elif "shift" in consts:
                        y = f"{y} + {consts['shift']}"
                    g(f"sts_f32(sb, {k}, {y})")
        g("cuda.syncthreads()")
        for e, (pb, ok) in enumerate(zip(pbs, oks)):
            ys = [g.new("y") for _ in range(V)]
            for j, nm in enumerate(ys):
                g(f"{nm} = lds_f32(sb, {pb} + I32({j}))")
            self.store_out(g, ys, x_at(f"I64({vector_at(e)})"), ok)  # recomputed: nothing held over step 2
        with g.block("if rem != 0 and t32 < rem:"):
            g("k = I32(lim) - rem + t32")
            g(f"st1_{self.ot}(op, f0 + k, lds_f32(sb, {at('k')}))")
        return KernelSource("normc_inner_staged", g.text(), p.grid, T, self.shared, self.ptypes(),
                            min_ctas=STAGED_SM_THREADS // T, max_spill=PERSISTENT_MAX_SPILL)

    def cluster_sum(self, g, name, rnd):
        """Sum a CTA-uniform value over the CTAs of the cluster (in rank order: every CTA gets the same
        result). Thread 0 publishes it in shared memory; after the cluster barrier every thread adds the C
        copies through distributed shared memory. ``rnd`` names this round's array (peers may still read the
        previous round's)."""
        C = self.p.cluster
        self.smem(g, f"sX{rnd}", 1)
        with g.block("if tid == 0:"):
            g(f"sX{rnd}[0] = {name}")
        g("cluster_arrive()")
        g("cluster_wait()")
        g(f"{name} = dsmem_ld(sX{rnd}, 0, 0)")
        with g.block(f"for k in range(1, {C}):"):
            g(f"{name} = {name} + dsmem_ld(sX{rnd}, 0, k)")

    def grid_merge(self, g, names, rnd=1):
        """Merge CTA-uniform statistics over the ``plan.splits`` CTAs of a co-resident grid holding row ``row``:
        ``names`` is ``(count, mean, M2)`` (norm: merged with Chan's formula) or ``(q,)`` (rms: summed). Thread 0
        writes the CTA's values to its workspace slots (3 per CTA), arrives on the row's counter (release) and
        waits (acquire) until all ``splits`` CTAs have arrived; then warp 0 merges the row's values in a fixed
        order (lane l takes CTAs l, l + 32, ... in turn, then a xor butterfly) and lane 0's result goes to every
        thread through shared memory, so every CTA gets the same statistics bit for bit. The counters follow the
        3 x splits slots of each row (zeroed by ``counter_zero``). ``rnd`` 2: a second exchange of one sum
        (``GRID_ONE_EXCHANGE`` 0), in the slot after round 1's, waiting for the counter's 2 x splits."""
        p, S = self.p, self.p.splits
        f0 = rnd - 1  # the first slot field this round writes
        cnt = f"{3 * S * p.kept} + row"
        with g.block("if tid == 0:"):
            for k, nm in enumerate(names):
                g(f"st1_f32(wp, (row * {S} + crank) * 3 + {k + f0}, {nm})")
            g(f"arrive_u32(wp, {cnt})  # release: the values are visible before the count")
            with g.block(f"while acquire_u32(wp, {cnt}) < {rnd * S}:"):
                g("pass")
        g("cuda.syncthreads()")
        # warp 0 merges and shares the result through shared memory: one warp per CTA reads the row's slots
        # (every warp reading them multiplied the L2 requests to these few lines by the CTA's warps)
        self.smem(g, f"sG{rnd}", len(names))
        with g.block("if tid < 32:"):
            acc = [g.new("a") for _ in names]
            for a in acc:
                g(f"{a} = F32(0.0)")
            for j in range(-(-S // 32)):
                k = g.new("k")
                g(f"{k} = tid + {32 * j}")
                vals = [g.new("v") for _ in names]
                for i, v in enumerate(vals):  # a slot past S: zeros (count 0 merges as nothing); selected, not
                    # multiplied by a 0/1 mask (an Inf in the clamped slot would give NaN)
                    ld = f"ldcg_f32(wp, (row * {S} + min({k}, {S - 1})) * 3 + {i + f0})"
                    g(f"{v} = {ld}" if 32 * (j + 1) <= S else f"{v} = sel({k} < {S}, {ld}, F32(0.0))")
                if len(names) == 3:
                    _chan(g, *acc, *vals)
                else:
                    g(f"{acc[0]} = {acc[0]} + {vals[0]}")
            off = 16
            while off >= 1:
                o = [g.new("o") for _ in names]
                for a, oo in zip(acc, o):
                    g(f"{oo} = shfl_xor({a}, {off})")
                if len(names) == 3:
                    _chan(g, *acc, *o)
                else:
                    g(f"{acc[0]} = {acc[0]} + {o[0]}")
                off //= 2
            with g.block("if tid == 0:"):  # xor merges are not symmetric in rounding: lane 0's result
                for i, a in enumerate(acc):
                    g(f"sG{rnd}[{i}] = {a}")
        g("cuda.syncthreads()")
        for i, nm in enumerate(names):
            g(f"{nm} = sG{rnd}[{i}]")

    def counter_zero(self, n):
        """The tiny kernel before a cooperative one: zero the ``plan.kept`` arrival counters at float32 offset
        ``n`` of the workspace (COUNTER_ZERO_GRID CTAs)."""
        p = self.p
        g = _Src()
        self.prologue(g, "normc_inner_zero")
        with g.block(f"for i in range(bid * {p.threads} + tid, {p.kept}, {COUNTER_ZERO_GRID * p.threads}):"):
            g(f"st1_f32(wp, {n} + i, F32(0.0))  # +0.0 has the bits of the u32 0")
        return KernelSource("normc_inner_zero", g.text(), COUNTER_ZERO_GRID, p.threads, 0, self.ptypes())

    def load_trip(self, g, hi, TPR, U, hint=""):
        """One trip of a streaming loop over a row (inside ``for base in range(..., TPR * U)``): U vectors
        ``base + u * TPR`` loaded before any is used (masked past ``hi``). Returns [(names, offsets, ok)]."""
        items = self.stream_loads(g, U, TPR, lambda c: f"{c} < {hi}", f"{hi} - 1", self.chunk_offsets,
                                  lambda o: f"xb + {o['x']}", ("c", "cc"), hint)
        return [(names, o, ok) for names, o, ok, _ in items]

    def _stats_loop(self, g, lo, hi, TPR):
        """Per-thread statistics over vectors [lo, hi) of the row, LOOP vectors per trip; V accumulators
        (sums shifted by the thread's first values, SHIFTED_SUMS, else Welford), ending as (cnt, mean of
        x - pv, M2) per lane."""
        V, U = self.V, self.p.per_thread

        def piv(j):
            return ("pv", "scl" if self.scaled else None)

        self.acc_init(g)
        if SHIFTED_SUMS:
            g(f"base = {lo} + lane")
            ((names, _, _),) = self.load_trip(g, hi, TPR, 1)
            self.acc_start(g, names, piv)
        with g.block(f"for base in range({lo} + lane, {hi}, {TPR * U}):"):
            for names, _, ok in self.load_trip(g, hi, TPR, U, self.h_first):
                with g.block(f"if {ok}:"):
                    self.acc_shift(g, names, piv)
                    self.acc_update(g, names)
        self.acc_finish(g, piv)
        # merge the V lane accumulators (each has count cnt); mean is of x - pv
        g("n = cnt")
        g("mean = wm0")
        g("m2 = wq0")
        for j in range(1, V):
            g(f"tn{j} = cnt")
            _chan(g, "n", "mean", "m2", f"tn{j}", f"wm{j}", f"wq{j}")

    def _sumsq_loop(self, g, lo, hi, TPR):
        U = self.p.per_thread
        g("q = F32(0.0)")
        with g.block(f"for base in range({lo} + lane, {hi}, {TPR * U}):"):
            for names, _, _ in self.load_trip(g, hi, TPR, U, self.h_first):  # masked lanes load 0
                for nm in names:
                    g(f"q = q + ({nm} * scl) * ({nm} * scl)" if self.scaled else f"q = q + {nm} * {nm}")

    def _normalize_loop(self, g, lo, hi, TPR, reverse=False):
        """Normalize vectors [lo, hi) of the row (backwards when ``reverse``); returns emit_row_affine's var."""
        var = self.emit_row_affine(g)
        U = LOOP_UNROLL  # vectors loaded before any is stored: independent loads in flight
        stream_loop(g, f"{lo} + lane", hi, TPR * U, backwards=reverse)
        for names, o, ok in self.load_trip(g, hi, TPR, U, self.h_last):
            self.emit_normalize_vec(g, names, o, var, ok, raw=True, hint=self.h_y)
        g.ind -= 1
        return var

    def looped(self):
        p = self.p
        g = _Src()
        self.prologue(g, "normc_inner")
        g("lane = tid")
        g("rloc = 0")
        self.row_setup(g, "bid", False)
        if p.stat == "norm":
            self._stats_loop(g, "0", self.nvec, self.TPR)
            self.emit_edge_stats(g, "lane == 0")
            self.reduce_triple(g, "n", "mean", "m2", "a")
            if self.scaled:
                g("mean = mean + pvs  # the loop accumulated x * scl - pv * scl: mean is scaled")
            else:
                g("mean = mean + pv  # the loop accumulated x - pv")
        else:
            self._sumsq_loop(g, "0", self.nvec, self.TPR)
            self.emit_edge_stats(g, "lane == 0", rms=True)
            self.reduce_sum(g, "q", "a")
        self.finish_stats(g, "lane == 0")
        var = self._normalize_loop(g, "0", self.nvec, self.TPR, reverse=bool(LOOPED_REVERSE))
        self.emit_edge_normalize(g, var, "lane == 0")
        return KernelSource("normc_inner", g.text(), p.grid, p.threads, self.shared, self.ptypes())

    def _partial(self, g, S, L):
        """Split schedules, first half: this CTA's slice [lo, hi) of row ``bid // S`` (vectors) -> partial
        statistics (n, mean of x - pv, M2; rms: 0, 0, sum of squares) written by lane 0 to the workspace at
        ``(row * S + sp_) * 3``."""
        p = self.p
        g(f"sp_ = bid % {S}")
        self.row_setup(g, f"bid // {S}", False)
        g(f"lo = sp_ * {L}")
        g(f"hi = min(lo + {L}, {self.nvec})")
        if p.stat == "norm":
            self._stats_loop(g, "lo", "hi", self.TPR)
            self.emit_edge_stats(g, "lane == 0 and sp_ == 0")
            self.reduce_triple(g, "n", "mean", "m2", "a")
        else:
            self._sumsq_loop(g, "lo", "hi", self.TPR)
            self.emit_edge_stats(g, "lane == 0 and sp_ == 0", rms=True)
            self.reduce_sum(g, "q", "a")
            g("n = F32(0.0)")
            g("mean = F32(0.0)")
            g("m2 = q")
        with g.block("if lane == 0:"):
            g(f"wi = (row * {S} + sp_) * 3")
            g("st1_f32(wp, wi, n)")
            g("st1_f32(wp, wi + 1, mean)")
            g("st1_f32(wp, wi + 2, m2)")

    def _merge_and_normalize(self, g, S, L, ld="ld1_f32", reverse=False):
        """Split schedules, second half: merge row ``row``'s S partials (Chan, in split order, so every CTA
        of the row gets the same bits), write mean/rstd from split 0, normalize slice [lo, hi), backwards when
        ``reverse``. ``ld`` loads a workspace float (the coop kernel reads partials other CTAs wrote during
        the launch: L2 only)."""
        p = self.p
        g("n = F32(0.0)")
        g("mean = F32(0.0)")
        g("m2 = F32(0.0)")
        with g.block(f"for k in range(lane, {S}, {self.TPR}):"):
            g(f"wi = (row * {S} + k) * 3")
            g(f"pn = {ld}(wp, wi)")
            g(f"pm = {ld}(wp, wi + 1)")
            g(f"pq = {ld}(wp, wi + 2)")
            if p.stat == "norm":
                _chan(g, "n", "mean", "m2", "pn", "pm", "pq")
            else:
                g("m2 = m2 + pq")
        if p.stat == "norm":
            self.reduce_triple(g, "n", "mean", "m2", "b")
            if self.scaled:
                g("mean = mean + pvs  # the partials are of x * scl - pv * scl: mean is scaled")
            else:
                g("mean = mean + pv  # the partials are of x - pv")
        else:
            g("q = m2")
            self.reduce_sum(g, "q", "b")
        self.finish_stats(g, "lane == 0 and sp_ == 0")
        g(f"lo = sp_ * {L}")
        g(f"hi = min(lo + {L}, {self.nvec})")
        var = self._normalize_loop(g, "lo", "hi", self.TPR, reverse=reverse)
        self.emit_edge_normalize(g, var, "lane == 0 and sp_ == 0")

    def split(self):
        """Two kernels: partial statistics of every (row, split) slice into the workspace; then each CTA
        merges its row's partials and normalizes its slice (re-reading x). When scale/shift run along the
        row and are the same for every row (layer/RMS norm), the second kernel instead normalizes one column
        slice of every row (:meth:`_finish_columns`), so they are read once, not once per row."""
        p, S = self.p, self.p.splits
        L = -(-self.NC // S)
        g = _Src()
        self.prologue(g, "normc_inner_partial")
        g("lane = tid")
        g("rloc = 0")
        self._partial(g, S, L)
        k1 = KernelSource("normc_inner_partial", g.text(), p.grid, p.threads, self.shared, self.ptypes())
        self.shared = 0
        # peeled rows do not share their vectors' alignment: row-wise
        if columns_finish(p, self.NC, p.grid, p.threads) and not self.peel:
            return [k1, self._finish_columns(S)]
        if p.finish_splits > 1:
            return [k1, self._row_stats(S), self._flat_finish(S, p.finish_splits)]
        g = _Src()
        self.prologue(g, "normc_inner_finish", reverse_grid=p.grid)
        g("lane = tid")
        g("rloc = 0")
        g(f"sp_ = bid % {S}")
        self.row_setup(g, f"bid // {S}", False)
        self._merge_and_normalize(g, S, L, reverse=True)  # the split's re-read: where kernel 1 ended (stream_loop)
        k2 = KernelSource("normc_inner_finish", g.text(), p.grid, p.threads, self.shared, self.ptypes())
        return [k1, k2]

    def _merge_row_partials(self, g, S, write_cond):
        """One thread merges row ``row``'s S partials in split order (Chan; rms: the sum of squares, ``q``),
        then :meth:`finish_stats` (mean and rstd written where ``write_cond``): the same bits as
        :meth:`_merge_and_normalize` gives every CTA of the row only when S == 1 (that one merges in a tree)."""
        g("n = F32(0.0)")
        g("mean = F32(0.0)")
        g("m2 = F32(0.0)")
        with g.block(f"for k in range({S}):"):
            g(f"wi = (row * {S} + k) * 3")
            if self.p.stat == "norm":
                _chan(g, "n", "mean", "m2", "ld1_f32(wp, wi)", "ld1_f32(wp, wi + 1)", "ld1_f32(wp, wi + 2)")
            else:
                g("m2 = m2 + ld1_f32(wp, wi + 2)")
        if self.p.stat == "norm":
            g("mean = mean + pvs" if self.scaled else "mean = mean + pv")
        else:
            g("q = m2")
        self.finish_stats(g, write_cond)

    def _row_factor(self):
        """The name of the per-row factor emit_row_affine starts from: ``ra`` (scaled norm), else ``rstd``."""
        return "ra" if self.scaled and self.p.stat == "norm" else "rstd"

    def _row_stats(self, S):
        """Split with a flat normalize kernel, middle kernel: thread ``row`` merges the row's S partials in
        split order (Chan; rms: the sum of squares), writes mean and rstd (stats), and puts the normalize
        kernel's mean and factor (:meth:`_row_factor`) in the workspace after the partials."""
        K = self.p.kept
        T = STATS_THREADS
        g = _Src()
        self.prologue(g, "normc_inner_stats")
        with g.block(f"if bid * {T} + tid < {K}:"):
            self.row_setup(g, f"bid * {T} + tid", False)
            self._merge_row_partials(g, S, "True")
            g(f"st1_f32(wp, {3 * K * S} + row * 2, mean)")
            g(f"st1_f32(wp, {3 * K * S} + row * 2 + 1, {self._row_factor()})")
        return KernelSource("normc_inner_stats", g.text(), -(-K // T), T, 0, self.ptypes())

    def _flat_finish(self, S, F):
        """Split with a flat normalize kernel, last kernel: each split's slice over F CTAs; CTA bid normalizes
        slice bid % (S * F) of row bid // (S * F) with the row's mean and factor from the middle kernel (the
        peeled row's edges by its first CTA), walking the grid last-first (where the partial kernel ended)."""
        p = self.p
        SF = S * F
        g = _Src()
        self.prologue(g, "normc_inner_finish", reverse_grid=p.grid * F)
        g("lane = tid")
        g("rloc = 0")
        g(f"sp_ = bid % {SF}")
        self.row_setup(g, f"bid // {SF}", False)
        g(f"mean = ld1_f32(wp, {3 * p.kept * S} + row * 2)")
        g(f"{self._row_factor()} = ld1_f32(wp, {3 * p.kept * S} + row * 2 + 1)")
        L = -(-self.NC // SF)
        g(f"lo = sp_ * {L}")
        g(f"hi = min(lo + {L}, {self.nvec})")
        var = self._normalize_loop(g, "lo", "hi", self.TPR, reverse=True)
        self.emit_edge_normalize(g, var, "lane == 0 and sp_ == 0")
        return KernelSource("normc_inner_finish", g.text(), p.grid * F, p.threads, 0, self.ptypes())

    def _finish_columns(self, S):
        """Second split kernel, column-major: every CTA first merges the partials of all K rows (a thread per
        row, splits in order: the same bits in every CTA and as :meth:`_merge_and_normalize`), keeping each
        row's mean and factor in shared memory, then normalizes vectors [lo, hi) of *every* row: each scale /
        shift vector is loaded once and applied to the K rows, LOOP_UNROLL rows' loads in flight. Row-wise,
        a 10 x 10M float32 layer norm re-read its 80 MB of scale and shift for every row. Measured on the H200
        (tests/gpu_sweep.py, this kernel's time, row-wise -> column-major): 10 x 10M 317 -> 299 us, 100 x 1M
        270 -> 231 us, 4 x 10,000,001 (scalar accesses: odd rows) 202 -> 204 us."""
        p, K, V = self.p, self.p.kept, self.V
        Lc = -(-self.NC // p.grid)
        norm_scaled = self.scaled and p.stat == "norm"
        g = _Src()
        self.prologue(g, "normc_inner_finish")
        self.smem(g, "sMe", K)
        self.smem(g, "sA", K)
        if norm_scaled:
            self.smem(g, "sSc", K)
        with g.block(f"for r in range({'tid'}, {K}, {p.threads}):"):
            self.row_setup(g, "r", False)
            self._merge_row_partials(g, S, "bid == 0")
            self.emit_row_affine(g)
            g("sMe[r] = mean")
            g("sA[r] = a")
            if norm_scaled:
                g("sSc[r] = scl")
        g("cuda.syncthreads()")
        var = self.params_for_row()
        U = LOOP_UNROLL
        g(f"lo = bid * {Lc}")
        g(f"hi = min(lo + {Lc}, {self.NC})")
        with g.block(f"for c in range(lo + tid, hi, {p.threads}):"):
            o = self.chunk_offsets(g, "c")
            inner = self.inner
            sc = (self.load_param(g, "scale", o["scale"], inner.scale, p.scale_vec, V) if var["scale"] else None)
            sh = (self.load_param(g, "shift", o["shift"], inner.shift, p.shift_vec, V) if var["shift"] else None)
            with g.block(f"for r0 in range(0, {K}, {U}):"):
                rows = []
                for u in range(U):
                    r, ok = g.new("r"), g.new("ok")
                    g(f"{ok} = r0 + {u} < {K}")
                    g(f"{r} = min(r0 + {u}, {K - 1})")
                    cs = _coords(g, r, self.kep, "k")
                    names = [g.new("x") for _ in range(V)]
                    self.load_x(g, names, f"{_offset(cs, self.kep, 'x')} + {o['x']}", ok, self.h_last)
                    rows.append((r, ok, names, _offset(cs, self.kep, "out")))
                for r, ok, names, obr in rows:
                    g(f"mean = sMe[{r}]")
                    g(f"a = sA[{r}]")
                    g("b = F32(0.0)")
                    if norm_scaled:
                        g(f"scl = sSc[{r}]")
                    self.emit_normalize_vec(g, names, o, var, ok, raw=True, params=(sc, sh), ob=f"({obr})",
                                            hint=self.h_y)
        return KernelSource("normc_inner_finish", g.text(), p.grid, p.threads, self.shared, self.ptypes())

    def coop(self):
        """The split's two halves in one cooperative kernel over a co-resident grid (``plan.grid`` CTAs at
        most, fewer if fewer fit; the runtime sizes it), software-pipelined by one item.

        CTAs walk the (row, split) items in order, ``grid`` apart: at step ``s`` a CTA computes the partial
        statistics of its item ``s`` (arriving on that row's counter, release), then waits (acquire) until
        all S partials of its item ``s - 1``'s row are in, merges them and normalizes that item's slice,
        re-reading it from L2, where it has been since the step before (HBM sees x about once). Waiting one
        item behind means a CTA's wait overlaps its own next read instead of idling until its row's slowest
        CTA arrives. The waits end: a wait on item ``w``'s row needs partials of items below ``w + S <= w +
        grid``, and writing item ``j``'s partial needs only waits on items up to ``j - 2 grid``, so every wait
        depends on strictly earlier waits, and every CTA is resident. A first, tiny kernel zeroes the counters
        (one per row, after the partials in the workspace)."""
        p, S = self.p, self.p.splits
        L = -(-self.NC // S)
        items = p.kept * S
        cnt = 3 * items  # the counters' offset in the workspace (u32 words)
        k0 = self.counter_zero(cnt)
        self.shared = 0
        g = _Src()
        self.prologue(g, "normc_inner_coop")
        g("lane = tid")
        g("rloc = 0")
        g(f"first = {special_index('blockIdx')}")
        g("stride = I64(cuda.gridDim.x)")
        g(f"mine = ({items} - first + stride - 1) // stride  # this CTA's items")
        with g.block("for step in range(mine + 1):"):
            with g.block("if step < mine:"):
                g("bid = first + step * stride")
                self._partial(g, S, L)
                with g.block("if tid == 0:"):
                    g(f"arrive_u32(wp, {cnt} + row)  # release: lane 0's partial is visible before the count")
            with g.block("if step > 0:"):
                g("bid = first + (step - 1) * stride  # the item before: its slice is in L2")
                g(f"sp_ = bid % {S}")
                self.row_setup(g, f"bid // {S}", False)
                with g.block("if tid == 0:"):
                    with g.block(f"while acquire_u32(wp, {cnt} + row) < {S}:"):
                        g("pass")
                g("cuda.syncthreads()")
                self._merge_and_normalize(g, S, L, ld="ldcg_f32", reverse=True)
            g("cuda.syncthreads()  # the next step reuses this step's shared arrays")
        k1 = KernelSource("normc_inner_coop", g.text(), p.grid, p.threads, self.shared, self.ptypes(), coop=True)
        return [k0, k1]


# ----------------------------------------------------------------------------------------------------------
# outer / mixed: lanes along the contiguous column block, rows over y-threads


class _Outer(_Kernel):
    def __init__(self, plan):
        super().__init__(plan)
        p = plan
        nb = 2 if p.strategy == "mixed" else 1
        self.block = list(p.axes[-nb:])
        self.rowax = [a for a in p.axes[:-nb] if a.reduced]
        self.kout = [a for a in p.axes[:-nb] if not a.reduced]
        self.CB = math.prod(a.size for a in self.block)
        self.RR = math.prod(a.size for a in self.rowax)
        self.KO = math.prod(a.size for a in self.kout)
        self.NT = -(-self.CB // p.tile)
        self.G = p.group
        self.NG = p.tile // p.group if p.strategy == "mixed" else p.tile

    def col_offsets(self, g, col):
        """Offsets of column ``col`` (within the block) for each tensor, and the kept-group index."""
        blk = self.block
        if len(blk) == 1:
            cs = [col]
        else:
            k = g.new("ck")
            gg = g.new("cg")
            g(f"{k} = {col} % {blk[1].size}")
            g(f"{gg} = {col} // {blk[1].size}")
            cs = [gg, k]
        return {t: _offset(cs, blk, t) for t in ("x", "out", "scale", "shift", "stat")}

    def row_offsets(self, g, r):
        cs = _coords(g, r, self.rowax, "r")
        return {t: _offset(cs, self.rowax, t) for t in ("x", "out", "scale", "shift")}

    def rows_vary_params(self):
        return any(a.scale or a.shift for a in self.rowax)

    def columns(self, T):
        """Header of a block run by thread ``lc`` for column lc of the tile's ``T`` columns
        (:func:`column_block` under :data:`COLUMN_IF`; ``lc = tid`` is set by :meth:`setup`)."""
        return column_block(T, self.p.threads, COLUMN_IF)

    def setup(self, g, name, splits=None, reverse_grid=0):
        p = self.p
        self.prologue(g, name, reverse_grid)
        if COLUMN_IF:
            g("lc = tid  # the column of the blocks under columns()")
        g(f"cx = tid % {p.nxc}")
        g(f"ry = tid // {p.nxc}")
        # Conditions known at generation time are emitted as the literal True (no branch in the kernel:
        # fewer basic blocks also make Numba's compile much faster).
        if p.threads == p.nxc * p.ry:
            g("act = True")
        else:
            g(f"act = ry < {p.ry}")
        S = p.splits if splits is None else splits
        self.static_cok = p.threads == p.nxc * p.ry and self.CB % p.tile == 0
        RS_ = -(-self.RR // S)
        self.min_rows = self.RR - (S - 1) * RS_  # rows of the last (smallest) slice
        g(f"sp_ = bid % {S}")
        g(f"t2 = bid // {S}")
        g(f"tile = t2 % {self.NT}")
        g(f"ko = t2 // {self.NT}")
        cs = _coords(g, "ko", self.kout, "k")
        for t, nm in (("x", "xb"), ("out", "ob"), ("scale", "sb"), ("shift", "hb"), ("stat", "mb")):
            g(f"{nm} = I64({_offset(cs, self.kout, t)})")
        g(f"col = tile * {p.tile} + cx * {self.V}")
        g("cok = True" if self.static_cok else f"cok = act & (col < {self.CB})")
        g(f"colc = min(col, {self.CB - self.V})")
        self.co = self.col_offsets(g, "colc")
        if p.stat == "norm" or self.scaled:  # scaled rms: the pivots pick the scales
            self.emit_pivots(g)
        RS = -(-self.RR // S)
        g(f"r0 = sp_ * {RS}")
        g(f"r1 = min(r0 + {RS}, {self.RR})")

    def emit_rows_accumulate(self, g):
        """Streaming schedules: per-thread per-column Welford statistics over this CTA's rows (of x - pivot),
        leaving cnt and wm{j}, wq{j}. Persistent: only the loads into registers (``self.px``: per row, the
        load condition, the V value names and the row offsets)."""
        p, V = self.p, self.V
        if p.schedule == "persistent":
            E = p.per_thread
            self.px = []
            for e in range(E):
                r = g.new("rw")
                g(f"{r} = r0 + ry + {e * p.ry}")
                if self.static_cok and (e + 1) * p.ry <= self.min_rows:
                    ok = "True"  # the row and column are always in range: no branch
                    rc = r
                else:
                    ok = g.new("ok")
                    g(f"{ok} = cok & ({r} < r1)")  # `&`, not `and`: no short-circuit branch
                    rc = g.new("rcl")
                    g(f"{rc} = min({r}, {self.RR - 1})")
                ro = self.row_offsets(g, rc)
                names = [g.new("x") for _ in range(V)]
                self.load_x(g, names, f"xb + {self.co['x']} + {ro['x']}", ok, self.h_last)
                self.px.append((ok, names, ro))
            return  # persistent(): the statistics are taken from the registers in self.px
        U = p.per_thread
        rms = p.stat == "rms"

        def piv(j):
            return (f"pv{j}", f"scl{j}" if self.scaled else None)

        self.acc_init(g)
        if SHIFTED_SUMS and not rms:
            g("base = r0 + ry")
            ((names, _, _, _),) = self.load_rows_trip(g, 1)
            self.acc_start(g, names, piv)
        with g.block(f"for base in range(r0 + ry, r1, {p.ry * U}):"):
            for names, _, _, row_ok in self.load_rows_trip(g, U, self.h_first):
                with g.block(f"if {row_ok}:"):
                    self.acc_shift(g, names, piv, rms=rms)
                    self.acc_update(g, names, rms=rms)
        self.acc_finish(g, piv, rms=rms)

    def emit_pivots(self, g):
        """Per-column pivots pv0..pv{V-1}: the value of the column in the reduction's first row (mixed: of
        the first column of the column's group, so a group shares one). Statistics accumulate x - pivot, so
        columns whose mean is large against their spread keep their digits. Scaled dtypes: also each
        column's scale scl{j} and pvs{j} = pv{j} * scl{j} (a group shares them, as it shares its pivot)."""
        self.emit_pivot_loads(g)
        if not self.scaled:
            return
        V = self.V
        shared = self.p.strategy == "mixed" and self.G % V == 0
        for j in range(1 if shared else V):
            self.emit_scale(g, f"pv{j}", f"scl{j}")
            if self.p.stat == "norm":
                g(f"pvs{j} = pv{j} * scl{j}")
        for j in range(1, V if shared else 1):
            g(f"scl{j} = scl0")
            if self.p.stat == "norm":
                g(f"pvs{j} = pvs0")

    def emit_pivot_loads(self, g):
        V = self.V
        if self.p.strategy == "mixed" and self.G % V == 0:
            # a vector never straddles groups: its V columns share the group's pivot
            g(f"gs0 = (colc // {self.G}) * {self.G}")
            co = self.col_offsets(g, "gs0")
            g(f"pv0 = ld1_{self.xt}(xp, xb + {co['x']})")
            for j in range(1, V):
                g(f"pv{j} = pv0")
        elif self.p.strategy == "mixed" and MIXED_TWO_PIVOTS and V <= self.G:
            # V <= G columns span at most two groups: the pivots of the first and the last column's groups
            G = self.G
            g(f"glo = colc // {G}")
            g(f"ghi = (colc + {V - 1}) // {G}")
            for name, gi in (("pvlo", "glo"), ("pvhi", "ghi")):
                cs = [gi, "0"] if len(self.block) == 2 else [f"{gi} * {G}"]  # (group, k) or the column
                off = _offset(cs, self.block, "x")
                g(f"{name} = ld1_{self.xt}(xp, xb + {off})")
            g(f"kf = colc - glo * {G}")  # the first column's place in its group
            for j in range(V):
                g(f"pv{j} = pvlo if kf + {j} < {G} else pvhi")
        elif self.p.strategy == "mixed":
            for j in range(V):
                gs = g.new("gs")
                g(f"{gs} = ((colc + {j}) // {self.G}) * {self.G}")
                co = self.col_offsets(g, gs)
                g(f"pv{j} = ld1_{self.xt}(xp, xb + {co['x']})")
        elif V == 1:
            g(f"pv0 = ld1_{self.xt}(xp, xb + {self.co['x']})")
        else:
            g(f"{', '.join(f'pv{j}' for j in range(V))} = ld{V}_{self.xt}(xp, xb + {self.co['x']})")

    def emit_pivot_table(self, g):
        """sPv[column] = that column's pivot (written by the y-thread 0 of each x-thread; read after a barrier)."""
        p, V, T = self.p, self.V, self.p.tile
        if p.stat != "norm" and not self.scaled:
            return
        self.smem(g, "sPv", T)
        with g.block("if act and ry == 0:"):
            for j in range(V):
                with g.block(f"if cx * {V} + {j} < {T}:"):
                    g(f"sPv[cx * {V} + {j}] = pv{j}")

    def load_rows_trip(self, g, U, hint=""):
        """One trip of a streaming loop over rows (inside ``for base in range(r0 + ry, r1, RY * U)``): U rows
        ``base + u * RY`` of this thread's V columns, loaded before any is used. Returns
        [(names, row offsets, load condition (row and column valid), row condition (row valid))]."""
        items = self.stream_loads(g, U, self.p.ry, lambda r: f"cok & ({r} < r1)", self.RR - 1, self.row_offsets,
                                  lambda ro: f"xb + {self.co['x']} + {ro['x']}", ("rw", "rcl"), hint)
        return [(names, ro, ok, f"act and {r} < r1") for names, ro, ok, r in items]

    def emit_cta_combine(self, g):
        """Merge the y-threads' partials per column; thread lc < tile ends with column stats (n, mean, m2)."""
        p, V = self.p, self.V
        T = p.tile
        self.emit_pivot_table(g)
        self.smem(g, "sN", p.ry)
        self.smem(g, "sM", p.ry * T)
        self.smem(g, "sQ", p.ry * T)
        with g.block("if act:"):
            with g.block("if cx == 0:"):
                g("sN[ry] = cnt")
            for j in range(V):
                g(f"sM[ry * {T} + cx * {V} + {j}] = wm{j}")
                g(f"sQ[ry * {T} + cx * {V} + {j}] = wq{j}")
        g("cuda.syncthreads()")

    def merge_column(self, g, lc):
        p = self.p
        T = p.tile
        g("n = sN[0]")
        g(f"mean = sM[{lc}]")
        g(f"m2 = sQ[{lc}]")
        with g.block(f"for k in range(1, {p.ry}):"):
            if p.stat == "norm":
                _chan(g, "n", "mean", "m2", "sN[k]", f"sM[k * {T} + {lc}]", f"sQ[k * {T} + {lc}]")
            else:
                g("n = n + sN[k]")
                g(f"m2 = m2 + sQ[k * {T} + {lc}]")

    def emit_stats_and_affine(self, g):
        """From column stats (thread lc holds n, mean, m2 for column lc) to per-column a, b in smem."""
        p = self.p
        T = p.tile
        self.smem(g, "sA", T)
        self.smem(g, "sB", T)
        self.smem(g, "sC", T)
        fold = not self.rows_vary_params()
        if p.strategy == "mixed":
            self.smem(g, "sCn", T)
            self.smem(g, "sCm", T)
            self.smem(g, "sCq", T)
            g("sCn[lc] = n")
            g("sCm[lc] = mean")
            g("sCq[lc] = m2")
            g.ind -= 1  # leave the per-column loop
            g("cuda.syncthreads()")
            self.smem(g, "sGa", self.NG)
            self.smem(g, "sGb", self.NG)
            with g.block(f"for gi in range(tid, {self.NG}, {p.threads}):"):
                g(f"n = sCn[gi * {self.G}]")
                g(f"mean = sCm[gi * {self.G}]")
                g(f"m2 = sCq[gi * {self.G}]")
                with g.block(f"for k in range(1, {self.G}):"):
                    c = f"gi * {self.G} + k"
                    if p.stat == "norm":
                        _chan(g, "n", "mean", "m2", f"sCn[{c}]", f"sCm[{c}]", f"sCq[{c}]")
                    else:
                        g("n = n + sCn[" + c + "]")
                        g(f"m2 = m2 + sCq[{c}]")
                if self.scaled:
                    wmean = self.emit_col_stats_scaled(g, f"sPv[gi * {self.G}]")
                else:
                    if p.stat == "norm":
                        g(f"mean = mean + sPv[gi * {self.G}]  # the partials are of x - the group's pivot")
                    self.emit_rstd(g)
                    wmean = "mean"
                if p.stats:
                    gst = self.block[0].stat
                    with g.block(f"if sp_ == 0 and tile * {self.NG} + gi < {self.block[0].size}:"):
                        g(f"st1_f32(mp, mb + (tile * {self.NG} + gi) * {gst}, {wmean})")
                        g(f"st1_f32(rp, mb + (tile * {self.NG} + gi) * {gst}, rstd)")
                g("sGa[gi] = ra" if self.scaled and p.stat == "norm" else "sGa[gi] = rstd")
                g("sGb[gi] = mean")
            g("cuda.syncthreads()")
            g(self.columns(T))
            g.ind += 1
            g(f"a = sGa[lc // {self.G}]")
            g(f"c = sGb[lc // {self.G}]")
            g("b = F32(0.0)")
        else:
            if self.scaled:
                wmean = self.emit_col_stats_scaled(g, "sPv[lc]")
            else:
                if p.stat == "norm":
                    g("mean = mean + sPv[lc]  # the partials are of x - the column's pivot")
                self.emit_rstd(g)
                wmean = "mean"
            if p.stats:
                with g.block(f"if sp_ == 0 and tile * {T} + lc < {self.CB}:"):
                    so = self.block[0].stat
                    g(f"st1_f32(mp, mb + (tile * {T} + lc) * {so}, {wmean})")
                    g(f"st1_f32(rp, mb + (tile * {T} + lc) * {so}, rstd)")
            g("a = ra" if self.scaled and p.stat == "norm" else "a = rstd")
            g("c = mean")
            g("b = F32(0.0)")
        if fold:
            self.emit_fold_params(g)
        g("sA[lc] = a")
        g("sB[lc] = b")
        g("sC[lc] = c")
        g.ind -= 1
        g("cuda.syncthreads()")

    def emit_fold_params(self, g):
        """Fold column lc's scale/shift (constant along the rows) into a, b."""
        p, T = self.p, self.p.tile
        g(f"gc = min(tile * {T} + lc, {self.CB - 1})")
        co = self.col_offsets(g, "gc")
        if p.scale_dtype is not None:
            g(f"sv = ld1_{TAG[p.scale_dtype]}(sp, sb + {co['scale']})")
            g("a = a * sv")
        if p.shift_dtype is not None:
            g(f"b = b + ld1_{TAG[p.shift_dtype]}(hp, hb + {co['shift']})")

    def emit_col_stats_scaled(self, g, pv):
        """Scaled dtypes: emit_rstd for a column (or group) whose merged partials (n, mean, m2) are of
        x * scl - pv * scl. ``pv`` is its pivot: the scale is recomputed from it, as the accumulating kernel
        chose it. Leaves ``mean`` (norm: the scaled mean, which y subtracts from x * scl; rms: 0), ``ra`` and
        ``rstd`` (see emit_scaled_rstd); returns the expression of the unscaled mean to write."""
        p = self.p
        self.emit_scale(g, pv, "cscl", "ciscl" if p.stats and p.stat == "norm" else None)
        if p.stat == "rms":
            self.emit_scaled_rstd(g, f"m2 / F32({float(p.reduced)!r})", "cscl")
            g("mean = F32(0.0)")
            return "mean"
        g(f"mean = mean + {pv} * cscl  # the partials are of x * scl - pivot * scl")
        self.emit_scaled_rstd(g, "m2 / max(n, F32(1.0))", "cscl")
        return "mean * ciscl"

    def emit_rstd(self, g):
        p = self.p
        if p.stat == "norm":
            self.rstd_of(g, "m2 / max(n, F32(1.0))", f"F32({p.eps!r})")
        else:
            self.rstd_of(g, f"m2 / F32({float(p.reduced)!r})", f"F32({p.eps!r})")
            g("mean = F32(0.0)")

    def emit_normalize(self, g, reverse=False):
        """y for this thread's rows: from registers (persistent) or re-read, rows walked backwards when
        ``reverse`` (:func:`stream_loop`)."""
        p, V = self.p, self.V
        fold = not self.rows_vary_params()
        for j in range(V):
            g(f"na{j} = sA[min(cx * {V} + {j}, {p.tile - 1})]")
            g(f"nb{j} = sB[min(cx * {V} + {j}, {p.tile - 1})]")
            g(f"nc{j} = sC[min(cx * {V} + {j}, {p.tile - 1})]")

        # scaled norm: the streaming kernels re-read x and scale it (exact products, one FMA); the persistent
        # kernel's registers already hold x * scl - pv * scl
        raw_scl = self.scaled and p.stat == "norm" and p.schedule != "persistent"

        def body(names, ro, ok="True", hint=""):
            ys = [g.new("y") for _ in range(V)]
            for j in range(V):
                xj = f"{names[j]} * scl{j}" if raw_scl else names[j]
                g(f"{ys[j]} = ({xj} - nc{j}) * na{j} + nb{j}")
            if not fold:
                blk = self.block
                for w in ("scale", "shift"):
                    if getattr(p, f"{w}_dtype") is None:
                        continue
                    step = blk[-1].stride(w) if len(blk) == 1 else None
                    if step is None:
                        vals = []
                        for j in range(V):
                            cj = g.new("cj")
                            g(f"{cj} = colc + {j}")
                            co = self.col_offsets(g, cj)
                            base = "sb" if w == "scale" else "hb"
                            vals += self.load_param(g, w, f"{base} + {co[w]} + {ro[w]}", 0, False, 1)
                    else:
                        base = "sb" if w == "scale" else "hb"
                        vals = self.load_param(g, w, f"{base} + {self.co[w]} + {ro[w]}", step, False, V)
                    for j in range(V):
                        g(f"{ys[j]} = {ys[j]} * {vals[j]}" if w == "scale" else f"{ys[j]} = {ys[j]} + {vals[j]}")
            self.store_out(g, ys, f"ob + {self.co['out']} + {ro['out']}", ok, hint)

        if p.schedule == "persistent":
            for ok, names, ro in self.px:
                body(names, ro, ok, self.h_y)
        else:
            # rows loaded before any is stored: independent loads in flight (the looped schedule: as many as its
            # statistics loop, plan.per_thread)
            U = p.per_thread if p.schedule == "looped" else LOOP_UNROLL
            stream_loop(g, "r0 + ry", "r1", p.ry * U, backwards=reverse)
            for names, ro, ok, _ in self.load_rows_trip(g, U, self.h_last):
                body(names, ro, ok, self.h_y)
            g.ind -= 1

    def column_total(self, g, vals, dst, rnd):
        """Sum per-thread per-column values ``vals`` (V names, one per column of this thread's vector) over the
        y-threads of the CTA and, with a cluster, over its CTAs: ``dst[lc]`` holds column lc's total for
        every lc of the tile afterwards (all threads synchronized). Plain sums (no Welford merges) keep the
        combine short: the y-threads' partials are added with independent loads, then C DSMEM loads.
        ``rnd`` names this round's shared arrays (a peer may still read the previous round's)."""
        p, V, T, C = self.p, self.V, self.p.tile, self.p.cluster
        RY = p.ry
        sr = f"sR{rnd}"
        self.smem(g, sr, RY * T)
        with g.block("if act:"):
            for j in range(V):
                g(f"{sr}[ry * {T} + cx * {V} + {j}] = {vals[j]}")
        g("cuda.syncthreads()")
        tgt = f"sP{rnd}" if C > 1 else dst
        if C > 1:
            self.smem(g, tgt, T)
        with g.block(self.columns(T)):
            g(f"tot = {sr}[lc]")
            with g.block(f"for k in range(1, {RY}):"):
                g(f"tot = tot + {sr}[k * {T} + lc]")
            g(f"{tgt}[lc] = tot")
        if C > 1:
            g("cluster_arrive()")
            g("cluster_wait()")
            with g.block(self.columns(T)):
                g(f"tot = dsmem_ld({tgt}, lc, 0)")
                with g.block(f"for k in range(1, {C}):"):
                    g(f"tot = tot + dsmem_ld({tgt}, lc, k)")
                g(f"{dst}[lc] = tot")
        g("cuda.syncthreads()")

    def group_total(self, g, src, dst):
        """Mixed strategy: ``dst[lc]`` = sum of ``src`` over the columns of lc's group (whole groups per tile)."""
        T, G = self.p.tile, self.G
        with g.block(self.columns(T)):
            g(f"g0 = (lc // {G}) * {G}")
            g(f"tot = {src}[g0]")
            with g.block(f"for k in range(1, {G}):"):
                g(f"tot = tot + {src}[g0 + k]")
            g(f"{dst}[lc] = tot")
        g("cuda.syncthreads()")

    def reduction_total(self, g, part, col, grp, rnd):
        """Persistent kernels: the per-thread partials ``{part}{j}`` summed per column into shared ``col`` (over
        the y-threads and the cluster, exchange round ``rnd``); mixed also sums a group's columns into ``grp``.
        Returns the name of the array holding each column's reduction total (``grp`` for mixed, else ``col``)."""
        T = self.p.tile
        self.smem(g, col, T)
        self.column_total(g, [f"{part}{j}" for j in range(self.V)], col, rnd)
        if self.p.strategy != "mixed":
            return col
        self.smem(g, grp, T)
        self.group_total(g, col, grp)
        return grp

    def squared_deviations(self, g, out, centre, masks):
        """``{out}{j}`` = the sum over this thread's register rows of (value - ``{centre}{j}``)^2 for each of its
        V columns, masked rows (``masks``: row condition -> its 0/1 float) adding nothing."""
        for j in range(self.V):
            terms = []
            for ok, names, _ in self.px:
                d2 = f"({names[j]} - {centre}{j}) * ({names[j]} - {centre}{j})"
                terms.append(d2 if ok == "True" else f"{d2} * {masks[ok]}")
            g(f"{out}{j} = " + " + ".join(terms))

    def persistent(self):
        """x held in registers, read once. Statistics in two exact passes over the registers: column sums
        -> mean, then sums of squared deviations -> variance (rms: sums of squares only). Each pass is a
        plain sum over the CTA's y-threads and, with ``plan.cluster`` = C > 1, over the C CTAs of the
        cluster (each CTA holds a slice of the rows, as ``setup`` assigns them) through distributed shared
        memory. The mixed strategy sums the columns of each group afterwards. Count per column: all rows."""
        p, V, T, C = self.p, self.V, self.p.tile, self.p.cluster
        cnt = float(self.RR * (self.G if p.strategy == "mixed" else 1))
        g = _Src()
        self.setup(g, "normc_outer", splits=C)
        self.emit_rows_accumulate(g)  # persistent: loads into registers (self.px)
        if p.stat == "norm":
            # registers hold x - pivot (masked lanes 0); means are of shifted values until written out
            # masked rows: values times their 0/1 mask (one F32() per row, not a select per value)
            masks = {}
            for ok, names, _ in self.px:
                if ok != "True":
                    masks[ok] = g.new("mk")
                    g(f"{masks[ok]} = F32({ok})")
                for j, nm in enumerate(names):
                    d = f"{nm} * scl{j} - pvs{j}" if self.scaled else f"{nm} - pv{j}"
                    g(f"{nm} = {d}" if ok == "True" else f"{nm} = ({d}) * {masks[ok]}")
            self.emit_pivot_table(g)
            for j in range(V):
                g(f"u{j} = " + " + ".join(names[j] for _, names, _ in self.px))
            src = self.reduction_total(g, "u", "sSum", "sGS", 1)
            self.smem(g, "sMu", T)
            with g.block(self.columns(T)):
                g(f"sMu[lc] = {src}[lc] / F32({cnt!r})")
            g("cuda.syncthreads()")
            for j in range(V):
                g(f"mu{j} = sMu[min(cx * {V} + {j}, {T - 1})]")
            self.squared_deviations(g, "q", "mu", masks)
        elif self.scaled:
            # the registers stay unscaled (y uses the unscaled rstd); only the squares see scl
            self.emit_pivot_table(g)
            for j in range(V):
                g(f"q{j} = " + " + ".join(f"({names[j]} * scl{j}) * ({names[j]} * scl{j})"
                                          for _, names, _ in self.px))
        else:
            for j in range(V):
                g(f"q{j} = " + " + ".join(f"{names[j]} * {names[j]}" for _, names, _ in self.px))
        qsrc = self.reduction_total(g, "q", "sSq", "sGQ", 2)
        if C > 1:
            g("cluster_arrive()  # done reading the peers' shared memory (the wait is at kernel end)")
        self.smem(g, "sA", T)
        self.smem(g, "sB", T)
        self.smem(g, "sC", T)
        with g.block(self.columns(T)):
            if self.scaled:
                # sMu holds the mean of x * scl - pv * scl; the registers stay shifted, so mean stays scaled
                g("mean = sMu[lc]" if p.stat == "norm" else "mean = F32(0.0)")
                self.emit_scale(g, "sPv[lc]", "cscl", "ciscl" if p.stats and p.stat == "norm" else None)
                self.emit_scaled_rstd(g, f"{qsrc}[lc] / F32({cnt!r})", "cscl")
                wmean = "(mean + sPv[lc] * cscl) * ciscl" if p.stat == "norm" else "mean"
            else:
                g("mean = sMu[lc]" if p.stat == "norm" else "mean = F32(0.0)")
                wmean = "mean + sPv[lc]" if p.stat == "norm" else "mean"  # written: the unshifted mean
                self.rstd_of(g, f"{qsrc}[lc] / F32({cnt!r})", f"F32({p.eps!r})")
            if p.stats:
                if p.strategy == "mixed":
                    gst = self.block[0].stat
                    grp = f"tile * {self.NG} + lc // {self.G}"
                    cond = f"sp_ == 0 and lc % {self.G} == 0 and {grp} < {self.block[0].size}"
                    with g.block(f"if {cond}:"):
                        g(f"st1_f32(mp, mb + ({grp}) * {gst}, {wmean})")
                        g(f"st1_f32(rp, mb + ({grp}) * {gst}, rstd)")
                else:
                    so = self.block[0].stat
                    with g.block(f"if sp_ == 0 and tile * {T} + lc < {self.CB}:"):
                        g(f"st1_f32(mp, mb + (tile * {T} + lc) * {so}, {wmean})")
                        g(f"st1_f32(rp, mb + (tile * {T} + lc) * {so}, rstd)")
            g("a = ra" if self.scaled and p.stat == "norm" else "a = rstd")
            g("b = F32(0.0)")
            g("c = mean")
            if not self.rows_vary_params():
                self.emit_fold_params(g)
            g("sA[lc] = a")
            g("sB[lc] = b")
            g("sC[lc] = c")
        g("cuda.syncthreads()")
        self.emit_normalize(g)
        if C > 1:
            g("cluster_wait()")
        bound = OUTER_PERSISTENT_SM_THREADS // p.threads
        return KernelSource("normc_outer", g.text(), p.grid, p.threads, self.shared, self.ptypes(), C,
                            min_ctas=bound if bound > 1 else 0, max_spill=PERSISTENT_MAX_SPILL if bound > 1 else 0)

    def stats_sliced(self, P, ab):
        """Split schedule, kernel 2 for the outer strategy: merge the splits' partial (n, mean, M2) of each
        column and write its a, b, c (y = (x - c) * a + b) to the workspace table at ``ab``.

        Work is spread over ``KO * NT * (T / W)`` CTAs, each owning W = vec columns of a tile (so a tile with
        1,056 splits is merged by many SMs, not one): ``threads / W`` y-threads each merge every
        (threads / W)-th split with LOOP_UNROLL loads in flight, then a tree of Chan merges in shared memory
        (log2 steps) combines the y-threads."""
        p, S, T, V = self.p, self.p.splits, self.p.tile, self.V
        W = V
        NS = T // W
        YT = p.threads // W
        U = min(LOOP_UNROLL, -(-S // YT))  # slots past the S splits are always masked off: not emitted
        self.shared = 0
        g = _Src()
        self.prologue(g, "normc_outer_stats")
        g(f"slc = bid % {NS}")
        g(f"t2 = bid // {NS}")
        g(f"tile = t2 % {self.NT}")
        g(f"ko = t2 // {self.NT}")
        cs = _coords(g, "ko", self.kout, "k")
        for t, nm in (("x", "xb"), ("scale", "sb"), ("shift", "hb"), ("stat", "mb")):
            g(f"{nm} = I64({_offset(cs, self.kout, t)})")
        g(f"wc = tid % {W}")
        g(f"yy = tid // {W}")
        g(f"lc = slc * {W} + wc")
        g("n = F32(0.0)")
        g("mean = F32(0.0)")
        g("m2 = F32(0.0)")
        with g.block(f"for k0 in range(yy, {S}, {YT * U}):"):
            loads = []
            for u in range(U):
                ok, wi = g.new("ok"), g.new("wi")
                g(f"{ok} = k0 + {u * YT} < {S}")
                g(f"{wi} = (t2 * {S} + min(k0 + {u * YT}, {S - 1})) * {T} + lc")
                trip = [g.new("pn"), g.new("pm"), g.new("pq")]
                for j, nm in enumerate(trip):
                    g(f"{nm} = ldm1_f32(wp, {wi} + {j * P}, {ok})")
                loads.append(trip)
            for pn, pm, pq in loads:
                if p.stat == "norm":
                    _chan(g, "n", "mean", "m2", pn, pm, pq)
                else:
                    g(f"n = n + {pn}")
                    g(f"m2 = m2 + {pq}")
        for nm in ("tn", "tm", "tq"):
            self.smem(g, nm, p.threads)
        step = YT // 2
        while step >= 1:
            g("tn[tid] = n")
            g("tm[tid] = mean")
            g("tq[tid] = m2")
            g("cuda.syncthreads()")
            with g.block(f"if yy < {step}:"):
                o = f"tid + {step * W}"
                if p.stat == "norm":
                    _chan(g, "n", "mean", "m2", f"tn[{o}]", f"tm[{o}]", f"tq[{o}]")
                else:
                    g(f"n = n + tn[{o}]")
                    g(f"m2 = m2 + tq[{o}]")
            g("cuda.syncthreads()")
            step //= 2
        with g.block(f"if yy == 0 and tile * {T} + lc < {self.CB}:"):
            if self.scaled:
                co = self.col_offsets(g, f"tile * {T} + lc")
                g(f"cpv = ld1_{self.xt}(xp, xb + {co['x']})")
                wmean = self.emit_col_stats_scaled(g, "cpv")
            else:
                if p.stat == "norm":
                    co = self.col_offsets(g, f"tile * {T} + lc")
                    g(f"mean = mean + ld1_{self.xt}(xp, xb + {co['x']})  # the partials are of x - the pivot")
                self.emit_rstd(g)
                wmean = "mean"
            if p.stats:
                so = self.block[0].stat
                g(f"st1_f32(mp, mb + (tile * {T} + lc) * {so}, {wmean})")
                g(f"st1_f32(rp, mb + (tile * {T} + lc) * {so}, rstd)")
            g("a = ra" if self.scaled and p.stat == "norm" else "a = rstd")
            g("b = F32(0.0)")
            g("c = mean")
            if not self.rows_vary_params():
                self.emit_fold_params(g)
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3, a)")
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 1, b)")
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 2, c)")
        return KernelSource("normc_outer_stats", g.text(), self.KO * self.NT * NS, p.threads, self.shared,
                            self.ptypes())

    def looped(self):
        """One kernel, one CTA per column tile: a Welford loop over the tile's rows (per thread, then the
        y-threads combined per column), then a second loop that re-reads the rows and normalizes them."""
        p = self.p
        g = _Src()
        self.setup(g, "normc_outer")
        self.emit_rows_accumulate(g)
        self.emit_cta_combine(g)
        g(self.columns(p.tile))
        g.ind += 1
        self.merge_column(g, "lc")
        self.emit_stats_and_affine(g)
        self.emit_normalize(g, reverse=bool(LOOPED_REVERSE))
        return KernelSource("normc_outer", g.text(), p.grid, p.threads, self.shared, self.ptypes())

    def split(self):
        p, S, T = self.p, self.p.splits, self.p.tile
        g = _Src()
        self.setup(g, "normc_outer_partial")
        self.emit_rows_accumulate(g)
        self.emit_cta_combine(g)
        # workspace: three planes (count, mean, M2) of P floats, indexed ((tile, split), column): consecutive
        # threads write consecutive columns
        P = self.KO * self.NT * T * S
        with g.block(self.columns(T)):
            self.merge_column(g, "lc")
            g(f"wi = (t2 * {S} + sp_) * {T} + lc")
            g("st1_f32(wp, wi, n)")
            g(f"st1_f32(wp, wi + {P}, mean)")
            g(f"st1_f32(wp, wi + {2 * P}, m2)")
        k1 = KernelSource("normc_outer_partial", g.text(), p.grid, p.threads, self.shared, self.ptypes())
        # kernel 2 (one CTA per column tile): y-thread ry merges splits ry, ry + RY, ... of its columns from
        # the workspace, the CTA combines the y-threads as the single-kernel schedule does, and the per-column
        # a, b, c (y = (x - c)*a + b) go to the workspace after the partials. Merging once here, not in every CTA of
        # kernel 3, keeps the merge O(splits) per column.
        V = self.V
        ab = 3 * P  # offset of the a, b table in the workspace
        # splits merged per loop trip: their loads are independent and issued together; slots past the S splits
        # (k0 + u * ry >= S for every y-thread) are always masked off and not emitted
        U = min(LOOP_UNROLL, -(-S // p.ry))
        self.shared = 0
        g = _Src()
        self.setup(g, "normc_outer_stats", splits=1)
        self.acc_init(g)
        with g.block(f"for k0 in range(ry, {S}, {p.ry * U}):"):
            loads = []
            for u in range(U):
                ok, wi = g.new("ok"), g.new("wi")
                g(f"{ok} = cok and k0 + {u * p.ry} < {S}")
                g(f"{wi} = (t2 * {S} + min(k0 + {u * p.ry}, {S - 1})) * {T} + cx * {V}")
                pn = g.new("pn")
                g(f"{pn} = ldm1_f32(wp, {wi}, {ok})")
                pm = [g.new("pm") for _ in range(V)]
                pq = [g.new("pq") for _ in range(V)]
                for j in range(V):
                    if p.stat == "norm":
                        g(f"{pm[j]} = ldm1_f32(wp, {wi} + {P + j}, {ok})")
                    g(f"{pq[j]} = ldm1_f32(wp, {wi} + {2 * P + j}, {ok})")
                loads.append((pn, pm, pq))
            for pn, pm, pq in loads:
                g(f"nn = cnt + {pn}")
                g(f"w = {pn} / max(nn, F32(1.0))")
                for j in range(V):
                    if p.stat == "norm":
                        g(f"d = {pm[j]} - wm{j}")
                        g(f"wm{j} = wm{j} + d * w")
                        g(f"wq{j} = wq{j} + {pq[j]} + d * d * cnt * w")
                    else:
                        g(f"wq{j} = wq{j} + {pq[j]}")
                g("cnt = nn")
        self.emit_cta_combine(g)
        g(self.columns(T))
        g.ind += 1
        self.merge_column(g, "lc")
        self.emit_stats_and_affine(g)
        with g.block(self.columns(T)):
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3, sA[lc])")
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 1, sB[lc])")
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 2, sC[lc])")
        km = KernelSource("normc_outer_stats", g.text(), self.KO * self.NT, p.threads, self.shared, self.ptypes())
        if p.strategy == "outer":
            km = self.stats_sliced(P, ab)
        # kernel 3: CTAs (splits x finish_splits per column tile, walked last-first) read their columns' a, b
        # and normalize their rows
        self.shared = 0
        g = _Src()
        F = p.finish_splits  # each split's rows over F CTAs: sp_ and the row slices below are of S x F
        self.setup(g, "normc_outer_finish", splits=S * F, reverse_grid=p.grid * F)
        self.smem(g, "sA", T)
        self.smem(g, "sB", T)
        self.smem(g, "sC", T)
        with g.block(self.columns(T)):
            g(f"sA[lc] = ld1_f32(wp, {ab} + (t2 * {T} + lc) * 3)")
            g(f"sB[lc] = ld1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 1)")
            g(f"sC[lc] = ld1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 2)")
        g("cuda.syncthreads()")
        self.emit_normalize(g, reverse=True)
        k2 = KernelSource("normc_outer_finish", g.text(), p.grid * F, p.threads, self.shared, self.ptypes())
        return [k1, km, k2]


def row_shared_params(p) -> bool:
    """Whether an inner split's second kernel is the column-major one (``_Inner._finish_columns``): every
    present scale/shift varies along the reduction and not across rows (layer/RMS norm ``scale d ; shift d``),
    and there are at most FINISH_COLUMNS_MAX_ROWS rows, whose statistics sit in shared memory. ``p``: a
    :class:`normc.planner.Plan` or the planner's problem (both have ``axes``, ``kept`` and the affine dtypes).
    The kernel is column-major only where :func:`columns_finish` also holds (its CTAs' column slices fill
    them); the planner asks that one, to leave such plans at one normalize CTA per split
    (``Plan.finish_splits``)."""
    present = [w for w in ("scale", "shift") if getattr(p, f"{w}_dtype") is not None]
    return (bool(present) and p.kept <= FINISH_COLUMNS_MAX_ROWS
            and all(any(a.stride(w) for a in p.axes if a.reduced) for w in present)
            and all(a.stride(w) == 0 for w in present for a in p.axes if not a.reduced))


def columns_finish(p, vectors, grid, threads) -> bool:
    """Whether an inner split's second kernel is the column-major one: :func:`row_shared_params` *and* each
    of its ``grid`` CTAs gets a column slice of at least FINISH_COLUMNS_MIN_FILL (half) of its ``threads``,
    out of the row's ``vectors`` (a thread per vector of the slice; the rest idle).

    A split forced on many short rows left most threads idle while the others walked every row: 1000 x
    100,000 float32 gave 2000 CTAs 13 vectors each (13 of 512 threads busy). On the H200 that call took
    877 us (the default plan 290); the torch profiler put 770 us in that kernel and 115 in the partial
    statistics, which read the same x. Such plans take the row-wise kernels instead. The rows the
    column-major kernel was measured on keep it: 100 x 1M float32 has 500 vectors per 512-thread CTA."""
    return row_shared_params(p) and -(-vectors // max(grid, 1)) >= threads * FINISH_COLUMNS_MIN_FILL


def generate(plan) -> list[KernelSource]:
    """Python sources of the kernels for ``plan``, in launch order: 1 kernel; for split schedules 2 (inner:
    partial statistics, merge + normalize; 3 when ``plan.finish_splits`` > 1: partial statistics, merge per
    row, flat normalize) or 3 (outer/mixed: partial statistics, merge per column tile, normalize); for coop 2
    (zero the arrival counters, the cooperative kernel)."""
    if plan.strategy == "inner":
        k = _Inner(plan)
        if plan.schedule == "persistent":
            return k.persistent()
        if plan.schedule == "staged":
            return [k.staged()]
        if plan.schedule == "looped":
            return _streaming([k.looped()])
        if plan.schedule == "coop":
            zero, coop = k.coop()  # the cooperative kernel bounded to COOP_SM_THREADS (dropped if it spills)
            return [zero, replace(coop, min_ctas=max(1, COOP_SM_THREADS // coop.block)) if COOP_SM_THREADS else coop]
        return _chain(_streaming(k.split()), plan.arch)
    k = _Outer(plan)
    if plan.schedule == "split":
        return _chain(_streaming(k.split()), plan.arch)
    if plan.schedule == "persistent":
        return [k.persistent()]
    return _streaming([k.looped()])


def _chain(kernels, arch):
    """The kernels of a split schedule chained by programmatic dependent launch (``PDL``; sm_90 and newer:
    ``arch`` is the plan's target, older targets get the kernels unchanged): every kernel but the first
    waits for the one before it as its first statement and is marked ``pdl`` (the runtime launches it with
    programmatic stream serialization); every kernel but the last lets its dependent be scheduled once all
    its CTAs have started. Both instructions are no-ops in a launch without the attribute, and the first
    kernel is launched as usual, after everything before it in the stream."""
    from . import arch_cc

    if not PDL or len(kernels) < 2 or arch_cc(arch) < (9, 0):
        return kernels
    out = []
    for i, ks in enumerate(kernels):
        calls = (["griddep_wait()  # the previous kernel has completed (programmatic dependent launch)"]
                 if i > 0 else [])
        if i < len(kernels) - 1:
            calls.append("griddep_launch_dependents()  # the next kernel may be scheduled")
        head, body = ks.source.split("\n", 1)
        assert head.startswith("def "), head
        src = "\n".join([head] + ["    " + c for c in calls] + [body])
        out.append(replace(ks, source=src, pdl=i > 0))
    return out


def _streaming(kernels):
    """Launch bounds for the streaming kernels of looped and split schedules: STREAM_THREADS_PER_SM threads
    resident per SM. The outer/mixed split's middle kernel (one CTA per column tile, a small grid) is left
    uncapped: the mixed one holds a tile's group table and needs up to 128 registers."""
    return [ks if ks.name in ("normc_outer_stats", "normc_inner_stats") else
            replace(ks, min_ctas=max(1, STREAM_THREADS_PER_SM // ks.block), max_spill=STREAM_MAX_SPILL)
            for ks in kernels]
