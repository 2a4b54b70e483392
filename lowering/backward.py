"""BackwardPlan -> Python source of the gradient kernels (Numba CUDA; same source on the GPU and the simulator).

Every backward kernel takes nine pointers, in this order::

    dy, x, scale, mean, rstd, dx, workspace, dscale, dshift

dy/x/dx/scale/dscale/dshift point to float32 (``float*``) or to 16-bit words (``uint16*``) by their dtypes;
mean, rstd and workspace to float32; unused ones may be null. dy and dx share strides (the forward's
``out`` strides). The helpers the source calls are those of :mod:`normc.lowering.codegen` (``ld{v}_{t}``,
``st{v}_{t}``, ``shfl_xor``, ``I64``, ``F32``, ...).

Kernels, in launch order (see :mod:`normc.backward_plan`):

* Fused path (``plan.fused``; inner rows that fit in the registers of a CTA, or of a thread-block cluster whose
  CTAs add their row sums through distributed shared memory): ``normc_bwd_fused`` reads each row's x and dy
  once into registers, writes dx and accumulates the parameter gradients (per-CTA partials, or per-row sums);
  ``normc_bwd_fparam_finish`` / ``normc_bwd_frow_finish`` add those in a fixed order (:class:`_Fused`).
  Parameter reductions it does not cover follow as ``normc_bwd_param*`` below.
* ``normc_bwd_dx`` (not split): per row, pass 1 sums ``g = dy*scale`` and ``g*xhat`` (lanes along the
  reduction, or along columns for an outer reduction), the CTA combines the sums in a fixed order, pass 2
  re-reads x and dy (mostly from L1/L2) and writes ``dx = rstd*(g - mean(g) - xhat*mean(g*xhat))``.
  Split: ``normc_bwd_dx_partial`` writes the sums per (split, row) to the workspace, then
  ``normc_bwd_dx_finish`` adds the row's partials in split order and writes its slice of dx.
  Parameters constant along every row (``dx.row_outputs``: instance and batch norm's ``scale c``): pass 1 sums
  ``dy`` and ``dy*xhat`` instead (g's sums are the row's scale times them), the row's sums are written to the
  workspace, and ``normc_bwd_row_finish`` adds them per parameter element in a fixed order; x and dy are not
  read again. Parameters varying along the row's outer summed axes only (``dx.seg_outputs``: NCHW group norm's
  ``scale g k``): pass 1 also adds ``dy*xhat`` / ``dy`` per warp into shared-memory slots, the row's lanes add
  each segment's slots in order and write them to the workspace, and ``normc_bwd_seg_finish`` adds them per
  parameter element.
* Column pass (``plan.cols``; layer and RMS norm rows too long for the fused kernel): ``normc_bwd_dx_partial``
  only writes each row's sums (per split, or one slot per row when not split), then ``normc_bwd_dx_cols``
  writes dx by column chunks and row groups, accumulating ``dscale``/``dshift`` in registers across the
  group's rows (:class:`_Cols`); ``normc_bwd_cols_finish`` adds the groups' partials in group order.
* ``normc_bwd_param`` (not split): per parameter element, the sums of ``dy*xhat`` (dscale) and ``dy``
  (dshift) over the axes it is broadcast along, converted to the parameter dtype. Split:
  ``normc_bwd_param_partial`` then ``normc_bwd_param_finish`` (one thread per parameter element adds the
  splits in order).

All arithmetic is float32; nothing uses atomics, so results are bitwise reproducible for a given plan.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import CompileError
from .codegen import (TAG, KernelSource, _chain, _coords, _Emitter, _offset, _ptr_type, _Src, column_block,
                      stream_loop, vector_offsets)

BPARAMS = "gp, xp, sp, mp, rp, dp, wp, dsp, dhp"
_OUTPTR = {"dscale": "dsp", "dshift": "dhp"}
_PTENSOR = {"dscale": "scale", "dshift": "shift"}
_SUM = {"dscale": "dyx", "dshift": "dy"}  # the sum each parameter gradient is made of
# Row-finish kernels: one warp per parameter element (lanes striding over its rows, then an xor butterfly) when
# an element has more rows than this; one thread per element otherwise.
ROW_FINISH_WARP_ROWS = 32
# Partial-sum finish kernels (normc_bwd_fparam_finish, normc_bwd_cols_finish): loads a thread issues before
# adding (per output; :meth:`_Red.partials_finish`). 0: the strided load-add loop, which NVVM unrolls by 4 per
# output, one output after the other (about 2 x ceil(G / 32) dependent rounds of loads for G partials).
FINISH_LOADS = 16


def _ordered_sum(g, pairs, lanes, stride, idx, var):
    """Emit, for each ``(dst, src)`` of ``pairs``, ``dst = src[idx] + src[stride + idx] + ...`` over ``lanes``
    shared-memory slots added in slot order (loop variable ``var``): a fixed, deterministic order."""
    for dst, src in pairs:
        g(f"{dst} = {src}[{idx}]")
    with g.block(f"for {var} in range(1, {lanes}):"):
        for dst, src in pairs:
            g(f"{dst} = {dst} + {src}[{var} * {stride} + {idx}]")


def _xor_butterfly(g, names, lanes=32):
    """Emit ``n = n + shfl_xor(n, off)`` for each of ``names``, off = lanes/2, ..., 1: each name summed over
    ``lanes`` (a power of two, at most 32) consecutive lanes of a warp; every lane gets the same bits."""
    off = lanes // 2
    while off >= 1:
        for n in names:
            g(f"{n} = {n} + shfl_xor({n}, {off})")
        off //= 2


class _Red(_Emitter):
    """Generator of one :class:`normc.backward_plan.ReducePlan`'s kernels."""

    params = BPARAMS

    def __init__(self, bp, rp):
        self.bp, self.rp = bp, rp
        self.V = rp.vec
        self.shared = 0
        self.red = [a for a in rp.axes if a.reduced]
        self.kep = [a for a in rp.axes if not a.reduced]
        self.inner = rp.axes[-1]
        self.dx = rp.role == "dx"
        self.norm = bp.stat == "norm"
        self.use_scale = self.dx and bp.scale_dtype is not None
        self.Q = list(rp.sums)

    def store_sums(self, g, mode, cond, key, prefix):
        """Where ``cond``: store the sums ``{prefix}{q}`` of reduction ``key``: ``"partial"`` to this split's
        float32 workspace slot, ``"direct"`` to the outputs (dscale/dshift) in their dtypes."""
        rp, b = self.rp, self.bp
        with g.block(f"if {cond}:"):
            if mode == "partial":
                for i, q in enumerate(self.Q):
                    g(f"st1_f32(wp, {rp.ws_offset} + (sp_ * {rp.keys} + {key}) * {rp.nq} + {i}, {prefix}{q})")
            else:
                for o, q in zip(rp.outputs, self.Q):
                    g(f"st1_{TAG[getattr(b, o + '_dtype')]}({_OUTPTR[o]}, {key}, {prefix}{q})")

    def store_rows(self, g, cond, key, prefix):
        """Where ``cond``: store row ``key``'s sums ``{prefix}{q}`` of the parameter gradients that are constant
        along the row (``rp.row_outputs``) to their float32 workspace slots."""
        rp = self.rp
        if not rp.row_outputs:
            return
        n = len(rp.row_outputs)
        with g.block(f"if {cond}:"):
            for i, o in enumerate(rp.row_outputs):
                g(f"st1_f32(wp, {rp.row_ws_offset} + {key} * {n} + {i}, {prefix}{_SUM[o]})")

    def means(self, g, c1, c2, get, sc):
        """Emit ``c1 = mean_R(g)`` (norm only) and ``c2 = mean_R(g*xhat)`` of a row from its sums (``get(q)``: the
        expression of sum ``q``); from those of dy and dy*xhat times the row's scale ``sc`` when the kernel
        took them instead of g's (``rp.sums``)."""
        n = f"F32({float(self.rp.reduced)!r})"
        if "gx" in self.Q:
            if self.norm:
                g(f"{c1} = {get('g')} / {n}")
            g(f"{c2} = {get('gx')} / {n}")
            return
        f = f"{sc} * " if self.use_scale else ""
        if self.norm:
            g(f"{c1} = {f}{get('dy')} / {n}")
        g(f"{c2} = {f}{get('dyx')} / {n}")

    def ptypes(self):
        b = self.bp
        return (_ptr_type(b.dy_dtype), _ptr_type(b.x_dtype), _ptr_type(b.scale_dtype), "float32", "float32",
                _ptr_type(b.x_dtype), "float32", _ptr_type(b.dscale_dtype), _ptr_type(b.dshift_dtype))

    # ------------------------------------------------------------------------------------------------
    # element values

    def _seq(self, g, tag, ptr, off, step, vec_ok):
        """``V`` float32 values at ``off + j*step``; one vector load when allowed."""
        V = self.V
        names = [g.new("v") for _ in range(V)]
        if step == 0 or V == 1:
            g(f"{names[0]} = ld1_{tag}({ptr}, {off})")
            if step == 0:
                return [names[0]] * V
            return names
        if vec_ok and step == 1:
            g(f"{', '.join(names)} = ld{V}_{tag}({ptr}, {off})")
            return names
        for j, nm in enumerate(names):
            g(f"{nm} = ld1_{tag}({ptr}, {off} + {j * step})")
        return names

    def _ok(self, g, *conds):
        conds = [c for c in conds if c != "True"]
        if not conds:
            return "True"
        if len(conds) == 1:
            return conds[0]
        nm = g.new("ok")
        g(f"{nm} = {' and '.join(conds)}")
        return nm

    def _ld(self, g, tag, ptr, off, ok):
        V = self.V
        names = [g.new("v") for _ in range(V)]
        fn = f"ld{V}_{tag}" if ok == "True" else f"ldm{V}_{tag}"
        cond = "" if ok == "True" else f", {ok}"
        g(f"{', '.join(names)} = {fn}({ptr}, {off}{cond})")
        return names

    def hoist(self, g, varies, offs):
        """Load the values constant along the iterated (summed) axes once: mean/rstd, scale."""
        self.h = {}
        if not varies["stat"]:
            self.h["rs"] = self._seq(g, "f32", "rp", offs["stat"], varies["stat_step"], self.rp.stat_vec)
            if self.norm:
                self.h["mu"] = self._seq(g, "f32", "mp", offs["stat"], varies["stat_step"], self.rp.stat_vec)
        if self.use_scale and not varies["scale"]:
            self.h["sc"] = self._seq(g, TAG[self.bp.scale_dtype], "sp", offs["scale"], varies["scale_step"],
                                     self.rp.scale_vec)

    def load_x_dy(self, g, offs, ok="True"):
        """Emit the loads of one vector of x and of dy at ``offs`` (zeros where ``ok`` is false: a predicated
        load); returns their per-element names."""
        b, V = self.bp, self.V
        xs = [g.new("x") for _ in range(V)]
        dys = [g.new("dy") for _ in range(V)]
        m = "" if ok == "True" else "m"
        cond = "" if ok == "True" else f", {ok}"
        for names, tag, ptr, off in ((xs, TAG[b.x_dtype], "xp", offs["x"]), (dys, TAG[b.dy_dtype], "gp", offs["out"])):
            g(f"{', '.join(names)} = ld{m}{V}_{tag}({ptr}, {off}{cond})")
        return xs, dys

    def values(self, g, offs, varies):
        """Emit loads for one vector of elements; returns dict of per-element names: xh, dy, g."""
        return self.derive(g, *self.load_x_dy(g, offs), offs, varies)

    def derive(self, g, xs, dys, offs, varies):
        """xhat, g (and rstd) of one vector from its loaded x and dy (names ``xs``, ``dys``) at ``offs``; loads
        the mean/rstd and scale values that were not hoisted. Returns dict of per-element names: xh, dy, g, rs."""
        b, V = self.bp, self.V
        if "rs" in self.h:
            rs = self.h["rs"]
            mu = self.h.get("mu")
        else:
            rs = self._seq(g, "f32", "rp", offs["stat"], self.inner.stat, self.rp.stat_vec)
            mu = self._seq(g, "f32", "mp", offs["stat"], self.inner.stat, self.rp.stat_vec) if self.norm else None
        xh = [g.new("xh") for _ in range(V)]
        for j in range(V):
            g(f"{xh[j]} = ({xs[j]} - {mu[j]}) * {rs[j]}" if self.norm else f"{xh[j]} = {xs[j]} * {rs[j]}")
        out = {"xh": xh, "dy": dys, "rs": rs}
        if self.dx:
            if self.use_scale:
                sc = self.h.get("sc") or self._seq(g, TAG[b.scale_dtype], "sp", offs["scale"], self.inner.scale,
                                                   self.rp.scale_vec)
                gs = [g.new("g") for _ in range(V)]
                for j in range(V):
                    g(f"{gs[j]} = {dys[j]} * {sc[j]}")
                out["g"] = gs
            else:
                out["g"] = dys
        return out

    def accumulate(self, g, vals, suffix=lambda j: ""):
        for j in range(self.V):
            s = suffix(j)
            for q in self.Q:
                if q == "g":
                    g(f"a_g{s} = a_g{s} + {vals['g'][j]}")
                elif q == "gx":
                    g(f"a_gx{s} = a_gx{s} + {vals['g'][j]} * {vals['xh'][j]}")
                elif q == "dyx":
                    g(f"a_dyx{s} = a_dyx{s} + {vals['dy'][j]} * {vals['xh'][j]}")
                else:
                    g(f"a_dy{s} = a_dy{s} + {vals['dy'][j]}")

    def emit_dx(self, g, vals, c1, c2, off_out, ok="True"):
        """dx for one vector given per-element mean(g) ``c1`` and mean(g*xhat) ``c2`` names; stored where
        ``ok``."""
        V = self.V
        ds = [g.new("dx") for _ in range(V)]
        for j in range(V):
            gj, xj, rj = vals["g"][j], vals["xh"][j], vals["rs"][j]
            if self.norm:
                g(f"{ds[j]} = {rj} * ({gj} - {c1[j]} - {xj} * {c2[j]})")
            else:
                g(f"{ds[j]} = {rj} * ({gj} - {xj} * {c2[j]})")
        self.store_dx(g, ds, off_out, ok)

    def store_dx(self, g, ds, off_out, ok="True"):
        """Store one vector of dx (names ``ds``, float32) at element offset ``off_out``, in x's dtype, where
        ``ok``."""
        t, V = TAG[self.bp.x_dtype], self.V
        vals = ds[0] if V == 1 else f"({', '.join(ds)},)"
        if ok == "True":
            g(f"st{V}_{t}(dp, {off_out}, {vals})")
        else:
            g(f"stm{V}_{t}(dp, {off_out}, {vals}, {ok})")

    def fold_dx(self, g, c1, c2):
        """Per-column factors of dx when rstd, mean and scale were hoisted (constant along the rows):
        ``dx = rs*(dy*sc - c1 - (x - mu)*rs*c2) = A*dy - C - ((x - mu)*S)*|S|`` with ``A = rs*sc``,
        ``C = rs*c1`` and ``S = sign(c2)*rs*sqrt(|c2|)`` (rms: ``A*dy - (x*S)*|S|``). Four values held per column
        instead of five (rs, mu, sc, c1, c2): NHWC batch statistics in float16 hold 8 columns per thread, and
        its finish kernel fits the 64 registers of 4 CTAs per SM only so. ``S*|S|`` is ``rs*rs*c2``, but that
        product itself under- or overflows float32 where rstd is below about 1e-19 or above about 1e19 (x's
        spread above 1e19, or eps = 0 and a spread below 1e-19) while dx is finite; ``(x - mu)*S`` is about
        ``xhat*sqrt|c2|`` in magnitude, so the xhat term stays in range. ``A`` and ``C`` do overflow where
        ``|rs*sc|`` or ``|rs*c1|`` exceeds 3.4e38 (dx ±inf where the unfolded order is finite), as the forward's
        ``a = rstd*scale`` does (docs/accuracy.md). Returns
        ``[(A, S, C or None, mu or None)]`` names per element, or None when a factor varies along the rows."""
        if "rs" not in self.h or (self.use_scale and "sc" not in self.h):
            return None
        rs, mu, sc = self.h["rs"], self.h.get("mu"), self.h.get("sc")
        out = []
        for j in range(self.V):
            A, B = g.new("fa"), g.new("fb")
            g(f"{A} = {rs[j]} * {sc[j]}" if sc else f"{A} = {rs[j]}")
            g(f"{B} = {rs[j]} * sqrtf(abs({c2[j]}))")
            g(f"{B} = sel({c2[j]} < F32(0.0), -{B}, {B})")
            C = None
            if self.norm:
                C = g.new("fc")
                g(f"{C} = {rs[j]} * {c1[j]}")
            out.append((A, B, C, mu[j] if self.norm else None))
        return out

    def emit_dx_folded(self, g, folds, offs, xs, dys, ok="True"):
        """Write the dx of one vector (x and dy loaded into ``xs``, ``dys``) at ``offs`` from :meth:`fold_dx`'s
        factors, where ``ok``."""
        V = self.V
        ds = [g.new("dx") for _ in range(V)]
        for j, (A, B, C, mu) in enumerate(folds):
            if self.norm:
                g(f"{ds[j]} = {A} * {dys[j]} - {C} - (({xs[j]} - {mu}) * {B}) * abs({B})")
            else:
                g(f"{ds[j]} = {A} * {dys[j]} - ({xs[j]} * {B}) * abs({B})")
        self.store_dx(g, ds, offs["out"], ok)

    def dx_pass(self, g, start, stop, step, backwards, offs_at, varies, c1, c2, folds=None):
        """The dx pass over indices ``[start, stop)`` ``step`` apart (vectors of a row, or rows of a column
        tile), backwards when asked (:func:`stream_loop`): each trip loads ``rp.unroll`` vectors of x and dy
        (the ones past ``stop`` masked, at a clamped in-bounds index) before it computes and stores their dx.
        ``offs_at(index)`` emits and returns the element offsets of an index; ``c1``/``c2``: per-element
        mean(g) and mean(g*xhat); ``folds``: :meth:`fold_dx`'s factors, or None."""
        U = self.rp.unroll
        stream_loop(g, start, stop, step * U, backwards=backwards)
        loaded = []
        for u in range(U):
            idx, ok = "base", "True"
            if U > 1:
                idx, ok = g.new("ix"), g.new("ok")
                g(f"{ok} = base + {u * step} < {stop}")
                g(f"{idx} = min(base + {u * step}, {stop} - 1)")
            offs = offs_at(idx)
            loaded.append((offs, ok, self.load_x_dy(g, offs, ok)))
        for offs, ok, (xs, dys) in loaded:
            if folds:
                self.emit_dx_folded(g, folds, offs, xs, dys, ok)
            else:
                self.emit_dx(g, self.derive(g, xs, dys, offs, varies), c1, c2, offs["out"], ok)
        g.ind -= 1

    def varies(self, iter_axes):
        v = {"stat": any(a.stat for a in iter_axes), "scale": any(a.scale for a in iter_axes)}
        return v

    # ------------------------------------------------------------------------------------------------
    # inner: lanes along the summed innermost axis

    def reduce_sum(self, g, s, tag):
        """Sum ``s`` over the TPR lanes of a row (xor butterfly: every lane gets the same bits)."""
        TPR, RPC = self.rp.tpr, self.rp.rows_per_cta
        _xor_butterfly(g, [s], min(TPR, 32))
        if TPR <= 32:
            return
        NW = TPR // 32
        self.smem(g, f"ss{tag}", RPC * NW)
        with g.block("if tid % 32 == 0:"):
            g(f"ss{tag}[rloc * {NW} + lane // 32] = {s}")
        g("cuda.syncthreads()")
        g(f"{s} = ss{tag}[rloc * {NW}]")
        with g.block(f"for wi in range(1, {NW}):"):
            g(f"{s} = {s} + ss{tag}[rloc * {NW} + wi]")

    def segment_slots(self, g, vals):
        """Segment route, in pass 1 (vector ``c`` of the row in ``vals``): the warp adds ``dy*xhat`` / ``dy`` of its
        32 vectors (all in one segment) by an xor butterfly, and its lane 0 stores them to the vector's slot
        ``c // 32`` of this row in shared memory ``sg``."""
        rp, V = self.rp, self.V
        NSL, nq = rp.seg_slots, len(rp.seg_outputs)
        ws = []
        for o in rp.seg_outputs:
            w = g.new("w")
            if _SUM[o] == "dyx":
                g(f"{w} = " + " + ".join(f"{vals['dy'][j]} * {vals['xh'][j]}" for j in range(V)))
            else:
                g(f"{w} = " + " + ".join(vals["dy"][j] for j in range(V)))
            ws.append(w)
        _xor_butterfly(g, ws)
        with g.block("if lane % 32 == 0:"):
            for i, w in enumerate(ws):
                g(f"sg[(rloc * {NSL} + c // 32) * {nq} + {i}] = {w}")

    def store_segments(self, g):
        """Segment route, after pass 1: the row's lanes add the slots of each segment in slot order and store the
        segment sums to the workspace, one float32 per (row, segment, output)."""
        rp = self.rp
        NSL, nq, NSEG = rp.seg_slots, len(rp.seg_outputs), rp.segments
        SPS = NSL // NSEG
        g("cuda.syncthreads()")
        first = f"rloc * {NSL} + sk * {SPS}"  # the segment's first slot; it has SPS in a row
        with g.block(f"for sk in range(lane, {NSEG}, {rp.tpr}):"):
            for i in range(nq):
                g(f"t{i} = sg[({first}) * {nq} + {i}]")
            if SPS > 1:
                with g.block(f"for sj in range(1, {SPS}):"):
                    for i in range(nq):
                        g(f"t{i} = t{i} + sg[({first} + sj) * {nq} + {i}]")
            with g.block("if rv:"):
                for i in range(nq):
                    g(f"st1_f32(wp, {rp.seg_offset} + (kb * {NSEG} + sk) * {nq} + {i}, t{i})")

    def chunk_offsets(self, g, c):
        return vector_offsets(g, c, self.red, self.V, ("x", "out", "scale", "stat"))

    def inner_kernel(self, mode):
        """mode: ``fused`` (dx, one kernel), ``partial``, ``finish`` (dx split), ``direct`` (param, one kernel)."""
        rp, V = self.rp, self.V
        S, TPR, RPC = rp.splits, rp.tpr, rp.rows_per_cta
        NC = rp.reduced // V
        g = _Src()
        name = {"fused": "normc_bwd_dx", "direct": "normc_bwd_param"}.get(
            mode, f"normc_bwd_{rp.role}_{mode}")
        # the re-read (dx pass) starts where the reading pass ended, in L2: the split's finish kernel takes
        # the work items last-first and walks its slice backwards; an unsplit CTA walks its own row backwards
        rev = mode in ("finish", "fused") and rp.reverse
        self.prologue(g, name, reverse_grid=rp.grid if rev and mode == "finish" else 0)
        if S > 1:
            g("lane = tid")
            g("rloc = 0")
            g(f"sp_ = bid % {S}")
            g(f"row = bid // {S}")
            g("rv = True")
            r = "row"
            L = -(-NC // S)
            g(f"lo = sp_ * {L}")
            g(f"hi = min(lo + {L}, {NC})")
        else:
            g(f"lane = tid % {TPR}" if RPC > 1 else "lane = tid")
            g(f"rloc = tid // {TPR}" if RPC > 1 else "rloc = 0")
            g(f"row = bid * {RPC} + rloc")
            ragged = rp.keys % RPC != 0
            g(f"rv = row < {rp.keys}" if ragged else "rv = True")
            g(f"rowc = min(row, {rp.keys - 1})")
            r = "rowc"
            g("lo = 0")
            g(f"hi = {NC}")
            if mode == "partial":  # row sums for the column kernel (dx.sums_only), one slot per row
                g("sp_ = 0")
        cs = _coords(g, r, self.kep, "k")
        for t, nm in (("x", "xb"), ("out", "ob"), ("scale", "sb"), ("stat", "mb"), (rp.key, "kb")):
            g(f"{nm} = I64({_offset(cs, self.kep, t)})")
        varies = self.varies(self.red)
        varies["stat_step"] = 0
        varies["scale_step"] = 0
        self.hoist(g, varies, {"stat": "mb", "scale": "sb"})

        def base_offs(o):
            return {"x": f"xb + {o['x']}", "out": f"ob + {o['out']}", "scale": f"sb + {o['scale']}",
                    "stat": f"mb + {o['stat']}"}

        W = f"{rp.ws_offset}"
        if mode == "finish":
            for q in self.Q:
                g(f"a_{q} = F32(0.0)")
            with g.block(f"for k in range({S}):"):
                for i, q in enumerate(self.Q):
                    g(f"a_{q} = a_{q} + ld1_f32(wp, {W} + (k * {rp.keys} + kb) * {rp.nq} + {i})")
        else:
            for q in self.Q:
                g(f"a_{q} = F32(0.0)")
            seg = mode == "fused" and rp.seg_outputs
            if seg:
                self.smem(g, "sg", RPC * rp.seg_slots * len(rp.seg_outputs))
            with g.block(f"for c in range(lo + lane, hi, {TPR}):"):
                o = self.chunk_offsets(g, "c")
                vals = self.values(g, base_offs(o), varies)
                self.accumulate(g, vals)
                if seg:
                    self.segment_slots(g, vals)
            for i, q in enumerate(self.Q):
                self.reduce_sum(g, f"a_{q}", f"{i}")
            if seg:
                self.store_segments(g)
        if mode == "partial":
            self.store_sums(g, mode, "lane == 0" if S > 1 else "lane == 0 and rv", "kb", "a_")
        elif mode == "direct":
            self.store_sums(g, mode, "lane == 0 and rv", "kb", "a_")
        else:  # fused / finish: the dx pass over this CTA's slice of the row
            self.store_rows(g, "lane == 0 and rv" if mode == "fused" else "lane == 0 and sp_ == 0", "kb", "a_")
            self.means(g, "c1", "c2", lambda q: f"a_{q}", self.h.get("sc", [None])[0])
            with g.block("if rv:"):
                self.dx_pass(g, "lo + lane", "hi", TPR, rev, lambda c: base_offs(self.chunk_offsets(g, c)), varies,
                             ["c1"] * V, ["c2"] * V)
        grid = rp.grid
        return KernelSource(name, g.text(), grid, rp.threads, self.shared, self.ptypes())

    # ------------------------------------------------------------------------------------------------
    # outer: lanes along the kept innermost axis (columns), rows over y-threads

    def outer_kernel(self, mode):
        rp, V = self.rp, self.V
        S, T, RY = rp.splits, rp.tile, rp.ry
        blk = self.inner
        CB = blk.size
        NT = -(-CB // T)
        rowax = self.red
        kout = self.kep[:-1]
        RR = rp.reduced
        g = _Src()
        name = {"fused": "normc_bwd_dx", "direct": "normc_bwd_param"}.get(
            mode, f"normc_bwd_{rp.role}_{mode}")
        rev = mode in ("finish", "fused") and rp.reverse  # as in inner_kernel
        self.prologue(g, name, reverse_grid=rp.grid if rev and mode == "finish" else 0)
        # Column loops stay loops here. Written as ``if tid < T`` (the forward's codegen.COLUMN_IF) they took 0.2-0.6%
        # fewer instructions on rows 1 and 3 and 11-22% fewer on rows 5 and 66, but no time: H100, 2026-12-07
        # (tests/gpu_backward_ab.py --rows 1,3,5,66,56,0), backward us loop / if: row 1 181.2 / 180.6, row 3 96.2 /
        # 96.9, row 5 454.0 / 455.0, row 66 180.8 / 180.6, row 56 39.7 / 40.7.
        columns = column_block(T, rp.threads, False)
        g(f"cx = tid % {rp.nxc}")
        g(f"ry = tid // {rp.nxc}")
        g(f"act = ry < {RY}")
        g(f"sp_ = bid % {S}")
        g(f"t2 = bid // {S}")
        g(f"tile = t2 % {NT}")
        g(f"ko = t2 // {NT}")
        cs = _coords(g, "ko", kout, "k")
        for t, nm in (("x", "xb"), ("out", "ob"), ("scale", "sb"), ("stat", "mb"), (rp.key, "kb")):
            g(f"{nm} = I64({_offset(cs, kout, t)})")
        g(f"col = tile * {T} + cx * {V}")
        g(f"cok = act and col < {CB}")
        g(f"colc = min(col, {CB - V})")
        co = {t: (f"colc * {blk.stride(t)}" if blk.stride(t) else "0") for t in ("x", "out", "scale", "stat")}
        RS = -(-RR // S)
        g(f"r0 = sp_ * {RS}")
        g(f"r1 = min(r0 + {RS}, {RR})")
        varies = self.varies(rowax)
        varies["stat_step"] = blk.stat
        varies["scale_step"] = blk.scale
        self.hoist(g, varies, {"stat": f"mb + {co['stat']}", "scale": f"sb + {co['scale']}"})

        def offs_at(r):
            rc = _coords(g, r, rowax, "r")
            ro = {t: _offset(rc, rowax, t) for t in ("x", "out", "scale", "stat")}
            return {t: f"{nm} + {co[t]} + {ro[t]}" for t, nm in
                    (("x", "xb"), ("out", "ob"), ("scale", "sb"), ("stat", "mb"))}

        W = f"{rp.ws_offset}"
        gkey = f"kb + (tile * {T} + lc) * {blk.stride(rp.key)}"
        for q in self.Q:
            self.smem(g, f"sQ_{q}", RY * T if mode != "finish" else T)
            if mode == "fused":
                self.smem(g, f"sT_{q}", T)
        if mode == "finish":
            with g.block(columns):
                g(f"gk = {gkey}")
                g(f"gok = tile * {T} + lc < {CB}")
                for q in self.Q:
                    g(f"t_{q} = F32(0.0)")
                with g.block("if gok:"):
                    if rp.merged:  # added once by normc_bwd_dx_merge
                        for i, q in enumerate(self.Q):
                            g(f"t_{q} = ld1_f32(wp, {rp.merge_offset} + gk * {rp.nq} + {i})")
                    else:
                        with g.block(f"for k in range({S}):"):
                            for i, q in enumerate(self.Q):
                                g(f"t_{q} = t_{q} + ld1_f32(wp, {W} + (k * {rp.keys} + gk) * {rp.nq} + {i})")
                if not rp.merged:
                    self.store_rows(g, "gok and sp_ == 0", "gk", "t_")
                for q in self.Q:
                    g(f"sQ_{q}[lc] = t_{q}")
            g("cuda.syncthreads()")
        else:
            for j in range(V):
                for q in self.Q:
                    g(f"a_{q}{j} = F32(0.0)")
            with g.block("if cok:"):
                with g.block(f"for r in range(r0 + ry, r1, {RY}):"):
                    vals = self.values(g, offs_at("r"), varies)
                    self.accumulate(g, vals, suffix=lambda j: f"{j}")
            with g.block("if act:"):
                for j in range(V):
                    for q in self.Q:
                        g(f"sQ_{q}[ry * {T} + cx * {V} + {j}] = a_{q}{j}")
            g("cuda.syncthreads()")
            with g.block(columns):
                _ordered_sum(g, [(f"t_{q}", f"sQ_{q}") for q in self.Q], RY, T, "lc", "k")
                g(f"gok = tile * {T} + lc < {CB}")
                g(f"gk = {gkey}")
                if mode in ("partial", "direct"):
                    self.store_sums(g, mode, "gok", "gk", "t_")
                else:
                    self.store_rows(g, "gok", "gk", "t_")
                    for q in self.Q:
                        g(f"sT_{q}[lc] = t_{q}")
            if mode == "fused":
                g("cuda.syncthreads()")
        if mode in ("fused", "finish"):
            src = "sT_" if mode == "fused" else "sQ_"
            c1 = [g.new("c1") for _ in range(V)]
            c2 = [g.new("c2") for _ in range(V)]
            sc = self.h.get("sc", [None] * V)
            for j in range(V):
                idx = f"min(cx * {V} + {j}, {T - 1})"
                self.means(g, c1[j], c2[j], lambda q: f"{src}{q}[{idx}]", sc[j])
            folds = self.fold_dx(g, c1, c2) if rp.fold else None
            with g.block("if cok:"):
                self.dx_pass(g, "r0 + ry", "r1", RY, rev, offs_at, varies, c1, c2, folds)
        return KernelSource(name, g.text(), rp.grid, rp.threads, self.shared, self.ptypes(), min_ctas=rp.min_ctas)

    def merge_kernel(self):
        """``normc_bwd_dx_merge``: adds each row's ``splits`` partial sums once, in a fixed order, to
        ``rp.merge_offset`` (and the per-row sums of ``rp.row_outputs`` to theirs). A 256-thread CTA takes
        ``KPC`` consecutive rows; its ``256 / KPC`` split lanes stride over the splits in order, then one thread
        per row adds the lanes' sums in lane order from shared memory. ``KPC`` is the power of two (up to 32)
        that leaves at least 64 CTAs (one row per CTA below 128 rows)."""
        rp = self.rp
        S, K, NQ = rp.splits, rp.keys, rp.nq
        KPC = 1
        while KPC < 32 and K // (2 * KPC) >= 64:
            KPC *= 2
        SL = 256 // KPC
        g = _Src()
        self.shared = 0
        self.prologue(g, "normc_bwd_dx_merge")
        g(f"kl = tid % {KPC}")
        g(f"sl = tid // {KPC}")
        g(f"k = bid * {KPC} + kl")
        g(f"kc = min(k, {K - 1})")
        for q in self.Q:
            self.smem(g, f"sM_{q}", 256)
            g(f"t_{q} = F32(0.0)")
        with g.block(f"for s in range(sl, {S}, {SL}):"):
            for i, q in enumerate(self.Q):
                g(f"t_{q} = t_{q} + ld1_f32(wp, {rp.ws_offset} + (s * {K} + kc) * {NQ} + {i})")
        for q in self.Q:
            g(f"sM_{q}[tid] = t_{q}")
        g("cuda.syncthreads()")
        with g.block(f"if sl == 0 and k < {K}:"):
            _ordered_sum(g, [(f"u_{q}", f"sM_{q}") for q in self.Q], SL, KPC, "kl", "w")
            for i, q in enumerate(self.Q):
                g(f"st1_f32(wp, {rp.merge_offset} + k * {NQ} + {i}, u_{q})")
            self.store_rows(g, "True", "k", "u_")
        return KernelSource("normc_bwd_dx_merge", g.text(), -(-K // KPC), 256, self.shared, self.ptypes())

    def param_finish(self):
        rp, b = self.rp, self.bp
        g = _Src()
        self.prologue(g, "normc_bwd_param_finish")
        g("k = bid * 256 + tid")
        with g.block(f"if k < {rp.keys}:"):
            for i, (o, q) in enumerate(zip(rp.outputs, self.Q)):
                g(f"t_{q} = F32(0.0)")
                with g.block(f"for s in range({rp.splits}):"):
                    g(f"t_{q} = t_{q} + ld1_f32(wp, {rp.ws_offset} + (s * {rp.keys} + k) * {rp.nq} + {i})")
                g(f"st1_{TAG[getattr(b, o + '_dtype')]}({_OUTPTR[o]}, k, t_{q})")
        return KernelSource("normc_bwd_param_finish", g.text(), -(-rp.keys // 256), 256, 0, self.ptypes())

    def partials_finish(self, name, outputs, G, P, W):
        """Adds ``G`` float32 partials per parameter element of each of ``outputs`` (at ``W + (output*G + s)*P
        + element``) in a fixed order: 32 parameter elements per CTA (one 128-byte line per partial), warp ``w``
        of 8 adding the contiguous partials ``[w*c, (w+1)*c)``, ``c = ceil(G/8)``, in ``s`` order, then the
        warps' sums added in warp order; converted once to the parameter's dtype.

        With ``FINISH_LOADS`` > 0 a thread issues the loads of up to that many partials of every output
        before adding any (a batch: ``ceil(c / batches)`` partials, all independent), so a warp has them in
        flight at once instead of one load-add chain per output; 0 emits the earlier strided loop
        (``s = w, w+8, ...`` per output), kept for A/B runs."""
        b = self.bp
        g = _Src()
        self.shared = 0
        self.prologue(g, name)
        g("cx = tid % 32")
        g("ty = tid // 32")
        g("k = bid * 32 + cx")
        g(f"kc = min(k, {P - 1})")
        for i, o in enumerate(outputs):
            self.smem(g, f"sF{i}", 256)
            g(f"t{i} = F32(0.0)")
        if FINISH_LOADS > 0:
            c = -(-G // 8)
            nb = -(-c // FINISH_LOADS)
            u = -(-c // nb)
            g(f"s0 = ty * {c}")
            g(f"se = min(s0 + {c}, {G})")
            with g.block(f"for sb in range(s0, s0 + {nb * u}, {u}):"):
                for j in range(u):
                    g(f"sj = min(sb + {j}, {G - 1})")
                    for i in range(len(outputs)):
                        g(f"v{i}_{j} = ld1_f32(wp, {W + i * G * P} + sj * {P} + kc)")
                for j in range(u):
                    with g.block(f"if sb + {j} < se:"):
                        for i in range(len(outputs)):
                            g(f"t{i} = t{i} + v{i}_{j}")
        else:
            for i in range(len(outputs)):
                with g.block(f"for s in range(ty, {G}, 8):"):
                    g(f"t{i} = t{i} + ld1_f32(wp, {W + i * G * P} + s * {P} + kc)")
        for i in range(len(outputs)):
            g(f"sF{i}[tid] = t{i}")
        g("cuda.syncthreads()")
        with g.block(f"if ty == 0 and k < {P}:"):
            for i, o in enumerate(outputs):
                _ordered_sum(g, [(f"u{i}", f"sF{i}")], 8, 32, "cx", "w")
                g(f"st1_{TAG[getattr(b, o + '_dtype')]}({_OUTPTR[o]}, k, u{i})")
        return KernelSource(name, g.text(), -(-P // 32), 256, self.shared, self.ptypes())

    def row_finish(self, outs, row_outputs, ws_offset, name, segments=0):
        """Adds the per-row sums of the outputs ``outs`` (one parameter layout) that ``row_outputs`` lays out per
        row at ``ws_offset`` (``len(row_outputs)`` floats a row, rows numbered by the statistics' offset), rows
        in the order of the kept axes the parameter is broadcast along: one thread per parameter element, or
        one warp (lanes striding over the rows, then an xor butterfly) when an element has more than
        ``ROW_FINISH_WARP_ROWS`` rows. Converted once to the parameter's dtype.

        ``segments`` > 0 (the segment route): the sums are per (row, segment), ``row * segments + segment``, a
        segment being numbered by the row's outer summed axes the parameter varies along, which then take
        part in the parameter element's index."""
        b = self.bp
        t = _PTENSOR[outs[0]]
        m = max(segments, 1)
        kep = [replace(a, stat=a.stat * m) for a in self.kep]
        own = [a for a in kep if a.stride(t) != 0]
        acc = 1
        for a in reversed([a for a in self.red if a.size > 1 and a.stride(t) != 0] if segments else []):
            own.append(replace(a, stat=acc))  # the segment's place in the row's segment numbering
            acc *= a.size
        K = sorted(own, key=lambda a: -a.stride(t))
        S = [a for a in kep if a.stride(t) == 0]
        NP = 1
        for a in K:
            NP *= a.size
        NS = 1
        for a in S:
            NS *= a.size
        nq = len(row_outputs)
        warp = NS > ROW_FINISH_WARP_ROWS
        g = _Src()
        self.shared = 0
        self.prologue(g, name)
        if warp:
            g("lane = tid % 32")
            g("k = bid * 8 + tid // 32")
        else:
            g("k = bid * 256 + tid")
        g(f"kc = min(k, {NP - 1})")
        kc = _coords(g, "kc", K, "p")
        g(f"base = I64({_offset(kc, K, 'stat')})")
        idx = {o: row_outputs.index(o) for o in outs}
        for o in outs:
            g(f"t_{o} = F32(0.0)")
        with g.block(f"for j in range(lane, {NS}, 32):" if warp else f"for j in range({NS}):"):
            sc = _coords(g, "j", S, "q")
            g(f"so = base + {_offset(sc, S, 'stat')}")
            for o in outs:
                g(f"t_{o} = t_{o} + ld1_f32(wp, {ws_offset} + so * {nq} + {idx[o]})")
        if warp:
            _xor_butterfly(g, [f"t_{o}" for o in outs])
        with g.block(f"if k < {NP} and lane == 0:" if warp else f"if k < {NP}:"):
            for o in outs:
                g(f"st1_{TAG[getattr(b, o + '_dtype')]}({_OUTPTR[o]}, k, t_{o})")
        grid = -(-NP // 8) if warp else -(-NP // 256)
        return KernelSource(name, g.text(), grid, 256, 0, self.ptypes())

    def row_groups(self, row_outputs):
        """``row_outputs`` grouped by parameter layout (dscale and dshift share a row-finish kernel when they
        name the same axes)."""
        groups = []
        for o in row_outputs:
            t = _PTENSOR[o]
            for grp in groups:
                t0 = _PTENSOR[grp[0]]
                if all(a.stride(t) == a.stride(t0) for a in self.rp.axes):
                    grp.append(o)
                    break
            else:
                groups.append([o])
        return groups

    def kernels(self):
        rp = self.rp
        gen = self.inner_kernel if rp.strategy == "inner" else self.outer_kernel
        if rp.role == "dx":
            if rp.sums_only:  # only the row sums: per-row / per-segment gradients need the full dx kernel
                if rp.row_outputs or rp.seg_outputs:
                    raise CompileError(f"a row-sums-only dx kernel cannot produce "
                                       f"{'+'.join(rp.row_outputs + rp.seg_outputs)} (a planner bug)")
                return [gen("partial")]
            if rp.splits == 1:
                out = [gen("fused")]
            else:
                out = [gen("partial")]
                if rp.merged:
                    out.append(self.merge_kernel())
                self.shared = 0
                out.append(gen("finish"))
            for grp in self.row_groups(rp.row_outputs):
                out.append(self.row_finish(grp, rp.row_outputs, rp.row_ws_offset, "normc_bwd_row_finish"))
            for grp in self.row_groups(rp.seg_outputs):
                out.append(self.row_finish(grp, rp.seg_outputs, rp.seg_offset, "normc_bwd_seg_finish",
                                           segments=rp.segments))
            return out
        if rp.splits == 1:
            return [gen("direct")]
        k1 = gen("partial")
        self.shared = 0
        return [k1, self.param_finish()]


class _Cols(_Red):
    """Generator of the column kernel of a :class:`normc.backward_plan.ColsPlan` and its finish kernel.

    ``normc_bwd_dx_cols``: CTA ``b`` takes column chunk ``b % chunks`` of the rows of group ``b // chunks``.
    Its threads first turn the group's row sums (written by ``normc_bwd_dx_partial``, ``sum_splits`` partials
    each, added in split order: one thread per row, or one warp per row when there are many partials) into
    mean(g) and mean(g*xhat) in shared memory. Then, row after row, each thread reads its ``per`` vectors of
    x and dy, writes dx and adds ``dy*xhat`` / ``dy`` to one float32 register per element (its scale values
    stay in registers too). Last it writes those sums: the gradients themselves with one row group, else
    the group's partials, which ``normc_bwd_cols_finish`` adds in group order."""

    # more partials per row than this: one warp adds a row's partials (lanes striding, xor butterfly)
    WARP_SPLITS = 8

    def __init__(self, bp):
        super().__init__(bp, bp.dx)  # the column kernel's vectors are dx's (ColsPlan.vec == dx.vec)
        self.cp = bp.cols

    def row_means(self, g):
        """Shared-memory mean(g) (``sC1``, norm only) and mean(g*xhat) (``sC2``) of the group's rows."""
        rp, cp = self.rp, self.cp
        R, S, keys = cp.rows_per_group, cp.sum_splits, cp.keys
        if self.norm:
            self.smem(g, "sC1", R)
        self.smem(g, "sC2", R)
        W = rp.ws_offset
        warp = S > self.WARP_SPLITS
        if warp:
            nw = cp.threads // 32
            g("wl = tid % 32")
            head, step = f"for rr in range(tid // 32, {R}, {nw}):", "wl"
        else:
            head, step = f"for rr in range(tid, {R}, {cp.threads}):", None
        with g.block(head):
            g(f"rw = min(r0 + rr, {keys - 1})")
            cs = _coords(g, "rw", self.kep, "k")
            g(f"kb = I64({_offset(cs, self.kep, 'stat')})")
            for q in self.Q:
                g(f"a_{q} = F32(0.0)")
            with g.block(f"for k in range({step}, {S}, 32):" if warp else f"for k in range({S}):"):
                for i, q in enumerate(self.Q):
                    g(f"a_{q} = a_{q} + ld1_f32(wp, {W} + (k * {keys} + kb) * {rp.nq} + {i})")
            if warp:
                _xor_butterfly(g, [f"a_{q}" for q in self.Q])
            self.means(g, "mg_", "mgx_", lambda q: f"a_{q}", None)
            if self.norm:
                g("sC1[rr] = mg_")
            g("sC2[rr] = mgx_")
        g("cuda.syncthreads()")

    def cols_kernel(self):
        """``normc_bwd_dx_cols`` (see the class docstring)."""
        b, cp, V = self.bp, self.cp, self.V
        T, E, NCH, R = cp.threads, cp.per, cp.chunks, cp.rows_per_group
        NC = b.reduced // V
        keys = cp.keys
        inner = self.inner
        g = _Src()
        self.shared = 0
        self.prologue(g, "normc_bwd_dx_cols", reverse_grid=cp.grid if cp.reverse else 0)
        g(f"ch = bid % {NCH}")
        g(f"grp = bid // {NCH}")
        g(f"r0 = grp * {R}")
        g(f"r1 = min(r0 + {R}, {keys})")
        self.row_means(g)
        pt = [_PTENSOR[o] for o in cp.outputs]
        slots = []
        for e in range(E):
            c = g.new("c")
            g(f"{c} = ch * {T * E} + {e * T} + tid")
            okc = g.new("okc")
            g(f"{okc} = {c} < {NC}")
            cc = g.new("cc")
            g(f"{cc} = min({c}, {NC - 1})")
            o = vector_offsets(g, cc, self.red, V, ("x", "out", "scale") + tuple(pt))
            slots.append((okc, o))
        stag = TAG[b.scale_dtype] if self.use_scale else None
        # a scale constant along the kept axes (layer norm's) is loaded once per column; one that also varies
        # along them (``t d : ... scale t d``) is loaded per row, beside that row's x and dy
        row_scale = self.use_scale and any(a.stride("scale") for a in self.kep)
        sc = ([self._seq(g, stag, "sp", o["scale"], inner.scale, self.rp.scale_vec) for _, o in slots]
              if self.use_scale and not row_scale else None)
        qs = [_SUM[o] for o in cp.outputs]
        for i in range(len(qs)):
            for e in range(E):
                for j in range(V):
                    g(f"a{i}_{e}_{j} = F32(0.0)")
        xt = TAG[b.x_dtype]
        U = cp.unroll
        stream_loop(g, "r0", "r1", U, backwards=cp.reverse)  # reverse: from where the partial kernel ended
        g("r = base")
        # U rows at a time: every load of them first (all in flight), then the arithmetic and the stores.
        # Rows past the group's end are clamped to its last row and masked: their loads give zeros, which
        # add nothing to the parameter sums, and their stores are skipped.
        rows = []
        for u in range(U):
            if U == 1:
                ru, oku = "r", "True"
            else:
                ru, oku = g.new("ru"), g.new("oku")
                g(f"{oku} = r + {u} < r1")
                g(f"{ru} = min(r + {u}, r1 - 1)")
            cs = _coords(g, ru, self.kep, "k")
            ts = ("x", "out", "stat") + (("scale",) if row_scale else ())
            nm = {t: g.new({"scale": "cb"}.get(t, t[0] + "b")) for t in ts}
            for t in ts:
                g(f"{nm[t]} = I64({_offset(cs, self.kep, t)})")
            oks = [self._ok(g, okc, oku) for okc, _ in slots]
            held = [(self._ld(g, xt, "xp", f"{nm['x']} + {o['x']}", ok),
                     self._ld(g, TAG[b.dy_dtype], "gp", f"{nm['out']} + {o['out']}", ok))
                    for ok, (_, o) in zip(oks, slots)]
            # clamped row and column: in bounds without a mask
            rsc = ([self._seq(g, stag, "sp", f"{nm['scale']} + {o['scale']}", inner.scale, self.rp.scale_vec)
                    for _, o in slots] if row_scale else sc)
            rows.append((ru, nm, oks, held, rsc))
        for ru, nm, oks, held, sc in rows:
            g(f"rs = ld1_f32(rp, {nm['stat']})")
            if self.norm:
                g(f"mu = ld1_f32(mp, {nm['stat']})")
                g(f"mg_ = sC1[{ru} - r0]")
            g(f"mgx_ = sC2[{ru} - r0]")
            for e, (ok, (_, o)) in enumerate(zip(oks, slots)):
                xs, dys = held[e]
                ds = [g.new("dx") for _ in range(V)]
                for j in range(V):
                    xh = g.new("xh")
                    g(f"{xh} = ({xs[j]} - mu) * rs" if self.norm else f"{xh} = {xs[j]} * rs")
                    for i, q in enumerate(qs):
                        g(f"a{i}_{e}_{j} = a{i}_{e}_{j} + {dys[j]} * {xh}" if q == "dyx"
                          else f"a{i}_{e}_{j} = a{i}_{e}_{j} + {dys[j]}")
                    gj = f"{dys[j]} * {sc[e][j]}" if sc else dys[j]
                    if self.norm:
                        g(f"{ds[j]} = rs * ({gj} - mg_ - {xh} * mgx_)")
                    else:
                        g(f"{ds[j]} = rs * ({gj} - {xh} * mgx_)")
                v = ds[0] if V == 1 else f"({', '.join(ds)},)"
                g(f"stm{V}_{xt}(dp, {nm['out']} + {o['out']}, {v}, {ok})")
        g.ind -= 1
        G, P = cp.groups, cp.params
        for i, (o, t) in enumerate(zip(cp.outputs, pt)):
            for e, (okc, off) in enumerate(slots):
                for j in range(V):
                    k = f"{off[t]} + {j * inner.stride(t)}" if j else off[t]
                    if G == 1:
                        g(f"stm1_{TAG[getattr(b, o + '_dtype')]}({_OUTPTR[o]}, {k}, a{i}_{e}_{j}, {okc})")
                    else:
                        g(f"stm1_f32(wp, {cp.ws_offset + i * G * P} + grp * {P} + {k}, a{i}_{e}_{j}, {okc})")
        return KernelSource("normc_bwd_dx_cols", g.text(), cp.grid, T, self.shared, self.ptypes(),
                            min_ctas=cp.min_ctas)

    def kernels(self):
        cp = self.cp
        out = [self.cols_kernel()]
        if cp.groups > 1:
            out.append(self.partials_finish("normc_bwd_cols_finish", cp.outputs, cp.groups, cp.params,
                                            cp.ws_offset))
        return out


# Fused kernel: the scale values of a lane's elements stay in registers across rows up to this many per thread
# (more are reloaded per row from L1, which keeps 16-value rows under 128 registers).
HOIST_SCALE_VALUES = 8


class _Fused(_Red):
    """Generator of the fused dx kernel of a :class:`normc.backward_plan.FusedPlan` and its finish kernels.

    ``normc_bwd_fused``: each CTA loops over its row groups; per row, ``tpr`` lanes load the row's x and dy
    once (``per`` vectors each, masked past the row's end and for rows past the last), form xhat and
    ``g = dy*scale``, accumulate the parameter sums of the lane route in registers (one per element the
    thread holds, kept across rows), combine the row sums across the lanes (xor butterfly, then shared memory
    in warp order), write dx from the registers, and for the row route write the row's sums. After its rows
    the CTA writes its parameter partials (rows of one CTA at a time combined in row order through shared
    memory). ``normc_bwd_fparam_finish`` / ``normc_bwd_frow_finish`` add them in a fixed order. With
    ``fused.prefetch`` each trip first issues the next row's loads (``nwx{e}``/``nwd{e}``, 16-bit values as
    32-bit words) and works on the ones the previous trip issued (``wx{e}``/``wd{e}``, converted by ``cvw``).

    With a cluster (``fused.cluster`` = C > 1, one row per CTA at a time) the C CTAs of cluster ``bid // C``
    share each row: rank ``cr = bid % C`` holds vectors ``lane + tpr*(cr + C*e)``; after the lanes' sums, thread 0
    publishes the CTA's row sums in shared memory (two buffers, alternating by row) and, after a cluster barrier,
    every thread adds the C CTAs' sums in rank order (every CTA gets the same bits). A buffer is rewritten two rows
    later, after every peer has passed the next row's barrier, i.e. finished reading it. The CTA of rank 0 writes
    the row-route sums; each CTA writes the lane-route partials of its own elements into its cluster's set."""

    def __init__(self, bp):
        super().__init__(bp, bp.dx)
        self.fz = bp.fused
        self.V = self.fz.vec

    def _lane_sums(self, g, sums, RPC, TPR):
        """Sum each name in ``sums`` over the TPR lanes of a row (every lane gets the same bits)."""
        _xor_butterfly(g, sums, min(TPR, 32))
        if TPR <= 32:
            return
        NW = TPR // 32
        n = RPC * NW
        self.smem(g, "sR", n * len(sums))
        with g.block("if tid % 32 == 0:"):
            for i, s in enumerate(sums):
                g(f"sR[{i * n} + rloc * {NW} + lane // 32] = {s}")
        g("cuda.syncthreads()")
        for i, s in enumerate(sums):
            g(f"{s} = sR[{i * n} + rloc * {NW}]")
            with g.block(f"for wi in range(1, {NW}):"):
                g(f"{s} = {s} + sR[{i * n} + rloc * {NW} + wi]")
        g("cuda.syncthreads()")  # sR is rewritten by the next row

    def fused_kernel(self):
        b, fz, V = self.bp, self.fz, self.V
        E, TPR, RPC, G = fz.per, fz.tpr, fz.rows_per_cta, fz.grid
        C = fz.cluster
        GC = G // C  # CTAs (clusters) that loop over the row groups
        NC = b.reduced // V
        keys = fz.keys
        P = fz.lane_params
        smode = fz.scale_mode
        stag = TAG[b.scale_dtype] if b.scale_dtype else None
        g = _Src()
        self.prologue(g, "normc_bwd_fused")
        g(f"lane = tid % {TPR}" if RPC > 1 else "lane = tid")
        g(f"rloc = tid // {TPR}" if RPC > 1 else "rloc = 0")
        if C > 1:
            g(f"cr = bid % {C}")
            g(f"cid = bid // {C}")
        else:
            g("cid = bid")
        g(f"g0 = (cid * {fz.groups}) // {GC}")
        g(f"g1 = ((cid + 1) * {fz.groups}) // {GC}")
        # the vectors this lane holds in every row: offsets relative to the row's bases
        slots = []
        for e in range(E):
            c = g.new("c")
            g(f"{c} = lane + {e * TPR}" if C == 1 else f"{c} = lane + {TPR} * (cr + {C * e})")
            if (e + 1) * TPR * C > NC:
                okc = g.new("okc")
                g(f"{okc} = {c} < {NC}")
                cc = g.new("cc")
                g(f"{cc} = min({c}, {NC - 1})")
            else:
                okc, cc = "True", c
            o = vector_offsets(g, cc, self.red, V, ("x", "out", "scale", "shift"))
            slots.append((okc, o))
        inner = self.inner
        sc = None
        if smode == "lane" and E * V <= HOIST_SCALE_VALUES:
            # scale depends only on the position in the row: loaded once per CTA
            sc = [self._seq(g, stag, "sp", o["scale"], inner.scale, self.rp.scale_vec) for _, o in slots]
        lane_q = [(_SUM[o], _PTENSOR[o]) for o in fz.lane_outputs]
        row_q = [_SUM[o] for o in fz.row_outputs]
        for i in range(len(lane_q)):
            for e in range(E):
                for j in range(V):
                    g(f"a{i}_{e}_{j} = F32(0.0)")
        by_dy = smode in ("none", "row")  # row sums of dy (times the row's scale) give those of g
        if by_dy:
            sums = (["s_dy"] if self.norm or "dy" in row_q else []) + ["s_dyx"]
        else:
            sums = (["s_g"] if self.norm else []) + ["s_gx"] + [f"s_{q}" for q in row_q]
        ragged = keys % RPC != 0
        pf = fz.prefetch
        bases = (("x", "xb"), ("out", "ob"), ("scale", "sb"), ("stat", "mb"))
        stats = ["rs"] + (["mu"] if self.norm else [])

        def row_setup(it, p="", more=None):
            """The row of group ``it`` (names prefixed ``p``): index, validity, bases, mean and rstd; with
            ``more`` (a condition), ``{p}ld``: whether its loads are wanted (the prefetch past the last group
            is not)."""
            g(f"{p}row = {f'({it})' if ' ' in it else it} * {RPC} + rloc")
            if ragged:
                g(f"{p}rv = {p}row < {keys}")
                g(f"{p}rowc = min({p}row, {keys - 1})")
                r = f"{p}rowc"
            else:
                g(f"{p}rv = True")
                r = f"{p}row"
                if more is not None:  # the prefetch past the CTA's last group may be past the last row
                    g(f"{p}rowc = min({p}row, {keys - 1})")
                    r = f"{p}rowc"
            if more is not None:
                g(f"{p}ld = {p}rv and {more}" if ragged else f"{p}ld = {more}")
            cs = _coords(g, r, self.kep, "k")
            for t, nm in bases:
                g(f"{p}{nm} = I64({_offset(cs, self.kep, t)})")
            g(f"{p}rs = ld1_f32(rp, {p}mb)")
            if self.norm:
                g(f"{p}mu = ld1_f32(mp, {p}mb)")

        def prefetch(p):
            """Issue the loads of row ``{p}row``'s x and dy, kept as moved (words for 16-bit: converted after
            the next barrier, see normc.lowering.device): one tuple per slot and tensor, ``{p}wx{e}``/``{p}wd{e}``."""
            for e, (okc, o) in enumerate(slots):
                ok = f"{p}ld" if okc == "True" else f"{p}ld and {okc}"
                for dt, ptr, off, nm in ((b.x_dtype, "xp", f"{p}xb + {o['x']}", "wx"),
                                         (b.dy_dtype, "gp", f"{p}ob + {o['out']}", "wd")):
                    fn = f"ldm{V}_f32" if TAG[dt] == "f32" else f"ldwm{V}_{TAG[dt]}"
                    g(f"{p}{nm}{e} = {fn}({ptr}, {off}, {ok})")

        def unpack(name, tag):
            names = [g.new("v") for _ in range(V)]
            g(f"{', '.join(names)} = " + (name if tag == "f32" else f"cvw{V}_{tag}({name})"))
            return names

        if pf:  # the first row's loads, before the loop; each trip issues the next row's before its own work
            row_setup("g0", "n", "g0 < g1")
            prefetch("n")
        with g.block("for it in range(g0, g1):"):
            if pf:
                for nm in ["row", "rv", "rowc"] + [nm for _, nm in bases] + stats:
                    g(f"{nm} = n{nm}")
                for e in range(E):
                    g(f"wx{e} = nwx{e}")
                    g(f"wd{e} = nwd{e}")
                row_setup("it + 1", "n", "it + 1 < g1")
                prefetch("n")
            else:
                row_setup("it")
            if smode == "row":
                g(f"scr = ld1_{stag}(sp, sb)")
            for s in sums:
                g(f"{s} = F32(0.0)")
            held = []
            for e, (okc, o) in enumerate(slots):
                ok = self._ok(g, "rv" if ragged else "True", okc)
                if pf:
                    xs = unpack(f"wx{e}", TAG[b.x_dtype])
                    dys = unpack(f"wd{e}", TAG[b.dy_dtype])
                else:
                    xs = self._ld(g, TAG[b.x_dtype], "xp", f"xb + {o['x']}", ok)
                    dys = self._ld(g, TAG[b.dy_dtype], "gp", f"ob + {o['out']}", ok)
                xh = [g.new("xh") for _ in range(V)]
                for j in range(V):
                    g(f"{xh[j]} = ({xs[j]} - mu) * rs" if self.norm else f"{xh[j]} = {xs[j]} * rs")
                for i, (q, _) in enumerate(lane_q):
                    for j in range(V):
                        g(f"a{i}_{e}_{j} = a{i}_{e}_{j} + {dys[j]} * {xh[j]}" if q == "dyx"
                          else f"a{i}_{e}_{j} = a{i}_{e}_{j} + {dys[j]}")
                if smode == "lane" and sc is not None:
                    gs = [g.new("g") for _ in range(V)]
                    for j in range(V):
                        g(f"{gs[j]} = {dys[j]} * {sc[e][j]}")
                elif smode in ("lane", "mixed"):  # lane: reloaded per row (L1 hits), saving registers
                    sv = self._seq(g, stag, "sp", f"sb + {o['scale']}", inner.scale, self.rp.scale_vec)
                    gs = [g.new("g") for _ in range(V)]
                    for j in range(V):
                        g(f"{gs[j]} = {dys[j]} * {sv[j]}")
                else:
                    gs = dys
                for j in range(V):
                    if by_dy:
                        if "s_dy" in sums:
                            g(f"s_dy = s_dy + {dys[j]}")
                        g(f"s_dyx = s_dyx + {dys[j]} * {xh[j]}")
                    else:
                        if self.norm:
                            g(f"s_g = s_g + {gs[j]}")
                        g(f"s_gx = s_gx + {gs[j]} * {xh[j]}")
                        for q in row_q:
                            g(f"s_{q} = s_{q} + {dys[j]} * {xh[j]}" if q == "dyx" else f"s_{q} = s_{q} + {dys[j]}")
                held.append((ok, o, xh, gs))
            self._lane_sums(g, sums, RPC, TPR)
            if C > 1:
                self._cluster_sums(g, sums, C)
            n = float(b.reduced)
            if by_dy:
                f = "scr * " if smode == "row" else ""
                if self.norm:
                    g(f"mg_ = {f}s_dy / F32({n!r})")
                g(f"mgx_ = {f}s_dyx / F32({n!r})")
            else:
                if self.norm:
                    g(f"mg_ = s_g / F32({n!r})")
                g(f"mgx_ = s_gx / F32({n!r})")
            xt = TAG[b.x_dtype]
            for ok, o, xh, gs in held:
                ds = [g.new("dx") for _ in range(V)]
                for j in range(V):
                    gj = f"scr * {gs[j]}" if smode == "row" else gs[j]
                    if self.norm:
                        g(f"{ds[j]} = rs * ({gj} - mg_ - {xh[j]} * mgx_)")
                    else:
                        g(f"{ds[j]} = rs * ({gj} - {xh[j]} * mgx_)")
                v = ds[0] if V == 1 else f"({', '.join(ds)},)"
                if ok == "True":
                    g(f"st{V}_{xt}(dp, ob + {o['out']}, {v})")
                else:
                    g(f"stm{V}_{xt}(dp, ob + {o['out']}, {v}, {ok})")
            if row_q:
                w0 = "lane == 0" if C == 1 else "lane == 0 and cr == 0"
                g(f"wok = rv and {w0}" if ragged else f"wok = {w0}")
                for i, q in enumerate(row_q):
                    g(f"stm1_f32(wp, {fz.row_ws_offset} + mb * {fz.row_nq} + {i}, s_{q}, wok)")
        # the CTA's parameter partials, one per (output, parameter element)
        W = fz.ws_offset
        for i, (q, t) in enumerate(lane_q):
            base = f"{W + i * GC * P} + cid * {P}"
            if RPC == 1:
                for e, (okc, o) in enumerate(slots):
                    for j in range(V):
                        k = f"{o[t]} + {j * inner.stride(t)}" if j else o[t]
                        if okc == "True":
                            g(f"st1_f32(wp, {base} + {k}, a{i}_{e}_{j})")
                        else:
                            g(f"stm1_f32(wp, {base} + {k}, a{i}_{e}_{j}, {okc})")
                continue
            if i == 0:
                self.smem(g, "sP", RPC * P)
            else:
                g("cuda.syncthreads()")
            for e, (okc, o) in enumerate(slots):
                with g.block("if True:" if okc == "True" else f"if {okc}:"):
                    for j in range(V):
                        k = f"{o[t]} + {j * inner.stride(t)}" if j else o[t]
                        g(f"sP[rloc * {P} + {k}] = a{i}_{e}_{j}")
            g("cuda.syncthreads()")
            with g.block(f"for kk in range(tid, {P}, {fz.threads}):"):
                g("tp = sP[kk]")
                with g.block(f"for r in range(1, {RPC}):"):
                    g(f"tp = tp + sP[r * {P} + kk]")
                g(f"st1_f32(wp, {base} + kk, tp)")
        if C > 1:
            g("cluster_arrive()  # no CTA exits while a peer may still read its shared memory")
            g("cluster_wait()")
        return KernelSource("normc_bwd_fused", g.text(), G, fz.threads, self.shared, self.ptypes(), cluster=C,
                            min_ctas=fz.min_ctas, max_spill=fz.max_spill)

    def _cluster_sums(self, g, sums, C):
        """Add each CTA-uniform name in ``sums`` over the C CTAs of the cluster, in rank order (see the class
        docstring): thread 0 publishes them in buffer ``it % 2`` of ``sC``, then a cluster barrier."""
        n = len(sums)
        self.smem(g, "sC", 2 * n)
        g(f"cb = (it % 2) * {n}")
        with g.block("if tid == 0:"):
            for i, s in enumerate(sums):
                g(f"sC[cb + {i}] = {s}")
        g("cluster_arrive()")
        g("cluster_wait()")
        for i, s in enumerate(sums):
            g(f"{s} = dsmem_ld(sC, cb + {i}, 0)")
        with g.block(f"for k in range(1, {C}):"):
            for i, s in enumerate(sums):
                g(f"{s} = {s} + dsmem_ld(sC, cb + {i}, k)")

    def lane_finish(self):
        """Adds the per-CTA partials of each lane-route output in CTA order (:meth:`_Red.partials_finish`)."""
        fz = self.fz
        return self.partials_finish("normc_bwd_fparam_finish", fz.lane_outputs, fz.partial_sets, fz.lane_params,
                                    fz.ws_offset)

    def kernels(self):
        fz = self.fz
        out = [self.fused_kernel()]
        if fz.lane_outputs:
            out.append(self.lane_finish())
        for grp in self.row_groups(fz.row_outputs):
            out.append(self.row_finish(grp, fz.row_outputs, fz.row_ws_offset, "normc_bwd_frow_finish"))
        return out


def generate_backward(bplan) -> list:
    """Python sources of the backward kernels of a :class:`normc.backward_plan.BackwardPlan`, in launch
    order: the dx kernel(s) (1; 2 when split; 3 when an outer split merges its partials in a kernel of its
    own), then for each parameter reduction 1 kernel (2 when split).
    Every kernel takes the nine pointers of this module's docstring."""
    out = []
    reds = tuple(bplan.params)
    if getattr(bplan, "fused", None) is not None:
        out += _Fused(bplan).kernels()
    else:
        out += _Red(bplan, bplan.dx).kernels()
        if bplan.cols is not None:
            out += _Cols(bplan).kernels()
    for rp in reds:
        out += _Red(bplan, rp).kernels()
    # plan.pdl: each kernel after the first waits for the one before it (griddepcontrol.wait as its first
    # statement) and is launched as its programmatic dependent (BWD_PDL), as the forward's split kernels are
    return _chain(out, bplan.arch) if bplan.pdl else out


def kernel_count(bplan) -> int:
    """Number of kernels :func:`generate_backward` emits (without generating them)."""
    fz = getattr(bplan, "fused", None)
    n = sum(2 if r.splits > 1 else 1 for r in bplan.params)
    if fz is not None:
        n += 1 + (1 if fz.lane_outputs else 0) + len(_Fused(bplan).row_groups(fz.row_outputs))
    elif bplan.dx.sums_only:
        n += 1 + 1 + (1 if bplan.cols.groups > 1 else 0)
    else:
        red = _Red(bplan, bplan.dx)
        n += ((3 if bplan.dx.merged else 2) if bplan.dx.splits > 1 else 1) + len(
            red.row_groups(bplan.dx.row_outputs)) + len(red.row_groups(bplan.dx.seg_outputs))
    return n


__all__ = ["generate_backward", "kernel_count", "BPARAMS"]
