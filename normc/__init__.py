"""normc: a compiler for GPU normalization kernels.

One small spec describes layer norm, RMS norm, instance norm, group norm or batch-norm statistics; normc
plans a strategy from the array's physical layout, generates Numba CUDA kernels, compiles them to PTX and
launches them with low overhead on any CUDA array (or on Numba's CUDA simulator without a GPU).

    >>> import normc
    >>> f = normc.compile(normc.spec("n c h w : norm over h w ; scale c ; shift c"))
    >>> y = f(x, scale, shift)          # x: a torch/CuPy/Numba CUDA array, or numpy on the simulator
"""

__version__ = "0.1.0"

import functools as _functools
import os as _os

# Numba builds a coloured message (colorama) for every typing attempt that fails while it resolves overloads,
# thousands per kernel, and throws them away. Without colour a compile takes a third less time: layer norm
# 4096 x 1000 0.50 -> 0.33 s, NHWC group norm float16 (three kernels) 1.97 -> 1.85 s (2-core CPU, two runs).
# Set before Numba is imported (it reads the variable once); a value the user set, "" included, is kept.
_os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")

from .errors import ArgumentError, CompileError, NormcError, SpecError
from .spec import Spec, batch_norm_stats, group_norm, instance_norm, layer_norm, rms_norm
from .spec import spec as _spec_fn
from .planner import Plan

spec = _spec_fn


def compile(spec, *, out_dtype=None, arch=None, schedule=None, use_tuning=True):  # noqa: A001 - the API's name
    """Return a callable that normalizes arrays as ``spec`` says; see :class:`normc.runtime.Compiled`."""
    from .runtime import Compiled

    return Compiled(spec, out_dtype=out_dtype, arch=arch, schedule=schedule, use_tuning=use_tuning)


def autotune(spec, x, scale=None, shift=None, *, reps=50):
    """Time the schedules ``x``'s problem admits on its GPU and store the fastest for later processes;
    see :func:`normc.runtime.tune.autotune`."""
    from .runtime.tune import autotune as _autotune

    return _autotune(spec, x, scale, shift, reps=reps)


def plan(spec, shape, dtype="float32", **kw):
    """Plan ``spec`` for an x of ``shape``; see :func:`normc.api.plan_for` for the keyword arguments.

    Raises:
        normc.ArgumentError: a keyword ``plan_for`` does not take (a split dim's size, e.g. ``g=2``, belongs to
            the spec: ``normc.plan(normc.spec(text, g=2), ...)``); the errors of ``plan_for``.
    """
    from .api import plan_for
    from .errors import ArgumentError

    params = _plan_keywords()
    unknown = sorted(set(kw) - set(params))
    if unknown:
        hint = ""
        if all(isinstance(kw[k], int) for k in unknown) and set(unknown) <= _split_parts(spec):
            sizes = ", ".join(f"{k}={kw[k]}" for k in unknown)
            hint = f"; a split dim's size goes into the spec: normc.plan(normc.spec(text, {sizes}), ...)"
        known = [p for p in params if p not in ("spec", "shape", "dtype")]
        raise ArgumentError(f"unexpected keyword argument(s) {', '.join(unknown)} for normc.plan; expected some of "
                            f"{', '.join(known)}{hint}")
    return plan_for(spec, shape, dtype=dtype, **kw)


@_functools.cache
def _plan_keywords() -> tuple:
    """The parameter names of :func:`normc.api.plan_for`, in order (read once: ``inspect.signature`` costs tens
    of microseconds a call)."""
    import inspect

    from .api import plan_for

    return tuple(inspect.signature(plan_for).parameters)


def _split_parts(spec) -> set:
    """The part names of the split dims of spec text ``spec`` (e.g. {"g", "k"} for ``n (g k) h w : ...``); empty
    for anything else, and for text that does not parse (its own error comes later)."""
    from .errors import SpecError
    from .spec import _Parser

    if not isinstance(spec, str):
        return set()
    try:
        dims = _Parser(spec).parse().dims
    except SpecError:
        return set()
    return {a for d in dims if len(d) > 1 for a in d}


__all__ = [
    "ArgumentError", "CompileError", "NormcError", "SpecError", "Spec", "Plan", "spec", "compile", "plan", "autotune",
    "layer_norm", "rms_norm", "instance_norm", "group_norm", "batch_norm_stats", "__version__",
]
