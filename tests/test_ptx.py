"""Every anchor workload plans, lowers to self-contained sm_90 PTX and assembles without spills, beyond the
few bytes a kernel's launch bound may cost (``codegen.STREAM_MAX_SPILL``, ``PERSISTENT_MAX_SPILL``) (no GPU).

nvJitLink (a pip dependency of numba-cuda[cu13]) assembles PTX on the host and reports ptxas' register and
spill counts, so register-pressure regressions show up in CI without a GPU.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

import normc
from normc.api import layout_strides, plan_for
from normc.canonical import dense_like
from normc.lowering import assemble, codegen, generate, lower
from normc.planner import Plan, make_plan
from normc.problem import make_problem

REGS_PER_SM = 65536


def _rows():
    data = json.loads(resources.files("normc").joinpath("data/anchors.json").read_text())
    return data["rows"]


ROWS = _rows()


def _row_id(i, r):
    return (f"{i:02d}-{r['family']}-{'x'.join(map(str, r['shape']))}-{r['dtype']}-"
            f"{r['memory_order'].replace(' ', '').replace('(', '').replace(')', '')}")


def _row_spec(r):
    eps = 1e-6 if "rms" in r["spec"] else 1e-5
    return normc.spec(r["spec"], eps=eps, **r["sizes"])


def check_kernels(plan, arch="sm_90", uses=None):
    """Lower ``plan`` and assemble each kernel with ptxas, checking its PTX and resource use; ``uses`` (a dict),
    when given, receives each kernel's resource use by entry name."""
    kernels = lower(plan)
    # split: a partial-statistics kernel, then merge/normalize kernel(s); coop and rows held over a co-resident
    # grid: counters zeroed, then the cooperative kernel; otherwise a single kernel
    grid = plan.grid_persistent
    assert len(kernels) >= 2 if plan.schedule in ("split", "coop") else len(kernels) == 1 + grid
    assert [k.coop for k in kernels] == [False] * (len(kernels) - 1) + [plan.schedule == "coop" or grid]
    for k in kernels:
        assert len(re.findall(r"\.visible\s+\.entry\s", k.ptx)) == 1
        assert ".extern" not in k.ptx
        assert re.search(rf"\.target\s+{arch}\b", k.ptx), re.search(r"\.target.*", k.ptx)
        assert k.entry in k.ptx
        assert k.grid >= 1 and 1 <= k.block <= 1024
        cubin, use = assemble(k.ptx, arch)
        assert cubin
        if uses is not None:
            uses[k.entry] = use
        # spills only under a launch bound (.minnctapersm), and at most what the generator lets a bound cost
        allowed = max(codegen.STREAM_MAX_SPILL, codegen.PERSISTENT_MAX_SPILL) if ".minnctapersm" in k.ptx else 0
        assert use.spill_stores <= allowed and use.spill_loads <= allowed, (k.entry, use.log)
        assert use.registers > 0, use.log
        assert use.registers * k.block <= REGS_PER_SM, (k.entry, use.registers, k.block)
        assert k.shared_bytes <= 48 * 1024
    return kernels


def test_anchor_rows_present():
    assert len(ROWS) >= 60
    assert {r["family"] for r in ROWS} >= {"layer", "rms", "instance", "group", "batch"}


@pytest.mark.parametrize("i", range(len(ROWS)), ids=[_row_id(i, r) for i, r in enumerate(ROWS)])
def test_anchor_row_assembles(i):
    r = ROWS[i]
    plan = plan_for(_row_spec(r), r["shape"], r["dtype"], layout=r["memory_perm"], stats=True)
    assert plan.x_dtype == r["dtype"] and plan.arch == "sm_90"
    check_kernels(plan)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n, vec", [(34, 2), (36, 4), (40, 8)])
def test_hinted_16bit_rows_of_every_vector_width_assemble(dtype, n, vec):
    """16-bit rows read and written with evict-first hints (PERSISTENT_CACHE_HINTS) at each vector width: a
    2-wide access moves one 32-bit word, which the hinted load and store once passed to NVVM as the wrong
    type (invalid IR, caught only on the GPU before this test)."""
    plan = plan_for(normc.spec("t d : norm over d ; scale d ; shift d"), (37, n), dtype, stats=True)
    assert (plan.schedule, plan.vec, plan.cache_hints) == ("persistent", vec, 1), plan.describe()
    ptx = check_kernels(plan)[0].ptx
    assert "ld.global.cs" in ptx and "st.global.cs" in ptx


@pytest.mark.parametrize("dtype, shape", [("float16", (1001, 6)), ("float16", (100000, 7)), ("float16", (9, 3)),
                                          ("float32", (12345, 3)), ("float32", (7, 10)), ("float32", (5000, 13))])
def test_staged_short_rows_assemble(dtype, shape):
    """Staged kernels assemble within 48 KiB of static shared memory (float16 rows of 7 values once asked
    for 58 KiB) and within registers."""
    plan = plan_for(normc.spec("t d : norm over d ; scale d ; shift d"), shape, dtype, stats=True)
    assert plan.schedule == "staged", plan.describe()
    check_kernels(plan)


@pytest.mark.parametrize("i", [9, 36, 54], ids=["outer-split", "inner-split", "mixed-split"])
def test_split_kernels_chained_by_programmatic_dependent_launch(i):
    """Every kernel of a split but the first is launched as a programmatic dependent and waits for the kernel
    before it first; every kernel but the last releases its dependent; nothing else carries either."""
    r = ROWS[i]
    plan = plan_for(_row_spec(r), r["shape"], r["dtype"], layout=r["memory_perm"], stats=True)
    assert plan.schedule == "split"
    ks = check_kernels(plan)
    n = len(ks)
    assert [k.pdl for k in ks] == [j > 0 for j in range(n)]
    assert [ks[j].ptx.count("griddepcontrol.wait;") for j in range(n)] == [int(j > 0) for j in range(n)]
    assert [ks[j].ptx.count("griddepcontrol.launch_dependents;") for j in range(n)] == [int(j < n - 1) for j in range(n)]
    for j in range(1, n):  # the wait comes before the kernel's first global load
        body = ks[j].ptx[ks[j].ptx.index(".entry"):]
        assert body.index("griddepcontrol.wait;") < body.index("ld.global")
    single = plan_for(_row_spec(ROWS[0]), ROWS[0]["shape"], ROWS[0]["dtype"], layout=ROWS[0]["memory_perm"])
    (k,) = lower(single)
    assert not k.pdl and "griddepcontrol" not in k.ptx


def test_split_kernels_before_sm90_are_not_chained():
    """griddepcontrol needs sm_90: a split planned for sm_80 has neither instruction and assembles there."""
    r = ROWS[36]
    spec = _row_spec(r)
    strides = layout_strides(spec, r["shape"], r["memory_perm"])
    prob = make_problem(spec, r["shape"], strides, dense_like(r["shape"], strides), x_dtype=r["dtype"])
    plan = make_plan(prob, arch="sm_80")
    assert plan.schedule == "split"
    ks = lower(plan)
    assert not any(k.pdl or "griddepcontrol" in k.ptx for k in ks)
    for k in ks:
        assert assemble(k.ptx, "sm_80")[0]


def test_outer_split_finish_grid():
    """An outer split's normalize kernel runs finish_splits CTAs per split CTA (NDHWC (4, 64, 64^3) float32:
    528 partial CTAs, 8 x 528 normalizing ones), the partial and merge kernels keep theirs."""
    r = ROWS[24]
    spec = _row_spec(r)
    strides = layout_strides(spec, r["shape"], r["memory_perm"])
    prob = make_problem(spec, r["shape"], strides, dense_like(r["shape"], strides), x_dtype=r["dtype"])
    plan = make_plan(prob, arch="sm_90")
    assert (plan.strategy, plan.schedule, plan.grid, plan.finish_splits) == ("outer", "split", 528, 8)
    ks = generate(plan)
    assert [k.grid for k in ks] == [528, 64, 528 * 8]
    assert "normalize kernel: 4224" in plan.describe()


def test_mixed_split_fills_one_wave():
    """NHWC group norm (8, 320, 64, 64) float16 (mixed split): the partial and normalize grids fit one wave of
    4 x 256-thread CTAs per SM on 132 SMs (at most 528 CTAs; 17 splits x 32 tiles = 544 left a 16-CTA second
    wave), and both kernels keep the launch bound that lets 4 fit (at most 64 registers, spilling at most
    STREAM_MAX_SPILL bytes) instead of 72-78 registers and 3 per SM."""
    r = ROWS[54]
    plan = plan_for(_row_spec(r), r["shape"], r["dtype"], layout=r["memory_perm"])
    assert (plan.strategy, plan.schedule) == ("mixed", "split")
    assert plan.grid <= 4 * 132
    uses = {}
    partial, _, finish = check_kernels(plan, uses=uses)
    for k in (partial, finish):
        use = uses[k.entry]
        assert ".minnctapersm 4" in k.ptx and use.registers <= 64, (k.entry, use.registers)


def test_outer_looped_cta_shape():
    """NHWC instance norm (256, 128, 28, 28) float16 (outer looped, one CTA per image): 512 threads loading 8
    vectors a trip (planner OUTER_LOOPED_THREADS / OUTER_LOOPED_UNROLL: 48 us against 54 us at 256 x 4 on an
    H100), assembled without spills (ptxas drops the 2-CTA launch bound that would spill: one CTA per SM)."""
    r = ROWS[3]
    plan = plan_for(_row_spec(r), r["shape"], r["dtype"], layout=r["memory_perm"])
    assert (plan.strategy, plan.schedule, plan.threads, plan.per_thread) == ("outer", "looped", 512, 8)
    uses = {}
    (k,) = check_kernels(plan, uses=uses)
    use = uses[k.entry]
    assert use.spill_stores == use.spill_loads == 0 and use.registers <= 128, use


def test_thread_and_block_index_zero_extended(monkeypatch):
    """codegen.UNSIGNED_INDEX: %tid.x and %ctaid.x reach int64 zero-extended (1, the default) or sign-extended
    (0). Zero-extended, LLVM drops the floor corrections of // and % and Numba's negative-index wrap of shared
    arrays: NHWC group norm (8, 640, 32, 32) float16 (row 56, mixed persistent) takes 1,727 PTX instructions
    and 94 registers against 2,118 and 114 (2026-12-07)."""
    r = ROWS[56]
    plan = plan_for(_row_spec(r), r["shape"], r["dtype"], layout=r["memory_perm"])
    got = {}
    for unsigned in (1, 0):
        monkeypatch.setattr(codegen, "UNSIGNED_INDEX", unsigned)
        uses = {}
        (k,) = check_kernels(plan, uses=uses)
        special = set(re.findall(r"mov\.u32\s+(%r\d+), %(?:tid|ctaid)\.x;", k.ptx))
        ext = {kind for kind, src in re.findall(r"cvt\.([us])64\.[us]32\s+%rd\d+, (%r\d+);", k.ptx) if src in special}
        assert ext == ({"u"} if unsigned else {"s"}), (unsigned, ext)
        ninstr = sum(1 for line in k.ptx.splitlines() if re.match(r"\s+[@a-z]", line))
        got[unsigned] = ninstr, uses[k.entry].registers
    (n1, r1), (n0, r0) = got[1], got[0]
    assert n1 < n0 - 100 and r1 < r0, got


def test_bounded_kernels_carry_their_cubin(monkeypatch, tmp_path):
    """The launch-bound check assembles a bounded kernel already: lower() hands that cubin on (the same
    bytes a fresh assemble gives) and the runtime's compiled_kernels stores it without linking again; an
    unbounded kernel has no cubin and is linked by the runtime."""
    from normc import runtime
    from normc.runtime import gpu

    r = ROWS[54]
    plan = plan_for(_row_spec(r), r["shape"], r["dtype"], layout=r["memory_perm"])
    ks = lower(plan)
    assert [".minnctapersm" in k.ptx for k in ks] == [k.cubin is not None for k in ks] == [True, False, True]
    for k in ks:
        if k.cubin is not None:
            assert k.cubin == assemble(k.ptx)[0]
    linked = []
    monkeypatch.setenv("NORMC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_kernel_memo", {})
    monkeypatch.setattr(gpu, "link_cubin", lambda ptx, cc: linked.append(ptx) or b"linked")
    got = runtime.compiled_kernels(plan, (9, 0))
    assert len(linked) == 1 and "normc_outer_stats" in linked[0]  # Numba numbers its entries per compile
    assert [g["cubin"] is not None and g["cubin"] != b"linked" for g in got] == [True, False, True]
    assert got[1]["cubin"] == b"linked"


FORCED = [
    ("t d : norm over d ; scale d ; shift d", (64, 4096), "bfloat16", None),
    ("t d : rms over d ; scale d", (8, 8192), "float16", None),
    ("n c h w : norm over h w ; scale c ; shift c", (8, 64, 28, 28), "float32", [0, 2, 3, 1]),
    ("n (g k) h w : norm over k h w ; scale g k ; shift g k", (4, 64, 16, 16), "float16", [0, 2, 3, 1]),
    ("t d : norm over d ; scale d ; shift d", (6, 10007), "bfloat16", None),  # odd rows: peeled (PEEL)
]


@pytest.mark.parametrize("schedule", ["looped", "split"])
@pytest.mark.parametrize("case", FORCED, ids=["layer", "rms", "instance-nhwc", "group-nhwc", "layer-peeled"])
def test_forced_schedule_assembles(case, schedule):
    text, shape, dtype, perm = case
    spec = normc.spec(text, g=8) if "(g k)" in text else normc.spec(text)
    strides = layout_strides(spec, shape, perm)
    prob = make_problem(spec, shape, strides, dense_like(shape, strides), x_dtype=dtype, stats=True)
    plan = make_plan(prob, arch="sm_90", schedule=schedule)
    assert plan.schedule == schedule
    if schedule == "split":
        assert plan.splits >= 2 and plan.workspace_floats > 0
    assert plan.peel == (shape[-1] == 10007)
    check_kernels(plan)


@pytest.mark.parametrize("case", FORCED[:2], ids=["layer", "rms"])
def test_forced_coop_assembles(case):
    """The cooperative split (inner): a counter-zeroing kernel, then one kernel whose CTAs arrive (release)
    and spin (acquire) on per-row counters and read the partials through L2; both assemble without spills."""
    text, shape, dtype, _ = case
    spec = normc.spec(text)
    strides = layout_strides(spec, shape, None)
    prob = make_problem(spec, shape, strides, dense_like(shape, strides), x_dtype=dtype, stats=True)
    plan = make_plan(prob, arch="sm_90", schedule="coop")
    assert (plan.schedule, plan.splits) == ("coop", 2)
    assert plan.workspace_floats == 3 * plan.kept * plan.splits + plan.kept
    ks = generate(plan)
    assert [k.coop for k in ks] == [False, True]
    ptx = lower(plan)[1].ptx
    assert "red.release.gpu.global.add.u32" in ptx and "ld.acquire.gpu.global.u32" in ptx
    assert "ld.global.cg.f32" in ptx
    check_kernels(plan)


def test_few_long_rows_plan_split_not_coop():
    """The coop schedule is opt-in (forced or autotuned): measured slower than split on the H200."""
    plan = plan_for(normc.spec("t d : norm over d"), (10, 10_000_000), "float32")
    assert plan.schedule == "split"


@pytest.mark.parametrize("sms", [16, 132])
def test_grid_persistent_plans_are_consistent(sms):
    """Over row counts and lengths around the cluster and grid limits, every row held over a co-resident grid
    has one CTA per SM at most, at least 2 CTAs per row, no cluster, at most 64 values per thread and CTAs
    that cover the row; the planner picks it for 4 x 400,001 (a cluster of 16 would use 64 of 132 SMs), for 1 x
    2M (too long for a cluster of 16: split before) and not for 8 x 262,144 (its cluster of 8 stays)."""
    seen = 0
    for dtype in ("float32", "bfloat16"):
        for rows in (1, 2, 3, 4, 5, 8, 13, 40, 131):
            for length in (8192, 65537, 150001, 400001, 1000003, 3000001, 9000000):
                for schedule in (None, "grid"):
                    plan = plan_for(normc.spec("t d : norm over d ; scale d ; shift d"), (rows, length), dtype,
                                    sms=sms, schedule=schedule)
                    if not plan.grid_persistent:
                        continue
                    seen += 1
                    assert plan.cluster == 1 and plan.grid == rows * plan.splits <= sms, plan.describe()
                    assert 2 <= plan.splits and plan.per_thread * plan.vec <= 64, plan.describe()
                    assert plan.splits * plan.tpr * plan.per_thread * plan.vec >= length - 2 * plan.vec, plan.describe()
    assert seen > 20
    if sms == 132:
        spec = normc.spec("t d : norm over d ; scale d ; shift d")
        assert plan_for(spec, (4, 400001), "float32").splits == 33
        assert plan_for(spec, (1, 2000000), "float32").splits == 132
        assert plan_for(spec, (8, 262144), "float32").cluster == 8


def test_forced_cluster_and_grid_name_the_tiling_they_replace():
    """A forced cluster or grid says which of the planner's tilings (the why lines above it) it replaces, as
    the forced streaming schedules do, rather than leaving that tiling's line to contradict the plan."""
    spec = normc.spec("t d : norm over d")
    plan = plan_for(spec, (8, 262144), "float32", schedule="grid")
    assert (plan.splits, plan.cluster) == (16, 1)
    assert "instead of the cluster tiling above" in plan.why[-1], plan.describe()
    plan = plan_for(spec, (4, 100), "float32", schedule="cluster")
    assert plan.cluster == 2 and "instead of the persistent tiling above" in plan.why[-1], plan.describe()


def test_split_normalize_kernel_column_major_only_where_its_ctas_fill():
    """The inner split's column-major normalize kernel (layer/RMS norm) where its CTAs' column slices fill
    half their threads: the 10 x 10M and 100 x 1M float32 anchor rows keep it (500 vectors per 512-thread
    CTA on 100 x 1M); a split forced on 1000 x 100,000 (13 vectors per CTA) normalizes row-wise and says why."""
    spec = normc.spec("t d : norm over d ; scale d ; shift d")
    for shape in ((10, 10000000), (100, 1000000)):
        plan = plan_for(spec, shape, "float32")
        assert plan.schedule == "split" and "sMe" in generate(plan)[-1].source, plan.describe()
    plan = plan_for(spec, (1000, 100000), "float32", schedule="split")
    assert (plan.schedule, plan.grid, plan.threads) == ("split", 2000, 512), plan.describe()
    assert "sMe" not in generate(plan)[-1].source
    assert any("row-wise" in w and "13 vector(s) for 512 threads" in w for w in plan.why), plan.describe()


@pytest.mark.parametrize("i", range(0, len(ROWS), 5))
def test_plan_json_round_trip(i):
    r = ROWS[i]
    plan = plan_for(_row_spec(r), r["shape"], r["dtype"], layout=r["memory_perm"], stats=True)
    text = plan.to_json()
    back = Plan.from_json(text)
    assert back == plan
    assert back.why == plan.why
    assert back.to_json() == text
    assert hash(back) == hash(plan)
    json.loads(text)  # plain JSON


def _canonical_ptx(ptx):
    """PTX with the names that differ between compiles of the same kernel (Numba's mangled entry names and its
    per-process shared-memory counter) replaced by their order of appearance."""
    seen = {}
    ptx = re.sub(r"_ZN[0-9A-Za-z_$]+", "NAME", ptx)
    return re.sub(r"_cudapy_smem_\d+", lambda m: seen.setdefault(m.group(0), f"SMEM{len(seen)}"), ptx)


@pytest.mark.parametrize("spec,shape,layout", [
    ("n (g k) h w : norm over k h w ; scale g k ; shift g k", (8, 320, 64, 64), "n h w (g k)"),
    ("t d : rms over d ; scale d", (2, 4000000), None),
], ids=["mixed-split-group-nhwc", "inner-split-rms"])
def test_typing_memo_keeps_the_ptx(spec, shape, layout, monkeypatch):
    """normc memoizes Numba's call typing while it compiles (lowering/__init__.py, ``_TYPING_MEMO``): the PTX
    is the same as without it (NORMC_TYPING_MEMO=0), kernel for kernel."""
    sp = normc.spec(spec, g=32) if "(g k)" in spec else normc.spec(spec)
    plan = plan_for(sp, shape, "float16", layout=layout)
    assert plan.schedule == "split"  # the most kernels (3 and 2) and the longest compiles
    with_memo = [_canonical_ptx(k.ptx) for k in lower(plan)]
    monkeypatch.setenv("NORMC_TYPING_MEMO", "0")
    without = [_canonical_ptx(k.ptx) for k in lower(plan)]
    assert len(with_memo) == len(without) >= 1
    assert with_memo == without


@pytest.mark.parametrize("spec,shape,layout,backward", [
    ("n (g k) h w : norm over k h w ; scale g k ; shift g k", (8, 320, 64, 64), "n h w (g k)", False),
    ("t d : rms over d ; scale d", (2, 4000000), None, False),
    ("n c h w : norm over h w ; scale c ; shift c", (8, 64, 96, 96), "n h w c", True),
], ids=["mixed-split-group-nhwc", "inner-split-rms", "backward-nhwc-instance"])
def test_lean_pipeline_keeps_the_ptx(spec, shape, layout, backward, monkeypatch):
    """normc skips Numba's rewrite passes and SSA reconstruction while it compiles (lowering/__init__.py,
    ``_LEAN_FLAGS``): the PTX is the same as with them (NORMC_LEAN_PIPELINE=0), kernel for kernel, and the
    lean flags are really in effect inside the block (and gone after it)."""
    from numba.cuda import compiler as cuda_compiler

    from normc.api import layout_strides
    from normc.lowering import _lean_pipeline, lower_backward
    from normc.runtime.backward import plan_backward

    sp = normc.spec(spec, g=32) if "(g k)" in spec else normc.spec(spec)
    if backward:
        strides = layout_strides(sp, shape, layout)
        plan = plan_backward(sp, shape, "float16", strides=strides, dy_dtype="float16", need_dscale=True,
                             need_dshift=True, arch="sm_90", sms=132, scale_dtype="float16",
                             shift_dtype="float16")
        compile_all = lower_backward
    else:
        plan = plan_for(sp, shape, "float16", layout=layout)
        assert plan.schedule == "split"  # the most kernels (3 and 2) and the longest compiles
        compile_all = lower
    lean = [_canonical_ptx(k.ptx) for k in compile_all(plan)]
    monkeypatch.setenv("NORMC_LEAN_PIPELINE", "0")
    full = [_canonical_ptx(k.ptx) for k in compile_all(plan)]
    assert len(lean) == len(full) >= 1
    assert lean == full
    monkeypatch.delenv("NORMC_LEAN_PIPELINE")
    base = cuda_compiler.CUDAFlags
    with _lean_pipeline():
        flags = cuda_compiler.CUDAFlags()
        assert flags.no_rewrites and not flags.enable_ssa
    assert cuda_compiler.CUDAFlags is base
    assert not base().no_rewrites and base().enable_ssa


def test_lean_pipeline_recompiles_a_float64_kernel_in_full(monkeypatch):
    """float64 in a lean compile's PTX (a name typed as the unification of an integer and a float, which SSA
    would have kept apart) makes ``_compile_ptx`` compile the kernel again with the full pipeline; a float32
    kernel compiles once."""
    import numba.cuda
    from numba import types

    from normc.lowering import _compile_ptx

    calls = []
    real = numba.cuda.compile_ptx

    def counting(*args, **kwargs):
        from numba.cuda import compiler as cuda_compiler

        calls.append(cuda_compiler.CUDAFlags().enable_ssa)  # False: lean, True: full
        return real(*args, **kwargs)

    monkeypatch.setattr(numba.cuda, "compile_ptx", counting)

    def wide(a):
        a[1] = a[0] * 0.1  # float64: 0.1 is a Python float

    def narrow(a):
        a[1] = a[0] * a[2]

    sig = (types.CPointer(types.float32),)
    assert ".f64" in _compile_ptx(wide, sig, (9, 0), 128)
    assert calls == [False, True]
    calls.clear()
    assert ".f64" not in _compile_ptx(narrow, sig, (9, 0), 128)
    assert calls == [False]


def test_typing_memo_respects_compile_flags_and_other_threads():
    """The memo keys on the compile flags: a fastmath compile's overload body is not reused by a later
    compile without fastmath (division stays a division), inside the memo as outside it."""
    import threading

    from numba import njit
    from numba.extending import overload

    from normc.lowering import _memoized_call_typing

    def scaled(x):
        pass

    @overload(scaled)
    def _ol(x):
        return lambda x: x / 3.7

    def k(a):
        return scaled(a)

    def ir(fastmath):
        f = njit(fastmath=fastmath)(k)
        f.compile("float64(float64)")
        return "\n".join(f.inspect_llvm().values())

    with _memoized_call_typing():
        fast, exact = ir(True), ir(False)
    assert "fmul fast double" in fast
    assert "fdiv double" in exact and "fmul fast" not in exact
    # a thread that did not enter the memo is not served by it (and nothing is left patched afterwards)
    from numba.core.types.functions import BaseFunction

    from normc import lowering

    seen = []
    with _memoized_call_typing():
        t = threading.Thread(target=lambda: seen.append(getattr(lowering._memo_tls, "depth", 0)))
        t.start()
        t.join()
    assert seen == [0]
    assert BaseFunction.get_call_type is not lowering._memo_get_call_type


@pytest.mark.parametrize("preload", [1, 0])
def test_row_params_load_beside_x(preload, monkeypatch):
    """NCHW instance norm, persistent: a row's scale and shift (one value each) are loaded before the row's
    first shuffle (``codegen.PRELOAD_ROW_PARAMS``), not after its statistics; 0 keeps the old order."""
    monkeypatch.setattr(codegen, "PRELOAD_ROW_PARAMS", preload)
    plan = plan_for(normc.spec("n c d h w : norm over d h w ; scale c ; shift c"), (2, 32, 6, 6, 6), "float32")
    assert plan.schedule == "persistent"
    (k,) = lower(plan)
    lines = k.ptx.splitlines()
    first_shfl = next(i for i, s in enumerate(lines) if "shfl.sync" in s)
    scalar_loads = [i for i, s in enumerate(lines) if re.search(r"ld\.global\.f32\s", s)]
    # x's pivot (the row's first value) and the two parameters are the kernel's scalar loads
    assert len(scalar_loads) == 3
    before = sum(i < first_shfl for i in scalar_loads)
    assert before == (3 if preload else 1)
