"""Canonical form of a normalization problem, read from the *physical* layout.

A spec names logical axes; an array lays them out in memory with strides. The kernels do not care about
logical names, only about which axes are reduced and how each tensor steps along them. This module turns
(spec, shape, strides) into a short list of :class:`Axis` records, outermost-first in memory:

1. split dims are expanded into their parts (``(g k)`` with extent C becomes g and k, k stepping by the
   dim's stride, g by ``k * stride``);
2. size-1 axes are dropped;
3. axes are sorted by |x stride|, largest first (ties keep logical order), which is the memory order;
4. neighbours of the same role (kept or reduced) are merged when *every* tensor involved (x, out, scale,
   shift, mean/rstd) steps contiguously across them.

The result alternates kept and reduced segments; e.g. an NHWC instance norm becomes
``[n: kept][h*w: reduced][c: kept]`` and a layer norm ``[t: kept][d: reduced]``.

All strides are in elements, not bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ArgumentError

# Tensors that carry a stride per axis, in the order they appear in Axis.strides.
TENSORS = ("x", "out", "scale", "shift", "stat")


@dataclass(frozen=True)
class Axis:
    """One canonical axis.

    Attributes:
        size: extent (>= 2 after canonicalization, except for the degenerate all-size-1 problem).
        reduced: True for a reduction axis, False for a kept (iteration) axis.
        x, out, scale, shift, stat: element strides of x, of the output, of the scale and shift vectors
            (0 where the parameter is broadcast along this axis) and of the float32 mean/rstd arrays
            (0 on reduced axes).
    """

    size: int
    reduced: bool
    x: int
    out: int
    scale: int
    shift: int
    stat: int

    def stride(self, tensor: str) -> int:
        return getattr(self, tensor)


def expand(spec, shape, x_strides, out_strides):
    """Expand the logical dims of ``spec`` over ``shape`` into per-axis records (logical order, size-1 kept).

    Args:
        spec: a :class:`normc.Spec`.
        shape: logical shape of x (one int per spec dim).
        x_strides, out_strides: element strides of x and out per logical dim.

    Returns:
        (list of Axis in logical axis order, dict axis name -> extent).

    Raises:
        ArgumentError: rank mismatch or a split extent not divisible by the given part sizes.
    """
    sizes = spec.axis_sizes(tuple(shape))
    scale_axes = spec.scale or ()
    shift_axes = spec.shift or ()

    def dense_strides(names):
        st, acc = {}, 1
        for a in reversed(names):
            st[a] = acc
            acc *= sizes[a]
        return st

    scale_st = dense_strides(scale_axes)
    shift_st = dense_strides(shift_axes)
    stat_st = dense_strides(spec.kept)

    records = []
    for d, parts in enumerate(spec.dims):
        xs, os_ = x_strides[d], out_strides[d]
        inner = 1
        part_recs = []
        for p in reversed(parts):
            part_recs.append(
                Axis(
                    size=sizes[p],
                    reduced=p in spec.reduced,
                    x=xs * inner,
                    out=os_ * inner,
                    scale=scale_st.get(p, 0),
                    shift=shift_st.get(p, 0),
                    stat=0 if p in spec.reduced else stat_st[p],
                )
            )
            inner *= sizes[p]
        records.extend(reversed(part_recs))
    return records, sizes


def canonicalize(records):
    """Drop size-1 axes, sort outermost-first by |x stride| and merge contiguous same-role neighbours.

    Args:
        records: list of :class:`Axis` in logical order (from :func:`expand`).

    Returns:
        tuple of :class:`Axis`, outermost-first in memory order. Empty when every axis has size 1.
    """
    kept = [(i, a) for i, a in enumerate(records) if a.size != 1]
    # Stable sort: larger |stride| first; among equal strides (only possible for broadcast/zero strides),
    # the logically outer axis stays outer.
    kept.sort(key=lambda ia: (-abs(ia[1].x), -abs(ia[1].out), ia[0]))
    merged: list[Axis] = []
    for _, a in kept:
        if merged:
            o = merged[-1]
            if o.reduced == a.reduced and all(o.stride(t) == a.stride(t) * a.size for t in TENSORS):
                merged[-1] = Axis(o.size * a.size, a.reduced, a.x, a.out, a.scale, a.shift, a.stat)
                continue
        merged.append(a)
    return tuple(merged)


def dense_like(shape, strides):
    """Element strides of a dense array with the same memory order as ``strides`` (for allocating out).

    Ties (size-1 dims, zero strides) keep the logical order. Raises nothing.
    """
    order = sorted(range(len(shape)), key=lambda d: (-abs(strides[d]), d))
    out = [0] * len(shape)
    acc = 1
    for d in reversed(order):
        out[d] = acc
        acc *= max(shape[d], 1)
    return tuple(out)


def check_no_overlap(shape, strides, name):
    """Raise :class:`ArgumentError` if an output array with these strides writes an element twice.

    A sufficient test: sorted by stride, each axis' stride must be at least the extent spanned by the
    axes inside it. Size-1 dims are ignored; an array with a size-0 dim has no elements (numpy gives such
    arrays zero strides), so nothing to check.
    """
    if any(n == 0 for n in shape):
        return
    dims = sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1)
    span = 1
    for s, n in dims:
        if s < span:
            raise ArgumentError(
                f"{name} has overlapping memory (element strides {tuple(strides)} for shape {tuple(shape)}); "
                f"expected an array whose elements are all distinct"
            )
        span = s * n
