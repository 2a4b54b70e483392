"""PyTorch integration: normc's forward and backward kernels as torch custom ops, an autograd Function and
drop-in ``torch.nn`` modules.

* ``torch.ops.normc.norm(x, weight, bias, spec, eps, sizes) -> (y, mean, rstd)`` and
  ``torch.ops.normc.norm_backward(dy, x, mean, rstd, weight, spec, eps, sizes, need_dweight, need_dbias)
  -> (dx, dweight, dbias)`` are registered with ``torch.library.custom_op`` (with fake implementations), and
  the first has the second as its autograd formula: ``torch.compile`` keeps them as single graph nodes
  instead of breaking the graph, and they launch on the current stream without synchronizing, so they can
  be captured in a CUDA graph (run one eager call per shape first: the first call of a shape compiles).
* :func:`normalize` is the functional form (in eager mode it calls the ops' implementations through a
  ``torch.autograd.Function``, skipping the custom-op dispatch and its host cost; under ``torch.compile`` the
  custom ops); :class:`NormFunction` the same as a public ``torch.autograd.Function``.
* :class:`LayerNorm`, :class:`RMSNorm`, :class:`GroupNorm`, :class:`InstanceNorm1d`/``2d``/``3d`` and
  :class:`BatchNorm1d`/``2d``/``3d`` subclass their ``torch.nn`` counterparts (same constructor arguments,
  parameters, buffers and ``state_dict``) and only replace ``forward``. :func:`convert` swaps the matching
  modules of an existing model in place.

Where the kernels apply: CUDA tensors of float32, float16 or bfloat16 (parameters of any of the three).
Anything else (CPU tensors, float64) runs a float64/float32 torch implementation of the same formulas
(:func:`reference_forward`, :func:`reference_backward`); that is what ``torch.autograd.gradcheck`` in float64
exercises (docs/backward.md). The ``mean`` and ``rstd`` outputs of the op are not differentiable.

Modes normc does not accelerate are delegated to torch itself: batch norm and instance norm in eval mode
with running statistics (an elementwise affine map, no reduction).
"""

import dataclasses
import functools
import math
from typing import Optional

try:
    import torch
except ModuleNotFoundError as e:  # still a ModuleNotFoundError (pytest.importorskip, try/except ImportError)
    if e.name != "torch":
        raise
    raise ModuleNotFoundError("normc.torch needs PyTorch, which is not installed: pip install torch (a CUDA "
                              "build, https://pytorch.org/get-started/)", name="torch") from None
from torch import Tensor, nn

import normc
from normc.canonical import dense_like
from normc.spec import Spec

__all__ = [
    "normalize", "NormFunction", "reference_forward", "reference_backward", "convert",
    "LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
]

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _sizes_text(spec: Spec) -> str:
    return ",".join(f"{k}={v}" for k, v in spec.sizes)


@functools.lru_cache(maxsize=None)
def _spec_of(text: str, eps: float, sizes: str) -> Spec:
    kw = {k: int(v) for k, v in (item.split("=") for item in sizes.split(",") if item)}
    return normc.spec(text, eps=eps, **kw)


@functools.lru_cache(maxsize=None)
def _compiled(text: str, eps: float, sizes: str):
    return normc.compile(_spec_of(text, eps, sizes))


def _kernel_ok(x, *params):
    return x.is_cuda and x.dtype in _KERNEL_DTYPES and all(p is None or p.dtype in _KERNEL_DTYPES for p in params)


def _stat_shape(spec, shape):
    sizes = spec.axis_sizes(tuple(shape))
    return tuple(sizes[a] for a in spec.kept)


def _like_x(x, t):
    """``t`` (x's shape) copied into a tensor with x's memory order."""
    out = torch.empty_strided(tuple(x.shape), dense_like(tuple(x.shape), x.stride()), dtype=x.dtype,
                              device=x.device)
    out.copy_(t)
    return out


def _full(spec, t):
    sizes = spec.axis_sizes(tuple(t.shape))
    return t.reshape([sizes[a] for a in spec.axes]), sizes


def _param(spec, p, axes, sizes, dtype):
    return p.to(dtype).reshape([sizes[a] if a in axes else 1 for a in spec.axes])


def reference_forward(spec: Spec, x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None):
    """``(y, mean, rstd)`` of ``spec`` computed with torch ops (float64 for float64 x, else float32).

    Shapes as :class:`normc.runtime.Compiled` returns them; y keeps x's dtype and memory order.
    """
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf, sizes = _full(spec, x.to(acc))
    red = [i for i, a in enumerate(spec.axes) if a in spec.reduced]
    if spec.stat == "norm":
        mean = xf.mean(dim=red, keepdim=True)
        rstd = torch.rsqrt(((xf - mean) ** 2).mean(dim=red, keepdim=True) + spec.eps)
        y = (xf - mean) * rstd
    else:
        rstd = torch.rsqrt((xf * xf).mean(dim=red, keepdim=True) + spec.eps)
        mean = torch.zeros_like(rstd)
        y = xf * rstd
    if spec.scale is not None:
        y = y * _param(spec, weight, spec.scale, sizes, acc)
    if spec.shift is not None:
        y = y + _param(spec, bias, spec.shift, sizes, acc)
    st = _stat_shape(spec, x.shape)
    return _like_x(x, y.reshape(x.shape)), mean.reshape(st).contiguous(), rstd.reshape(st).contiguous()


def reference_backward(spec: Spec, dy: Tensor, x: Tensor, mean: Tensor, rstd: Tensor,
                       weight: Optional[Tensor] = None, param_dtype=None):
    """``(dx, dweight, dbias)`` from the backward formulas of docs/backward.md, with torch ops.

    dx has x's dtype and memory order; dweight/dbias are flat in spec axis order (``None`` without the step)
    in ``param_dtype`` (default: weight's, else x's).
    """
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf, sizes = _full(spec, x.to(acc))
    gf, _ = _full(spec, dy.to(acc))
    keep = [sizes[a] if a in spec.kept else 1 for a in spec.axes]
    red = [i for i, a in enumerate(spec.axes) if a in spec.reduced]
    rs = rstd.to(acc).reshape(keep)
    xh = (xf - mean.to(acc).reshape(keep)) * rs if spec.stat == "norm" else xf * rs
    g = gf * _param(spec, weight, spec.scale, sizes, acc) if spec.scale is not None else gf
    c2 = (g * xh).mean(dim=red, keepdim=True)
    if spec.stat == "norm":
        dx = rs * (g - g.mean(dim=red, keepdim=True) - xh * c2)
    else:
        dx = rs * (g - xh * c2)
    pdt = param_dtype or (weight.dtype if weight is not None else x.dtype)

    def psum(v, axes):
        if axes is None:
            return None
        dims = [i for i, a in enumerate(spec.axes) if a not in axes]
        return (v.sum(dim=dims) if dims else v).reshape(-1).to(pdt)

    return _like_x(x, dx.reshape(x.shape)), psum(gf * xh, spec.scale), psum(gf, spec.shift)


# ----------------------------------------------------------------------------------------------------------
# custom ops


def _kernel_forward(x, weight, bias, spec, eps, sizes):
    """``(Compiled, (y, mean, rstd))`` from normc's kernels, or ``None`` where they do not apply."""
    if not _kernel_ok(x, weight, bias):
        return None
    f = _compiled(spec, eps, sizes)
    return f, f(x, None if weight is None else weight.contiguous(), None if bias is None else bias.contiguous(),
                return_stats=True)


def _norm_impl(x, weight, bias, spec, eps, sizes):
    """(y, mean, rstd): normc's kernels where they apply, else the torch reference (the body of
    ``torch.ops.normc.norm``)."""
    hit = _kernel_forward(x, weight, bias, spec, eps, sizes)
    return hit[1] if hit is not None else _reference_impl(x, weight, bias, spec, eps, sizes)


def _reference_impl(x, weight, bias, spec, eps, sizes):
    """(y, mean, rstd) from the torch reference, after the runtime's argument checks (where the kernels do
    not apply: CPU tensors, float64, other dtypes)."""
    sp = _spec_of(spec, eps, sizes)
    w = None if weight is None else weight.contiguous()
    b = None if bias is None else bias.contiguous()
    _check_reference_args(sp, x, w, b)
    return reference_forward(sp, x, w, b)


_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _check_reference_args(spec, x, weight, bias):
    """The checks normc's runtime makes on the kernels' path, for the torch reference path (CPU tensors,
    float64, other dtypes): the parameters' presence, element count and order are the runtime's own
    (:func:`normc.runtime.check_param`).

    Raises:
        normc.ArgumentError: x is not a floating-point tensor of the spec's logical shape, or weight/bias is
            missing, given for a spec without its step, not floating point, of the wrong element count or
            transposed.
    """
    from normc.runtime import check_param

    if x.dtype not in _FLOATS:
        raise normc.ArgumentError(f"x has dtype {x.dtype}; expected a floating-point tensor "
                                  f"({', '.join(str(d) for d in _FLOATS)})")
    sizes = spec.axis_sizes(tuple(x.shape))
    for name, t, step in (("weight", weight, "scale"), ("bias", bias, "shift")):
        check_param(spec, sizes, step, name, None if t is None else tuple(t.shape))
        if t is not None and t.dtype not in _FLOATS:
            raise normc.ArgumentError(f"{name} has dtype {t.dtype}; expected a floating-point tensor")


@torch.library.custom_op("normc::norm", mutates_args=())
def _norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], spec: str, eps: float,
          sizes: str) -> tuple[Tensor, Tensor, Tensor]:
    return _norm_impl(x, weight, bias, spec, eps, sizes)


@_norm.register_fake
def _norm_fake(x, weight, bias, spec, eps, sizes):
    sp = _spec_of(spec, eps, sizes)
    sz = sp.axis_sizes(x.shape, symbolic=True)
    st = tuple(sz[a] for a in sp.kept)
    sdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = torch.empty_strided(tuple(x.shape), dense_like(tuple(x.shape), x.stride()), dtype=x.dtype, device=x.device)
    return y, x.new_empty(st, dtype=sdt), x.new_empty(st, dtype=sdt)


def _norm_backward_impl(dy, x, mean, rstd, weight, spec, eps, sizes, need_dweight, need_dbias, bias_dtype):
    """(dx, dweight, dbias) (empty tensors for gradients not asked for): the body of
    ``torch.ops.normc.norm_backward``, also called directly by the eager path."""
    w = None if weight is None else weight.contiguous()
    if _kernel_ok(x, w) and dy.dtype in _KERNEL_DTYPES and mean.dtype == torch.float32:
        dx, dw, db = _compiled(spec, eps, sizes).backward(dy, x, mean.contiguous(), rstd.contiguous(), w,
                                                          need_dscale=need_dweight, need_dshift=need_dbias)
    else:
        dx, dw, db = reference_backward(_spec_of(spec, eps, sizes), dy, x, mean, rstd, w)
    dw = x.new_empty(0) if dw is None or not need_dweight else dw.reshape(-1)
    db = x.new_empty(0) if db is None or not need_dbias else db.reshape(-1)
    if bias_dtype is not None and db.numel():
        db = db.to(bias_dtype)
    return dx, dw, db


@torch.library.custom_op("normc::norm_backward", mutates_args=())
def _norm_backward(dy: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, weight: Optional[Tensor], spec: str,
                   eps: float, sizes: str, need_dweight: bool, need_dbias: bool,
                   bias_dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor, Tensor]:
    return _norm_backward_impl(dy, x, mean, rstd, weight, spec, eps, sizes, need_dweight, need_dbias,
                               bias_dtype)


@_norm_backward.register_fake
def _norm_backward_fake(dy, x, mean, rstd, weight, spec, eps, sizes, need_dweight, need_dbias, bias_dtype):
    sp = _spec_of(spec, eps, sizes)
    sz = sp.axis_sizes(x.shape, symbolic=True)
    dx = torch.empty_strided(tuple(x.shape), dense_like(tuple(x.shape), x.stride()), dtype=x.dtype,
                             device=x.device)
    pdt = weight.dtype if weight is not None else x.dtype
    # a gradient not asked for is an empty tensor of x's dtype, as the real implementation returns it
    dw = (x.new_empty((math.prod(sz[a] for a in sp.scale),), dtype=pdt) if need_dweight and sp.scale
          else x.new_empty(0))
    db = (x.new_empty((math.prod(sz[a] for a in sp.shift),), dtype=bias_dtype or pdt) if need_dbias and sp.shift
          else x.new_empty(0))
    return dx, dw, db


def _setup_context(ctx, inputs, output):
    x, weight, bias, spec, eps, sizes = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.meta = (spec, eps, sizes, bias is not None, None if bias is None else bias.dtype,
                None if bias is None else tuple(bias.shape), None if weight is None else tuple(weight.shape))


def _autograd_backward(ctx, dy, dmean, drstd, backward_op=None):
    x, weight, mean, rstd = ctx.saved_tensors
    spec, eps, sizes, has_bias, bias_dtype, bias_shape, w_shape = ctx.meta
    need_w = weight is not None and ctx.needs_input_grad[1]
    need_b = has_bias and ctx.needs_input_grad[2]
    if backward_op is not None and torch.is_grad_enabled():
        return _differentiable_backward(ctx, dy, x, weight, need_w, need_b)
    op = backward_op or torch.ops.normc.norm_backward
    dx, dw, db = op(dy, x, mean, rstd, weight, spec, eps, sizes, need_w, need_b, bias_dtype)
    return (dx, dw.reshape(w_shape) if need_w else None, db.reshape(bias_shape) if need_b else None,
            None, None, None)


_norm.register_autograd(_autograd_backward, setup_context=_setup_context)


def _differentiable_backward(ctx, dy, x, weight, need_w, need_b):
    """The eager backward when autograd records it (``create_graph=True``: double backward, Hessian-vector
    products): the forward recomputed from x with torch ops (:func:`reference_forward`, mean and rstd as
    functions of x, not the saved constants) and differentiated by autograd, so second derivatives are right.
    The bias enters y additively: its gradient is dy summed over the other axes."""
    spec, eps, sizes, has_bias, bias_dtype, bias_shape, w_shape = ctx.meta
    sp = _spec_of(spec, eps, sizes)
    inputs = [t for t, need in ((x, ctx.needs_input_grad[0]), (weight, need_w)) if need]
    grads = []
    if inputs:
        with torch.enable_grad():
            y = reference_forward(dataclasses.replace(sp, shift=None), x, weight)[0]  # the bias: below
            grads = list(torch.autograd.grad(y, inputs, dy, create_graph=True, allow_unused=True))
    dx = grads.pop(0) if ctx.needs_input_grad[0] else None
    dw = grads.pop(0).reshape(w_shape) if need_w else None
    db = None
    if need_b:
        g, _ = _full(sp, dy)
        dims = [i for i, a in enumerate(sp.axes) if a not in sp.shift]
        db = (g.sum(dim=dims) if dims else g).reshape(bias_shape).to(bias_dtype)
    return dx, dw, db, None, None, None


@functools.lru_cache(maxsize=1024)
def _spec_args(spec):
    """``(text, eps, sizes)``, the custom ops' spelling of a :class:`Spec` (or of spec text), memoized: the
    modules pass the same few specs on every call."""
    if isinstance(spec, str):
        spec = normc.spec(spec)
    if not isinstance(spec, Spec):
        raise normc.ArgumentError(f"spec is {spec!r}; expected a normc.Spec or spec text")
    return spec.text, float(spec.eps), _sizes_text(spec)


# The modules' specs, built once per (rank, settings) instead of on every forward: building a Spec renders and
# parses its text, 50-100 us of host time per call (measured on a 2-core CPU).
_layer_norm_spec = functools.lru_cache(maxsize=1024)(normc.layer_norm)
_rms_norm_spec = functools.lru_cache(maxsize=1024)(normc.rms_norm)


@functools.lru_cache(maxsize=1024)
def _layer_norm_args(ndim, nnorm, eps, affine, bias):
    """The custom ops' ``(text, eps, sizes)`` of ``LayerNorm`` (memoized on positional arguments: the modules
    call it on every forward, and hashing a Spec or keyword arguments costs more)."""
    return _spec_args(_layer_norm_spec(ndim, nnorm, eps=eps, elementwise_affine=affine, bias=bias))


@functools.lru_cache(maxsize=1024)
def _rms_norm_args(ndim, nnorm, eps, affine):
    """As :func:`_layer_norm_args`, for ``RMSNorm``."""
    return _spec_args(_rms_norm_spec(ndim, nnorm, eps=eps, elementwise_affine=affine))


def _apply(x, args, weight, bias):
    """``(y, mean, rstd)``: what :func:`normalize` does after its argument checks, given the custom ops'
    ``args`` (the modules' path)."""
    if torch.compiler.is_compiling():
        return torch.ops.normc.norm(x, weight, bias, *args)
    return _EagerNorm.apply(x, weight, bias, *args)


def normalize(x: Tensor, spec, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
              return_stats: bool = False):
    """Normalize ``x`` as ``spec`` says (differentiable in x, weight and bias).

    Args:
        x: tensor of the spec's logical shape; CUDA float32/float16/bfloat16 uses normc's kernels (any memory
            order; y keeps it), anything else the torch reference.
        spec: a :class:`normc.Spec` or its text.
        weight, bias: the scale / shift, required exactly when the spec has the step (any shape holding the
            product of their axes' extents, spec axis order).
        return_stats: also return ``mean`` and ``rstd`` (kept axes in spec order; not differentiable): float32,
            float64 for a float64 x.

    Returns:
        ``y`` (x's shape, dtype and memory order), or ``(y, mean, rstd)``.

    Raises:
        normc.ArgumentError: x is not a floating-point tensor, or shapes or dtypes do not fit the spec (weight
            or bias missing, extra or of the wrong size).
    """
    if not isinstance(x, Tensor):
        raise normc.ArgumentError(f"x is a {type(x).__name__}; expected a torch.Tensor")
    y, mean, rstd = _apply(x, _spec_args(spec), weight, bias)
    return (y, mean, rstd) if return_stats else y


class _EagerNorm(torch.autograd.Function):
    """The custom ops' autograd pair without the custom-op dispatch, for eager mode: on the H200 (torch 2.11)
    ``torch.library``'s ``backend_impl`` spent about 0.46 ms of host time per call (cProfile, 2026-12-01),
    which made a layer-norm forward+backward of (8192, 4096) bfloat16 cost 1.4 ms of wall time for 0.19 ms of
    kernels. Under ``torch.compile`` :func:`normalize` uses the custom ops (one graph node each)."""

    @staticmethod
    def forward(ctx, x, weight, bias, spec, eps, sizes):
        # The kernels' path calls the Compiled object directly and keeps it for the backward: on the H200's
        # host each torch method call from Python (reshape, to, contiguous) and each memo probe costs 1-3 us,
        # which a host-bound training step pays per norm and direction.
        hit = _kernel_forward(x, weight, bias, spec, eps, sizes)
        f, (y, mean, rstd) = hit if hit is not None else (None, _reference_impl(x, weight, bias, spec, eps, sizes))
        _setup_context(ctx, (x, weight, bias, spec, eps, sizes), (y, mean, rstd))
        ctx.compiled = f
        ctx.mark_non_differentiable(mean, rstd)
        # mean and rstd get no gradient: without this autograd fills two zero tensors for them every step
        ctx.set_materialize_grads(False)
        return y, mean, rstd

    @staticmethod
    def backward(ctx, dy, dmean, drstd):
        if dy is None:  # y took no part in the loss (only possible without materialized gradients)
            return (None,) * 6
        f = ctx.compiled
        if f is None or dy.dtype not in _KERNEL_DTYPES or torch.is_grad_enabled():
            return _autograd_backward(ctx, dy, dmean, drstd, backward_op=_norm_backward_impl)
        # the kernels' path of _norm_backward_impl, with the parameter gradients in the parameters' shapes
        # (Compiled.backward returns dscale in the weight's shape) instead of flattened and reshaped back
        x, weight, mean, rstd = ctx.saved_tensors
        _, _, _, has_bias, bias_dtype, bias_shape, w_shape = ctx.meta
        need_w = weight is not None and ctx.needs_input_grad[1]
        need_b = has_bias and ctx.needs_input_grad[2]
        dx, dw, db = f.backward(dy, x, mean, rstd, None if weight is None else weight.contiguous(),
                                need_dscale=need_w, need_dshift=need_b)
        if need_w and dw.shape != w_shape:
            dw = dw.reshape(w_shape)
        if need_b:
            if db.shape != bias_shape:
                db = db.reshape(bias_shape)
            if db.dtype != bias_dtype:
                db = db.to(bias_dtype)
        return dx, dw if need_w else None, db if need_b else None, None, None, None


class NormFunction(torch.autograd.Function):
    """``NormFunction.apply(x, weight, bias, spec)`` -> y: :func:`normalize` as an autograd Function (eager
    only; :func:`normalize` and the modules use the custom ops, which ``torch.compile`` understands)."""

    @staticmethod
    def forward(ctx, x, weight, bias, spec):
        args = _spec_args(spec)
        out = _norm_impl(x, weight, bias, *args)
        _setup_context(ctx, (x, weight, bias, *args), out)
        return out[0]

    @staticmethod
    def backward(ctx, dy):
        # the same formula as the ops' autograd (inputs x, weight, bias line up); spec gets no gradient
        return _autograd_backward(ctx, dy, None, None, backward_op=_norm_backward_impl)[:3] + (None,)


# ----------------------------------------------------------------------------------------------------------
# modules


@functools.lru_cache(maxsize=1024)
def _channel_spec(kind, ndim, eps, scale, shift, groups=None):
    """Spec for an (n, c, *spatial) input of rank ``ndim``: instance / group norm / batch statistics, with a
    per-channel scale and shift where ``scale`` / ``shift`` (the module's weight / bias exist: ``affine``, and
    ``bias=False`` drops the shift) (memoized, as the specs above)."""
    spatial = tuple(f"s{i}" for i in range(ndim - 2))
    par = ("c",) if kind != "group" else ("g", "k")
    sc, sh = (par if scale else None), (par if shift else None)
    if kind == "instance":
        return Spec((("n",), ("c",)) + tuple((a,) for a in spatial), "norm", spatial, sc, sh, eps)
    if kind == "batch":
        return Spec((("n",), ("c",)) + tuple((a,) for a in spatial), "norm", ("n",) + spatial, sc, sh, eps)
    return Spec((("n",), ("g", "k")) + tuple((a,) for a in spatial), "norm", ("k",) + spatial, sc, sh, eps,
                (("g", groups),))


@functools.lru_cache(maxsize=1024)
def _channel_op_args(kind, ndim, eps, scale, shift, groups=None):
    """The custom ops' ``(text, eps, sizes)`` of :func:`_channel_spec` (memoized: see :func:`_layer_norm_args`)."""
    return _spec_args(_channel_spec(kind, ndim, eps, scale, shift, groups))


def _channel_args(mod, kind, x, groups=None):
    """The custom ops' ``(text, eps, sizes)`` of channel norm ``mod`` for ``x``, and its (weight, bias)."""
    w, b = mod.weight, mod.bias
    return _channel_op_args(kind, x.dim(), mod.eps, w is not None, b is not None, groups), w, b


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` (same arguments and state) computed by normc."""

    def forward(self, x):
        _check_normalized_shape(x, self.normalized_shape)
        b = self.bias
        args = _layer_norm_args(x.dim(), len(self.normalized_shape), self.eps, self.elementwise_affine, b is not None)
        return _apply(x, args, self.weight, b)[0]


def _check_normalized_shape(x, normalized_shape):
    """Raise :class:`normc.ArgumentError` unless x's trailing extents are ``normalized_shape`` (as torch's
    ``F.layer_norm`` / ``F.rms_norm`` require)."""
    n = len(normalized_shape)
    if x.dim() < n or tuple(x.shape[x.dim() - n:]) != tuple(normalized_shape):
        raise normc.ArgumentError(f"x has shape {tuple(x.shape)}; expected [*, {', '.join(map(str, normalized_shape))}]"
                                  f" (normalized_shape={list(normalized_shape)})")


# ``eps=None``: the machine epsilon of the type torch's RMS norm computes in (ATen's opmath type: float32 for
# float16/bfloat16 x, else x's own), as torch does since pytorch/pytorch#142848 (January 2025); float16's own
# (9.8e-4) or bfloat16's (7.8e-3) would differ from torch.nn.RMSNorm by up to 0.4% on activations near 1e-3.
_RMS_EPS_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` (same arguments and state; ``eps=None`` means the machine epsilon of the type torch
    computes in: ``torch.finfo(torch.float32).eps`` for float16/bfloat16 x, else ``torch.finfo(x.dtype).eps``)."""

    def forward(self, x):
        _check_normalized_shape(x, self.normalized_shape)
        eps = self.eps if self.eps is not None else torch.finfo(_RMS_EPS_DTYPE.get(x.dtype, x.dtype)).eps
        args = _rms_norm_args(x.dim(), len(self.normalized_shape), eps, self.elementwise_affine)
        return _apply(x, args, self.weight, None)[0]


class GroupNorm(nn.GroupNorm):
    """``torch.nn.GroupNorm`` (same arguments and state) computed by normc; channels-last stays channels-last."""

    def forward(self, x):
        args, w, b = _channel_args(self, "group", x, self.num_groups)
        return _apply(x, args, w, b)[0]


class _InstanceMixin:
    _spatial = 2

    def forward(self, x):
        if x.dim() == self._spatial + 1:  # unbatched (C, *spatial)
            return self.forward(x.unsqueeze(0)).squeeze(0)
        self._check_input_dim(x)
        if self.track_running_stats and not self.training:
            return super().forward(x)  # running statistics: an elementwise map, torch's own
        if math.prod(x.shape[2:]) == 1:  # as torch (input statistics): one value cannot be normalized
            raise ValueError(f"Expected more than 1 spatial element when training, got input size {list(x.shape)}")
        args, w, b = _channel_args(self, "instance", x)
        y, mean, rstd = _apply(x, args, w, b)
        if self.track_running_stats and self.training and x.numel():
            _update_running(self, mean.mean(0), _unbiased_var(rstd, self.eps, math.prod(x.shape[2:])).mean(0),
                            count=False)
        return y


def _unbiased_var(rstd, eps, n):
    var = (1.0 / (rstd.double() ** 2) - eps).clamp_min(0)
    return (var * (n / max(n - 1, 1))).float()


def _update_running(mod, mean, var, count=True):
    """torch's running-statistics update. Batch norm (``count``): counts batches, ``momentum=None`` is a
    cumulative average. Instance norm: no count, ``momentum=None`` means 0 (as ``F.instance_norm`` is called)."""
    with torch.no_grad():
        if count and mod.num_batches_tracked is not None:
            mod.num_batches_tracked.add_(1)
        m = mod.momentum
        if m is None:
            m = 1.0 / float(mod.num_batches_tracked) if count else 0.0
        mod.running_mean.mul_(1 - m).add_(mean.to(mod.running_mean.dtype), alpha=m)
        mod.running_var.mul_(1 - m).add_(var.to(mod.running_var.dtype), alpha=m)


class InstanceNorm1d(_InstanceMixin, nn.InstanceNorm1d):
    """``torch.nn.InstanceNorm1d`` (same arguments and state) computed by normc."""
    _spatial = 1


class InstanceNorm2d(_InstanceMixin, nn.InstanceNorm2d):
    """``torch.nn.InstanceNorm2d`` (same arguments and state) computed by normc."""
    _spatial = 2


class InstanceNorm3d(_InstanceMixin, nn.InstanceNorm3d):
    """``torch.nn.InstanceNorm3d`` (same arguments and state) computed by normc."""
    _spatial = 3


class _BatchMixin:
    def forward(self, x):
        self._check_input_dim(x)
        use_batch = self.training or not self.track_running_stats
        if not use_batch:
            return super().forward(x)  # eval with running statistics: torch's elementwise map
        n = x.numel() // x.shape[1] if x.shape[1] else 0  # values per channel
        if n == 1:  # as torch (batch statistics): one value per channel cannot be normalized
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
        args, w, b = _channel_args(self, "batch", x)
        y, mean, rstd = _apply(x, args, w, b)
        if self.training and self.track_running_stats:
            if n:
                _update_running(self, mean, _unbiased_var(rstd, self.eps, n))
            elif self.num_batches_tracked is not None:  # as torch: an empty batch is counted, the statistics
                with torch.no_grad():                     # are left as they are
                    self.num_batches_tracked.add_(1)
        return y


class BatchNorm1d(_BatchMixin, nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` (training: batch statistics by normc, running mean and unbiased running
    variance updated as torch does; eval: torch's own)."""


class BatchNorm2d(_BatchMixin, nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d``, as :class:`BatchNorm1d`."""


class BatchNorm3d(_BatchMixin, nn.BatchNorm3d):
    """``torch.nn.BatchNorm3d``, as :class:`BatchNorm1d`."""


_SWAP = {
    nn.LayerNorm: LayerNorm, nn.RMSNorm: RMSNorm, nn.GroupNorm: GroupNorm,
    nn.InstanceNorm1d: InstanceNorm1d, nn.InstanceNorm2d: InstanceNorm2d, nn.InstanceNorm3d: InstanceNorm3d,
    nn.BatchNorm1d: BatchNorm1d, nn.BatchNorm2d: BatchNorm2d, nn.BatchNorm3d: BatchNorm3d,
}


def convert(model: nn.Module) -> nn.Module:
    """Make every LayerNorm, RMSNorm, GroupNorm, InstanceNorm1d/2d/3d and BatchNorm1d/2d/3d of ``model``
    (exactly those classes, not subclasses) a normc module, in place: parameters, buffers and hooks are kept.
    Returns ``model``.

    Raises:
        normc.ArgumentError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise normc.ArgumentError(f"model is a {type(model).__name__}; expected a torch.nn.Module")
    for m in model.modules():
        new = _SWAP.get(type(m))
        if new is not None:
            m.__class__ = new
    return model
