"""Bad input raises normc's own errors (ArgumentError / SpecError, both NormcError), naming the argument.

All checks run before any kernel is launched, so these tests are fast even on the simulator.
"""

from __future__ import annotations

import numpy as np
import pytest

import normc
from conftest import make_x
from normc import ArgumentError, CompileError, NormcError, SpecError

LN = "t d : norm over d ; scale d ; shift d"
PLAIN = "t d : norm over d"
GN = "n (g k) h w : norm over k h w ; scale g k ; shift g k"


def ones(n, dtype=np.float32):
    return np.ones(n, dtype)


def raises(exc, *words):
    """pytest.raises(exc) that also checks each of ``words`` appears in the message."""

    class _Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(exc)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *a):
            handled = self.ctx.__exit__(*a)
            msg = str(self.info.value)
            assert isinstance(self.info.value, NormcError)
            for w in words:
                assert w in msg, f"{w!r} not in {msg!r}"
            return handled

    return _Ctx()


def test_error_hierarchy():
    for e in (ArgumentError, SpecError, CompileError):
        assert issubclass(e, NormcError)
    assert issubclass(ArgumentError, ValueError) and issubclass(SpecError, ValueError)


def test_wrong_rank():
    f = normc.compile(LN)
    with raises(ArgumentError, "x", "rank", "3"):
        f(make_x((2, 3, 8), "float32"), ones(8), ones(8))
    with raises(ArgumentError, "x", "rank"):
        f(np.zeros(8, np.float32), ones(8), ones(8))


def test_scale_wrong_size():
    f = normc.compile(LN)
    with raises(ArgumentError, "scale", "7", "8"):
        f(make_x((2, 8), "float32"), ones(7), ones(8))
    with raises(ArgumentError, "shift", "9", "8"):
        f(make_x((2, 8), "float32"), ones(8), ones(9))


def test_group_scale_size_counts_channels():
    f = normc.compile(normc.spec(GN, g=2))
    x = make_x((1, 6, 2, 2), "float32")
    with raises(ArgumentError, "scale", "6"):
        f(x, ones(2), ones(6))  # one value per group is not enough: scale g k has C = 6
    f(x, ones(6).reshape(2, 3), ones(6))  # any shape with the right count is accepted


def test_missing_scale():
    f = normc.compile(LN)
    with raises(ArgumentError, "scale", "required"):
        f(make_x((2, 8), "float32"))
    with raises(ArgumentError, "shift", "required"):
        f(make_x((2, 8), "float32"), ones(8))


def test_scale_given_without_step():
    f = normc.compile(PLAIN)
    with raises(ArgumentError, "scale"):
        f(make_x((2, 8), "float32"), ones(8))
    with raises(ArgumentError, "shift"):
        f(make_x((2, 8), "float32"), None, ones(8))


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.bool_, np.complex64])
def test_unsupported_x_dtype(dtype):
    f = normc.compile(PLAIN)
    with raises(ArgumentError, "x", "dtype", np.dtype(dtype).name):
        f(np.zeros((2, 8), dtype))


def test_unsupported_param_dtype():
    f = normc.compile(LN)
    with raises(ArgumentError, "scale", "dtype", "float64"):
        f(make_x((2, 8), "float32"), np.ones(8), ones(8))


def test_non_contiguous_scale():
    f = normc.compile(LN)
    with raises(ArgumentError, "scale", "contiguous"):
        f(make_x((2, 8), "float32"), ones(16)[::2], ones(8))


@pytest.mark.parametrize("bad", [[[1.0, 2.0], [3.0, 4.0]], 3.0, "x", None, {"a": 1}], ids=str)
def test_non_array_x(bad):
    f = normc.compile(PLAIN)
    with raises(ArgumentError, "x"):
        f(bad)


def test_non_array_scale():
    f = normc.compile(LN)
    with raises(ArgumentError, "scale"):
        f(make_x((2, 8), "float32"), [1.0] * 8, ones(8))


def test_out_wrong_shape():
    f = normc.compile(PLAIN)
    x = make_x((2, 8), "float32")
    with raises(ArgumentError, "out", "shape"):
        f(x, out=np.empty((2, 9), np.float32))
    with raises(ArgumentError, "out", "shape"):
        f(x, out=np.empty((8, 2), np.float32))


def test_out_wrong_dtype():
    x = make_x((2, 8), "float32")
    with raises(ArgumentError, "out", "dtype"):
        normc.compile(PLAIN)(x, out=np.empty((2, 8), np.float64))
    with raises(ArgumentError, "out", "dtype", "float16"):
        normc.compile(PLAIN, out_dtype="float16")(x, out=np.empty((2, 8), np.float32))


def test_out_not_an_array():
    with raises(ArgumentError, "out"):
        normc.compile(PLAIN)(make_x((2, 8), "float32"), out=[[0.0] * 8] * 2)


def test_out_partially_overlapping_x():
    buf = np.zeros((3, 9), np.float32)
    x, out = buf[:, :-1], buf[:, 1:]
    with raises(ArgumentError, "out", "overlap"):
        normc.compile(PLAIN)(x, out=out)


@pytest.mark.parametrize("spec,shape", [(PLAIN, (3, 16)), ("t d : norm over d ; scale d ; shift d", (3, 16)),
                                        ("n c h w : norm over h w", (2, 3, 4, 8))])
def test_out_interleaved_with_x_without_shared_elements_runs(spec, shape):
    """out = buf[..., 1::2] next to x = buf[..., 0::2] shares no element with x, but its address range meets
    x's: it was refused as overlapping x. The overlap check is now exact (numpy's solver on the addresses): the
    result matches float64 and x is untouched; an out shifted onto x's elements is still refused."""
    rng = np.random.default_rng(7)
    buf = rng.standard_normal(shape).astype(np.float32)
    x, out = buf[..., 0::2], buf[..., 1::2]
    x0 = x.copy()
    sp = normc.spec(spec)
    affine = bool(sp.scale)  # the "t d" spec with scale d and shift d
    w, b = rng.standard_normal((2, x.shape[-1])).astype(np.float32)
    f = normc.compile(sp)
    y = f(x, w, b, out=out) if affine else f(x, out=out)
    red = tuple(sp.axes.index(a) for a in sp.reduced)
    x64 = x0.astype(np.float64)
    ref = (x64 - x64.mean(red, keepdims=True)) / np.sqrt(x64.var(red, keepdims=True) + 1e-5)
    ref = ref * w + b if affine else ref
    assert y is out and np.array_equal(x, x0)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    xs, shifted = buf[..., 0:-2:2], buf[..., 2::2]  # out's elements 0..n-2 are x's 1..n-1
    with raises(ArgumentError, "out overlaps x"):
        f(xs, w[:-1], b[:-1], out=shifted) if affine else f(xs, out=shifted)


@pytest.mark.parametrize("xdt, odt", [("float16", "float32"), ("float32", "float16")])
def test_out_at_x_with_another_itemsize_is_refused(xdt, odt):
    """out at x's address with x's element strides but another element size is no in-place output: its
    elements cover other elements of x (a float32 row of out spans two float16 rows of x), which other CTAs
    may not have read yet. It was accepted (the simulator copies arguments, so it hid the race)."""
    n = 64 * 16 * 4
    buf = np.zeros(n, np.uint8)
    x = buf.view(xdt)[: 64 * 16].reshape(64, 16)
    out = buf.view(odt)[: 64 * 16].reshape(64, 16)
    assert out.__array_interface__["data"][0] == x.__array_interface__["data"][0]
    with raises(ArgumentError, "out aliases x with different strides or itemsize"):
        normc.compile(normc.spec(PLAIN))(x, out=out)


@pytest.mark.parametrize("shape", [(0, 32), (4, 0), (0, 0)])
def test_zero_size_out_is_accepted(shape):
    """A zero-size out (numpy gives it zero strides) has no elements to overlap: it was refused as "out has
    overlapping memory". Now the call returns out, empty, as it does without out=; out=x in place too."""
    x = np.zeros(shape, np.float32)
    f = normc.compile(normc.layer_norm())
    w = np.ones(shape[1], np.float32)
    out = np.zeros(shape, np.float32)
    assert f(x, w, w, out=out) is out
    assert f(x, w, w, out=x) is x


def test_out_overlap_check_past_its_work_bound_refuses(monkeypatch):
    """Where numpy's exact solver would need more than OVERLAP_MAX_WORK, out is refused as overlapping
    (conservative), as every out whose address range met x's was before."""
    import normc.runtime as rt

    monkeypatch.setattr(rt, "OVERLAP_MAX_WORK", 0)
    buf = np.zeros((3, 16), np.float32)
    with raises(ArgumentError, "out overlaps x"):
        normc.compile(PLAIN)(buf[:, 0::2], out=buf[:, 1::2])


def test_out_aliasing_x_with_other_strides():
    buf = np.zeros(16, np.float32)
    x = buf.reshape(2, 8)
    out = buf.reshape(8, 2).T  # same first element and shape (2, 8), other strides
    with raises(ArgumentError, "out"):
        normc.compile(PLAIN)(x, out=out)


def test_out_overlapping_itself():
    out = np.broadcast_to(np.zeros(8, np.float32), (2, 8))
    with raises(ArgumentError, "out", "overlap"):
        normc.compile(PLAIN)(make_x((2, 8), "float32"), out=out)


def test_spec_text_error():
    with raises(SpecError):
        normc.compile("t d : norm over q")
    with raises(SpecError):
        normc.compile("t d norm over d")
    with raises(SpecError):
        normc.spec("t d : norm over d", eps=-1.0)


def test_spec_wrong_type():
    with raises(ArgumentError, "spec"):
        normc.compile(42)


def test_group_split_not_dividing():
    f = normc.compile(normc.spec(GN, g=4))
    with raises(ArgumentError, "6", "g=4"):
        f(make_x((1, 6, 2, 2), "float32"), ones(6), ones(6))


@pytest.mark.parametrize("bad", ["fast", "Looped", 1, ""])
def test_bad_schedule(bad):
    with raises(ArgumentError, "schedule"):
        normc.compile(PLAIN, schedule=bad)


@pytest.mark.parametrize("bad", ["float64", "int8", "fp64"])
def test_bad_out_dtype(bad):
    with raises(ArgumentError, "out_dtype"):
        normc.compile(PLAIN, out_dtype=bad)


def test_dtype_aliases_as_on_the_command_line():
    # "bf16" / "fp16" / "half" worked in `normc plan --dtype` but were refused by normc.compile and normc.plan
    f = normc.compile(PLAIN, out_dtype="bf16")
    assert f(make_x((2, 8), "float32")).dtype.name == "bfloat16"
    p = normc.plan(PLAIN, (4, 8), "fp16", out_dtype="half")
    assert (p.x_dtype, p.out_dtype) == ("float16", "float16")
    assert normc.plan(PLAIN, (4, 8), " FP32 ").x_dtype == "float32"


@pytest.mark.parametrize("bad", [object(), "abc", -1, True, 2**70, np.int64(3)],
                         ids=["object", "str", "negative", "bool", "over-64-bit", "numpy-int"])
def test_bad_stream_is_argument_error(bad):
    # checked on every call, also on the simulator (which launches on no stream), forward and backward
    f = normc.compile(PLAIN)
    x = make_x((1, 4), "float32")
    with raises(ArgumentError, "stream is", "a Python int in [0, 2**64)"):
        f(x, stream=bad)
    _, m, r = f(x, return_stats=True)
    with raises(ArgumentError, "stream is"):
        f.backward(x, x, m, r, stream=bad)
    assert f(x, stream=0).shape == (1, 4)  # a plain handle is fine


def test_negative_strides_on_simulator():
    # The GPU path lays axes out by |stride|; the simulator's flat views cannot index below element 0.
    f = normc.compile(PLAIN)
    x = make_x((2, 8), "float32")[:, ::-1]
    with raises(ArgumentError, "x", "negative"):
        f(x)


def test_errors_leave_no_partial_entry():
    f = normc.compile(LN)
    with pytest.raises(ArgumentError):
        f(make_x((2, 8), "float32"), ones(7), ones(8))
    assert f._table == {}


def test_plan_errors():
    with raises(ArgumentError, "layout"):
        normc.plan("n c h w : norm over h w", (1, 2, 3, 4), layout="n h c")
    with raises(ArgumentError, "arch"):
        normc.plan("t d : norm over d", (2, 8), arch="gfx90a")
    with raises(ArgumentError, "dtype"):
        normc.plan("t d : norm over d", (2, 8), dtype="float64")


def test_fortran_order_scale_is_rejected_not_misread():
    spec = normc.layer_norm(3, 2)  # scale over d0 d1
    x = make_x((2, 3, 4), "float32")
    w = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    with raises(ArgumentError, "scale", "C-contiguous"):
        normc.compile(spec)(x, w, np.zeros((3, 4), np.float32))


def test_read_only_out_and_bad_arch_and_huge_shape():
    x = make_x((2, 8), "float32")
    out = np.empty((2, 8), np.float32)
    out.setflags(write=False)
    with raises(ArgumentError, "out", "read-only"):
        normc.compile(PLAIN)(x, out=out)
    for arch in ("banana", "sm_50"):
        with raises(ArgumentError, "arch"):
            normc.compile(PLAIN, arch=arch)
    with raises(ArgumentError, "x", "2**62"):
        normc.plan(PLAIN, (2**40, 2**40))


def test_arch_the_toolkit_does_not_compile_for_is_named():
    """A break test found sm_999/sm_130 compiled for sm_121, sm_95/sm_91 for sm_90, and sm_90a/sm_100a for
    sm_90/sm_100 (the 'a' dropped), silently: each is now an ArgumentError naming arch."""
    from normc.lowering import arch_cc, supported_ccs

    assert (9, 0) in supported_ccs() and (12, 1) in supported_ccs()  # the installed toolkit's list
    for arch in ("sm_999", "sm_95", "sm_91", "sm_130", "95", (9, 5), (13, 0)):
        with raises(ArgumentError, "arch", "not one this CUDA toolkit compiles for", "sm_90, sm_100"):
            normc.plan(PLAIN, (2, 8), arch=arch)
        with raises(ArgumentError, "arch"):
            normc.compile(PLAIN, arch=arch)
    for arch in ("sm_90a", "sm_100a", "compute_90a", "sm_100f"):
        with raises(ArgumentError, "arch", repr(arch), "arch-specific targets", "not supported"):
            normc.plan(PLAIN, (2, 8), arch=arch)
    assert normc.plan(PLAIN, (2, 8), arch="compute_100").arch == "sm_100"
    assert arch_cc("sm_121") == (12, 1) and arch_cc((10, 3)) == (10, 3)


def test_arch_forms_accepted_and_refused_alike_everywhere():
    """arch=90 (an int) means sm_90, as '90' and (9, 0) do, for normc.plan and normc.compile; a tuple that is no
    compute capability ((9, 10), (9, -1), (True, 0)) was accepted (then planned as 'sm_9-1' or refused only by the
    toolkit's list) and is now an ArgumentError naming arch. A Compiled with arch=90 runs numpy input on the
    simulator (which does not use arch), as float64 computes it."""
    from normc.lowering import arch_cc

    for arch in (90, "90", "sm_90", "compute_90", (9, 0), np.int64(90), (np.int64(9), np.int32(0))):
        assert arch_cc(arch) == (9, 0) and normc.plan(PLAIN, (2, 8), arch=arch).arch == "sm_90"
    for arch in ((9, 10), (9, -1), (0, 9), (True, 0), (9, 0, 0), (9.0, 0), 9.0, True, [9, 0]):
        with raises(ArgumentError, "arch", repr(arch), "expected a compute capability such as 'sm_90'"):
            normc.plan(PLAIN, (2, 8), arch=arch)
        with raises(ArgumentError, "arch", "expected a compute capability"):
            normc.compile(PLAIN, arch=arch)
    x = make_x((2, 8), "float32")
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    assert np.abs(normc.compile(PLAIN, arch=90)(x) - ref).max() < 1e-5


def test_numba_simulator_stream_is_accepted_under_numba_cudasim(tmp_path):
    """Under NUMBA_ENABLE_CUDASIM=1, ``numba.cuda.stream()`` is the simulator's stream, which has no raw handle:
    it was refused as 'expected a CUDA stream object (torch, CuPy, Numba, ...)'. It is now accepted (the
    simulator runs each call to its end), forward and backward, and the results are the float64 layer norm."""
    import os
    import pathlib
    import subprocess
    import sys

    code = ("import numpy as np, normc\nfrom numba import cuda\n"
            "x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)\n"
            "f = normc.compile('t d : norm over d')\ns = cuda.stream()\n"
            "y, m, r = f(x, stream=s, return_stats=True)\n"
            "dx = f.backward(np.ones_like(x), x, m, r, stream=s)[0]\n"
            "x64 = x.astype(np.float64)\n"
            "ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)\n"
            "print(float(np.abs(np.asarray(y) - ref).max()), float(np.abs(np.asarray(dx)).max()))\n")
    root = str(pathlib.Path(normc.__file__).resolve().parent.parent)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NORMC_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    err_y, max_dx = map(float, out.stdout.split())
    assert err_y < 1e-5 and max_dx < 1e-4  # dy = 1 everywhere: the layer norm's dx is 0


def test_plan_refuses_16bit_before_sm80_as_compile_does():
    """normc.plan returned a float16 plan for sm_75 that normc.compile/ptx (and the CLI's plan) refuse: now the
    same CompileError, naming the dtype and the target; float32 on sm_75 and float16 on sm_80 still plan."""
    for dtype in ("float16", "bfloat16"):
        with raises(normc.CompileError, dtype, "sm_75", "8.0"):
            normc.plan(PLAIN, (2, 8), dtype, arch="sm_75")
        with raises(normc.CompileError, dtype, "sm_75"):
            normc.plan(PLAIN, (2, 8), "float32", out_dtype=dtype, arch=(7, 5))
    assert normc.plan(PLAIN, (2, 8), "float32", arch="sm_75").arch == "sm_75"
    assert normc.plan(PLAIN, (2, 8), "float16", arch="sm_80").arch == "sm_80"


def test_arch_checked_under_numba_cudasim(tmp_path):
    """Under NUMBA_ENABLE_CUDASIM=1 Numba's cuda module has no NVRTC to ask, so supported_ccs() was () and any
    arch of the right form passed (normc.compile(spec, arch='sm_999') ran on the simulator); the toolkit's list
    now comes from NVRTC through cuda.bindings there too, so an arch is refused as without the variable."""
    import os
    import pathlib
    import subprocess
    import sys

    from normc.lowering import supported_ccs

    if not supported_ccs():
        pytest.skip("no CUDA toolkit (NVRTC) to ask: arch_cc checks the form only, with or without the simulator")
    code = ("import normc\nfrom normc.lowering import supported_ccs\nprint(supported_ccs())\n"
            "try:\n    normc.compile('t d : norm over d', arch='sm_999')\nexcept normc.ArgumentError as e:\n"
            "    print(e)\n")
    root = str(pathlib.Path(normc.__file__).resolve().parent.parent)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NORMC_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ccs, err = out.stdout.splitlines()[:2]
    assert ccs == str(supported_ccs())
    assert err.startswith("arch is 'sm_999': compute capability 99.9 is not one this CUDA toolkit compiles for")


def test_malformed_plan_json_names_what_is_wrong():
    """``Plan.from_json("{}")`` raised a bare KeyError: 'axes', and ``"[1,2]"`` a TypeError about list
    indices; malformed text is now an ArgumentError (a ValueError, as documented) naming what is wrong."""
    import json

    good = json.loads(normc.plan(PLAIN, (4, 8)).to_json())
    no_axis_x = {**good, "axes": [{k: v for k, v in a.items() if k != "x"} for a in good["axes"]]}
    cases = [
        ("{}", ["text lacks Plan field(s) strategy, schedule, axes,"]),
        ("[1,2]", ["text holds a JSON list", "expected an object of Plan fields"]),
        ("not json", ["text is not JSON"]),
        (None, ["text is NoneType; expected the str of Plan.to_json()"]),  # was json's own TypeError
        (json.dumps({k: v for k, v in good.items() if k != "grid"}), ["text lacks Plan field(s) grid;"]),
        (json.dumps({**good, "bogus": 1}), ["text has unknown field(s) bogus"]),
        (json.dumps({**good, "axes": 3}), ["text: axes is 3", "list"]),
        (json.dumps({**good, "axes": [7]}), ["text: axes[0] holds a JSON int"]),
        (json.dumps(no_axis_x), ["text: axes[0] lacks Axis field(s) x;"]),
        (json.dumps({**good, "why": "a reason"}), ["text: why is 'a reason'", "list"]),
        # field values were taken as they came: eps -1 or 'x', vec 2.5, stat 'mean' reached the lowering
        (json.dumps({**good, "eps": -1.0}), ["text: eps must be a finite non-negative"]),
        (json.dumps({**good, "eps": 1e-50}), ["text: eps 1e-50 rounds to 0 in float32"]),
        (json.dumps({**good, "eps": 1e39}), ["text: eps 1e+39 is too large: expected at most 1e+30"]),
        (json.dumps({**good, "eps": "x"}), ["text: eps is 'x'; expected float"]),
        (json.dumps({**good, "vec": 2.5}), ["text: vec is 2.5; expected int"]),
        (json.dumps({**good, "vec": True}), ["text: vec is True; expected int"]),
        (json.dumps({**good, "stats": 1}), ["text: stats is 1; expected bool"]),
        (json.dumps({**good, "stat": "mean"}), ["text: stat is 'mean'", "'norm', 'rms'"]),
        (json.dumps({**good, "x_dtype": "float64"}), ["text: x_dtype is 'float64'", "'bfloat16'"]),
        (json.dumps({**good, "axes": [{**good["axes"][0], "size": "4"}]}), ["text: axes[0]: size is '4'"]),
        # ... and so were values no plan has (a new-user run: threads 0 gave a ZeroDivisionError in the lowering,
        # schedule 'bogus' lowered a split's two kernels)
        (json.dumps({**good, "schedule": "bogus"}), ["text: schedule is 'bogus'", "'persistent'"]),
        (json.dumps({**good, "threads": 0}), ["text: threads is 0; expected an int >= 1 in an inner plan"]),
        (json.dumps({**good, "tpr": 0}), ["text: tpr is 0; expected an int >= 1"]),
        (json.dumps({**good, "vec": 3}), ["text: vec is 3; expected 1, 2, 4 or 8"]),
        (json.dumps({**good, "grid": -5}), ["text: grid is -5; expected an int >= 0"]),
        (json.dumps({**good, "cluster": 0}), ["text: cluster is 0"]),
        (json.dumps({**good, "axes": []}), ["text: axes is empty"]),
        (json.dumps({**good, "kept": 5}), ["text: kept is 5; the kept axes' sizes multiply to 4"]),
        (json.dumps({**good, "arch": "sm_1"}), ["text: arch is 'sm_1'"]),
    ]
    for text, words in cases:
        with raises(ArgumentError, *words):
            normc.Plan.from_json(text)
    assert issubclass(ArgumentError, ValueError)
    assert normc.Plan.from_json(json.dumps(good)) == normc.plan(PLAIN, (4, 8))
    assert normc.Plan.from_json(json.dumps({**good, "eps": 0, "stat": "rms"})).eps == 0  # an int eps is a float


def test_malformed_backward_plan_json_values_are_named():
    """BackwardPlan.from_json checks field values as Plan.from_json does (eps, dtypes, nested reductions)."""
    import json

    from normc.backward_plan import BackwardPlan
    from normc.runtime.backward import plan_backward

    bp = plan_backward(normc.spec("t d : norm over d ; scale d ; shift d"), (64, 40), "float32")
    good = json.loads(bp.to_json())
    assert BackwardPlan.from_json(json.dumps(good)) == bp
    with raises(ArgumentError, "text: eps must be a finite non-negative"):
        BackwardPlan.from_json(json.dumps({**good, "eps": -1e-5}))
    with raises(ArgumentError, "text: dy_dtype is 'int8'"):
        BackwardPlan.from_json(json.dumps({**good, "dy_dtype": "int8"}))
    with raises(ArgumentError, "text: dx", "is 'many'; expected int"):
        BackwardPlan.from_json(json.dumps({**good, "dx": {**good["dx"], "splits": "many"}}))


def test_dtypes_as_numpy_objects_are_accepted_or_named():
    """dtype arguments may be names or numpy dtype objects/types (a fresh user passed np.dtype("float16") to
    normc.plan and got a bare KeyError); anything else is an ArgumentError naming the argument."""
    for dt in ("float16", np.float16, np.dtype("float16")):
        assert normc.plan(PLAIN, (4, 6), dt).x_dtype == "float16"
        assert normc.compile(PLAIN, out_dtype=dt).out_dtype == "float16"
    with raises(ArgumentError, "dtype", "int8"):
        normc.plan(PLAIN, (4, 6), np.dtype("int8"))
    with raises(ArgumentError, "out_dtype", "int32"):
        normc.compile(PLAIN, out_dtype=np.int32)


def test_layout_of_the_wrong_type_is_named():
    """The plan fuzzer found layout=False raising a bare TypeError."""
    for bad in (False, 3, [0, "a"]):
        with raises(ArgumentError, "layout"):
            normc.plan(PLAIN, (4, 6), layout=bad)


def test_grid_beyond_one_launch_is_argument_error():
    # planning only (no array this large is allocated): 10^12 short rows need 3.9e9 CTAs, over 2^31 - 1
    from normc.runtime.backward import plan_backward

    with raises(ArgumentError, "would need a grid of"):
        normc.plan("t d : norm over d", (10**12, 1), "float32")
    with raises(ArgumentError, "would need a grid of"):
        plan_backward("t d : norm over d ; scale d ; shift d", (10**9, 10**9), "float32")
    assert plan_backward("t d : norm over d ; scale d ; shift d", (10**9, 4), "float32").fused.grid == 264
