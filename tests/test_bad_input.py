"""Bad input, part 2 (issue 5, part 3): every public entry point checks its arguments before any launch and
raises a normc error naming the argument. Complements tests/test_errors.py (one case per check) with
property tests: random argument combinations are either launched or rejected with the *first* bad
argument named, never launched half-checked; ``normc.plan`` and ``normc.compile`` turn any junk into a
NormcError. No kernel runs here: launches are intercepted, so these tests are fast.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import normc
from normc import ArgumentError, NormcError, SpecError

LN = "t d : norm over d ; scale d ; shift d"


class Launched(Exception):
    """Raised instead of running kernels: the call got past every check."""


@pytest.fixture
def no_launch(monkeypatch):
    """Replace the simulator launch so that reaching it raises Launched."""
    from normc.runtime import simulate

    def run(*a, **k):
        raise Launched

    monkeypatch.setattr(simulate, "run", run)


# ----------------------------------------------------------------------------------------------------
# Spec text errors point at the position, through every entry point


@pytest.mark.parametrize("entry", ["spec", "compile", "plan", "family"])
def test_spec_error_has_a_caret_under_the_position(entry):
    text = "n c h w : norm over h q ; scale c"
    call = {
        "spec": lambda: normc.spec(text),
        "compile": lambda: normc.compile(text),
        "plan": lambda: normc.plan(text, (1, 2, 3, 4)),
        "family": lambda: normc.group_norm(0),
    }[entry]
    with pytest.raises(SpecError) as info:
        call()
    err = info.value
    if entry == "family":
        assert "groups" in str(err) or "0" in str(err)
        return
    lines = str(err).splitlines()
    assert lines[1].strip() == text and lines[2].strip() == "^"
    assert lines[2].index("^") - lines[1].index(text[0]) == text.index("q") == err.pos
    assert "'q'" in lines[0]


# ----------------------------------------------------------------------------------------------------
# normc.plan: every argument checked


@pytest.mark.parametrize("kw,words", [
    ({"shape": "ab"}, ["x shape"]),
    ({"shape": None}, ["x shape"]),
    ({"shape": (2.5, 3)}, ["x shape"]),
    ({"shape": (2, -1)}, ["x shape"]),
    ({"shape": (2, 3, 4)}, ["rank"]),
    ({"strides": (1,)}, ["strides", "2 ints"]),
    ({"strides": "ab"}, ["strides"]),
    ({"out_strides": (1, 2, 3)}, ["out_strides"]),
    ({"dtype": None}, ["dtype", "float32"]),
    ({"dtype": "float64"}, ["dtype", "float64"]),
    ({"out_dtype": "int8"}, ["out_dtype"]),
    ({"scale_dtype": 3}, ["scale_dtype"]),
    ({"sms": 0}, ["sms"]),
    ({"sms": "132"}, ["sms"]),
    ({"aligns": {"x": 3}}, ["aligns", "power of two"]),
    ({"aligns": {"y": 16}}, ["aligns"]),
    ({"arch": "sm_5"}, ["arch"]),
    ({"layout": "t t"}, ["layout"]),
    ({"layout": [0, 0]}, ["layout"]),
    ({"schedule": "fast"}, ["schedule", "'split'"]),
    ({"schedule": 1}, ["schedule"]),
])
def test_plan_names_the_bad_argument(kw, words):
    args = {"shape": (2, 3)}
    args.update(kw)
    shape = args.pop("shape")
    with pytest.raises(ArgumentError) as info:
        normc.plan(LN, shape, **args)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


junk = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 2**63), st.floats(allow_nan=True), st.text(max_size=4),
    st.lists(st.integers(-3, 9), max_size=4), st.lists(st.one_of(st.integers(0, 9), st.floats(), st.text(max_size=1)),
                                                       max_size=3).map(tuple),
    st.dictionaries(st.sampled_from(["x", "out", "scale", "y"]), st.integers(-1, 32), max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.one_of(junk, st.tuples(st.integers(0, 9), st.integers(0, 9))),
       dtype=st.one_of(junk, st.sampled_from(["float32", "float16", "bfloat16"])),
       kw=st.dictionaries(st.sampled_from(["strides", "layout", "out_dtype", "out_strides", "scale_dtype", "sms",
                                           "aligns", "arch", "stats"]), junk, max_size=3))
def test_fuzz_plan_gives_a_plan_or_a_normc_error(shape, dtype, kw):
    try:
        plan = normc.plan(LN, shape, dtype, **kw)
    except NormcError:
        return
    assert isinstance(plan, normc.Plan)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="tdnchw :;()=.,0123456789gkoverscalshiftrmsq", max_size=50),
       schedule=st.sampled_from([None, "looped", "split", "bogus"]),
       out_dtype=st.sampled_from([None, "float16", "float64"]))
def test_fuzz_compile_gives_a_callable_or_a_normc_error(text, schedule, out_dtype):
    try:
        f = normc.compile(text, schedule=schedule, out_dtype=out_dtype)
    except NormcError:
        return
    assert callable(f) and schedule != "bogus" and out_dtype != "float64"


# ----------------------------------------------------------------------------------------------------
# Calls: every argument checked before the launch, the first bad one named


def _arr(shape, dtype):
    return np.zeros(shape, dtype)


@st.composite
def calls(draw):
    """Random arguments for a layer norm over d = 8, and the argument the call must name (None: valid).

    normc reads every argument first (a non-array is named at once, in the order scale, shift, out), then
    checks x, scale, shift and out in that order."""
    d = 8
    xdt = draw(st.sampled_from(["float32", "float32", "float16", "float64", "int32"]))
    xshape = draw(st.sampled_from([(3, d), (3, d), (3, d), (d,), (2, 3, d)]))
    x = _arr(xshape, xdt)
    unreadable, bad = [], []
    if xdt not in ("float32", "float16") or len(xshape) != 2:
        bad.append("x")
    params = []
    for name in ("scale", "shift"):
        kind = draw(st.sampled_from(["ok", "ok", "ok", "missing", "count", "dtype", "strided", "list"]))
        p = {
            "ok": lambda: _arr((d,), draw(st.sampled_from(["float32", "float16"]))),
            "missing": lambda: None,
            "count": lambda: _arr((d + 1,), "float32"),
            "dtype": lambda: _arr((d,), "float64"),
            "strided": lambda: _arr((2 * d,), "float32")[::2],
            "list": lambda: [1.0] * d,
        }[kind]()
        (unreadable if kind == "list" else bad if kind != "ok" else []).append(name)
        params.append(p)
    okind = draw(st.sampled_from(["none", "none", "ok", "shape", "dtype", "x", "overlap", "readonly", "list"]))
    out = None
    if okind == "ok":
        out = _arr(xshape, draw(st.sampled_from(["float32", "float16"])))
    elif okind == "shape":
        out = _arr((4, d), "float32")
    elif okind == "dtype":
        out = _arr(xshape, "float64")
    elif okind == "x":
        out = x  # in place: allowed
    elif okind == "overlap":
        buf = np.zeros(x.size + 1, x.dtype)
        x = buf[1:].reshape(xshape)
        out = buf[:-1].reshape(xshape)
    elif okind == "readonly":
        out = _arr(xshape, "float32")
        out.setflags(write=False)
    elif okind == "list":
        out = x.tolist()
    if okind == "list":
        unreadable.append("out")
    elif okind in ("shape", "dtype", "overlap", "readonly"):
        bad.append("out")
    expect = (unreadable + bad + [None])[0]
    stats = draw(st.booleans())
    return x, params[0], params[1], out, stats, expect


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=calls())
def test_every_argument_checked_before_launch(no_launch, case):
    x, scale, shift, out, stats, expect = case
    f = normc.compile(LN)
    try:
        f(x, scale, shift, out=out, return_stats=stats)
    except Launched:
        assert expect is None, f"launched although {expect} is bad"
        return
    except ArgumentError as e:
        assert expect is not None, f"rejected good arguments: {e}"
        msg = str(e)
        assert msg.startswith(expect + " ") or msg.startswith(expect + ":"), (expect, msg)
        # nothing half-built is left behind for a later call to find
        assert all(v.kernels is not None for v in f._table.values())
        return
    raise AssertionError("neither launched nor rejected")


def test_zero_size_input_does_not_launch(no_launch):
    f = normc.compile(LN)
    y, mean, rstd = f(np.zeros((0, 8), np.float32), np.ones(8, np.float32), np.zeros(8, np.float32),
                      return_stats=True)
    assert y.shape == (0, 8) and mean.shape == (0,) and rstd.shape == (0,)
    g = normc.compile("t d : norm over d")
    y, mean, rstd = g(np.zeros((3, 0), np.float32), return_stats=True)  # empty reductions: NaN statistics
    assert y.shape == (3, 0) and np.isnan(mean).all() and np.isnan(rstd).all()


class _FakeCudaArray:
    """Claims to be a CUDA array (``__cuda_array_interface__``) at an address no one allocated."""

    def __init__(self, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0x7F0000000000, False),
                                         "version": 3, "strides": None}


@pytest.mark.parametrize("which", ["x", "scale", "shift", "out"])
def test_cuda_array_next_to_host_arrays_is_named(no_launch, which):
    """On the simulator a (claimed) CUDA array among numpy arrays is rejected, naming the argument:
    either it cannot be read without a driver, or it is on another device than x."""
    args = {"x": np.zeros((3, 8), np.float32), "scale": np.ones(8, np.float32), "shift": np.zeros(8, np.float32),
            "out": None}
    args[which] = _FakeCudaArray((3, 8) if which in ("x", "out") else (8,))
    f = normc.compile(LN)
    with pytest.raises(ArgumentError) as info:
        f(args["x"], args["scale"], args["shift"], out=args["out"])
    assert str(info.value).startswith(which + " ")


@pytest.mark.parametrize("which", ["scale", "shift"])
def test_out_overlapping_scale_or_shift_is_rejected(no_launch, which):
    buf = np.zeros(3 * 8, np.float32)
    x = np.ones((3, 8), np.float32)
    params = {"scale": np.ones(8, np.float32), "shift": np.zeros(8, np.float32)}
    params[which] = buf[:8]
    with pytest.raises(ArgumentError, match="out"):
        normc.compile(LN)(x, params["scale"], params["shift"], out=buf.reshape(3, 8))


def test_out_checked_on_every_call_not_only_the_first(no_launch):
    """What out's memory and flags forbid (read-only, overlapping x, scale or shift) is not in the
    specialization key: a call after a valid one with the same shapes must still be refused (it was accepted,
    writing into scale or returning a read-only zeros array)."""
    f = normc.compile("t d : norm over d ; scale d")
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    with pytest.raises(Launched):  # a valid call: builds the specialization, then reaches the launch
        f(x, np.ones(8, np.float32), out=np.empty_like(x))
    buf = np.zeros(64, np.float32)
    with pytest.raises(ArgumentError, match="out overlaps scale"):
        f(x, buf[:8], out=buf[:16].reshape(2, 8))
    ro = np.zeros_like(x)
    ro.setflags(write=False)
    with pytest.raises(ArgumentError, match="out is read-only"):
        f(x, np.ones(8, np.float32), out=ro)
    big = np.zeros(24, np.float32)
    xs = big[:16].reshape(2, 8)
    with pytest.raises(ArgumentError, match="out overlaps x"):
        f(xs, np.ones(8, np.float32), out=big[8:].reshape(2, 8))


def test_backward_refuses_transposed_statistics():
    """mean and rstd hold one value per kept index in spec axis order: their transposes (same element count)
    are refused, as a transposed scale is (they were read in the wrong order: dx off by 2.7)."""
    f = normc.compile(normc.spec("n (g k) h w : norm over k h w ; scale g k ; shift g k", g=2))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 6, 2, 2)).astype(np.float32)
    w, b = np.ones(6, np.float32), np.zeros(6, np.float32)
    y, m, r = f(x, w, b, return_stats=True)
    assert m.shape == (3, 2)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    for name, mm, rr in (("mean", m.T.copy(), r), ("rstd", m, r.T.copy())):
        with pytest.raises(ArgumentError, match=rf"{name} has shape \(2, 3\); expected \(3, 2\)"):
            f.backward(dy, x, mm, rr, w)
    dx, _, _ = f.backward(dy, x, m.reshape(-1), r.reshape(-1), w)  # flat, in order: accepted
    assert dx.shape == x.shape


def test_transposed_multi_axis_scale_is_refused():
    """A scale whose shape is the step axes' extents in another order (transposed) is refused: it would scale
    the wrong elements. Other shapes of the right size are read in spec axis order."""
    import numpy as np

    import normc

    f = normc.compile(normc.spec("t d0 d1 : norm over d0 d1 ; scale d0 d1"))
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    with pytest.raises(normc.ArgumentError, match=r"scale has shape \(4, 3\); expected \(3, 4\)"):
        f(x, np.ones((4, 3), np.float32))
    w = np.arange(12, dtype=np.float32) / 12 + 0.5
    xd = x.astype(np.float64)
    ref = (xd - xd.mean((1, 2), keepdims=True)) / np.sqrt(xd.var((1, 2), keepdims=True) + 1e-5) * w.reshape(3, 4)
    for shaped in (w, w.reshape(3, 4), w.reshape(1, 12)):
        assert np.abs(f(x, shaped) - ref).max() < 1e-5


def test_moved_unit_extents_of_a_scale_are_not_a_transpose():
    """(12, 1) for step axes of extents (1, 12) keeps the elements in spec order: accepted, as a flat one."""
    import numpy as np

    import normc

    f = normc.compile(normc.spec("t d0 d1 : norm over d0 d1 ; scale d0 d1"))
    x = np.random.default_rng(1).standard_normal((2, 1, 12)).astype(np.float32)
    w = np.arange(12, dtype=np.float32) / 12 + 0.5
    assert np.array_equal(f(x, w.reshape(12, 1)), f(x, w))


def test_empty_batch_of_long_rows():
    """Zero rows of a reduction too long for one CTA (a split plan) give an empty result, not a crash."""
    import numpy as np

    import normc

    n = 4_000_000
    y = normc.compile(normc.layer_norm())(np.zeros((0, n), np.float32), np.ones(n, np.float32),
                                          np.zeros(n, np.float32))
    assert y.shape == (0, n)


# Third break test (2026-12-04): API edges.

@pytest.mark.parametrize("call, words", [
    (lambda: normc.layer_norm(elementwise_affine="no"), "elementwise_affine"),
    (lambda: normc.layer_norm(bias="False"), "bias"),
    (lambda: normc.rms_norm(elementwise_affine=[]), "elementwise_affine"),
    (lambda: normc.instance_norm(affine="yes"), "affine"),
    (lambda: normc.group_norm(2, affine=None), "affine"),
    (lambda: normc.batch_norm_stats(affine=1), "affine"),
])
def test_family_flags_are_bools(call, words):
    """A truthy string silently meant True (layer_norm(elementwise_affine='no') kept scale and shift)."""
    with pytest.raises(SpecError, match=words):
        call()
    assert normc.layer_norm(elementwise_affine=np.bool_(False)).scale is None


def test_masked_array_is_refused():
    # its mask was ignored and y came back as a plain ndarray
    f = normc.compile("t d : norm over d")
    x = np.ma.masked_array(np.ones((2, 8), np.float32), mask=np.eye(2, 8, dtype=bool))
    with pytest.raises(ArgumentError, match=r"x is a numpy masked array; normc would ignore its mask: pass x.filled"):
        f(x)
    with pytest.raises(ArgumentError, match="out is a numpy masked array"):
        f(x.data, out=np.ma.masked_array(np.zeros((2, 8), np.float32)))


def test_plan_names_an_unknown_keyword():
    # a split dim's size given to plan() raised "TypeError: plan_for() got an unexpected keyword argument 'g'"
    text = "n (g k) h w : norm over k h w"
    want = r"keyword argument\(s\) g for normc.plan; .*layout.*normc.spec\(text, g=2\)"
    with pytest.raises(ArgumentError, match=want):
        normc.plan(text, (2, 4, 2, 2), layout="n h w (g k)", g=2)
    with pytest.raises(ArgumentError, match="keyword argument\\(s\\) foo for normc.plan; expected some of strides"):
        normc.plan(text, (2, 4, 2, 2), foo="x")
    # an int keyword that names no part of a split dim gets no hint to move it into the spec (a new user's
    # report: the hint sent them to another error)
    for t in (text, "n c h w : norm over h w"):
        with pytest.raises(ArgumentError, match=r"foo for normc.plan; expected some of [a-z_, ]*schedule$"):
            normc.plan(t, (2, 4, 2, 2), foo=1)
    assert normc.plan(normc.spec(text, g=2), (2, 4, 2, 2), layout="n h w (g k)").strategy == "mixed"


def test_plan_refuses_param_dtype_without_the_step():
    # was accepted silently (and ignored), though f(x, scale) is refused for such a spec
    for name in ("scale", "shift"):
        with pytest.raises(ArgumentError, match=f"{name}_dtype is 'float16' but the spec has no {name} step"):
            normc.plan("t d : norm over d", (2, 8), **{f"{name}_dtype": "float16"})
    assert normc.plan("t d : norm over d ; scale d", (2, 8), scale_dtype="float16").scale_dtype == "float16"


def test_numpy_type_codes_name_dtypes():
    # np.dtype("f4") is accepted, so its code is too; float64 ("f8") stays refused by name
    f = normc.compile("t d : norm over d", out_dtype="<f2")
    assert f(np.ones((2, 8), np.float32)).dtype == np.float16
    assert normc.plan("t d : norm over d", (2, 8), dtype="f4").x_dtype == "float32"
    with pytest.raises(ArgumentError, match="dtype is 'f8'; expected one of"):
        normc.plan("t d : norm over d", (2, 8), dtype="f8")
    # strings numpy's dtype parser fails on with ValueError or SyntaxError (found by the fuzz test below)
    for junk in ("0:", "01", "f4,", "(2)f4x"):
        with pytest.raises(ArgumentError, match=re.escape(f"dtype is {junk!r}; expected one of")):
            normc.plan("t d : norm over d", (2, 8), dtype=junk)


def test_plan_names_a_non_string_dtype_with_its_type():
    # an int is shown as itself with its type, not as the string '5'
    with pytest.raises(ArgumentError, match=r"^dtype is 5 \(int\); expected one of 'float32'"):
        normc.plan("t d : norm over d", (2, 8), dtype=5)
    with pytest.raises(ArgumentError, match=r"^scale_dtype is 2.5 \(float\); expected one of"):
        normc.plan("t d : norm over d ; scale d", (2, 8), dtype="float32", scale_dtype=2.5)


def test_runtime_and_plan_flags_are_bools():
    with pytest.raises(ArgumentError, match="use_tuning"):
        normc.compile(LN, use_tuning="no")
    with pytest.raises(ArgumentError, match="stats"):
        normc.plan(LN, (4, 8), stats="no")
    f = normc.compile("t d : norm over d")
    x = np.ones((4, 8), np.float32)
    for bad in (1, "yes"):  # return_stats=1 was accepted where plan(stats=1) was refused
        with pytest.raises(ArgumentError, match=f"return_stats is {bad!r}; expected True or False"):
            f(x, return_stats=bad)
    assert len(f(x, return_stats=np.bool_(True))) == 3
    with pytest.raises(ArgumentError, match="out_strides has overlapping memory"):
        normc.plan(LN, (4, 8), out_strides=(0, 0))


def test_compiled_pickles_and_deep_copies_with_its_options():
    """Compiled held a lock: pickle and deepcopy raised a raw TypeError. They keep the spec and options; the
    specializations are rebuilt on first use."""
    import copy
    import pickle

    f = normc.compile(LN, schedule="looped", out_dtype="float16", use_tuning=False)
    assert repr(f) == ("normc.compile(normc.spec('t d : norm over d ; scale d ; shift d', eps=1e-05), "
                       "out_dtype='float16', schedule='looped', use_tuning=False)")
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    w, b = np.ones(40, np.float32), np.zeros(40, np.float32)
    y = f(x, w, b)
    for g in (pickle.loads(pickle.dumps(f)), copy.deepcopy(f)):
        assert repr(g) == repr(f) and g._table == {}
        assert np.array_equal(g(x, w, b), y)


def test_big_endian_float16_on_the_simulator():
    """Big-endian float16 x, scale, shift, out and dy were read and written as native words: garbage."""
    f = normc.compile(LN)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    w, b = (1 + 0.1 * np.arange(8)).astype(np.float32), np.arange(8, dtype=np.float32) / 10
    le = [a.astype("<f2") for a in (x, w, b)]
    be = [a.astype(">f2") for a in (x, w, b)]
    y = f(*le)
    out = np.empty((2, 8), ">f2")
    f(*be, out=out)
    assert np.array_equal(f(*be), y) and np.array_equal(out.astype(np.float16), y)
    _, m, r = f(*le, return_stats=True)
    dy = rng.standard_normal((2, 8)).astype(np.float32)
    for p, q in zip(f.backward(dy.astype("<f2"), le[0], m, r, le[1]), f.backward(dy.astype(">f2"), be[0], m, r, be[1])):
        assert np.array_equal(p, q)


# New-user run (2026-12): zero-size kept axes, bench tables, eps, arch.

@pytest.mark.parametrize("spec,shape,layout", [
    ("n c : norm over n", (4, 0), None),                                   # the contiguous kept axis is empty
    ("n c : norm over n ; scale c ; shift c", (0, 4), None),               # no rows (worked before)
    ("n c h w : norm over n h w ; scale c ; shift c", (2, 0, 3, 3), None),
    ("n c h w : norm over h w ; scale c ; shift c", (2, 0, 3, 3), "n h w c"),
    ("n c h w : norm over h w ; scale c ; shift c", (2, 3, 0, 3), "n h w c"),  # empty reductions, outer
    ("n (g k) h w : norm over k h w", (2, 0, 4, 4), "n h w (g k)"),
])
@pytest.mark.parametrize("schedule", [None, "looped", "split"])
def test_zero_size_outer_plan_launches_nothing(spec, shape, layout, schedule):
    """A zero-size x whose innermost axis is kept is planned (no ZeroDivisionError): nothing to launch."""
    sp = normc.spec(spec, g=2) if "(g k)" in spec else spec
    plan = normc.plan(sp, shape, layout=layout, schedule=schedule)
    assert plan.kept * plan.reduced == 0
    assert "launch:   none (zero-size input: nothing to compute)" in str(plan)


def test_cli_plan_of_an_empty_kept_axis(capsys):
    from normc.cli import main

    assert main(["plan", "n c : norm over n", "--shape", "4,0"]) == 0
    out = capsys.readouterr().out
    assert "0 reductions x 4 elements" in out and "launch:   none" in out
    for shape in ("4,0", "0,4"):  # the backward's listing too (it printed grids of kernels it never launches)
        assert main(["plan", "t d : norm over d ; scale d ; shift d", "--shape", shape, "--backward"]) == 0
        out = capsys.readouterr().out
        assert "launch:   none" in out and "grid=" not in out, out


@pytest.mark.parametrize("spec,shape,perm", [
    (normc.batch_norm_stats(0), (4, 0), (0, 1)),                       # no channels
    (normc.batch_norm_stats(0), (4, 0), (1, 0)),
    (normc.batch_norm_stats(0, affine=False), (4, 0), (0, 1)),
    (normc.batch_norm_stats(0), (0, 3), (0, 1)),                       # no batch: empty reductions
    (normc.instance_norm(2), (2, 0, 3, 3), (0, 2, 3, 1)),               # NHWC, no channels
    (normc.instance_norm(2), (2, 3, 0, 3), (0, 2, 3, 1)),               # NHWC, empty reductions
])
def test_zero_size_forward_and_backward(spec, shape, perm):
    """Forward and backward of zero-size x: empty y and dx, NaN statistics for empty reductions (the float64
    mean of nothing), zero parameter gradients (sums of nothing); nothing launched."""
    sizes = dict(zip(spec.axes, shape))
    f = normc.compile(spec)
    x = np.zeros([shape[d] for d in perm], np.float32).transpose(np.argsort(perm))
    params = [np.ones([sizes[a] for a in ax], np.float32) for ax in (spec.scale, spec.shift) if ax]
    y, mean, rstd = f(x, *params, return_stats=True)
    with warnings.catch_warnings():  # numpy warns of the mean of nothing (NaN)
        warnings.simplefilter("ignore", RuntimeWarning)
        ref_mean = x.astype(np.float64).mean(axis=tuple(spec.axes.index(a) for a in spec.reduced))
    assert y.shape == x.shape and mean.shape == rstd.shape == ref_mean.shape
    assert np.array_equal(np.isnan(mean), np.isnan(ref_mean)) and np.array_equal(np.isnan(rstd), np.isnan(ref_mean))
    dx, dscale, dshift = f.backward(np.zeros_like(x), x, mean, rstd, params[0] if spec.scale else None)
    assert dx.shape == x.shape
    for g, ax in ((dscale, spec.scale), (dshift, spec.shift)):
        if ax:
            assert g.shape == tuple(sizes[a] for a in ax) and np.array_equal(g, np.zeros(g.shape))
        else:
            assert g is None


def test_astronaut_example_without_scikit_image_says_what_to_install():
    """examples/astronaut_instance_norm.py raised a bare ModuleNotFoundError: No module named 'skimage'; it now
    exits with one line saying to pip install scikit-image (scikit-image is hidden from the child process)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "examples", "astronaut_instance_norm.py")
    code = ("import runpy, sys\nsys.modules['skimage'] = None\n"
            f"sys.argv = [{path!r}, '--size', '4']\nrunpy.run_path({path!r}, run_name='__main__')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        "astronaut_instance_norm.py reads scikit-image's bundled astronaut photograph: pip install scikit-image")


@pytest.mark.parametrize("script, needs", [("style_transfer.py", "torch and scikit-image"),
                                           ("unet3d_block.py", "torch"), ("transformer_block.py", "torch")])
def test_backward_examples_without_torch_name_everything_missing(script, needs):
    """The backward examples failed on `import torch` (a ModuleNotFoundError traceback) before the style-transfer
    one could say it also needs scikit-image; they now exit with one line naming all that is missing (torch and
    scikit-image hidden from the child process)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "examples", script)
    code = ("import runpy, sys\nsys.modules['torch'] = sys.modules['skimage'] = None\n"
            f"sys.path.insert(0, {os.path.dirname(path)!r})\nsys.argv = [{path!r}]\n"
            f"runpy.run_path({path!r}, run_name='__main__')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"{script} needs {needs}: pip install {needs.replace(' and ', ' ')} (and a CUDA GPU)")


def test_normc_torch_without_torch_says_what_to_install():
    # a bare "No module named 'torch'" from normc/torch.py; still a ModuleNotFoundError (importorskip works)
    import subprocess
    import sys

    code = ("import sys\nsys.modules['torch'] = None\n"
            "try:\n    import normc.torch\nexcept ModuleNotFoundError as e:\n    print(e.name, '|', e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.startswith("torch | normc.torch needs PyTorch, which is not installed: pip install torch"), (
        res.stdout + res.stderr)


def test_simulator_refuses_16bit_on_an_old_arch_as_a_gpu_would():
    # arch is not used on the simulator, but a float16 call for sm_75 is refused there as on a GPU
    from normc.errors import CompileError

    x = np.ones((2, 8), np.float16)
    f = normc.compile("t d : norm over d ; scale d", arch="sm_75")
    with pytest.raises(CompileError, match=r"compute capability 8\.0 or newer.*sm_75"):
        f(x, np.ones(8, np.float16))
    with pytest.raises(CompileError, match="sm_75"):
        f.backward(x, x, np.zeros(2, np.float32), np.ones(2, np.float32), np.ones(8, np.float16))
    y = normc.compile("t d : norm over d", arch="sm_75")(x.astype(np.float32))  # float32 runs there
    assert np.allclose(y, 0.0)


def test_lower_names_a_wrong_plan():
    from normc.lowering import lower, lower_backward

    with pytest.raises(ArgumentError, match="^plan is a str; expected a normc.Plan"):
        lower("t d : norm over d")
    with pytest.raises(ArgumentError, match="^bplan is a Plan; expected a normc.backward_plan.BackwardPlan"):
        lower_backward(normc.plan("t d : norm over d", (2, 8)))
