"""Shared test helpers: a float64 numpy reference for any spec, tolerance checks, and the ``gpu`` marker skip.

Without a GPU, ``normc.compile(spec)(x_numpy, ...)`` runs the generated kernels on Numba's CUDA simulator
(each CUDA thread is a Python thread), so simulator tests keep their arrays tiny.
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings

import numpy as np
import pytest

# The simulator path warns once per process that it is slow; the tests know. (Set at import for non-pytest
# use of these helpers, and as ini filters below: pytest restores the filters after importing conftest.)
warnings.filterwarnings("ignore", message="normc: no CUDA GPU")
_FILTERS = (
    "ignore:normc. no CUDA GPU:RuntimeWarning",
    # Simulated idle threads (rows past the end) compute 0/0 statistics they never store, in numpy scalars.
    "ignore:invalid value encountered in scalar divide:RuntimeWarning",
)

# Specs shared by the simulator tests of the forward (test_sim.py) and backward (test_backward.py) kernels.
LN = "t d : norm over d ; scale d ; shift d"
RMS_TEXT = "t d : rms over d ; scale d"
IN1 = "n c l : norm over l ; scale c ; shift c"
IN2 = "n c h w : norm over h w ; scale c ; shift c"
IN3 = "n c d h w : norm over d h w ; scale c ; shift c"
BN = "n c h w : norm over n h w ; scale c ; shift c"
GN = "n (g k) h w : norm over k h w ; scale g k ; shift g k"
NHWC = [0, 2, 3, 1]  # memory order of a logical (n c h w) array stored n h w c


def pytest_configure(config):
    for f in _FILTERS:
        config.addinivalue_line("filterwarnings", f)
    # A private kernel/tuning cache per test session: a user's cache (e.g. schedules recorded by
    # normc.autotune) must not change what the tests plan.
    if "NORMC_CACHE_DIR" not in os.environ or not os.environ.get("NORMC_TEST_KEEP_CACHE"):
        os.environ["NORMC_CACHE_DIR"] = tempfile.mkdtemp(prefix="normc-test-cache-")

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test extra
    BF16 = None

# max|err| / max(max|ref|, 1) allowed for y, by x's (output) dtype. float32: the simulator computes in
# float32 (numpy scalars), so a few ulps of accumulated rounding; half dtypes: output rounding (2^-8 for
# bfloat16, 2^-11 for float16) dominates.
Y_TOL = {"float32": 2e-5, "float16": 1e-2, "bfloat16": 1e-2}
# mean/rstd are float32 accumulations whatever x's dtype: relative to max(|ref|, 1).
STAT_TOL = 1e-4


def np_dtype(name):
    """numpy dtype for a normc dtype name (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        if BF16 is None:
            pytest.skip("ml_dtypes is needed for bfloat16 numpy arrays")
        return BF16
    return np.dtype(name)


def dtype_name(a) -> str:
    return np.asarray(a).dtype.name


def as_spec(spec):
    import normc

    return normc.spec(spec) if isinstance(spec, str) else spec


def reference(spec, x, scale=None, shift=None):
    """float64 reference of ``spec`` on numpy ``x``: returns ``(y, mean, rstd)``.

    x's logical dims are reshaped into the spec's axes (split dims expanded, outer part first), reduced over
    the reduction axes, normalized (biased variance; mean 0 for rms), multiplied by ``scale`` and offset by
    ``shift`` (each reshaped to its axes' extents, in spec axis order, and broadcast along the others), and
    reshaped back. mean/rstd are shaped like the kept axes in spec order.
    """
    spec = as_spec(spec)
    x = np.asarray(x)
    sizes = spec.axis_sizes(x.shape)
    axes = spec.axes
    full = [sizes[a] for a in axes]
    xd = x.astype(np.float64).reshape(full)
    red = tuple(i for i, a in enumerate(axes) if a in spec.reduced)
    if spec.stat == "norm":
        mean = xd.mean(axis=red, keepdims=True)
        var = ((xd - mean) ** 2).mean(axis=red, keepdims=True)
        rstd = 1.0 / np.sqrt(var + spec.eps)
        y = (xd - mean) * rstd
    else:
        ms = (xd * xd).mean(axis=red, keepdims=True)
        rstd = 1.0 / np.sqrt(ms + spec.eps)
        mean = np.zeros_like(rstd)
        y = xd * rstd

    def param(p, p_axes):
        pd = np.asarray(p).astype(np.float64).reshape([sizes[a] for a in p_axes])
        return pd.reshape([sizes[a] if a in p_axes else 1 for a in axes])

    if spec.scale is not None:
        assert scale is not None
        y = y * param(scale, spec.scale)
    if spec.shift is not None:
        assert shift is not None
        y = y + param(shift, spec.shift)
    stat_shape = tuple(sizes[a] for a in spec.kept)
    return y.reshape(x.shape), mean.reshape(stat_shape), rstd.reshape(stat_shape)


def rel_err(got, ref) -> float:
    """max|got - ref| / max(max|ref|, 1) in float64 (0 for empty arrays; inf if got has a non-finite value
    where ref is finite)."""
    got = np.asarray(got).astype(np.float64)
    ref = np.asarray(ref).astype(np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if got.size == 0:
        return 0.0
    if not np.all(np.isfinite(got[np.isfinite(ref)])):
        return math.inf
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1.0))


def fold_atol(x, ref_rstd, scale=None, ulps=8):
    """Absolute error float32 arithmetic cannot avoid in ``y``: the kernels apply ``y = (x - mean) * a + b``
    with ``a = rstd * scale``; a float32 ``mean`` is only good to ``|mean| * 2^-24``, which ``a`` amplifies.
    Negligible for well-conditioned rows (rstd ~ 1), it matters when ``|mean| >> std``."""
    x = np.asarray(x).astype(np.float64)
    if x.size == 0:
        return 0.0
    s = 1.0 if scale is None else max(float(np.max(np.abs(np.asarray(scale).astype(np.float64)))), 1.0)
    r = float(np.max(np.asarray(ref_rstd, dtype=np.float64))) if np.size(ref_rstd) else 1.0
    return ulps * 2.0**-24 * float(np.max(np.abs(x))) * r * s


def check_y(y, ref, dtype, tol=None, atol=0.0):
    """max|y - ref| <= tol * max(max|ref|, 1) + atol (tol by dtype by default; atol: see fold_atol)."""
    tol = Y_TOL[dtype] if tol is None else tol
    scale = max(float(np.max(np.abs(np.asarray(ref, dtype=np.float64)))), 1.0) if np.size(ref) else 1.0
    err = rel_err(y, ref)
    assert err <= tol + atol / scale, f"y: max rel err {err:.3g} > {tol:.3g} + {atol / scale:.3g} ({dtype})"


def check_stats(mean, rstd, ref_mean, ref_rstd, tol=STAT_TOL):
    for name, got, ref in (("mean", mean, ref_mean), ("rstd", rstd, ref_rstd)):
        assert np.asarray(got).dtype == np.float32, f"{name} dtype {np.asarray(got).dtype}"
        assert np.shape(got) == np.shape(ref), f"{name} shape {np.shape(got)} != {np.shape(ref)}"
        err = rel_err(got, ref)
        assert err <= tol, f"{name}: max rel err {err:.3g} > {tol:.3g}"


def make_x(shape, dtype, *, perm=None, rng=None, loc=0.0, std=1.0, values=None):
    """x of logical ``shape`` and ``dtype`` laid out in memory as ``perm`` (dims outermost-first; default
    row-major), filled with normal(loc, std) values cast to ``dtype`` (or with ``values``)."""
    rng = np.random.default_rng(0) if rng is None else rng
    shape = tuple(shape)
    perm = list(range(len(shape))) if perm is None else list(perm)
    phys = np.empty([shape[d] for d in perm], dtype=np_dtype(dtype))
    x = phys.transpose(np.argsort(perm))
    assert x.shape == shape
    if values is None:
        values = rng.normal(loc, std, size=shape)
    x[...] = np.asarray(values).astype(np.float64).astype(np_dtype(dtype))
    return x


def make_param(n, dtype="float32", rng=None, loc=0.0, std=1.0):
    rng = np.random.default_rng(1) if rng is None else rng
    return rng.normal(loc, std, size=n).astype(np_dtype(dtype))


def memory_order(a):
    """a's dims of extent > 1, outermost-first by stride, for comparing layouts."""
    a = np.asarray(a)
    dims = [d for d in range(a.ndim) if a.shape[d] > 1]
    return sorted(dims, key=lambda d: -a.strides[d])


# ----------------------------------------------------------------------------------------------------
# The gpu marker: skipped without a usable CUDA GPU.


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from normc.runtime import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (normc.runtime.gpu_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
