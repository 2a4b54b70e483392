"""Numerical robustness of every strategy x schedule on Numba's CUDA simulator, against a float64 reference.

The failure modes of normalization kernels in the wild (issue 5, part 1), one test each, over every
(strategy, schedule) pair the planner can produce: rows whose mean is large next to their spread
(catastrophic cancellation, negative variance), constant rows, eps = 0, float16/bfloat16 inputs near their
largest finite value (squares that overflow; bfloat16 statistics are scaled by a power of two, see
lowering/codegen.py SCALED_DTYPES), reductions of one element and over every axis, and NaN/+-Inf
propagation row by row. The contract tested here is the one docs/accuracy.md states.

Shapes are tiny (each simulated CUDA thread is a Python thread); the GPU versions of the large cases (25M
elements per row, > 2**31 elements) are in tests/test_gpu_reliability.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import normc
from conftest import check_stats, check_y, fold_atol, make_param, make_x, reference, rel_err

LN = "t d : norm over d ; scale d ; shift d"
IN2 = "n c h w : norm over h w ; scale c ; shift c"
GN = "n (g k) h w : norm over k h w ; scale g k ; shift g k"
NHWC = [0, 2, 3, 1]

# (spec text, spec sizes, shape, memory order, forced schedule) for each strategy/schedule. inner: layer norm
# rows; outer: channels-last instance norm; mixed: channels-last group norm. Forced looped/split schedules
# stream with 512-thread CTAs (slow on the simulator), so those rows are short.
CASES = {
    "inner-persistent": (LN, {}, (3, 24), None, None),
    "inner-staged": (LN, {}, (37, 6), None, "staged"),
    "inner-looped": (LN, {}, (1, 64), None, "looped"),
    "inner-split": (LN, {}, (1, 64), None, "split"),
    "outer-persistent": (IN2, {}, (2, 4, 3, 4), NHWC, None),
    "outer-looped": (IN2, {}, (2, 4, 3, 4), NHWC, "looped"),
    "outer-split": (IN2, {}, (2, 4, 4, 4), NHWC, "split"),
    "mixed-persistent": (GN, {"g": 2}, (2, 6, 3, 3), NHWC, None),
    "mixed-looped": (GN, {"g": 2}, (2, 6, 3, 3), NHWC, "looped"),
    "mixed-split": (GN, {"g": 2}, (2, 6, 4, 4), NHWC, "split"),
}
NAMES = list(CASES)
# Persistent schedules over a thread-block cluster (CTAs' partials merged through distributed shared memory;
# on the simulator a cluster runs as one block), for the tests of code that cluster kernels change.
CLUSTER_CASES = {
    "inner-cluster": (LN, {}, (2, 72), None, "cluster"),
    "outer-cluster": (IN2, {}, (2, 8, 5, 5), NHWC, "cluster"),
    "mixed-cluster": (GN, {"g": 2}, (2, 8, 4, 4), NHWC, "cluster"),
}
# inner-split streams 2 x 512-thread CTAs (~5 s a run on the simulator): it runs in the tests where the
# split merge is what could break (large/huge means, constants, NaN/Inf, one-element reductions).
NAMES_NO_INNER_SPLIT = [n for n in NAMES if n != "inner-split"]

# Longer outer/mixed reductions (more y-threads whose partials are merged) for the large-mean test.
LARGE_MEAN_SHAPES = {
    "inner-staged": (257, 3),  # three values a row: without the pivot, y was off by 1.3e-2 of max|y|
    "outer-persistent": (1, 4, 16, 16), "outer-looped": (1, 8, 12, 12), "outer-split": (1, 8, 12, 12),
    "mixed-persistent": (1, 4, 12, 12), "mixed-looped": (1, 4, 12, 12), "mixed-split": (1, 4, 12, 12),
}


# Known limits (docs/accuracy.md, "Known limits"); the strict xfails turn into failures once fixed.
FLOAT32_SQUARE_LIMIT = (
    "float32 inputs are not scaled (lowering/codegen.py SCALED_DTYPES: it would cost registers): squares of "
    "x - pivot above FLT_MAX (|x - pivot| > 1.8e19) overflow the variance: that reduction's y and rstd are NaN"
)
SMALL_PIVOT_LIMIT = (
    "the scale comes from the reduction's first value (its pivot): a pivot far smaller than the other values "
    "(here 1.0 before values near 3e38) leaves scl = 1, and their squares overflow as unscaled (y, rstd NaN)"
)


def case(name):
    """(spec text, sizes, shape, memory order, schedule) of case ``name`` (CASES or CLUSTER_CASES)."""
    return CASES[name] if name in CASES else CLUSTER_CASES[name]


def per_reduction(name, shape, fill):
    """Values of ``shape`` for case ``name`` where reduction number i holds ``fill(i, n)`` (n: its size)."""
    text, sizes, _, _, _ = case(name)
    spec = normc.spec(text, **sizes)
    ax = spec.axis_sizes(shape)
    full = [ax[a] for a in spec.axes]
    kept_pos = [i for i, a in enumerate(spec.axes) if a in spec.kept]
    red_n = math.prod(ax[a] for a in spec.reduced)
    v = np.empty(full)
    for j, idx in enumerate(np.ndindex(*[full[i] for i in kept_pos])):
        sl = [slice(None)] * len(full)
        for i, k in zip(kept_pos, idx):
            sl[i] = k
        v[tuple(sl)] = np.asarray(fill(j, red_n)).reshape(v[tuple(sl)].shape)
    return v.reshape(shape)


def run(name, *, values=None, loc=0.0, std=1.0, dtype="float32", eps=None, shape=None, seed=0, f=None,
        stat="norm"):
    """Run case ``name`` on x ~ normal(loc, std) (or ``values``): returns (x, scale, shift, y, mean, rstd,
    ref_y, ref_mean, ref_rstd, f). Checks the plan is the one the case names. ``stat="rms"`` runs the
    case's spec with ``rms`` in place of ``norm`` (same reductions, scale and shift)."""
    text, sizes, shp, perm, sched = case(name)
    text = text.replace("norm over", f"{stat} over")
    shape = shp if shape is None else shape
    spec = normc.spec(text, **sizes) if eps is None else normc.spec(text, eps=eps, **sizes)
    rng = np.random.default_rng(seed)
    x = make_x(shape, dtype, perm=perm, rng=rng, loc=loc, std=std, values=values)
    ax = spec.axis_sizes(shape)
    sc = make_param(math.prod(ax[a] for a in spec.scale), dtype, rng, loc=1.0, std=0.5)
    sh = make_param(math.prod(ax[a] for a in spec.shift), dtype, rng)
    f = normc.compile(spec, schedule=sched) if f is None else f
    y, mean, rstd = f(x, sc, sh, return_stats=True)
    if len(f._table) == 1:
        plan = next(iter(f._table.values())).plan
        if name in CASES:
            assert f"{plan.strategy}-{plan.schedule}" == name, plan.describe()
        else:
            assert f"{plan.strategy}-cluster" == name and plan.cluster > 1, plan.describe()
    ry, rm, rr = reference(spec, x, sc, sh)
    return x, sc, sh, y, mean, rstd, ry, rm, rr, f


# ----------------------------------------------------------------------------------------------------
# Large means: no cancellation, no negative variance


@pytest.mark.parametrize("name", NAMES)
def test_large_mean_1e4_accurate(name):
    """mean = 1e4 x std (float32): y within 1e-3 of max|y|, mean within 1e-6 relative, rstd within 1%."""
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, loc=1e4, std=1.0, shape=LARGE_MEAN_SHAPES.get(name),
                                                  seed=1)
    assert rel_err(y, ry) <= 1e-3, f"y rel err {rel_err(y, ry):.3g}"
    assert np.max(np.abs(mean - rm) / np.abs(rm)) <= 1e-6
    assert np.max(np.abs(rstd - rr) / rr) <= 1e-2


# Hypothesis draws from the cheap cases (every strategy; inner-split costs ~5 s a run on the simulator and
# is covered by the parametrized tests).
CHEAP = [n for n in NAMES if n != "inner-split"]


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(CHEAP), log_ratio=st.floats(0.0, 4.0), seed=st.integers(0, 2**16),
       sign=st.sampled_from([1.0, -1.0]), std=st.sampled_from([1e-3, 1.0, 50.0]))
def test_large_mean_property(name, log_ratio, seed, sign, std):
    loc = sign * std * 10.0**log_ratio
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, loc=loc, std=std, seed=seed)
    assert rel_err(y, ry) <= 1e-3, f"y rel err {rel_err(y, ry):.3g} at mean/std = {loc / std:.3g}"
    assert np.max(np.abs(rstd - rr) / rr) <= 1e-2


@pytest.mark.parametrize("name", NAMES)
def test_huge_ratio_never_nan_inf_or_negative_variance(name):
    """mean/std up to 1e7 (each reduction its own ratio: 1e7, -1e5, 1e6, -1e7, ...): the variance may lose
    all its digits but never goes negative (rstd finite, positive, <= 1/sqrt(eps)), nothing turns NaN or
    Inf, and the mean stays within 1e-6 relative."""
    rng = np.random.default_rng(12)
    locs = (1e7, -1e5, 1e6, -1e7, 3e5, -3e6)
    vals = per_reduction(name, CASES[name][2], lambda i, n: locs[i % len(locs)] + rng.normal(size=n))
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=vals)
    assert np.all(np.isfinite(y))
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(rstd))
    assert np.all(rstd > 0) and np.all(rstd <= (1 / math.sqrt(1e-5)) * (1 + 1e-6))
    assert np.max(np.abs(mean - rm) / np.abs(rm)) <= 1e-6


# ----------------------------------------------------------------------------------------------------
# Constant rows and eps


@pytest.mark.parametrize("name", NAMES)
def test_constant_rows_give_shift(name):
    """Constant reductions (each its own constant: -1e4, 0.1, 3.25, 6e4, ...) with eps > 0: mean = the
    constant, rstd = 1/sqrt(eps), y = shift, all finite."""
    consts = (-1e4, 0.1, 3.25, 6e4, -7.5, 1e-3)
    vals = per_reduction(name, CASES[name][2], lambda i, n: np.full(n, consts[i % len(consts)]))
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=vals)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(rstd))
    np.testing.assert_allclose(mean, rm, rtol=1e-6)
    np.testing.assert_allclose(rstd, rr, rtol=1e-5)
    # y == shift (ry) up to the float32 mean's rounding: exactly when the row's float32 mean is exact (-1e4,
    # 3.25, ...), else (0.1) within a few ulps of the constant times rstd = 1/sqrt(eps) times |scale|
    # (docs/accuracy.md); the kernels subtract the mean before scaling, so there is no other cancellation.
    atol = 1e-6 * max(1.0, float(np.abs(ry).max())) + 8 * 2.0**-24 * np.abs(x) / math.sqrt(1e-5) * np.abs(sc).max()
    assert np.all(np.abs(y - ry) <= atol), float(np.max(np.abs(y - ry) - atol))
    exact = np.isin(x, [-1e4, 3.25, 6e4, -7.5])
    np.testing.assert_array_equal(y[exact], ry[exact].astype(np.float32))


@pytest.mark.parametrize("name", NAMES_NO_INNER_SPLIT)
def test_eps_zero_non_constant_rows(name):
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, eps=0.0, seed=5)
    assert np.all(np.isfinite(y))
    check_y(y, ry, "float32")
    assert np.max(np.abs(rstd - rr) / rr) <= 1e-4
    # the mean is near 0 next to the pivot (pivoted schemes round it to a few ulps of the pivot): 1e-4 std
    assert np.max(np.abs(mean - rm) * rr) <= 1e-4


def test_eps_zero_constant_row_is_nan_like_the_reference():
    """eps = 0 and a constant row: 0/0 in the mathematics; rstd = inf and y = NaN, only in that row."""
    v = np.random.default_rng(2).normal(size=(3, 24))
    v[1] = 2.5
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run("inner-persistent", values=v, eps=0.0)
    assert np.isinf(rstd[1]) and np.all(np.isnan(y[1]))
    assert np.all(np.isfinite(y[[0, 2]]))
    check_y(y[[0, 2]], ry[[0, 2]], "float32")


# ----------------------------------------------------------------------------------------------------
# Half precision near its maximum


HALF_MAX = {"float16": 65504.0, "bfloat16": float(np.finfo(np.dtype("float32")).max) * (1 - 2**-8)}


@pytest.mark.parametrize("name", NAMES_NO_INNER_SPLIT)
def test_float16_near_max(name):
    """|x| up to 0.95 * 65504: squares (up to 4.3e9 each) fit float32; y accurate, stats finite."""
    shape = CASES[name][2]
    vals = np.random.default_rng(1).uniform(-0.95, 0.95, size=shape) * HALF_MAX["float16"]
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=vals, dtype="float16")
    assert np.all(np.isfinite(y.astype(np.float32)))
    check_y(y, ry, "float16")
    check_stats(mean, rstd, rm, rr)


def test_float16_near_max_rms_and_constant():
    """rms sums x^2 (65504^2 * n stays finite in float32); a constant row of 65504 gives shift."""
    spec = normc.spec("t d : rms over d ; scale d", eps=1e-6)
    x = make_x((3, 40), "float16", values=np.full((3, 40), 65504.0))
    x[1] = -65504.0
    sc = make_param(40, "float16", np.random.default_rng(0), loc=1.0, std=0.5)
    y, mean, rstd = normc.compile(spec)(x, sc, return_stats=True)
    ry, rm, rr = reference(spec, x, sc)
    assert np.all(np.isfinite(y.astype(np.float32)))
    check_y(y, ry, "float16")
    check_stats(mean, rstd, rm, rr)


def check_near_max_stats(x, mean, rstd, rm, rr):
    """mean within 1e-5 of max|x| (its float32 sums round at ~2^-24 of the values, not of the mean, which
    may cancel to ~0), rstd within 1e-4 relative (rstd ~ 1/3e38 is a float32 subnormal: ~22 bits)."""
    assert mean.dtype == np.float32 and rstd.dtype == np.float32
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(rstd)) and np.all(rstd > 0)
    xmax = float(np.max(np.abs(x.astype(np.float64))))
    assert np.max(np.abs(mean - rm)) <= 1e-5 * xmax, float(np.max(np.abs(mean - rm)) / xmax)
    assert np.max(np.abs(rstd - rr) / rr) <= 1e-4, float(np.max(np.abs(rstd - rr) / rr))


# norm: every strategy x schedule. rms: one case per code path its scaling touches (inner: the persistent
# sum and the streaming loop, which inner-split shares; outer: persistent, the streaming loop, the split
# schedule's per-column merge; mixed: persistent and the per-group merge, which mixed-split shares), to keep
# the simulator time down (a split or outer cluster case costs 10-20 s).
RMS_NEAR_MAX = ["inner-persistent", "inner-looped", "outer-persistent", "outer-looped", "outer-split",
                "mixed-persistent", "mixed-looped", "inner-cluster"]
# bfloat16 never plans the staged schedule (its statistics are scaled; the staged kernel does not scale)
NEAR_MAX = ([(n, "norm") for n in NAMES + list(CLUSTER_CASES) if n != "inner-staged"]
            + [(n, "rms") for n in RMS_NEAR_MAX])


@pytest.mark.parametrize("name,stat", NEAR_MAX, ids=[f"{n}-{s}" for n, s in NEAR_MAX])
def test_bfloat16_near_max(name, stat):
    """|x| up to 0.95 * 3.39e38 in bfloat16 (squares up to 1e77, far past float32): the reference is finite
    (float64); so is normc, and accurate. Statistics accumulate x * scl - pivot * scl with scl a power of
    two picked from |pivot| (2^-96 here), so float32 holds them; rms scales its squares the same way."""
    shape = case(name)[2]
    vals = np.random.default_rng(1).uniform(-0.95, 0.95, size=shape) * HALF_MAX["bfloat16"]
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=vals, dtype="bfloat16", stat=stat)
    assert np.all(np.isfinite(y.astype(np.float32)))
    check_y(y, ry, "bfloat16")
    check_near_max_stats(x, mean, rstd, rm, rr)


# One constant per reduction, across the scale steps: |c| >= 2^96 (scl = 2^-96: eps * scl^2 underflows),
# >= 2^64, >= 2^32, and < 2^32 (scl = 1, unscaled).
NEAR_MAX_CONSTANTS = (3.0e38, -2.5e38, 1.0e30, -7.0e20, 5.0e10, 3.25)
# each place a scaled rstd is finished: inner (all schedules), outer persistent, outer/mixed merged partials
# (outer-split's per-column merge runs the same code as outer-looped's), mixed persistent
CONSTANT_CASES = ["inner-persistent", "inner-looped", "outer-persistent", "outer-looped", "mixed-persistent",
                  "mixed-split"]


@pytest.mark.parametrize("name", CONSTANT_CASES)
def test_bfloat16_constant_rows_near_max(name):
    """Constant bfloat16 reductions up to 3e38 with eps > 0: y = shift exactly, mean = the constant exactly
    and rstd = 1/sqrt(eps) exactly (in float32), as for small constants: scaling must not turn eps * scl^2
    (which underflows for scl = 2^-96) into rstd = inf and y = 0 * inf = NaN."""
    vals = per_reduction(name, case(name)[2],
                         lambda i, n: np.full(n, NEAR_MAX_CONSTANTS[i % len(NEAR_MAX_CONSTANTS)]))
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=vals, dtype="bfloat16")
    np.testing.assert_array_equal(y.astype(np.float64), ry)
    np.testing.assert_array_equal(mean, rm.astype(np.float32))
    np.testing.assert_array_equal(rstd, np.full(rstd.shape, np.float32(1.0) / np.sqrt(np.float32(1e-5))))


@pytest.mark.xfail(strict=True, reason=FLOAT32_SQUARE_LIMIT)
def test_float32_near_max():
    vals = np.random.default_rng(1).uniform(-0.95, 0.95, size=CASES["inner-persistent"][2]) * 3.4e38
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run("inner-persistent", values=vals)
    check_y(y, ry, "float32")
    check_near_max_stats(x, mean, rstd, rm, rr)


@pytest.mark.xfail(strict=True, reason=SMALL_PIVOT_LIMIT)
def test_bfloat16_small_pivot_before_near_max_values():
    vals = np.random.default_rng(1).uniform(-0.95, 0.95, size=CASES["inner-persistent"][2]) * HALF_MAX["bfloat16"]
    vals[:, 0] = 1.0
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run("inner-persistent", values=vals, dtype="bfloat16")
    check_y(y, ry, "bfloat16")
    check_near_max_stats(x, mean, rstd, rm, rr)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["inner-persistent", "inner-looped", "outer-looped", "mixed-split"])
def test_overflowed_variance_is_nan_not_shift(name, dtype):
    """The known limits above, made loud: a reduction whose squared deviations overflow float32 (float32 near
    3e38; bfloat16 near 3e38 after a pivot of 1.0) gets NaN y and rstd, never rstd = 0 and y = shift (a
    silently wrong, finite result); every other reduction stays finite and accurate."""
    shape = case(name)[2]

    def fill(j, n):
        if j % 2:
            return np.random.default_rng(j).normal(5.0, 2.0, n)  # an ordinary reduction
        v = np.random.default_rng(j).uniform(-0.95, 0.95, n) * 3.0e38
        v[0] = 1.0  # the pivot (first value): bfloat16's scale stays 1
        return v

    vals = per_reduction(name, shape, fill)
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=vals, dtype=dtype)
    over = np.zeros(rr.shape, bool)
    over.flat[::2] = True  # reductions 0, 2, 4, ... (kept indices in order)
    assert np.isnan(rstd[over]).all() and np.isfinite(rstd[~over]).all()
    np.testing.assert_allclose(rstd[~over], rr[~over], rtol=1e-3)
    yy = np.asarray(y, np.float64)
    kept_nan = np.isnan(yy)
    assert kept_nan.any() and not np.isnan(ry).any()  # the reference is finite: normc says it cannot be
    assert np.isfinite(yy[~kept_nan]).all()


@pytest.mark.parametrize("name", ["inner-persistent", "outer-looped", "mixed-split"])
def test_bfloat16_near_max_eps_zero(name):
    """eps = 0: a constant reduction near the maximum has rstd = inf and y = NaN (as unscaled, and as the
    reference's 0/0), only in that reduction; the others (random, up to 3e38) stay finite and accurate."""
    rng = np.random.default_rng(3)
    vals = per_reduction(name, case(name)[2], lambda i, n: np.full(n, 2.5e38) if i == 1 else
                         rng.uniform(-0.95, 0.95, size=n) * HALF_MAX["bfloat16"])
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=vals, dtype="bfloat16", eps=0.0)
    bad = np.isinf(rr)
    assert bad.sum() == 1 and np.isinf(rstd[bad]).all() and not np.isinf(rstd[~bad]).any()
    np.testing.assert_array_equal(np.isnan(y.astype(np.float32)), np.isnan(ry))
    assert np.isnan(ry).any()
    ok = ~np.isnan(ry)
    check_y(y[ok], ry[ok], "bfloat16")
    check_near_max_stats(x, mean[~bad], rstd[~bad], rm[~bad], rr[~bad])


@pytest.mark.parametrize("name", ["inner-persistent", "outer-persistent", "mixed-split"])
def test_bfloat16_large_but_safe(name):
    """bfloat16 values up to 1e18 (squares up to 1e36 < FLT_MAX): accurate."""
    shape = CASES[name][2]
    vals = np.random.default_rng(4).uniform(-1.0, 1.0, size=shape) * 1e18
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=vals, dtype="bfloat16")
    check_y(y, ry, "bfloat16")
    assert rel_err(mean / 1e18, rm / 1e18) <= 1e-4


# ----------------------------------------------------------------------------------------------------
# Degenerate reductions


@pytest.mark.parametrize("spec,shape,perm,schedule", [
    (LN, (5, 1), None, None),
    (LN, (2, 1), None, "looped"),
    (LN, (1, 1), None, "split"),            # two CTAs share one element: one partial is empty
    (IN2, (2, 3, 1, 1), NHWC, None),          # outer: channels contiguous, one element per reduction
    (IN2, (2, 3, 1, 1), None, None),
], ids=["inner", "inner-looped", "inner-split", "outer-nhwc", "nchw"])
def test_reduction_extent_one(spec, shape, perm, schedule):
    """One element per reduction: mean = x, rstd = 1/sqrt(eps), y = shift (to rounding)."""
    spec = normc.spec(spec)
    rng = np.random.default_rng(8)
    x = make_x(shape, "float32", perm=perm, rng=rng)
    ax = spec.axis_sizes(shape)
    sc = None if spec.scale is None else make_param(math.prod(ax[a] for a in spec.scale), "float32", rng)
    sh = None if spec.shift is None else make_param(math.prod(ax[a] for a in spec.shift), "float32", rng)
    f = normc.compile(spec, schedule=schedule)
    y, mean, rstd = f(x, sc, sh, return_stats=True)
    ry, rm, rr = reference(spec, x, sc, sh)
    np.testing.assert_array_equal(mean.reshape(-1), np.asarray(rm, np.float32).reshape(-1))
    np.testing.assert_allclose(rstd, 1 / np.sqrt(1e-5), rtol=1e-6)
    np.testing.assert_allclose(y, ry, rtol=0, atol=max(fold_atol(x, rr, sc), 1e-6))


@pytest.mark.parametrize("text,shape,perm,schedule", [
    ("t d : norm over t d", (3, 5), [1, 0], None),
    ("n c h w : norm over n c h w", (2, 3, 2, 3), NHWC, None),
    ("n c h w : rms over n c h w ; scale c h w", (1, 3, 2, 2), [1, 0, 2, 3], None),
    ("a b c : norm over a b c ; shift a b c", (2, 5, 3), [2, 0, 1], "looped"),
], ids=["2d-transposed", "4d-nhwc", "rms-affine", "3d-permuted-looped"])
def test_reduction_over_every_axis(text, shape, perm, schedule):
    spec = normc.spec(text)
    rng = np.random.default_rng(9)
    x = make_x(shape, "float32", perm=perm, rng=rng, loc=2.0)
    ax = spec.axis_sizes(shape)
    sc = None if spec.scale is None else make_param(math.prod(ax[a] for a in spec.scale), "float32", rng)
    sh = None if spec.shift is None else make_param(math.prod(ax[a] for a in spec.shift), "float32", rng)
    y, mean, rstd = normc.compile(spec, schedule=schedule)(x, sc, sh, return_stats=True)
    ry, rm, rr = reference(spec, x, sc, sh)
    assert mean.shape == () and rstd.shape == ()
    check_y(y, ry, "float32", atol=fold_atol(x, rr, sc))
    check_stats(mean, rstd, rm, rr)


# ----------------------------------------------------------------------------------------------------
# NaN and +-Inf


def _poison(name):
    """Values for case ``name`` with a NaN in one reduction, +Inf in a second and -Inf in a third (rows
    2 and later of inner cases, and every other reduction, stay finite). Inner cases put the -Inf at
    its row's pivot (first value)."""
    shape = CASES[name][2]
    if name == "inner-split":  # two rows (each run costs a 512-thread CTA per split): NaN in the 2nd split
        shape = (2, shape[1])
        v = np.random.default_rng(3).normal(size=shape)
        v[0, 40] = np.nan
        return shape, v
    if len(shape) == 2:
        shape = (4, shape[1])
    v = np.random.default_rng(3).normal(size=shape)
    if len(shape) == 2:
        v[0, 5], v[1, 3], v[2, 0] = np.nan, np.inf, -np.inf
    else:  # (n, c, ...) : reductions (0, 0), (1, 1), (0, 2 or 3)
        v[0, 0, 1, 1], v[1, 1, 0, 2], v[0, shape[1] - 1, -1, -1] = np.nan, np.inf, -np.inf
    return shape, v


def assert_same_nonfinite(y, mean, rstd, ry, rm, rr):
    """y, rstd and mean are NaN/Inf/non-finite exactly where the reference's are, and some but not all of y
    is finite; returns the mask of finite reference values."""
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ry))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ry))
    np.testing.assert_array_equal(np.isnan(rstd), np.isnan(rr))
    np.testing.assert_array_equal(np.isfinite(mean), np.isfinite(rm))
    ok = np.isfinite(ry)
    assert ok.any() and (~ok).any()
    return ok


@pytest.mark.parametrize("name", NAMES)
def test_nan_and_inf_propagate_per_reduction(name):
    """A NaN or +-Inf in x makes its own reduction's y and rstd NaN, as the float64 reference does, and
    leaves every other reduction accurate. The mean of a reduction holding an Inf is NaN or that Inf
    (merging partials computes Inf - Inf); either is non-finite where the reference's is."""
    shape, v = _poison(name)
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=v, shape=shape)
    ok = assert_same_nonfinite(y, mean, rstd, ry, rm, rr)
    if name != "inner-split":
        assert np.isinf(x).any() and np.isnan(x).any()
    check_y(y[ok], ry[ok], "float32")
    fin = np.isfinite(rm)
    check_stats(mean[fin], rstd[fin], rm[fin], rr[fin])


@pytest.mark.parametrize("stat", ["norm", "rms"])
@pytest.mark.parametrize("name", ["inner-persistent", "outer-persistent", "mixed-looped"])
def test_nan_and_inf_propagate_bfloat16_scaled(name, stat):
    """As test_nan_and_inf_propagate_per_reduction, with bfloat16 values of magnitude ~1e37, so every
    reduction's statistics are scaled (scl = 2^-96): a NaN pivot keeps scl = 1, an Inf pivot gives
    scl = 2^-96 and pivot * scl = Inf; either way the reduction is non-finite exactly where the
    reference's is, and no other reduction is touched."""
    shape, v = _poison(name)
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=v * 1e37, shape=shape, dtype="bfloat16",
                                                  stat=stat)
    yf = y.astype(np.float32)
    ok = assert_same_nonfinite(yf, mean, rstd, ry, rm, rr)
    check_y(y[ok], ry[ok], "bfloat16")
    fin = np.isfinite(rm) & np.isfinite(rr) & (rr > 0)
    check_near_max_stats(x[np.isfinite(x)], mean[fin], rstd[fin], rm[fin], rr[fin])


def test_inf_in_rms_row_like_the_reference():
    """rms: sum of squares = inf gives rstd = 0, y = 0 for the finite elements and NaN at the Inf."""
    spec = normc.spec("t d : rms over d ; scale d", eps=1e-6)
    x = make_x((3, 16), "float32", rng=np.random.default_rng(6))
    x[1, 4] = np.inf
    x[2, 7] = np.nan
    sc = make_param(16, "float32", np.random.default_rng(0), loc=1.0, std=0.5)
    y, mean, rstd = normc.compile(spec)(x, sc, return_stats=True)
    ry, rm, rr = reference(spec, x, sc)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ry))
    assert rstd[1] == 0 and np.isnan(rstd[2])
    np.testing.assert_allclose(y[np.isfinite(ry)], ry[np.isfinite(ry)], rtol=0, atol=2e-5 * np.abs(ry[0]).max())


# Streaming schedules sum x minus each thread's first value (lowering/codegen.py SHIFTED_SUMS); the shift is a
# value of the thread's own data, not the reduction's pivot (its first value), which can lie far from them.
OUTLIER_SHAPES = {"inner-looped": (1, 16384), "inner-split": (1, 16384), "outer-looped": (1, 2, 128, 128),
                  "outer-split": (1, 2, 128, 128), "outer-persistent": (1, 2, 32, 32),
                  "mixed-persistent": (1, 4, 24, 24), "outer-cluster": (1, 2, 48, 48)}


def outlier_x(name):
    """(x, shape) for case ``name`` at OUTLIER_SHAPES[name]: each reduction n - 1 standard normal values after a
    first value (its pivot) of 4 sqrt(n)."""
    shape = OUTLIER_SHAPES[name]
    rng = np.random.default_rng(5)

    def fill(i, n):
        v = rng.standard_normal(n)
        v[0] = 4 * math.sqrt(n)
        return v

    return per_reduction(name, shape, fill), shape


@pytest.mark.parametrize("name", list(OUTLIER_SHAPES))
def test_outlier_first_value(name):
    """Each reduction's first value (its pivot) is 4 sqrt(n) above n - 1 standard normal values: sums
    shifted by that pivot cancel about 16 n^2 ulps of the variance, which is about 17 n (with n = 16384,
    ~1e-3 relative; y off by up to 6.5e-4 of max|y| when tried). Streaming schedules: Welford or sums shifted
    by each thread's own first value stay within float32 rounding; persistent kernels take two exact rounds."""
    x, shape = outlier_x(name)
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=x, shape=shape)
    check_y(y, ry, "float32")
    assert np.max(np.abs(rstd - rr) / rr) <= 1e-4
    # the mean is near 0 next to the pivot (pivoted schemes round it to a few ulps of the pivot): 1e-4 std
    assert np.max(np.abs(mean - rm) * rr) <= 1e-4


@pytest.mark.parametrize("name", ["outer-persistent", "mixed-persistent", "outer-cluster"])
def test_quantized_values_with_a_far_first_value(name):
    """8-bit integer values (0..255 as float32) whose first value, the pivot, lies 7.9 standard deviations out:
    the persistent outer/mixed kernels' two exact rounds keep rstd within 1e-6 of float64. Summing x - pivot
    and its square in one round (E[d^2] - E[d]^2, timed and removed; lowering/codegen.py) put rstd off by up
    to 1.6e-4 here, since the rounding errors of the sum of squares lean the same way on such data."""
    shape = OUTLIER_SHAPES[name]
    rng = np.random.default_rng(7)

    def fill(i, n):
        v = rng.integers(0, 256, n).astype(np.float64)
        v[0] = v.mean() + 7.9 * v.std()
        return v

    x = per_reduction(name, shape, fill)
    x, sc, sh, y, mean, rstd, ry, rm, rr, f = run(name, values=x, shape=shape)
    check_y(y, ry, "float32")
    assert np.max(np.abs(rstd - rr) / rr) <= 1e-6


@pytest.mark.parametrize("name", ["inner-looped", "outer-looped", "outer-split", "mixed-looped"])
def test_huge_values_with_idle_threads_streaming(name):
    """Streaming schedules with threads that see no value (most of them, at these sizes) on reductions
    near 1e20 (constant, then 1e18 (1 + 1e-3 N(0, 1))): an idle thread's partial has a count of 0 and must
    not carry a mean of -pivot, whose square times the other count overflowed a Chan merge (inf * 0 = NaN
    in every y and rstd; found by a break test)."""
    shape = CASES[name][2]
    const = per_reduction(name, shape, lambda i, n: np.full(n, 1e20 * (1 + i % 3)))
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, values=const)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(rstd)) and np.all(np.isfinite(mean))
    np.testing.assert_allclose(y, ry, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ry).max())))
    x, sc, sh, y, mean, rstd, ry, rm, rr, _ = run(name, loc=1e18, std=1e15, seed=9)
    check_y(y, ry, "float32")
    assert np.max(np.abs(rstd - rr) / rr) <= 1e-4
