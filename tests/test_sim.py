"""Every strategy x schedule run on Numba's CUDA simulator (no GPU) and checked against a float64 reference.

Each CUDA thread is a Python thread on the simulator, so arrays are tiny and grids a few CTAs; the plan
that actually ran (``f._table`` entries' ``.plan``) is asserted so each case covers the path it names.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import normc
from conftest import (
    BN,
    GN,
    IN1,
    IN2,
    IN3,
    LN,
    NHWC,
    RMS_TEXT,
    STAT_TOL,
    check_stats,
    check_y,
    fold_atol,
    make_param,
    make_x,
    memory_order,
    np_dtype,
    reference,
    rel_err,
)

RMS = normc.spec(RMS_TEXT, eps=1e-6)
ROW_SCALE = "t d : norm over d ; scale t ; shift d"  # a per-row scale before a shift along the row


def _spec(s, **sizes):
    return normc.spec(s, **sizes) if isinstance(s, str) else s


def _params(spec, shape, pdtype, rng):
    sizes = spec.axis_sizes(shape)
    sc = sh = None
    if spec.scale is not None:
        sc = make_param(math.prod(sizes[a] for a in spec.scale), pdtype, rng, loc=1.0, std=0.5)
    if spec.shift is not None:
        sh = make_param(math.prod(sizes[a] for a in spec.shift), pdtype, rng)
    return sc, sh


def only_plan(f):
    plans = [e.plan for e in f._table.values()]
    assert len(plans) == 1, plans
    return plans[0]


def run_case(spec, x, *, scale=None, shift=None, schedule=None, expect=None, ytol=None, stats=True,
             params="auto", pdtype=None, rng=None):
    """Compile ``spec``, run it on ``x`` (simulator), check plan, dtype, layout, y and the statistics."""
    spec = _spec(spec)
    rng = np.random.default_rng(7) if rng is None else rng
    dt = x.dtype.name
    if params == "auto":
        scale, shift = _params(spec, x.shape, pdtype or dt, rng)
    f = normc.compile(spec, schedule=schedule)
    y, mean, rstd = f(x, scale, shift, return_stats=True)
    plan = only_plan(f)
    if expect is not None:
        assert (plan.strategy, plan.schedule) == expect, plan.describe()
    if schedule == "split":
        assert plan.splits >= 2 and len(next(iter(f._table.values())).kernels) >= 2
    assert y.shape == x.shape and y.dtype == x.dtype
    assert memory_order(y) == memory_order(x), (y.strides, x.strides)
    ry, rm, rr = reference(spec, x, scale, shift)
    check_y(y, ry, dt, ytol, atol=fold_atol(x, rr, scale))
    if stats:
        check_stats(mean, rstd, rm, rr)
    return y, mean, rstd, plan


DTYPES = ["float32", "float16", "bfloat16"]

# ----------------------------------------------------------------------------------------------------
# inner


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 40), (2, 33), (4, 64)])
def test_inner_persistent_layer_norm(shape, dtype):
    run_case(LN, make_x(shape, dtype), expect=("inner", "persistent"))


@pytest.mark.parametrize("spec", [LN, RMS], ids=["norm", "rms"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(3, 5), (1037, 6), (9, 3), (700, 8)])
def test_inner_staged_short_rows(shape, dtype, spec):
    """Short contiguous rows go through shared memory: (3, 5) is 15 elements, not whole 16-byte vectors (the
    ragged last vector is loaded and stored one element at a time); (1037, 6) spans several CTAs, the last
    one partly filled; (9, 3) packs many rows per CTA and per thread; (700, 8) is whole vectors."""
    _, _, _, plan = run_case(spec, make_x(shape, dtype), expect=("inner", "staged"))
    assert plan.vec * np.dtype(np_dtype(dtype)).itemsize == 16
    assert plan.rows_per_cta * shape[1] % plan.vec == 0
    if shape[0] > plan.rows_per_cta:
        assert plan.grid >= 2


@pytest.mark.parametrize("text, shape, sizes", [
    (IN2, (3, 1, 4, 4), {}),                                            # instance norm, one channel
    (IN1, (8, 1, 10), {}),
    (GN, (2, 1, 2, 2), {"g": 1}),                                        # one group of one channel
    ("n c h w : rms over h w ; scale c", (3, 1, 4, 4), {}),
    ("n c h w : norm over h w ; shift c", (3, 1, 2, 3), {}),
])
def test_inner_staged_size_one_parameters(text, shape, sizes):
    """A scale or shift over axes that all have size 1 (one value for every row) on the staged schedule's short
    rows: applied, not dropped (it was: y came out as the bare normalized x)."""
    _, _, _, plan = run_case(normc.spec(text, **sizes), make_x(shape, "float32"), expect=("inner", "staged"))


@pytest.mark.parametrize("text, shape, schedule", [
    ("t d : norm over d ; scale d ; shift t", (5, 40), None),
    ("t d : rms over d ; scale d ; shift t", (5, 40), None),
    ("t d : norm over d ; scale d ; shift t", (2, 300), "looped"),
    ("n c l : norm over l ; scale l ; shift c", (2, 3, 40), None),
])
def test_per_row_shift_after_a_scale_along_the_row(text, shape, schedule):
    """y = x^ * scale[d] + shift[t]: the per-row shift is added after the scale along the row (it was once
    folded in before it, giving (x^ + shift) * scale)."""
    run_case(normc.spec(text), make_x(shape, "float32"), schedule=schedule,
             expect=("inner", schedule or "persistent"))


def test_inner_staged_constant_rows_near_float32_max():
    """Constant rows of 1e38 (their sum overflows float32): mean = the constant, y = shift, as the persistent
    schedule gives (the staged kernel sums values minus the row's first one)."""
    x = np.full((5, 4), 1e38, np.float32)
    x[2] = -3e38
    sh = np.arange(1, 5, dtype=np.float32)
    f = normc.compile("t d : norm over d ; shift d")
    y, mean, rstd = f(x, shift=sh, return_stats=True)
    assert only_plan(f).schedule == "staged"
    np.testing.assert_array_equal(y, np.broadcast_to(sh, x.shape))
    np.testing.assert_array_equal(mean, x[:, 0])
    np.testing.assert_allclose(rstd, 1 / np.sqrt(1e-5), rtol=1e-6)


def test_inner_staged_wider_out_dtype():
    """float16 x, float32 y: the flat vectors are as wide as 16 bytes of the wider dtype (4 elements)."""
    x = make_x((301, 6), "float16")
    rng = np.random.default_rng(3)
    sc, sh = _params(_spec(LN), x.shape, "float32", rng)
    f = normc.compile(LN, out_dtype="float32")
    y, mean, rstd = f(x, sc, sh, return_stats=True)
    plan = only_plan(f)
    assert (plan.schedule, plan.vec) == ("staged", 4)
    assert y.dtype == np.float32
    ry, rm, rr = reference(_spec(LN), x, sc, sh)
    check_y(y, ry, "float32", None, atol=fold_atol(x, rr, sc))
    check_stats(mean, rstd, rm, rr)


def test_inner_staged_not_forced_where_it_does_not_apply():
    """bfloat16 rows and long rows keep the persistent schedule even when staged is asked for."""
    for shape, dtype in (((4, 10), "bfloat16"), ((4, 100), "float32")):
        f = normc.compile(LN, schedule="staged")
        f(make_x(shape, dtype), *_params(_spec(LN), shape, dtype, np.random.default_rng(1)))
        plan = only_plan(f)
        assert plan.schedule == "persistent"
        assert any("not forced" in w for w in plan.why)
    # a transposed x puts a kept axis innermost: the outer strategy, which has no staged schedule
    f = normc.compile(LN, schedule="staged")
    x = np.ascontiguousarray(make_x((6, 5), "float32").T).T
    f(x, *_params(_spec(LN), x.shape, "float32", np.random.default_rng(2)))
    plan = only_plan(f)
    assert plan.strategy == "outer" and any("staged schedule exists for the inner strategy only" in w
                                            for w in plan.why)


def test_inner_persistent_rms_bf16():
    _, mean, _, plan = run_case(RMS, make_x((3, 40), "bfloat16"), expect=("inner", "persistent"))
    assert plan.stat == "rms"
    assert np.all(mean == 0)


def test_inner_persistent_instance_nchw():
    run_case(IN2, make_x((2, 3, 5, 7), "float32"), expect=("inner", "persistent"))


def test_inner_looped_layer_norm():
    run_case(LN, make_x((2, 300), "float32"), schedule="looped", expect=("inner", "looped"))


@pytest.mark.parametrize("reverse", [1, 0], ids=["last-first", "first-last"])
@pytest.mark.parametrize("spec,shape,perm,strategy", [(LN, (2, 300), None, "inner"),
                                                      (BN, (2, 8, 3, 3), NHWC, "outer")], ids=["inner", "outer"])
def test_looped_reread_direction(spec, shape, perm, strategy, reverse, monkeypatch):
    """codegen.LOOPED_REVERSE: the looped schedule's normalize pass walks the rows last-first (1) or in order
    (0); y matches the reference either way. The shapes differ by direction: the kernel cache does not key on
    codegen constants."""
    from normc.lowering.codegen import generate

    monkeypatch.setattr("normc.lowering.codegen.LOOPED_REVERSE", reverse)
    shape = shape[:-1] + (shape[-1] + reverse,)
    *_, plan = run_case(spec, make_x(shape, "float32", perm=perm), schedule="looped", expect=(strategy, "looped"))
    src = "".join(k.source for k in generate(plan))
    assert ("for trip in range(ntrip - 1, -1, -1):" in src) == bool(reverse)


@pytest.mark.parametrize("spec", [LN, RMS], ids=["norm", "rms"])
def test_inner_split(spec):
    run_case(spec, make_x((2, 700), "float32"), schedule="split", expect=("inner", "split"))


@pytest.mark.parametrize("text, shape, dtype", [
    (IN1, (2, 3, 1031), "float32"),  # odd rows: peeled, the edges by the first normalize CTA of each row
    ("n c l : rms over l ; scale c", (2, 2, 1040), "bfloat16"),  # scaled statistics, factor rstd
    (GN, (2, 4, 5, 104), "bfloat16"),  # scaled norm (factor ra) with scale/shift along the row
    (ROW_SCALE, (3, 1030), "float16"),  # a per-row scale before a shift along the row (peeled)
], ids=["peeled", "rms-bf16", "group-bf16", "row-scale"])
def test_inner_split_flat_finish(text, shape, dtype, monkeypatch):
    """The split's normalize kernel as a flat grid (planner INNER_FINISH_TRIPS): a middle kernel merges each
    row's partials once (a thread per row) into its mean and factor; the normalize kernel's F CTAs per split
    (Plan.finish_splits, forced to 3 here: the simulator's rows are short) only read them."""
    from normc import planner
    from normc.lowering import generate

    make = planner.make_plan

    def three_per_split(*a, **k):
        p = make(*a, **k)
        return dataclasses.replace(p, finish_splits=3) if (p.strategy, p.schedule) == ("inner", "split") else p

    monkeypatch.setattr(planner, "make_plan", three_per_split)
    spec = normc.spec(text, g=2) if text == GN else normc.spec(text)
    _, _, _, plan = run_case(spec, make_x(shape, dtype), schedule="split", expect=("inner", "split"))
    names = [k.name for k in generate(plan)]
    assert names == ["normc_inner_partial", "normc_inner_stats", "normc_inner_finish"], names
    assert plan.workspace_floats == 3 * plan.kept * plan.splits + 2 * plan.kept
    assert plan.peel == (shape[-1] % (16 // np.dtype(np_dtype(dtype)).itemsize) != 0)


@pytest.mark.parametrize("schedule", ["looped", "split"])
def test_inner_streaming_scalar_rows_load_more_per_trip(schedule):
    """Odd rows of a view 4 bytes past a 16-byte boundary (scalar accesses: not peeled) load
    NARROW_LOOP_UNROLL values per trip, masked past the row's end."""
    x = make_x((2, 1002), "float32")[:, 1:]
    _, _, _, plan = run_case(LN, x, schedule=schedule, expect=("inner", schedule))
    assert (plan.vec, plan.per_thread, plan.peel) == (1, normc.planner.NARROW_LOOP_UNROLL, False)




@pytest.mark.parametrize("text, schedule, dtype, n", [
    (LN, "looped", "float32", 1031), (RMS_TEXT, "looped", "float16", 517), (ROW_SCALE, "looped", "bfloat16", 263),
    (LN, "split", "float16", 517), (RMS_TEXT, "split", "float32", 1031), (ROW_SCALE, "split", "float32", 1030),
    (LN, "coop", "bfloat16", 263), (RMS_TEXT, "coop", "float32", 1031), (LN, "split", "float32", 8),
])
def test_inner_streaming_peeled_rows(text, schedule, dtype, n):
    """Rows whose length is not a multiple of the 16-byte vector start at varying alignments: peeled, each
    row's values before its first boundary and after its last whole vector (both up to vec - 1) are handled
    one at a time, the rest as aligned vectors (planner PEEL). Rows of 8 float32 (two whole vectors) are
    aligned and not peeled."""
    x = make_x((3, n), dtype)
    _, _, _, plan = run_case(normc.spec(text), x, schedule=schedule, expect=("inner", schedule))
    assert plan.peel == (n % 8 != 0) and plan.vec == 16 // np.dtype(np_dtype(dtype)).itemsize


@pytest.mark.parametrize("text, shape, dtype", [
    ("t d : norm over d ; scale d ; shift d", (2, 520), "bfloat16"),
    ("n c h w : norm over c h w ; scale c h w ; shift c h w", (3, 4, 5, 30), "float32"),
    ("t d : rms over d ; shift d", (2, 333), "float16"),
], ids=["layer-bf16", "layer-3axes", "rms-shift-only-odd"])
def test_inner_split_column_major_finish(text, shape, dtype, monkeypatch):
    """Split layer/RMS norm: the second kernel takes a column slice of every row (scale/shift read once).
    The odd rows are a view one element past an aligned start (scalar, not peeled: peeled rows take the
    row-wise finish). The simulator's rows give each CTA a few columns, which the planner leaves to the
    row-wise kernel (codegen.columns_finish): its fill threshold is lifted here."""
    from normc.lowering import codegen, generate

    monkeypatch.setattr(codegen, "FINISH_COLUMNS_MIN_FILL", 0)
    x = make_x(shape, dtype) if shape[-1] % 2 == 0 else make_x(shape[:-1] + (shape[-1] + 1,), dtype)[..., 1:]
    _, _, _, plan = run_case(normc.spec(text), x, schedule="split", expect=("inner", "split"))
    assert "sMe" in generate(plan)[1].source  # the per-row statistics table of the column-major kernel


def test_inner_split_few_columns_per_cta_normalize_row_wise():
    """A split layer norm whose column-major second kernel would give each CTA fewer vectors than half its
    threads (here 2 rows x 2 splits, 16 vectors a row: 4 vectors per 512-thread CTA) normalizes row-wise
    instead, and says so in the plan; the values still match float64. (40 rows took 5 minutes to simulate.)"""
    from normc.lowering import generate

    x = make_x((2, 64), "float32")
    _, _, _, plan = run_case(LN, x, schedule="split", expect=("inner", "split"))
    assert "sMe" not in generate(plan)[1].source
    assert any("normalize kernel row-wise" in w for w in plan.why)


@pytest.mark.parametrize("spec, dtype", [(LN, "bfloat16"), (RMS, "float32")], ids=["norm-bf16", "rms"])
def test_inner_coop(spec, dtype, monkeypatch):
    """The cooperative split: 2 CTAs per row wait on the row's arrival counter; with one row in flight
    (COOP_L2_BYTES = one row), a grid of 2 walks the 3 rows in 3 pipelined steps, each CTA waiting for the row
    of its previous step (the simulator runs the grid as one block, so the CTAs really do wait for each
    other)."""
    monkeypatch.setattr("normc.planner.COOP_L2_BYTES", 600 * np.dtype(np_dtype(dtype)).itemsize)
    _, _, _, plan = run_case(spec, make_x((3, 600), dtype), schedule="coop", expect=("inner", "coop"))
    assert (plan.splits, plan.grid) == (2, 2)
    assert plan.workspace_floats == 3 * 3 * 2 + 3  # partials, then one counter per row


def test_group_norm_nchw_inner():
    run_case(_spec(GN, g=3), make_x((2, 6, 3, 3), "float32"), expect=("inner", "persistent"))


@pytest.mark.parametrize("schedule", [None, "split"])
def test_batch_stats_nchw_inner_noncontiguous_reduction(schedule):
    # reduction over n and (h w): two runs per kept channel, 256 B apart from the next channel's
    want = "persistent" if schedule is None else schedule
    run_case(BN, make_x((2, 2, 8, 8), "float32"), schedule=schedule, expect=("inner", want))


def test_batch_stats_nchw_short_planes_mixed():
    # (h w) = 10 floats = 40 B < MIXED_MAX_RUN_BYTES inside the contiguous c axis: the planner picks mixed
    run_case(BN, make_x((3, 4, 2, 5), "float32"), expect=("mixed", "persistent"))


def test_instance_norm_1d():
    run_case(IN1, make_x((2, 3, 11), "float16"), expect=("inner", "persistent"))


# ----------------------------------------------------------------------------------------------------
# outer


@pytest.mark.parametrize("schedule", [None, "looped", "split"])
def test_outer_instance_nhwc(schedule):
    want = "persistent" if schedule is None else schedule
    x = make_x((2, 3, 5, 6), "float32", perm=NHWC)
    assert x.strides[1] == 4  # c contiguous
    run_case(IN2, x, schedule=schedule, expect=("outer", want))


@pytest.mark.parametrize("schedule", [None, "split"])
def test_outer_batch_stats_nhwc(schedule):
    want = "persistent" if schedule is None else schedule
    run_case(BN, make_x((2, 8, 3, 3), "float32", perm=NHWC), schedule=schedule, expect=("outer", want))


@pytest.mark.parametrize("shape,dtype", [((1, 8, 8, 16), "bfloat16"), ((1, 3, 20, 20), "float32")])
def test_outer_split_many_rows(shape, dtype):
    # long columns (128 / 400 rows): split CTAs each loop over several rows, partials merged afterwards
    x = make_x(shape, dtype, perm=NHWC)
    _, _, _, plan = run_case(IN2, x, schedule="split", expect=("outer", "split"))
    assert plan.splits >= 2


def test_outer_split_finish_splits():
    # 256 rows of 128 channels over 4 splits: the normalize kernel runs 2 CTAs per split (Plan.finish_splits),
    # each re-reading half of its split's rows; y and the statistics still match float64
    x = make_x((1, 128, 16, 16), "float32", perm=NHWC, loc=3.0)
    _, _, _, plan = run_case(IN2, x, schedule="split", expect=("outer", "split"))
    assert (plan.splits, plan.finish_splits) == (4, 2)


def test_outer_instance_norm_3d_ndhwc():
    run_case(IN3, make_x((1, 2, 3, 4, 5), "float16", perm=[0, 2, 3, 4, 1]), expect=("outer", "persistent"))


# ----------------------------------------------------------------------------------------------------
# mixed: NHWC group norm


@pytest.mark.parametrize("schedule", [None, "looped", "split"])
def test_mixed_group_norm_nhwc(schedule):
    want = "persistent" if schedule is None else schedule
    x = make_x((2, 6, 4, 4), "float32", perm=NHWC)
    _, _, _, plan = run_case(_spec(GN, g=2), x, schedule=schedule, expect=("mixed", want))
    assert plan.group == 3


def test_mixed_group_norm_nhwc_bf16():
    run_case(_spec(GN, g=2), make_x((2, 6, 4, 4), "bfloat16", perm=NHWC), expect=("mixed", "persistent"))


@pytest.mark.parametrize("text, shape, dtype, sizes, perm, schedule, strategy", [
    (GN, (2, 12, 4, 4), "float32", {"g": 2}, NHWC, None, "mixed"),
    (GN, (2, 12, 4, 4), "float32", {"g": 2}, NHWC, "looped", "mixed"),
    (GN, (2, 12, 4, 4), "float32", {"g": 2}, NHWC, "split", "mixed"),
    (GN, (2, 24, 3, 3), "float16", {"g": 2}, NHWC, None, "mixed"),
    (BN, (2, 6, 1, 5), "float32", {}, None, None, "mixed"),
    (IN2, (2, 3, 5, 6), "float32", {}, NHWC, None, "outer"),
    (IN2, (2, 3, 5, 6), "float32", {}, NHWC, "split", "outer"),
], ids=["mixed-persistent", "mixed-looped", "mixed-split", "mixed-f16", "mixed-nchw-batch-stats", "outer-persistent",
        "outer-split"])
@pytest.mark.parametrize("flags", [1, 0], ids=["default", "old-loops"])
def test_outer_column_if_and_mixed_two_pivots(text, shape, dtype, sizes, perm, schedule, strategy, flags,
                                              monkeypatch):
    """codegen.COLUMN_IF (column loops as ``if tid < T``) and codegen.MIXED_TWO_PIVOTS (two pivot loads per
    thread where a vector's columns straddle two groups: groups of 6, 12 and 5 columns against vectors of 4, 8
    and 2), the defaults since 2026-12-07, and the loops they replaced (both 0) keep y and the statistics equal
    to float64's, and each form is really in the kernels."""
    from normc.lowering import codegen, generate

    monkeypatch.setattr(codegen, "COLUMN_IF", flags)
    monkeypatch.setattr(codegen, "MIXED_TWO_PIVOTS", flags)
    x = make_x(shape, dtype, perm=perm, loc=2.0)
    want = "persistent" if schedule is None else schedule
    _, _, _, plan = run_case(_spec(text, **sizes), x, schedule=schedule, expect=(strategy, want))
    src = "\n".join(k.source for k in generate(plan))
    assert ("if tid < " in src) == bool(flags) and ("for lc in range" in src) == (not flags)
    if strategy == "mixed":
        assert plan.group % plan.vec != 0 and plan.vec <= plan.group
        assert ("pvlo" in src and "pvhi" in src) == bool(flags)


def test_outer_looped_reread_takes_the_plans_unroll(monkeypatch):
    """The outer looped kernel's re-read loop loads plan.per_thread rows a trip, as its statistics loop does (the
    planner gives that schedule OUTER_LOOPED_UNROLL = 8 where it picks it; forced, LOOP_UNROLL): with 8, both
    loops step 8 x the y-threads, and y and the statistics stay equal to float64's."""
    from normc import planner
    from normc.lowering import codegen, generate

    monkeypatch.setattr(planner, "LOOP_UNROLL", 8)
    x = make_x((2, 3, 5, 6), "float32", perm=NHWC, loc=2.0)
    *_, plan = run_case(_spec(IN2), x, schedule="looped", expect=("outer", "looped"))
    assert plan.per_thread == 8 != codegen.LOOP_UNROLL
    (k,) = generate(plan)
    assert k.source.count(f"for base in range(r0 + ry, r1, {8 * plan.ry}):") == 2


def test_outer_persistent_keeps_nan_to_its_column():
    """An Inf in a column of the persistent outer kernel (registers, two rounds of column sums) makes that
    column's statistics and y NaN and leaves the other columns finite."""
    x = make_x((2, 3, 5, 6), "float32", perm=NHWC)
    x[0, 1, 2, 3] = np.inf
    f = normc.compile(IN2)
    y, mean, rstd = f(x, np.ones(3, np.float32), np.zeros(3, np.float32), return_stats=True)
    assert (only_plan(f).strategy, only_plan(f).schedule) == ("outer", "persistent")
    assert np.isnan(rstd[0, 1]) and np.isnan(y[0, 1]).all()
    assert np.isfinite(rstd[0, 0]) and np.isfinite(rstd[1]).all() and np.isfinite(y[1]).all()


# ----------------------------------------------------------------------------------------------------
# edge extents and strides


def test_reduce_every_axis():
    _, mean, rstd, _ = run_case("t d : norm over t d", make_x((3, 5), "float32"), params=None)
    assert mean.shape == () and rstd.shape == ()


def test_reduction_extent_one():
    # every row is its own mean: y == shift
    x = make_x((4, 1), "float32")
    sc, sh = make_param(1, "float32", np.random.default_rng(4)), make_param(1, "float32")
    y, mean, rstd, _ = run_case(LN, x, scale=sc, shift=sh, params=None)
    np.testing.assert_array_equal(mean, x[:, 0])
    np.testing.assert_allclose(rstd, 1 / np.sqrt(1e-5), rtol=1e-6)
    # y == shift up to the rounding of x * rstd * scale (rstd = 1/sqrt(eps) ~ 316 amplifies it)
    np.testing.assert_allclose(y, np.broadcast_to(sh, (4, 1)), atol=fold_atol(x, rstd, sc))


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (5, 13), (1, 31)])
def test_size_one_and_prime_extents(shape):
    run_case(LN, make_x(shape, "float32"))


def test_non_contiguous_view():
    base = make_x((3, 26), "float32")
    x = base[:, ::2]
    assert not x.flags.c_contiguous
    _, _, _, plan = run_case(LN, x)
    assert plan.vec == 1


def test_transposed_layer_norm_input():
    x = make_x((9, 4), "float32").T  # logical (4, 9), d strided, t contiguous
    run_case("t d : norm over d", x, params=None, expect=("outer", "persistent"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_odd_offset_view(dtype):
    base = make_x((3, 17), dtype)
    x = base[:, 1:]  # base pointer one element past an aligned boundary
    run_case(LN, x)


@pytest.mark.parametrize("pdtype", ["float32", "bfloat16"])
def test_params_of_another_dtype(pdtype):
    _, _, _, plan = run_case(LN, make_x((3, 16), "float16"), pdtype=pdtype)
    assert plan.scale_dtype == pdtype and plan.shift_dtype == pdtype


# ----------------------------------------------------------------------------------------------------
# value distributions


def test_large_mean_small_spread():
    x = make_x((3, 48), "float32", loc=1e4, std=1.0)
    rng = np.random.default_rng(3)
    sc, sh = _params(normc.spec(LN), x.shape, "float32", rng)
    f = normc.compile(LN)
    y, mean, rstd = f(x, sc, sh, return_stats=True)
    ry, rm, rr = reference(LN, x, sc, sh)
    assert rel_err(y, ry) <= 1e-3
    assert rel_err(mean, rm) <= STAT_TOL
    assert np.max(np.abs(rstd - rr) / rr) <= 1e-2  # rstd ~ 1: catastrophic cancellation would show here


@pytest.mark.parametrize("layout", ["inner", "outer"])
def test_constant_rows_give_shift(layout):
    if layout == "inner":
        spec, x = LN, make_x((3, 20), "float32", values=np.full((3, 20), 3.25))
    else:
        spec, x = IN2, make_x((2, 3, 2, 2), "float32", perm=NHWC, values=np.full((2, 3, 2, 2), -7.5))
    spec = normc.spec(spec)
    sc, sh = _params(spec, x.shape, "float32", np.random.default_rng(5))
    y, mean, rstd = normc.compile(spec)(x, sc, sh, return_stats=True)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(rstd))
    _, rm, rr = reference(spec, x, sc, sh)
    check_stats(mean, rstd, rm, rr)
    want = np.broadcast_to(sh.reshape((1, -1) if layout == "inner" else (1, -1, 1, 1)), x.shape)
    # the kernels apply (x - mean) * a + shift: a constant row gives shift to float32 rounding
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-6)


def test_float16_near_max():
    rng = np.random.default_rng(11)
    vals = rng.uniform(-60000, 60000, size=(3, 24))
    x = make_x((3, 24), "float16", values=vals)
    y, _, _, _ = run_case(LN, x)
    assert np.all(np.isfinite(y.astype(np.float32)))


# ----------------------------------------------------------------------------------------------------
# out=, empty, stats


def test_out_argument():
    x = make_x((3, 12), "float32")
    sc, sh = _params(normc.spec(LN), x.shape, "float32", np.random.default_rng(2))
    out = np.full_like(x, np.nan)
    f = normc.compile(LN)
    y, mean, rstd = f(x, sc, sh, out=out, return_stats=True)
    assert y is out
    ry, rm, rr = reference(LN, x, sc, sh)
    check_y(out, ry, "float32")
    check_stats(mean, rstd, rm, rr)


def test_out_in_place():
    x = make_x((3, 12), "float32")
    x0 = x.copy()
    sc, sh = _params(normc.spec(LN), x.shape, "float32", np.random.default_rng(2))
    y = normc.compile(LN)(x, sc, sh, out=x)
    assert y is x
    check_y(x, reference(LN, x0, sc, sh)[0], "float32")


def test_out_in_place_outer():
    x = make_x((2, 3, 2, 3), "float32", perm=NHWC)
    x0 = x.copy()
    sc, sh = _params(normc.spec(IN2), x.shape, "float32", np.random.default_rng(2))
    normc.compile(IN2)(x, sc, sh, out=x)
    check_y(x, reference(IN2, x0, sc, sh)[0], "float32")


def test_out_other_layout():
    # out in another memory order than x: values land by logical index
    x = make_x((2, 3, 2, 3), "float32")
    out = make_x((2, 3, 2, 3), "float32", perm=NHWC)
    sc, sh = _params(normc.spec(IN2), x.shape, "float32", np.random.default_rng(2))
    normc.compile(IN2)(x, sc, sh, out=out)
    check_y(out, reference(IN2, x, sc, sh)[0], "float32")


def test_broadcast_x_zero_strides():
    # a read-only broadcast view (zero strides) is a valid input; every row is the same
    row = make_x((1, 12), "float32")
    x = np.broadcast_to(row, (3, 12))
    y, _, _, _ = run_case(LN, x)
    assert y.flags.writeable and np.all(y == y[:1])


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
def test_out_dtype(out_dtype):
    x = make_x((3, 16), "float32")
    sc, sh = _params(normc.spec(LN), x.shape, "float32", np.random.default_rng(2))
    y, mean, rstd = normc.compile(LN, out_dtype=out_dtype)(x, sc, sh, return_stats=True)
    assert y.dtype == np_dtype(out_dtype)
    ry, rm, rr = reference(LN, x, sc, sh)
    check_y(y, ry, out_dtype)
    check_stats(mean, rstd, rm, rr)


def test_zero_size():
    x = np.empty((0, 8), np.float32)
    f = normc.compile(LN)
    y = f(x, np.ones(8, np.float32), np.zeros(8, np.float32))
    assert y.shape == (0, 8) and y.dtype == np.float32
    y, mean, rstd = f(x, np.ones(8, np.float32), np.zeros(8, np.float32), return_stats=True)
    assert y.shape == (0, 8) and mean.shape == (0,) and rstd.shape == (0,)
    assert mean.dtype == np.float32


def test_return_stats_shapes_group_norm():
    spec = _spec(GN, g=3)
    x = make_x((2, 6, 2, 2), "float32")
    _, mean, rstd, _ = run_case(spec, x)
    assert mean.shape == (2, 3) and rstd.shape == (2, 3)


def test_cached_entry_reused():
    f = normc.compile(LN)
    x = make_x((2, 8), "float32")
    sc, sh = np.ones(8, np.float32), np.zeros(8, np.float32)
    y1 = f(x, sc, sh)
    x2 = make_x((2, 8), "float32", rng=np.random.default_rng(9))
    y2 = f(x2, sc, sh)
    assert len(f._table) == 1
    check_y(y1, reference(LN, x, sc, sh)[0], "float32")
    check_y(y2, reference(LN, x2, sc, sh)[0], "float32")


# ----------------------------------------------------------------------------------------------------
# property test: random family, extents, dtype, memory order and values

EXT = st.sampled_from([1, 2, 3, 5, 7, 8])


@st.composite
def problems(draw):
    family = draw(st.sampled_from(["layer", "rms", "instance", "group", "batch"]))
    g = 1
    if family in ("layer", "rms"):
        nd = draw(st.integers(2, 3))
        spec = (normc.layer_norm if family == "layer" else normc.rms_norm)(nd, draw(st.integers(1, nd - 1)))
        ext = [draw(EXT) for _ in range(nd)]
    elif family == "group":
        g = draw(st.sampled_from([1, 2, 3]))
        sp = draw(st.integers(1, 2))
        spec = normc.group_norm(g, sp)
        ext = [draw(EXT) for _ in range(2 + sp)]  # ext[1] is k; the channel dim is g * k
    else:
        sp = draw(st.integers(1, 3 if family == "instance" else 2))
        spec = (normc.instance_norm if family == "instance" else normc.batch_norm_stats)(sp)
        ext = [draw(EXT) for _ in range(2 + sp)]
    # keep the simulator fast: at most ~600 elements (shrink the largest extent until it fits)
    while math.prod(ext) * g > 600:
        i = max(range(len(ext)), key=lambda j: ext[j])
        ext[i] = max(1, ext[i] // 2)
    shape = tuple(e * g if (family == "group" and i == 1) else e for i, e in enumerate(ext))
    perm = list(draw(st.permutations(range(len(shape)))))
    if family in ("group", "batch") and draw(st.booleans()):
        perm = [0] + list(range(2, len(shape))) + [1]  # channels last (NHWC): outer/mixed strategies
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    dist = draw(st.sampled_from(["normal", "normal", "large_mean"]))
    seed = draw(st.integers(0, 2**16))
    return family, spec, shape, list(perm), dtype, dist, seed


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problems())
def test_property_against_reference(prob):
    family, spec, shape, perm, dtype, dist, seed = prob
    rng = np.random.default_rng(seed)
    loc, std = (0.0, 1.0) if dist == "normal" else (300.0, 0.5)
    x = make_x(shape, dtype, perm=perm, rng=rng, loc=loc, std=std)
    sc, sh = _params(spec, shape, dtype, rng)
    f = normc.compile(spec)
    y, mean, rstd = f(x, sc, sh, return_stats=True)
    plan = only_plan(f)
    ry, rm, rr = reference(spec, x, sc, sh)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert memory_order(y) == memory_order(x)
    # the reference sees the same (half-rounded) x; float32 statistics stay accurate for large means
    check_y(y, ry, dtype, atol=fold_atol(x, rr, sc))
    check_stats(mean, rstd, rm, rr)
    assert plan.strategy in ("inner", "outer", "mixed")


@pytest.mark.parametrize("layout", ["inner", "outer"])
def test_nan_stays_in_its_row(layout):
    """A NaN makes its own reduction NaN, like the reference, and leaves every other one finite."""
    rng = np.random.default_rng(21)
    if layout == "inner":
        spec = normc.spec(LN)
        x = make_x((3, 8), "float32", rng=rng)
        x[1, 5] = np.nan
        bad = (slice(1, 2), slice(None))
    else:
        spec = normc.spec(IN2)
        x = make_x((2, 3, 2, 2), "float32", perm=NHWC, rng=rng)
        x[1, 2, 0, 1] = np.nan
        bad = (slice(1, 2), slice(2, 3))
    sc, sh = _params(spec, x.shape, "float32", rng)
    y, mean, rstd = normc.compile(spec)(x, sc, sh, return_stats=True)
    ry, rm, rr = reference(spec, x, sc, sh)
    nan_y = np.isnan(y)
    assert np.array_equal(nan_y, np.isnan(ry))
    assert nan_y[bad].all() and np.isnan(mean[bad[:mean.ndim]]).all()
    np.testing.assert_allclose(y[~nan_y], ry[~nan_y], rtol=0, atol=2e-5 * max(1.0, np.nanmax(np.abs(ry))))


# ----------------------------------------------------------------------------------------------------
# thread-block clusters: a reduction spread over the CTAs of a cluster, partials merged through
# distributed shared memory (on the simulator a cluster runs as one block; see normc.lowering.sim)


@pytest.fixture(params=[2, 4], ids=["cluster2", "cluster4"])
def cluster_size(request, monkeypatch):
    from normc import planner

    monkeypatch.setattr(planner, "CLUSTER_SIZES", (request.param,))
    return request.param


@pytest.mark.parametrize("spec,shape,dtype", [
    (LN, (3, 200), "float32"),
    (LN, (2, 72), "bfloat16"),  # 9 vectors of 8: the last CTA of the cluster holds fewer
    (RMS, (2, 130), "float16"),
    (IN2, (2, 3, 5, 7), "float32"),
], ids=["layer", "layer-bf16-ragged", "rms", "instance-nchw"])
def test_inner_cluster(spec, shape, dtype, cluster_size):
    _, _, _, plan = run_case(spec, make_x(shape, dtype), schedule="cluster", expect=("inner", "persistent"))
    assert plan.cluster == cluster_size and plan.grid == plan.kept * cluster_size


@pytest.mark.parametrize("spec,shape,dtype", [
    (LN, (2, 1031), "float32"),
    (RMS, (3, 2049), "bfloat16"),
    (ROW_SCALE, (2, 1030), "float16"),
], ids=["layer", "rms-bf16", "row-scale-f16"])
def test_inner_cluster_peeled_rows(spec, shape, dtype, cluster_size):
    """Odd rows held over a cluster: peeled (vectors from each row's first 16-byte boundary, the edges held as
    single values by the first CTA's first thread), as 4 x 400,001 float32 is planned."""
    _, _, _, plan = run_case(spec, make_x(shape, dtype), schedule="cluster", expect=("inner", "persistent"))
    assert plan.cluster == cluster_size and plan.peel and plan.vec == 16 // np.dtype(np_dtype(dtype)).itemsize


@pytest.mark.parametrize("spec,shape,dtype,splits", [
    (LN, (2, 1031), "float32", 2),  # peeled: 257 whole vectors
    (RMS, (1, 2053), "float16", 4),
    (ROW_SCALE, (2, 263), "bfloat16", 2),  # scaled statistics, one vector per thread
    (LN, (2, 700), "float32", 2),  # aligned rows, not peeled
    (IN2, (1, 2, 16, 33), "float16", 2),  # instance norm: 528 values per (n, c)
], ids=["layer", "rms-f16", "row-scale-bf16", "layer-aligned", "instance-nchw"])
def test_inner_grid_persistent(spec, shape, dtype, splits):
    """Rows held in registers over CTAs of a co-resident grid (forced "grid"): each CTA's partial sums go through
    the workspace, every CTA waits on its row's counter (the simulator runs the cooperative grid as one block,
    so they really wait for each other) and sums them in the same order; y and the statistics against float64."""
    _, _, _, plan = run_case(spec, make_x(shape, dtype), schedule="grid", expect=("inner", "persistent"))
    assert (plan.splits, plan.cluster, plan.grid) == (splits, 1, plan.kept * splits), plan.describe()
    assert plan.workspace_floats == 3 * plan.kept * splits + plan.kept


def test_inner_grid_persistent_inf_and_huge_values():
    """Over a co-resident grid, as on one CTA: an Inf in an RMS row gives rstd 0 and one NaN (the merge's unused
    lanes select zeros rather than multiply a clamped Inf slot by 0), and a row of values near 1e18 (d^2 n of
    the Chan merge beyond float32, against an empty side) keeps its float64 rstd."""
    x = np.random.default_rng(0).standard_normal((2, 700)).astype(np.float32)
    x[0, 690] = np.inf
    f = normc.compile(RMS, schedule="grid")
    y, _, r = f(x, np.ones(700, np.float32), return_stats=True)
    assert only_plan(f).splits > 1
    assert r[0] == 0 and np.isnan(y[0]).sum() == 1 and np.isfinite(y[1]).all()
    x = (1e18 * (1 + np.random.default_rng(1).standard_normal((1, 2000)) * 1e-3)).astype(np.float32)
    x[0, 0] = 0
    f = normc.compile(_spec(LN), schedule="grid")
    _, _, r = f(x, np.ones(2000, np.float32), np.zeros(2000, np.float32), return_stats=True)
    assert only_plan(f).splits > 1
    want = 1 / np.sqrt(x.astype(np.float64).var() + 1e-5)
    assert abs(r[0] / want - 1) < 1e-4, (r[0], want)


@pytest.mark.parametrize("spec,shape,dtype", [
    (LN, (3, 1031), "float32"),
    (LN, (4, 777), "float16"),
    (RMS, (3, 517), "float16"),
    (ROW_SCALE, (4, 263), "bfloat16"),
    (LN, (5, 131), "float32"),  # 32 vectors a row: 8 threads per row, 32 rows per CTA (5 of them real)
], ids=["layer", "layer-f16", "rms-f16", "row-scale-bf16", "rows-share-a-cta"])
def test_inner_persistent_peeled_rows(spec, shape, dtype):
    """Rows held in registers whose length is not a multiple of the 16-byte vector: peeled where a row has at
    least PEEL_PERSISTENT_MIN_VECTORS whole vectors (rows start at varying alignments: the rows of each case
    start at every offset within a vector), y and the statistics against float64."""
    _, _, _, plan = run_case(spec, make_x(shape, dtype), expect=("inner", "persistent"))
    assert plan.peel and plan.vec == 16 // np.dtype(np_dtype(dtype)).itemsize and plan.cluster == 1


def test_short_odd_rows_held_in_registers_are_not_peeled():
    """Below PEEL_PERSISTENT_MIN_VECTORS whole vectors a persistent row keeps its narrower aligned accesses."""
    _, _, _, plan = run_case(LN, make_x((3, 127), "float32"), expect=("inner", "persistent"))
    assert not plan.peel and plan.vec == 1


@pytest.mark.parametrize("spec,shape,dtype,g", [
    (IN2, (2, 8, 5, 5), "float32", None),
    (BN, (3, 4, 3, 3), "float16", None),
    (GN, (2, 8, 4, 4), "float32", 2),
], ids=["instance-nhwc", "batch-nhwc", "group-nhwc"])
def test_outer_cluster(spec, shape, dtype, g, cluster_size):
    spec = _spec(spec, g=g) if g else spec
    want = "mixed" if g else "outer"
    _, _, _, plan = run_case(spec, make_x(shape, dtype, perm=NHWC), schedule="cluster", expect=(want, "persistent"))
    assert plan.cluster == cluster_size


def test_mixed_group_norm_nhwc_tiled_by_groups():
    # 32 groups of 2 channels (float32: 8 B runs, 256 B per pixel): a tile holds 16 whole groups (128 B),
    # two tiles per image
    spec = _spec(GN, g=32)
    _, _, _, plan = run_case(spec, make_x((2, 64, 3, 3), "float32", perm=NHWC), expect=("mixed", "persistent"))
    assert plan.tile % plan.group == 0 and plan.tile == 32 and plan.grid == 4
