"""The physical problem handed to the planner: canonical axes plus dtypes, statistic, eps and alignments."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .canonical import Axis, canonicalize, expand
from .errors import ArgumentError

DTYPES = ("float32", "float16", "bfloat16")


# Accepted spellings of the three dtypes (strings, in Python and on the command line).
DTYPE_ALIASES = {
    "float32": "float32", "f32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "f16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def dtype_name(dt):
    """The name normc uses for a dtype given as a string (a name or an alias of :data:`DTYPE_ALIASES`, e.g.
    ``"bf16"``, or a numpy type code such as ``"f4"``, ``"<f2"``), a numpy dtype or scalar type
    (``np.float16``, ``np.dtype("float16")``, ``ml_dtypes.bfloat16``) or a torch dtype (``torch.float16``);
    ``None`` stays ``None``. Anything else comes back as its ``str`` so that the caller's check names it."""
    if dt is None:
        return dt
    if isinstance(dt, str):
        name = DTYPE_ALIASES.get(dt.strip().lower())
        if name is None:  # numpy's type codes, e.g. "f4", "<f2": np.dtype accepts them, so do we
            import numpy as np

            try:
                name = np.dtype(dt.strip()).name
            except Exception:  # TypeError, or ValueError/SyntaxError from numpy's parse of "0:", "01"...
                name = None
        return name if name in DTYPES else dt
    name = getattr(dt, "name", None)  # numpy dtypes
    if not isinstance(name, str) and isinstance(dt, type):
        import numpy as np

        try:
            name = np.dtype(dt).name  # numpy scalar types, ml_dtypes.bfloat16
        except Exception:  # not a dtype numpy knows
            name = None
    return name if isinstance(name, str) else str(dt).replace("torch.", "")
# Element offsets are int64 in the kernels; keep products of extents and strides clear of overflow.
MAX_INDEX = 2**62


@dataclass(frozen=True)
class Problem:
    """A normalization problem in canonical form (see :mod:`normc.canonical`).

    Attributes:
        axes: canonical axes, outermost-first.
        stat: ``"norm"`` or ``"rms"``.
        eps: float >= 0.
        x_dtype, out_dtype: element types of x and the output.
        scale_dtype, shift_dtype: element types of the affine vectors, ``None`` when the spec has no such step.
        stats: whether float32 mean/rstd are produced.
        aligns: byte alignment (power of two, capped at 16) of each base pointer: keys x, out, scale, shift.
        kept: number of reductions (product of kept extents).
        reduced: elements per reduction (product of reduced extents).
    """

    axes: tuple
    stat: str
    eps: float
    x_dtype: str
    out_dtype: str
    scale_dtype: str | None
    shift_dtype: str | None
    stats: bool
    aligns: tuple  # ((name, bytes), ...)
    kept: int
    reduced: int

    @property
    def align(self):
        return dict(self.aligns)


def pointer_align(addr: int) -> int:
    """Largest power of two (capped at 16) dividing a byte address; 16 for a null pointer."""
    if addr == 0:
        return 16
    return min(16, addr & -addr)


def make_problem(spec, shape, x_strides, out_strides, *, x_dtype, out_dtype=None, scale_dtype=None,
                 shift_dtype=None, stats=False, aligns=None) -> Problem:
    """Build the canonical :class:`Problem` for ``spec`` over an x of ``shape``/``x_strides``.

    Args:
        spec: :class:`normc.Spec`.
        shape: logical shape of x (tuple of ints, one per spec dim).
        x_strides, out_strides: element strides of x and of the output, per logical dim.
        x_dtype, out_dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"`` (out defaults to x's).
        scale_dtype, shift_dtype: dtypes of the affine vectors (required when the spec has the step).
        stats: produce float32 mean and rstd.
        aligns: dict tensor -> byte alignment of its base pointer (default 16 for all: aligned allocations).

    Raises:
        ArgumentError: bad dtype, rank or extents.
    """
    out_dtype = out_dtype or x_dtype
    for name, dt in (("x", x_dtype), ("out_dtype", out_dtype), ("scale", scale_dtype), ("shift", shift_dtype)):
        if dt is not None and dt not in DTYPES:
            raise ArgumentError(f"{name} has dtype {dt}; expected one of float32, float16, bfloat16")
    if spec.scale is not None and scale_dtype is None:
        scale_dtype = x_dtype
    if spec.shift is not None and shift_dtype is None:
        shift_dtype = x_dtype
    records, sizes = expand(spec, shape, x_strides, out_strides)
    numel = math.prod(shape)
    span = sum((n - 1) * abs(s) for n, s in zip(shape, x_strides) if n > 0)
    if numel >= MAX_INDEX or span >= MAX_INDEX:
        raise ArgumentError(
            f"x has shape {tuple(shape)} ({numel} elements); expected fewer than 2**62 elements and element "
            f"offsets (normc indexes with 64-bit integers)"
        )
    axes = canonicalize(records)
    if not any(a.reduced for a in axes):
        # Every reduced extent is 1 (or the array is all size-1 dims): keep a size-1 reduction axis innermost
        # so the kernels always have one; its zero strides force scalar accesses.
        axes = axes + (Axis(1, True, 0, 0, 0, 0, 0),)
    kept = math.prod(sizes[a] for a in spec.kept)
    reduced = math.prod(sizes[a] for a in spec.reduced)
    al = {"x": 16, "out": 16, "scale": 16, "shift": 16}
    if aligns:
        al.update(aligns)
    return Problem(
        axes=axes, stat=spec.stat, eps=float(spec.eps), x_dtype=x_dtype, out_dtype=out_dtype,
        scale_dtype=scale_dtype if spec.scale is not None else None,
        shift_dtype=shift_dtype if spec.shift is not None else None,
        stats=bool(stats), aligns=tuple(sorted(al.items())), kept=kept, reduced=reduced,
    )
