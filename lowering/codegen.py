"""Plan -> Python source of Numba CUDA kernels.

Every extent, stride and tiling constant of the plan is baked into the source as a literal, so NVVM folds
the index arithmetic (divisions by constants become multiply-shifts) and unrolled loops hold their values
in registers. The same source runs on the GPU (compiled by Numba/NVVM) and on Numba's CUDA simulator: the
few operations they do differently (vector loads/stores with conversions, warp shuffles, int/float
constructors) are names the source calls and the caller supplies (``normc.lowering.device`` on the GPU,
``normc.lowering.sim`` on the simulator).

Kernel parameters are always seven pointers, in this order::

    x, out, scale, shift, mean, rstd, workspace

x/out/scale/shift point to float32 (``float*``) or to 16-bit words (``uint16*``: float16/bfloat16 bits);
mean, rstd and workspace point to float32. Unused pointers may be null.

Names the source expects in its globals: ``cuda``, ``I64``, ``F32``, ``F32T``, ``rsqrt``, ``shfl_xor``,
``shfl_idx``, and for each dtype tag ``t`` in {f32, f16, bf16} and width ``v``: ``ld{v}_{t}(p, i)`` returning
a tuple of ``v`` float32 (``v`` = 1 returns a float32), ``st{v}_{t}(p, i, tuple)`` (``v`` = 1 takes a scalar).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TAG = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
PARAMS = "xp, op, sp, hp, mp, rp, wp"


@dataclass(frozen=True)
class KernelSource:
    """One kernel to compile: its Python source, function name, launch shape and pointer element types.

    Attributes:
        name: Python function name (the PTX entry is Numba's mangling of it; read it from the PTX).
        source: Python source text defining ``name``.
        grid: CTAs (1-D).
        block: threads per CTA (1-D).
        shared_bytes: static shared memory the kernel declares (bytes), for reporting.
        pointer_types: element type of each of the 7 pointer parameters: ``"float32"`` or ``"uint16"``.
    """

    name: str
    source: str
    grid: int
    block: int
    shared_bytes: int
    pointer_types: tuple


class _Src:
    def __init__(self):
        self.lines = []
        self.ind = 0
        self.tmp = 0
        self.decls = []  # shared-memory declarations, hoisted to the top of the kernel body
        self.decl_at = None

    def __call__(self, text):
        for ln in text.split("\n"):
            self.lines.append("    " * self.ind + ln)

    def new(self, prefix):
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    def block(self, head):
        self(head)
        return _Indent(self)

    def mark_decls(self):
        """Shared arrays declared later are placed here (every thread must see them)."""
        self.decl_at = len(self.lines)
        self.decl_ind = self.ind

    def text(self):
        lines = list(self.lines)
        if self.decls:
            pad = "    " * self.decl_ind
            lines[self.decl_at:self.decl_at] = [pad + d for d in self.decls]
        return "\n".join(lines) + "\n"


class _Indent:
    def __init__(self, src):
        self.src = src

    def __enter__(self):
        self.src.ind += 1

    def __exit__(self, *a):
        self.src.ind -= 1


def _ptr_type(dtype):
    return "float32" if dtype in (None, "float32") else "uint16"


def _coords(g, var, axes, prefix):
    """Emit mixed-radix decomposition of linear index ``var`` over ``axes`` (outermost-first).

    Returns coordinate expressions aligned with ``axes``. The outermost coordinate is not reduced modulo
    its extent (the caller guarantees the index is in range).
    """
    if not axes:
        return []
    if len(axes) == 1:
        return [var]
    coords = [None] * len(axes)
    t = var
    for j in range(len(axes) - 1, 0, -1):
        c = g.new(prefix)
        g(f"{c} = {t} % {axes[j].size}")
        coords[j] = c
        q = g.new(prefix + "q")
        g(f"{q} = {t} // {axes[j].size}")
        t = q
    coords[0] = t
    return coords


def _offset(coords, axes, tensor, scale_by=1):
    terms = []
    for c, a in zip(coords, axes):
        s = a.stride(tensor) * scale_by
        if s == 0:
            continue
        terms.append(c if s == 1 else f"{c} * {s}")
    return " + ".join(terms) if terms else "0"


def _chan(g, n, m, m2, on, om, om2):
    """Emit the Chan et al. merge of (on, om, om2) into (n, m, m2) (float32, safe for empty sides)."""
    nn, d, w = g.new("nn"), g.new("d"), g.new("w")
    g(f"{nn} = {n} + {on}")
    g(f"{d} = {om} - {m}")
    g(f"{w} = {on} / max({nn}, F32(1.0))")
    g(f"{m} = {m} + {d} * {w}")
    g(f"{m2} = {m2} + {om2} + {d} * {d} * {n} * {w}")
    g(f"{n} = {nn}")


class _Kernel:
    """Shared helpers for the inner and outer generators."""

    def __init__(self, plan):
        self.p = plan
        self.V = plan.vec
        self.xt = TAG[plan.x_dtype]
        self.ot = TAG[plan.out_dtype]
        self.shared = 0

    def ptypes(self):
        p = self.p
        return (_ptr_type(p.x_dtype), _ptr_type(p.out_dtype), _ptr_type(p.scale_dtype),
                _ptr_type(p.shift_dtype), "float32", "float32", "float32")

    def acc_init(self, g):
        """Zero the per-thread accumulators: a shared count and V (mean, M2) pairs."""
        g("cnt = F32(0.0)")
        for j in range(self.V):
            g(f"wm{j} = F32(0.0)")
            g(f"wq{j} = F32(0.0)")

    def acc_update(self, g, names, rms=False):
        """One Welford step of the V accumulators with V new values (one reciprocal for all of them);
        for rms only the sums of squares (in wq) are kept."""
        g("cnt += F32(1.0)")
        if rms:
            for j, nm in enumerate(names):
                g(f"wq{j} = wq{j} + {nm} * {nm}")
            return
        g("rc = F32(1.0) / cnt")
        for j, nm in enumerate(names):
            g(f"dd = {nm} - wm{j}")
            g(f"wm{j} = wm{j} + dd * rc")
            g(f"wq{j} = wq{j} + dd * ({nm} - wm{j})")

    def smem(self, g, name, n):
        g.decls.append(f"{name} = cuda.shared.array({n}, F32T)")
        self.shared += 4 * n

    def load_x(self, g, names, off, ok):
        """Emit loading V x-values at element offset ``off`` into ``names`` (zeros when not ``ok``)."""
        V = self.V
        for nm in names:
            g(f"{nm} = F32(0.0)")
        if ok != "True":
            g(f"if {ok}:")
            g.ind += 1
        if V == 1:
            g(f"{names[0]} = ld1_{self.xt}(xp, {off})")
        else:
            g(f"{', '.join(names)} = ld{V}_{self.xt}(xp, {off})")
        if ok != "True":
            g.ind -= 1

    def store_out(self, g, vals, off):
        V = self.V
        if V == 1:
            g(f"st1_{self.ot}(op, {off}, {vals[0]})")
        else:
            g(f"st{V}_{self.ot}(op, {off}, ({', '.join(vals)},))")

    def load_param(self, g, which, off, step, vec_ok, count):
        """Emit loads of ``count`` affine values at ``off`` + j*``step``; returns their names."""
        dt = getattr(self.p, f"{which}_dtype")
        tag = TAG[dt]
        ptr = "sp" if which == "scale" else "hp"
        names = [g.new(which[:2]) for _ in range(count)]
        if step == 0:
            g(f"{names[0]} = ld1_{tag}({ptr}, {off})")
            return [names[0]] * count
        if vec_ok and count > 1 and step == 1:
            g(f"{', '.join(names)} = ld{count}_{tag}({ptr}, {off})")
            return names
        for j, nm in enumerate(names):
            g(f"{nm} = ld1_{tag}({ptr}, {off} + {j * step})")
        return names


# ----------------------------------------------------------------------------------------------------------
# inner: lanes along the reduction


class _Inner(_Kernel):
    def __init__(self, plan):
        super().__init__(plan)
        p = plan
        self.red = [a for a in p.axes if a.reduced]
        self.kep = [a for a in p.axes if not a.reduced]
        self.inner = p.axes[-1]
        self.NC = p.reduced // self.V
        self.IV = self.inner.size // self.V  # vectors along the innermost reduced axis
        self.TPR = p.tpr
        self.RPC = p.rows_per_cta

    # index helpers -------------------------------------------------------------------------------------
    def row_setup(self, g, row_expr, clamp):
        """Kept coordinates of the row -> base offsets xb, ob, sb, hb, mb."""
        p = self.p
        g(f"row = {row_expr}")
        if clamp:
            g(f"rowc = min(row, {p.kept - 1})")
            r = "rowc"
        else:
            r = "row"
        cs = _coords(g, r, self.kep, "k")
        for t, nm in (("x", "xb"), ("out", "ob"), ("scale", "sb"), ("shift", "hb"), ("stat", "mb")):
            g(f"{nm} = I64({_offset(cs, self.kep, t)})")

    def chunk_offsets(self, g, c):
        """Offsets (x, out, scale, shift) of vector ``c`` of a row, relative to the row bases."""
        V = self.V
        red = self.red
        if len(red) == 1:
            coords = [f"({c} * {V})" if V > 1 else c]
        else:
            if self.IV == 1:
                inner_c = "0"
                rest = c
            else:
                inner_c = g.new("ic")
                g(f"{inner_c} = ({c} % {self.IV}) * {V}")
                rest = g.new("rc")
                g(f"{rest} = {c} // {self.IV}")
            coords = _coords(g, rest, red[:-1], "r") + [inner_c]
        return {t: _offset(coords, red, t) for t in ("x", "out", "scale", "shift")}

    def params_for_row(self):
        """Whether scale/shift vary along the reduction (else one value per row, folded into a, b)."""
        p = self.p
        var = {}
        for w in ("scale", "shift"):
            if getattr(p, f"{w}_dtype") is None:
                var[w] = None
            else:
                var[w] = any(a.stride(w) for a in self.red)
        return var

    def emit_row_affine(self, g):
        """a, b such that y = (x - mean)*a + b, folding per-row (kept-only) scale/shift.

        Subtracting the mean before scaling (rather than y = x*a' + b' with b' = shift - mean*a') keeps
        constant rows exact: y == shift."""
        var = self.params_for_row()
        g("a = rstd")
        g("b = F32(0.0)")
        if var["scale"] is False:
            g("sv = ld1_%s(sp, sb)" % TAG[self.p.scale_dtype])
            g("a = a * sv")
        if var["shift"] is False:
            g("b = b + ld1_%s(hp, hb)" % TAG[self.p.shift_dtype])
        return var

    def emit_normalize_vec(self, g, xs, offs, var):
        V = self.V
        inner = self.inner
        ys = [g.new("y") for _ in range(V)]
        for j in range(V):
            g(f"{ys[j]} = ({xs[j]} - mean) * a + b")
        if var["scale"]:
            sc = self.load_param(g, "scale", f"sb + {offs['scale']}", inner.scale, self.p.scale_vec, V)
            for j in range(V):
                g(f"{ys[j]} = {ys[j]} * {sc[j]}")
        if var["shift"]:
            sh = self.load_param(g, "shift", f"hb + {offs['shift']}", inner.shift, self.p.shift_vec, V)
            for j in range(V):
                g(f"{ys[j]} = {ys[j]} + {sh[j]}")
        self.store_out(g, ys, f"ob + {offs['out']}")

    # reductions ----------------------------------------------------------------------------------------
    def reduce_triple(self, g, n, m, m2, tag):
        """Merge (n, m, m2) across the TPR threads of a row; every thread ends with the same result."""
        TPR = self.TPR
        width = min(TPR, 32)
        off = width // 2
        while off >= 1:
            on, om, om2 = g.new("on"), g.new("om"), g.new("om2")
            g(f"{on} = shfl_xor({n}, {off})")
            g(f"{om} = shfl_xor({m}, {off})")
            g(f"{om2} = shfl_xor({m2}, {off})")
            _chan(g, n, m, m2, on, om, om2)
            off //= 2
        if TPR <= 32:
            if TPR > 1:
                # xor merges are not symmetric in rounding: take the first lane's result for the whole row
                src = f"(tid % 32) - (tid % 32) % {TPR}"
                g(f"{n} = shfl_idx({n}, {src})")
                g(f"{m} = shfl_idx({m}, {src})")
                g(f"{m2} = shfl_idx({m2}, {src})")
            return
        NW = TPR // 32
        tot = self.RPC * NW
        self.smem(g, f"sn{tag}", tot)
        self.smem(g, f"sm{tag}", tot)
        self.smem(g, f"sq{tag}", tot)
        with g.block("if tid % 32 == 0:"):
            g(f"sn{tag}[rloc * {NW} + lane // 32] = {n}")
            g(f"sm{tag}[rloc * {NW} + lane // 32] = {m}")
            g(f"sq{tag}[rloc * {NW} + lane // 32] = {m2}")
        g("cuda.syncthreads()")
        g(f"{n} = sn{tag}[rloc * {NW}]")
        g(f"{m} = sm{tag}[rloc * {NW}]")
        g(f"{m2} = sq{tag}[rloc * {NW}]")
        with g.block(f"for wi in range(1, {NW}):"):
            _chan(g, n, m, m2, f"sn{tag}[rloc * {NW} + wi]", f"sm{tag}[rloc * {NW} + wi]",
                  f"sq{tag}[rloc * {NW} + wi]")

    def reduce_sum(self, g, s, tag):
        TPR = self.TPR
        width = min(TPR, 32)
        off = width // 2
        while off >= 1:
            g(f"{s} = {s} + shfl_xor({s}, {off})")
            off //= 2
        if TPR <= 32:
            return
        NW = TPR // 32
        self.smem(g, f"ss{tag}", self.RPC * NW)
        with g.block("if tid % 32 == 0:"):
            g(f"ss{tag}[rloc * {NW} + lane // 32] = {s}")
        g("cuda.syncthreads()")
        g(f"{s} = ss{tag}[rloc * {NW}]")
        with g.block(f"for wi in range(1, {NW}):"):
            g(f"{s} = {s} + ss{tag}[rloc * {NW} + wi]")

    def finish_stats(self, g, write_cond):
        p = self.p
        if p.stat == "norm":
            g(f"rstd = rsqrt(m2 / n + F32({p.eps!r}))")
        else:
            g(f"rstd = rsqrt(q / F32({float(p.reduced)!r}) + F32({p.eps!r}))")
            g("mean = F32(0.0)")
        if p.stats:
            with g.block(f"if {write_cond}:"):
                g("st1_f32(mp, mb, mean)")
                g("st1_f32(rp, mb, rstd)")

    # kernels -------------------------------------------------------------------------------------------
    def prologue(self, g, name):
        g(f"def {name}({PARAMS}):")
        g.ind += 1
        g("tid = I64(cuda.threadIdx.x)")
        g("bid = I64(cuda.blockIdx.x)")
        g.mark_decls()

    def persistent(self):
        p, V, TPR, NC, E = self.p, self.V, self.TPR, self.NC, self.p.per_thread
        g = _Src()
        self.prologue(g, "normc_inner")
        g(f"lane = tid % {TPR}" if self.RPC > 1 else "lane = tid")
        g(f"rloc = tid // {TPR}" if self.RPC > 1 else "rloc = 0")
        ragged_rows = p.kept % self.RPC != 0
        self.row_setup(g, f"bid * {self.RPC} + rloc", ragged_rows)
        rv = f"row < {p.kept}" if ragged_rows else "True"
        g(f"rv = {rv}")
        xs, oks, offs = [], [], []
        for e in range(E):
            c = g.new("c")
            g(f"{c} = lane + {e * TPR}")
            need = (e + 1) * TPR > NC
            ok = g.new("ok")
            if need:
                g(f"{ok} = rv and {c} < {NC}")
                cc = g.new("cc")
                g(f"{cc} = min({c}, {NC - 1})")
            else:
                g(f"{ok} = rv")
                cc = c
            o = self.chunk_offsets(g, cc)
            names = [g.new("x") for _ in range(V)]
            self.load_x(g, names, f"xb + {o['x']}", ok)
            xs.append(names)
            oks.append(ok)
            offs.append(o)
        if p.stat == "norm":
            g("n = F32(0.0)")
            for ok in oks:
                g(f"if {ok}: n += F32({float(V)!r})")
            g("s = F32(0.0)")
            for names in xs:
                for nm in names:
                    g(f"s = s + {nm}")
            g("mean = s / max(n, F32(1.0))")
            g("m2 = F32(0.0)")
            for names, ok in zip(xs, oks):
                with g.block(f"if {ok}:"):
                    for nm in names:
                        g(f"m2 = m2 + ({nm} - mean) * ({nm} - mean)")
            self.reduce_triple(g, "n", "mean", "m2", "a")
        else:
            g("q = F32(0.0)")
            for names in xs:
                for nm in names:
                    g(f"q = q + {nm} * {nm}")
            self.reduce_sum(g, "q", "a")
        self.finish_stats(g, "lane == 0 and rv")
        var = self.emit_row_affine(g)
        for names, ok, o in zip(xs, oks, offs):
            with g.block(f"if {ok}:"):
                self.emit_normalize_vec(g, names, o, var)
        return KernelSource("normc_inner", g.text(), p.grid, p.threads, self.shared, self.ptypes())

    def _welford_loop(self, g, lo, hi, TPR):
        """Per-thread Welford over vectors [lo, hi) of the row, LOOP vectors per trip; V accumulators."""
        V, U = self.V, self.p.per_thread
        self.acc_init(g)
        with g.block(f"for base in range({lo} + lane, {hi}, {TPR * U}):"):
            items = []
            for u in range(U):
                c = g.new("c")
                g(f"{c} = base + {u * TPR}")
                ok = g.new("ok")
                g(f"{ok} = {c} < {hi}")
                cc = g.new("cc")
                g(f"{cc} = min({c}, {hi} - 1)")
                o = self.chunk_offsets(g, cc)
                names = [g.new("x") for _ in range(V)]
                self.load_x(g, names, f"xb + {o['x']}", ok)
                items.append((ok, names))
            for ok, names in items:
                with g.block(f"if {ok}:"):
                    self.acc_update(g, names)
        # merge the V lane accumulators (each has count cnt)
        g("n = cnt")
        g("mean = wm0")
        g("m2 = wq0")
        for j in range(1, V):
            g(f"tn{j} = cnt")
            _chan(g, "n", "mean", "m2", f"tn{j}", f"wm{j}", f"wq{j}")

    def _sumsq_loop(self, g, lo, hi, TPR):
        V, U = self.V, self.p.per_thread
        g("q = F32(0.0)")
        with g.block(f"for base in range({lo} + lane, {hi}, {TPR * U}):"):
            for u in range(U):
                c = g.new("c")
                g(f"{c} = base + {u * TPR}")
                ok = g.new("ok")
                g(f"{ok} = {c} < {hi}")
                cc = g.new("cc")
                g(f"{cc} = min({c}, {hi} - 1)")
                o = self.chunk_offsets(g, cc)
                names = [g.new("x") for _ in range(V)]
                self.load_x(g, names, f"xb + {o['x']}", ok)
                for nm in names:
                    g(f"q = q + {nm} * {nm}")

    def _normalize_loop(self, g, lo, hi, TPR):
        V = self.V
        var = self.emit_row_affine(g)
        with g.block(f"for c in range({lo} + lane, {hi}, {TPR}):"):
            o = self.chunk_offsets(g, "c")
            names = [g.new("x") for _ in range(V)]
            self.load_x(g, names, f"xb + {o['x']}", "True")
            self.emit_normalize_vec(g, names, o, var)

    def looped(self):
        p = self.p
        g = _Src()
        self.prologue(g, "normc_inner")
        g("lane = tid")
        g("rloc = 0")
        self.row_setup(g, "bid", False)
        if p.stat == "norm":
            self._welford_loop(g, "0", str(self.NC), self.TPR)
            self.reduce_triple(g, "n", "mean", "m2", "a")
        else:
            self._sumsq_loop(g, "0", str(self.NC), self.TPR)
            self.reduce_sum(g, "q", "a")
        self.finish_stats(g, "lane == 0")
        self._normalize_loop(g, "0", str(self.NC), self.TPR)
        return KernelSource("normc_inner", g.text(), p.grid, p.threads, self.shared, self.ptypes())

    def split(self):
        p, S = self.p, self.p.splits
        L = -(-self.NC // S)
        # kernel 1: partial statistics of each (row, split) into the workspace
        g = _Src()
        self.prologue(g, "normc_inner_partial")
        g("lane = tid")
        g("rloc = 0")
        g(f"sp_ = bid % {S}")
        self.row_setup(g, f"bid // {S}", False)
        g(f"lo = sp_ * {L}")
        g(f"hi = min(lo + {L}, {self.NC})")
        if p.stat == "norm":
            self._welford_loop(g, "lo", "hi", self.TPR)
            self.reduce_triple(g, "n", "mean", "m2", "a")
        else:
            self._sumsq_loop(g, "lo", "hi", self.TPR)
            self.reduce_sum(g, "q", "a")
            g("n = F32(0.0)")
            g("mean = F32(0.0)")
            g("m2 = q")
        with g.block("if lane == 0:"):
            g(f"wi = (row * {S} + sp_) * 3")
            g("st1_f32(wp, wi, n)")
            g("st1_f32(wp, wi + 1, mean)")
            g("st1_f32(wp, wi + 2, m2)")
        k1 = KernelSource("normc_inner_partial", g.text(), p.grid, p.threads, self.shared, self.ptypes())
        # kernel 2: merge the row's partials (same order in every CTA of the row) and normalize a slice
        self.shared = 0
        g = _Src()
        self.prologue(g, "normc_inner_finish")
        g("lane = tid")
        g("rloc = 0")
        g(f"sp_ = bid % {S}")
        self.row_setup(g, f"bid // {S}", False)
        g("n = F32(0.0)")
        g("mean = F32(0.0)")
        g("m2 = F32(0.0)")
        with g.block(f"for k in range(lane, {S}, {self.TPR}):"):
            g(f"wi = (row * {S} + k) * 3")
            g("pn = ld1_f32(wp, wi)")
            g("pm = ld1_f32(wp, wi + 1)")
            g("pq = ld1_f32(wp, wi + 2)")
            if p.stat == "norm":
                _chan(g, "n", "mean", "m2", "pn", "pm", "pq")
            else:
                g("m2 = m2 + pq")
        if p.stat == "norm":
            self.reduce_triple(g, "n", "mean", "m2", "b")
        else:
            g("q = m2")
            self.reduce_sum(g, "q", "b")
        self.finish_stats(g, "lane == 0 and sp_ == 0")
        g(f"lo = sp_ * {L}")
        g(f"hi = min(lo + {L}, {self.NC})")
        self._normalize_loop(g, "lo", "hi", self.TPR)
        k2 = KernelSource("normc_inner_finish", g.text(), p.grid, p.threads, self.shared, self.ptypes())
        return [k1, k2]


# ----------------------------------------------------------------------------------------------------------
# outer / mixed: lanes along the contiguous column block, rows over y-threads


class _Outer(_Kernel):
    def __init__(self, plan):
        super().__init__(plan)
        p = plan
        nb = 2 if p.strategy == "mixed" else 1
        self.block = list(p.axes[-nb:])
        self.rowax = [a for a in p.axes[:-nb] if a.reduced]
        self.kout = [a for a in p.axes[:-nb] if not a.reduced]
        self.CB = math.prod(a.size for a in self.block)
        self.RR = math.prod(a.size for a in self.rowax)
        self.KO = math.prod(a.size for a in self.kout)
        self.NT = -(-self.CB // p.tile)
        self.G = p.group
        self.NG = p.tile // p.group if p.strategy == "mixed" else p.tile

    def col_offsets(self, g, col):
        """Offsets of column ``col`` (within the block) for each tensor, and the kept-group index."""
        blk = self.block
        if len(blk) == 1:
            cs = [col]
        else:
            k = g.new("ck")
            gg = g.new("cg")
            g(f"{k} = {col} % {blk[1].size}")
            g(f"{gg} = {col} // {blk[1].size}")
            cs = [gg, k]
        return {t: _offset(cs, blk, t) for t in ("x", "out", "scale", "shift", "stat")}

    def row_offsets(self, g, r):
        cs = _coords(g, r, self.rowax, "r")
        return {t: _offset(cs, self.rowax, t) for t in ("x", "out", "scale", "shift")}

    def rows_vary_params(self):
        return any(a.scale or a.shift for a in self.rowax)

    def setup(self, g, name, splits=None):
        p = self.p
        g(f"def {name}({PARAMS}):")
        g.ind += 1
        g("tid = I64(cuda.threadIdx.x)")
        g("bid = I64(cuda.blockIdx.x)")
        g.mark_decls()
        g(f"cx = tid % {p.nxc}")
        g(f"ry = tid // {p.nxc}")
        g(f"act = ry < {p.ry}")
        S = p.splits if splits is None else splits
        g(f"sp_ = bid % {S}")
        g(f"t2 = bid // {S}")
        g(f"tile = t2 % {self.NT}")
        g(f"ko = t2 // {self.NT}")
        cs = _coords(g, "ko", self.kout, "k")
        for t, nm in (("x", "xb"), ("out", "ob"), ("scale", "sb"), ("shift", "hb"), ("stat", "mb")):
            g(f"{nm} = I64({_offset(cs, self.kout, t)})")
        g(f"col = tile * {p.tile} + cx * {self.V}")
        g(f"cok = act and col < {self.CB}")
        g(f"colc = min(col, {self.CB - self.V})")
        self.co = self.col_offsets(g, "colc")
        RS = -(-self.RR // S)
        g(f"r0 = sp_ * {RS}")
        g(f"r1 = min(r0 + {RS}, {self.RR})")

    def emit_rows_accumulate(self, g):
        """Per-thread per-column statistics over this CTA's rows; leaves cnt and wm{j}, wq{j}."""
        p, V = self.p, self.V
        if p.schedule == "persistent":
            E = p.per_thread
            self.px = []
            g("cnt = F32(0.0)")
            for e in range(E):
                r = g.new("rw")
                g(f"{r} = r0 + ry + {e * p.ry}")
                ok = g.new("ok")
                g(f"{ok} = cok and {r} < r1")
                rc = g.new("rcl")
                g(f"{rc} = min({r}, {self.RR - 1})")
                ro = self.row_offsets(g, rc)
                names = [g.new("x") for _ in range(V)]
                self.load_x(g, names, f"xb + {self.co['x']} + {ro['x']}", ok)
                g(f"if act and {r} < r1: cnt += F32(1.0)")
                self.px.append((ok, names, ro))
            for j in range(V):
                g(f"s{j} = F32(0.0)")
                for _, names, _ in self.px:
                    g(f"s{j} = s{j} + {names[j]}")
                g(f"wm{j} = s{j} / max(cnt, F32(1.0))")
                g(f"wq{j} = F32(0.0)")
            for ok, names, _ in self.px:
                with g.block(f"if {ok}:"):
                    for j in range(V):
                        g(f"wq{j} = wq{j} + ({names[j]} - wm{j}) * ({names[j]} - wm{j})")
            if p.stat == "rms":
                for j in range(V):
                    g(f"wq{j} = F32(0.0)")
                    for _, names, _ in self.px:
                        g(f"wq{j} = wq{j} + {names[j]} * {names[j]}")
            return
        U = p.per_thread
        self.acc_init(g)
        with g.block(f"for base in range(r0 + ry, r1, {p.ry * U}):"):
            items = []
            for u in range(U):
                r = g.new("rw")
                g(f"{r} = base + {u * p.ry}")
                ok = g.new("ok")
                g(f"{ok} = cok and {r} < r1")
                rc = g.new("rcl")
                g(f"{rc} = min({r}, {self.RR - 1})")
                ro = self.row_offsets(g, rc)
                names = [g.new("x") for _ in range(V)]
                self.load_x(g, names, f"xb + {self.co['x']} + {ro['x']}", ok)
                items.append((f"act and {r} < r1", names))
            for ok, names in items:
                with g.block(f"if {ok}:"):
                    self.acc_update(g, names, rms=p.stat == "rms")

    def emit_cta_combine(self, g):
        """Merge the y-threads' partials per column; thread lc < tile ends with column stats (n, mean, m2)."""
        p, V = self.p, self.V
        T = p.tile
        self.smem(g, "sN", p.ry)
        self.smem(g, "sM", p.ry * T)
        self.smem(g, "sQ", p.ry * T)
        with g.block("if act:"):
            with g.block("if cx == 0:"):
                g("sN[ry] = cnt")
            for j in range(V):
                g(f"sM[ry * {T} + cx * {V} + {j}] = wm{j}")
                g(f"sQ[ry * {T} + cx * {V} + {j}] = wq{j}")
        g("cuda.syncthreads()")

    def merge_column(self, g, lc):
        p = self.p
        T = p.tile
        g("n = sN[0]")
        g(f"mean = sM[{lc}]")
        g(f"m2 = sQ[{lc}]")
        with g.block(f"for k in range(1, {p.ry}):"):
            if p.stat == "norm":
                _chan(g, "n", "mean", "m2", "sN[k]", f"sM[k * {T} + {lc}]", f"sQ[k * {T} + {lc}]")
            else:
                g("n = n + sN[k]")
                g(f"m2 = m2 + sQ[k * {T} + {lc}]")

    def emit_stats_and_affine(self, g):
        """From column stats (thread lc holds n, mean, m2 for column lc) to per-column a, b in smem."""
        p = self.p
        T = p.tile
        self.smem(g, "sA", T)
        self.smem(g, "sB", T)
        self.smem(g, "sC", T)
        fold = not self.rows_vary_params()
        if p.strategy == "mixed":
            self.smem(g, "sCn", T)
            self.smem(g, "sCm", T)
            self.smem(g, "sCq", T)
            g("sCn[lc] = n")
            g("sCm[lc] = mean")
            g("sCq[lc] = m2")
            g.ind -= 1  # leave the per-column loop
            g("cuda.syncthreads()")
            self.smem(g, "sGa", self.NG)
            self.smem(g, "sGb", self.NG)
            with g.block(f"for gi in range(tid, {self.NG}, {p.threads}):"):
                g(f"n = sCn[gi * {self.G}]")
                g(f"mean = sCm[gi * {self.G}]")
                g(f"m2 = sCq[gi * {self.G}]")
                with g.block(f"for k in range(1, {self.G}):"):
                    c = f"gi * {self.G} + k"
                    if p.stat == "norm":
                        _chan(g, "n", "mean", "m2", f"sCn[{c}]", f"sCm[{c}]", f"sCq[{c}]")
                    else:
                        g("n = n + sCn[" + c + "]")
                        g(f"m2 = m2 + sCq[{c}]")
                self.emit_rstd(g)
                if p.stats:
                    gst = self.block[0].stat
                    with g.block("if sp_ == 0:"):
                        g(f"st1_f32(mp, mb + gi * {gst}, mean)")
                        g(f"st1_f32(rp, mb + gi * {gst}, rstd)")
                g("sGa[gi] = rstd")
                g("sGb[gi] = mean")
            g("cuda.syncthreads()")
            g(f"for lc in range(tid, {T}, {p.threads}):")
            g.ind += 1
            g(f"a = sGa[lc // {self.G}]")
            g(f"c = sGb[lc // {self.G}]")
            g("b = F32(0.0)")
        else:
            self.emit_rstd(g)
            if p.stats:
                with g.block(f"if sp_ == 0 and tile * {T} + lc < {self.CB}:"):
                    so = self.block[0].stat
                    g(f"st1_f32(mp, mb + (tile * {T} + lc) * {so}, mean)")
                    g(f"st1_f32(rp, mb + (tile * {T} + lc) * {so}, rstd)")
            g("a = rstd")
            g("c = mean")
            g("b = F32(0.0)")
        if fold:
            g(f"gc = min(tile * {T} + lc, {self.CB - 1})")
            co = self.col_offsets(g, "gc")
            if p.scale_dtype is not None:
                g(f"sv = ld1_{TAG[p.scale_dtype]}(sp, sb + {co['scale']})")
                g("a = a * sv")
            if p.shift_dtype is not None:
                g(f"b = b + ld1_{TAG[p.shift_dtype]}(hp, hb + {co['shift']})")
        g("sA[lc] = a")
        g("sB[lc] = b")
        g("sC[lc] = c")
        g.ind -= 1
        g("cuda.syncthreads()")

    def emit_rstd(self, g):
        p = self.p
        if p.stat == "norm":
            g(f"rstd = rsqrt(m2 / max(n, F32(1.0)) + F32({p.eps!r}))")
        else:
            g(f"rstd = rsqrt(m2 / F32({float(p.reduced)!r}) + F32({p.eps!r}))")
            g("mean = F32(0.0)")

    def emit_normalize(self, g):
        p, V = self.p, self.V
        fold = not self.rows_vary_params()
        for j in range(V):
            g(f"na{j} = sA[min(cx * {V} + {j}, {p.tile - 1})]")
            g(f"nb{j} = sB[min(cx * {V} + {j}, {p.tile - 1})]")
            g(f"nc{j} = sC[min(cx * {V} + {j}, {p.tile - 1})]")

        def body(names, ro):
            ys = [g.new("y") for _ in range(V)]
            for j in range(V):
                g(f"{ys[j]} = ({names[j]} - nc{j}) * na{j} + nb{j}")
            if not fold:
                blk = self.block
                for w in ("scale", "shift"):
                    if getattr(p, f"{w}_dtype") is None:
                        continue
                    step = blk[-1].stride(w) if len(blk) == 1 else None
                    if step is None:
                        vals = []
                        for j in range(V):
                            cj = g.new("cj")
                            g(f"{cj} = colc + {j}")
                            co = self.col_offsets(g, cj)
                            base = "sb" if w == "scale" else "hb"
                            vals += self.load_param(g, w, f"{base} + {co[w]} + {ro[w]}", 0, False, 1)
                    else:
                        base = "sb" if w == "scale" else "hb"
                        vals = self.load_param(g, w, f"{base} + {self.co[w]} + {ro[w]}", step, False, V)
                    for j in range(V):
                        g(f"{ys[j]} = {ys[j]} * {vals[j]}" if w == "scale" else f"{ys[j]} = {ys[j]} + {vals[j]}")
            self.store_out(g, ys, f"ob + {self.co['out']} + {ro['out']}")

        if p.schedule == "persistent":
            for ok, names, ro in self.px:
                with g.block(f"if {ok}:"):
                    body(names, ro)
        else:
            with g.block("if cok:"):
                with g.block(f"for r in range(r0 + ry, r1, {p.ry}):"):
                    ro = self.row_offsets(g, "r")
                    names = [g.new("x") for _ in range(V)]
                    self.load_x(g, names, f"xb + {self.co['x']} + {ro['x']}", "True")
                    body(names, ro)

    def single(self):
        p = self.p
        g = _Src()
        self.setup(g, "normc_outer")
        self.emit_rows_accumulate(g)
        self.emit_cta_combine(g)
        g(f"for lc in range(tid, {p.tile}, {p.threads}):")
        g.ind += 1
        self.merge_column(g, "lc")
        self.emit_stats_and_affine(g)
        self.emit_normalize(g)
        return KernelSource("normc_outer", g.text(), p.grid, p.threads, self.shared, self.ptypes())

    def split(self):
        p, S, T = self.p, self.p.splits, self.p.tile
        g = _Src()
        self.setup(g, "normc_outer_partial")
        self.emit_rows_accumulate(g)
        self.emit_cta_combine(g)
        with g.block(f"for lc in range(tid, {T}, {p.threads}):"):
            self.merge_column(g, "lc")
            g(f"wi = ((t2 * {T} + lc) * {S} + sp_) * 3")
            g("st1_f32(wp, wi, n)")
            g("st1_f32(wp, wi + 1, mean)")
            g("st1_f32(wp, wi + 2, m2)")
        k1 = KernelSource("normc_outer_partial", g.text(), p.grid, p.threads, self.shared, self.ptypes())
        # kernel 2 (one CTA per column tile): y-thread ry merges splits ry, ry + RY, ... of its columns from
        # the workspace, the CTA combines the y-threads as the single-kernel schedule does, and the per-column
        # a, b, c (y = (x - c)*a + b) go to the workspace after the partials. Merging once here, not in every CTA of
        # kernel 3, keeps the merge O(splits) per column.
        V = self.V
        cols = self.KO * self.NT * T
        ab = 3 * cols * S  # offset of the a, b table in the workspace
        self.shared = 0
        g = _Src()
        self.setup(g, "normc_outer_stats", splits=1)
        self.acc_init(g)
        with g.block("if cok:"):
            with g.block(f"for k in range(ry, {S}, {p.ry}):"):
                g(f"wi = ((t2 * {T} + cx * {V}) * {S} + k) * 3")
                g("pn = ld1_f32(wp, wi)")
                g("nn = cnt + pn")
                g("w = pn / max(nn, F32(1.0))")
                for j in range(V):
                    g(f"wj = ((t2 * {T} + cx * {V} + {j}) * {S} + k) * 3")
                    if p.stat == "norm":
                        g("pm = ld1_f32(wp, wj + 1)")
                        g(f"d = pm - wm{j}")
                        g(f"wm{j} = wm{j} + d * w")
                        g(f"wq{j} = wq{j} + ld1_f32(wp, wj + 2) + d * d * cnt * w")
                    else:
                        g(f"wq{j} = wq{j} + ld1_f32(wp, wj + 2)")
                g("cnt = nn")
        self.emit_cta_combine(g)
        g(f"for lc in range(tid, {T}, {p.threads}):")
        g.ind += 1
        self.merge_column(g, "lc")
        self.emit_stats_and_affine(g)
        with g.block(f"for lc in range(tid, {T}, {p.threads}):"):
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3, sA[lc])")
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 1, sB[lc])")
            g(f"st1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 2, sC[lc])")
        km = KernelSource("normc_outer_stats", g.text(), self.KO * self.NT, p.threads, self.shared, self.ptypes())
        # kernel 3: every split CTA reads its columns' a, b and normalizes its rows
        self.shared = 0
        g = _Src()
        self.setup(g, "normc_outer_finish")
        self.smem(g, "sA", T)
        self.smem(g, "sB", T)
        self.smem(g, "sC", T)
        with g.block(f"for lc in range(tid, {T}, {p.threads}):"):
            g(f"sA[lc] = ld1_f32(wp, {ab} + (t2 * {T} + lc) * 3)")
            g(f"sB[lc] = ld1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 1)")
            g(f"sC[lc] = ld1_f32(wp, {ab} + (t2 * {T} + lc) * 3 + 2)")
        g("cuda.syncthreads()")
        self.emit_normalize(g)
        k2 = KernelSource("normc_outer_finish", g.text(), p.grid, p.threads, self.shared, self.ptypes())
        return [k1, km, k2]


def generate(plan) -> list[KernelSource]:
    """Python sources of the kernels for ``plan``, in launch order: 1 kernel; for split schedules 2 (inner:
    partial statistics, merge + normalize) or 3 (outer/mixed: partial statistics, merge per column tile,
    normalize)."""
    if plan.strategy == "inner":
        k = _Inner(plan)
        if plan.schedule == "persistent":
            return [k.persistent()]
        if plan.schedule == "looped":
            return [k.looped()]
        return k.split()
    k = _Outer(plan)
    if plan.schedule == "split":
        return k.split()
    return [k.single()]
