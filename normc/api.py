"""Planning entry points shared by the runtime and the CLI (no GPU needed)."""

from __future__ import annotations

import numbers
import re

from .canonical import check_no_overlap, dense_like
from .errors import ArgumentError, check_flag
from .planner import DEFAULT_SMS, make_plan
from .problem import DTYPES, dtype_name, make_problem


def layout_strides(spec, shape, layout):
    """Element strides of a dense array of logical ``shape`` laid out in memory as ``layout``.

    Args:
        spec: the :class:`normc.Spec`.
        shape: logical shape (one int per spec dim).
        layout: the spec's dims outermost-first as they lie in memory, as text (``"n h w c"``; a split dim is
            written as its group, ``"n h w (g k)"``) or a sequence of dim indices (a permutation, like
            anchors.json's ``memory_perm``). ``None``: as written in the spec (row-major).

    Raises:
        ArgumentError: the layout does not name each dim exactly once.
    """
    nd = len(spec.dims)
    if layout is None:
        perm = list(range(nd))
    elif isinstance(layout, str):
        names = ["(" + " ".join(d) + ")" if len(d) > 1 else d[0] for d in spec.dims]
        toks = re.findall(r"\([^)]*\)|[^\s()]+", layout)
        toks = ["(" + " ".join(t[1:-1].split()) + ")" if t.startswith("(") else t for t in toks]
        if sorted(toks) != sorted(names):
            raise ArgumentError(
                f"layout {layout!r} must list each dim of the spec once, outermost first; expected a "
                f"permutation of {' '.join(names)!r}"
            )
        perm = [names.index(t) for t in toks]
    else:
        try:
            perm = [int(i) for i in layout]
        except (TypeError, ValueError):
            raise ArgumentError(f"layout is {layout!r}; expected dim names as text (e.g. 'n h w c') or a "
                                f"permutation of 0..{nd - 1}") from None
        if sorted(perm) != list(range(nd)):
            raise ArgumentError(f"layout {layout!r} must be a permutation of 0..{nd - 1}")
    strides = [0] * nd
    acc = 1
    for d in reversed(perm):
        strides[d] = acc
        acc *= max(int(shape[d]), 1)
    return tuple(strides)


def _strides_arg(name, strides, nd):
    """``strides`` as a tuple of ``nd`` ints, else :class:`ArgumentError` naming ``name``."""
    if isinstance(strides, (str, bytes)) or not hasattr(strides, "__iter__"):
        raise ArgumentError(f"{name} is {strides!r}; expected a sequence of {nd} ints (element strides)")
    strides = tuple(strides)
    if len(strides) != nd or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in strides):
        raise ArgumentError(f"{name} is {strides!r}; expected a sequence of {nd} ints (element strides, one per dim)")
    return tuple(int(s) for s in strides)


def plan_for(spec, shape, dtype="float32", *, strides=None, layout=None, out_dtype=None, out_strides=None,
             scale_dtype=None, shift_dtype=None, stats=False, arch="sm_90", sms=DEFAULT_SMS, aligns=None,
             schedule=None):
    """Plan ``spec`` for an x of logical ``shape`` (no GPU needed).

    Args:
        spec: :class:`normc.Spec` (or spec text).
        shape: logical shape of x.
        dtype: x's dtype name: ``"float32"``, ``"float16"`` or ``"bfloat16"``.
        strides: x's element strides (default: from ``layout``).
        layout: memory order, see :func:`layout_strides` (ignored when ``strides`` is given).
        out_dtype, out_strides: output dtype and strides (default: x's dtype, dense in x's memory order).
        scale_dtype, shift_dtype: affine vector dtypes (default: x's).
        stats: whether mean/rstd are produced.
        arch: target compute capability: ``"sm_90"``, ``"compute_90"``, ``"90"``, ``90`` or ``(9, 0)``, one the
            installed CUDA toolkit compiles for (:func:`normc.lowering.arch_cc`).
        sms: multiprocessors assumed when sizing grids.
        aligns: byte alignment of the base pointers (dict: x, out, scale, shift; default 16).
        schedule: force a schedule as :func:`normc.compile` does (``"persistent"``, ``"staged"``, ``"looped"``,
            ``"split"``, ``"coop"``, ``"cluster"`` or ``"grid"``; where the problem does not admit it, the planner keeps its
            own choice and says why); None: the planner's choice.

    Returns:
        :class:`normc.Plan`.

    Raises:
        SpecError: the spec text is invalid.
        ArgumentError: any other argument is invalid (shape, strides, out_strides that overlap, dtypes, layout,
            stats not a bool, arch, sms, aligns, schedule).
        CompileError: a float16/bfloat16 dtype with an arch older than sm_80 (normc's 16-bit kernels need it),
            as :func:`normc.compile` would refuse it.
    """
    from .spec import Spec, spec as parse

    if isinstance(spec, str):
        spec = parse(spec)
    if not isinstance(spec, Spec):
        raise ArgumentError(f"spec is {type(spec).__name__}; expected a normc.Spec or spec text")
    spec.axis_sizes(shape)  # type, rank and split checks first: ArgumentError naming x
    shape = tuple(int(s) for s in shape)
    given = {"dtype": dtype, "out_dtype": out_dtype, "scale_dtype": scale_dtype, "shift_dtype": shift_dtype}
    dtype, out_dtype, scale_dtype, shift_dtype = map(dtype_name, given.values())
    for name, dt, optional in (("dtype", dtype, False), ("out_dtype", out_dtype, True),
                               ("scale_dtype", scale_dtype, True), ("shift_dtype", shift_dtype, True)):
        if not (optional and dt is None) and dt not in DTYPES:
            raw = given[name]  # as the caller wrote it: 5 (an int) is not the string '5'
            shown = repr(raw) if isinstance(raw, str) or raw is None else f"{raw!r} ({type(raw).__name__})"
            raise ArgumentError(f"{name} is {shown}; expected one of {', '.join(map(repr, DTYPES))}")
    for name, dt in (("scale", scale_dtype), ("shift", shift_dtype)):
        if dt is not None and getattr(spec, name) is None:
            raise ArgumentError(f"{name}_dtype is {dt!r} but the spec has no {name} step; expected None "
                                f"(or add '; {name} <axes>' to the spec)")
    stats = check_flag(stats, "stats")
    from .runtime.tune import SCHEDULES  # the one list of schedule names

    if schedule not in SCHEDULES:
        raise ArgumentError(f"schedule is {schedule!r}; expected one of {SCHEDULES}")
    if isinstance(sms, bool) or not isinstance(sms, numbers.Integral) or sms < 1:
        raise ArgumentError(f"sms is {sms!r}; expected a positive int (multiprocessors)")
    if aligns is not None:
        if not isinstance(aligns, dict) or not set(aligns) <= {"x", "out", "scale", "shift"}:
            raise ArgumentError(f"aligns is {aligns!r}; expected a dict with keys among x, out, scale, shift")
        for k, a in aligns.items():
            if isinstance(a, bool) or not isinstance(a, numbers.Integral) or a < 1 or a & (a - 1):
                raise ArgumentError(f"aligns[{k!r}] is {a!r}; expected a power of two (bytes)")
    if strides is None:
        strides = layout_strides(spec, shape, layout)
    strides = _strides_arg("strides", strides, len(shape))
    if out_strides is None:
        out_strides = dense_like(shape, strides)
    out_strides = _strides_arg("out_strides", out_strides, len(shape))
    check_no_overlap(shape, out_strides, "out_strides")  # as the runtime refuses such an out
    prob = make_problem(spec, shape, strides, out_strides, x_dtype=dtype, out_dtype=out_dtype,
                        scale_dtype=scale_dtype, shift_dtype=shift_dtype, stats=stats, aligns=aligns)
    from .lowering import arch_cc, check_16bit_target

    cc = arch_cc(arch)
    plan = make_plan(prob, arch=f"sm_{cc[0]}{cc[1]}", sms=sms, schedule=schedule)
    check_16bit_target(plan, cc)  # as compiling it would refuse it
    return plan
