"""``normc bench``: time normc against PyTorch eager, torch.compile and Liger on a table of workloads.

One run, on one GPU: measure the device-to-device copy bandwidth (the floor's denominator), then for every
row build x in its memory order, run each system, check its result against normc's, and time it. Two
benchmarks share this machinery (row loading, peers, timing, the resumable run loop, reports):

* **forward** (``normc bench``, :func:`run`): ``y``; floor: x read once + y written once.
* **backward** (``normc bench --backward``, :func:`run_backward`): the backward alone (from saved statistics,
  or a retained autograd graph) and forward + backward; every peer's dx, dscale and dshift are checked
  against normc's; floor: :func:`backward_floor`.

Kernel time is the median per call of a CUDA-graph replay of several calls over rotating inputs (so rows
that fit in L2 are not timed from L2), falling back to ``triton.testing.do_bench`` when a system cannot be
captured; the host overhead of one eager normc forward call is measured separately. Results go to JSON
(written after every row, so an interrupted run can be resumed), a Markdown table and (with matplotlib) a
PNG chart.

    normc bench [--backward] [--table FILE] [--rows 0,5,40-44] [--limit N] [--budget S] [--out DIR]
                [--systems normc,eager,compile,liger] [--compile-dynamic] [--jobs N] [--resume | --render]

The table is the bundled anchor table (``normc/data/anchors.json``) unless a JSON file of the same form is
given. Needs a CUDA GPU and torch; Liger and matplotlib are optional.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from importlib import resources

SYSTEMS = ("normc", "eager", "compile", "liger")
# Rotate among enough input copies that one pass over them is this many times the L2 size (60 MB on the
# H200), so repeated calls are served from HBM as in a real model, not from cache.
ROTATE_L2_MULTIPLE = 3
MAX_ROTATIONS = 16
# Calls captured per CUDA graph and graph replays timed (median over replays). The forward bench always uses
# these; the backward bench (``adaptive`` timing) uses fewer on slow calls: calls per graph so that a replay
# lasts about GRAPH_MIN_US, replays so that all of them take about TIMED_US of device time (at least
# MIN_REPLAYS), which bounds the time a 10 ms call costs.
GRAPH_CALLS = 10
GRAPH_REPLAYS = 20
GRAPH_MIN_US = 2_000
TIMED_US = 50_000
MIN_REPLAYS = 5
# Dynamo's recompile limit while benchmarking (torch's default, 8, is per code object: the peers' functions
# are shared by every row of a family, and past the limit torch.compile silently runs eager).
RECOMPILE_LIMIT = 64
# Gradients of a peer agree with normc's when max|peer - normc| / max|normc| is at most this (per gradient):
# about 4 units in the last place of the dtype for 16-bit gradients (each side rounds once, sums in
# different orders), float32 sums over up to 10^7 terms in different orders.
GRAD_TOL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}
# The backward's floor target (fraction of the floor, rows with a floor of at least 20 µs).
BACKWARD_TARGET = 0.70
# A row (x and dy) at most this long fits in one SM's register file (64K 32-bit registers on sm_90): the
# floor's single-read algorithm streams whole rows through CTAs; longer rows are cut into column ranges.
ROW_ON_CHIP_BYTES = 256 * 1024
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# File name (without extension) of each benchmark's reports in --out.
STEMS = {"forward": "bench", "backward": "backward"}


# ----------------------------------------------------------------------------------------------------------
# the table


def _read_json(path, what):
    """The JSON value in file ``path``; :class:`normc.ArgumentError` starting with ``what`` (the file, or the
    option naming it) when it cannot be read or is not JSON."""
    from .errors import ArgumentError

    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ArgumentError(f"{what}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        raise ArgumentError(f"{what}: not JSON ({e})") from None
    except RecursionError:
        raise ArgumentError(f"{what}: not JSON this reader takes (nested too deeply)") from None


def _check_table_row(row):
    """The problem with a table row (a field missing or of the wrong kind, a spec that does not parse or does
    not fit the shape, a memory_order other than memory_perm's), or None."""
    from .api import layout_strides
    from .errors import NormcError

    if not isinstance(row, dict):
        return f"is a JSON {type(row).__name__}, not an object"
    for key in ("family", "spec", "memory_order"):
        if not isinstance(row.get(key), str):
            return f"{key} is {row.get(key)!r}; expected a string"
    shape = row.get("shape")
    if not (isinstance(shape, list) and shape
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        return f"shape is {shape!r}; expected a list of non-negative integers"
    if row.get("dtype") not in ITEMSIZE:
        return f"dtype is {row.get('dtype')!r}; expected one of {', '.join(ITEMSIZE)}"
    if not isinstance(row.get("sizes", {}), dict):
        return f"sizes is {row['sizes']!r}; expected an object of split-axis sizes, e.g. {{\"g\": 32}}"
    if not all(isinstance(k, str) and k != "eps" for k in row.get("sizes", {})):
        return f"sizes is {row['sizes']!r}; expected split-axis names as keys (eps goes in the spec text)"
    try:
        sp = row_spec(row)
    except NormcError as e:
        return str(e).splitlines()[0]
    if len(shape) != sp.ndim:
        return f"shape is {shape!r} ({len(shape)} dims); expected {sp.ndim} dims, one per dim of the spec"
    perm = row.get("memory_perm")
    if not (isinstance(perm, list) and all(type(d) is int for d in perm) and sorted(perm) == list(range(len(shape)))):
        return f"memory_perm is {perm!r}; expected a permutation of 0..{len(shape) - 1}"
    try:
        sp.axis_sizes(tuple(shape))
    except NormcError as e:
        return str(e).splitlines()[0]
    try:
        order = layout_strides(sp, shape, row["memory_order"])
    except NormcError as e:
        return f"memory_order: {str(e).splitlines()[0]}"
    if order != layout_strides(sp, shape, perm):
        return (f"memory_order {row['memory_order']!r} and memory_perm {perm!r} disagree; expected the same "
                "dims in the same order")
    fam = row["family"]
    if fam == "group" and not isinstance(row.get("sizes", {}).get("g"), int):
        return "family is 'group' but sizes gives no int g (torch's num_groups), e.g. {\"g\": 32}"
    stat = "rms" if fam == "rms" else "norm"  # what torch's op of the family computes
    if fam in PEER_FAMILIES and sp.stat != stat:
        return (f"family is {fam!r} but the spec's statistic is {sp.stat!r}; expected {stat} (the peers run "
                f"torch's {fam} norm)")
    return None


# families with a torch op (torch_op) the peers run; a row of another family times normc alone
PEER_FAMILIES = ("instance", "layer", "rms", "group", "batch")


def load_table(path=None) -> list:
    """Rows of a workload table (default: the bundled anchors). Each row has family, shape, dtype,
    memory_order, memory_perm, spec, sizes (see anchors.json's "about"; sizes and eps are optional).

    Raises:
        normc.ArgumentError: the file cannot be read, is not JSON, or is not an object whose ``rows`` are such
            rows (the message names the file, and the row and field at fault).
    """
    from .errors import ArgumentError

    if path is None:
        with resources.files("normc").joinpath("data/anchors.json").open() as f:
            return json.load(f)["rows"]
    table = _read_json(path, f"--table {path}")
    rows = table.get("rows") if isinstance(table, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ArgumentError(f"--table {path}: expected a JSON object whose \"rows\" is a non-empty list of "
                            "workloads, as in normc/data/anchors.json")
    for i, row in enumerate(rows):
        bad = _check_table_row(row)
        if bad:
            raise ArgumentError(f"--table {path}: row {i}: {bad}")
    return rows


def parse_rows(text: str, n: int | None = None) -> list:
    """Row indices from ``--rows`` text: indices and inclusive ranges, ``"0,5,40-44"``, in the order given
    (repeats dropped). ``n``: the table's length (indices must be below it).

    Raises:
        ValueError: a part is not an index or range, a range runs backwards, or an index is out of range.
    """
    out, seen = [], set()
    for part in text.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"--rows {text!r}: {part!r} is not a row index or range; expected e.g. 0,5,40-44")
        a = int(m[1])
        b = int(m[2]) if m[2] is not None else a
        if b < a:
            raise ValueError(f"--rows {text!r}: the range {part!r} runs backwards")
        if n is not None and b >= n:
            raise ValueError(f"--rows {text!r}: row {b} is out of range; the table has {n} rows (0-{n - 1})")
        for i in range(a, b + 1):
            if i not in seen:
                seen.add(i)
                out.append(i)
    return out


def row_spec(row):
    """The :class:`normc.Spec` of a table row (eps: the row's, else 1e-6 for rms and 1e-5 otherwise)."""
    import normc

    return normc.spec(row["spec"], eps=row.get("eps", 1e-6 if " rms " in f" {row['spec']} " else 1e-5),
                      **row.get("sizes", {}))


def _in_order(row, g, mean, std):
    """One tensor of the row's logical shape and dtype laid out in its memory order, filled N(mean, std)."""
    import torch

    shape, perm = row["shape"], row["memory_perm"]
    inv = [perm.index(d) for d in range(len(perm))]
    x = torch.empty([shape[d] for d in perm], dtype=getattr(torch, row["dtype"]), device="cuda")
    return x.normal_(mean, std, generator=g).permute(*inv)


def make_inputs(row, copies=1, seed=0):
    """x (``copies`` independent tensors in the row's memory order), scale, shift as torch CUDA tensors."""
    import torch

    spec = row_spec(row)
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, row["dtype"])
    xs = [_in_order(row, g, 0.5, 2.0) for _ in range(copies)]
    sizes = spec.axis_sizes(tuple(row["shape"]))
    sc = sh = None
    if spec.scale:
        sc = torch.empty(math.prod(sizes[a] for a in spec.scale), dtype=dt, device="cuda").normal_(1, .5, generator=g)
    if spec.shift:
        sh = torch.empty(math.prod(sizes[a] for a in spec.shift), dtype=dt, device="cuda").normal_(0, .5, generator=g)
    return spec, xs, sc, sh


def make_grads(row, copies=1, seed=0):
    """``copies`` output gradients dy (N(0, 1), x's dtype, in the row's memory order, as a layer that
    produces them in that layout would)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed + 7919)
    return [_in_order(row, g, 0.0, 1.0) for _ in range(copies)]


# ----------------------------------------------------------------------------------------------------------
# peers


def torch_op(row, spec):
    """PyTorch's functional form of the row's normalization, ``op(x, weight, bias) -> y`` (``None`` for an
    unknown family). It closes over nothing but constants (eps, groups), so ``torch.compile`` treats
    weight and bias as inputs."""
    import torch.nn.functional as F

    fam, eps = row["family"], spec.eps
    if fam == "instance":
        def op(x, w, b):
            return F.instance_norm(x, weight=w, bias=b, eps=eps)
    elif fam == "layer":
        def op(x, w, b):
            return F.layer_norm(x, x.shape[-1:], w, b, eps)
    elif fam == "rms":
        def op(x, w, b):
            return F.rms_norm(x, x.shape[-1:], w, eps)
    elif fam == "group":
        groups = row["sizes"]["g"]

        def op(x, w, b):
            return F.group_norm(x, groups, w, b, eps)
    elif fam == "batch":
        def op(x, w, b):
            return F.batch_norm(x, None, None, w, b, training=True, eps=eps)
    else:
        return None
    return op


def _compile_key(row, spec):
    return (row["family"], row["dtype"], len(row["shape"]), tuple(row["memory_perm"]), spec.eps,
            tuple(sorted(row.get("sizes", {}).items())))


def peer_fns(row, spec, sc, sh, compile_cache=None):
    """Callables x -> y for each peer that has this op: ``{"eager": fn, "compile": fn, "liger": fn}``.

    ``compile_cache``: ``None`` compiles ``torch.compile(op, dynamic=False)`` for this row (static shapes);
    a dict shares one ``torch.compile(op, dynamic=True)`` among the rows of the same family, dtype, rank,
    memory order and constants (kept in the dict)."""
    import torch

    op = torch_op(row, spec)
    if op is None:
        return {}
    if compile_cache is None:
        cop = torch.compile(op, dynamic=False)
    else:
        key = _compile_key(row, spec)
        cop = compile_cache.get(key)
        if cop is None:
            cop = compile_cache[key] = torch.compile(op, dynamic=True)
    fns = {"eager": lambda x: op(x, sc, sh), "compile": lambda x: cop(x, sc, sh)}
    try:
        from liger_kernel.transformers import functional as LF
    except Exception:
        LF = None
    fam, eps, shape = row["family"], spec.eps, row["shape"]
    if LF is not None:
        if fam == "layer":
            fns["liger"] = lambda x: LF.liger_layer_norm(x, sc, sh, eps)
        elif fam == "rms":
            fns["liger"] = lambda x: LF.liger_rms_norm(x, sc, eps, in_place=False)
        elif fam == "group":
            fns["liger"] = lambda x: LF.liger_group_norm(x, sc, sh, shape[1], row["sizes"]["g"], eps)
    return fns


@contextlib.contextmanager
def torch_compile_settings():
    """Dynamo and AOTAutograd settings for benchmarking (restored on exit): a recompile limit of
    RECOMPILE_LIMIT that raises when hit (instead of silently running eager), and no donated buffers (they
    forbid ``retain_graph=True``, which the backward timing needs)."""
    import torch
    import torch._dynamo
    import torch._functorch.config

    saved = []

    def put(mod, name, value):
        if hasattr(mod, name):
            saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, value)

    dc = torch._dynamo.config
    if hasattr(dc, "recompile_limit"):
        put(dc, "recompile_limit", RECOMPILE_LIMIT)
    else:  # torch < 2.6
        put(dc, "cache_size_limit", RECOMPILE_LIMIT)
    put(dc, "fail_on_recompile_limit_hit", True)
    put(torch._functorch.config, "donated_buffer", False)
    try:
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


def _fresh_compile(compile_cache):
    """Static torch.compile: forget earlier rows' graphs (one compile per row, never the recompile limit)."""
    if compile_cache is None:
        import torch

        torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------------------
# timing


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written (2 GiB buffers).

    Timed as ``../shared/bench/peers-h200.md`` did (``triton.testing.do_bench`` median of ``b.copy_(a)``, no
    CUDA graph: inside a graph torch's copy becomes a copy-engine memcpy node, about 2.8 TB/s on the H200
    instead of about 4.3 through the SMs); falls back to CUDA events without triton."""
    import torch

    a = torch.empty(2**29, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    try:
        from triton.testing import do_bench

        ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    except ImportError:
        b.copy_(a)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(20):
            b.copy_(a)
        e1.record()
        e1.synchronize()
        ms = e0.elapsed_time(e1) / 20
    a = b = None  # free both buffers now (not "del": pyflakes then calls the lambda's a, b undefined)
    return 2 * 2**31 / (ms * 1e-3)


def rotations(bytes_per_call, l2_bytes) -> int:
    """Input copies to rotate over so that one pass over them is ROTATE_L2_MULTIPLE x the L2 size."""
    return max(1, min(MAX_ROTATIONS, math.ceil(ROTATE_L2_MULTIPLE * l2_bytes / max(bytes_per_call, 1))))


def graph_shape(call_us, rotations=1):
    """(calls per graph, replays) of adaptive timing for a call of about ``call_us`` µs."""
    call_us = max(call_us, 0.1)
    calls = max(1, min(GRAPH_CALLS, math.ceil(GRAPH_MIN_US / call_us)))
    if rotations > 1:
        calls = max(calls, min(GRAPH_CALLS, rotations))
    replays = max(MIN_REPLAYS, min(GRAPH_REPLAYS, math.ceil(TIMED_US / (calls * call_us))))
    return calls, replays


def _time_graph(call, rotations, stream=None, adaptive=False):
    """Median µs per call of ``call(i)`` (i cycling over rotations) from CUDA-graph replays.

    Warm-up and capture run on ``stream`` (default: a new side stream); autograd graphs the calls backward
    through must have been built on that stream (their nodes run where their forward ran)."""
    import torch

    s = stream if stream is not None else torch.cuda.Stream()
    outer = torch.cuda.current_stream()
    s.wait_stream(outer)
    calls, replays = GRAPH_CALLS, GRAPH_REPLAYS
    with torch.cuda.stream(s):
        for i in range(3):
            call(i % rotations)
        if adaptive:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            call(0)
            e1.record()
            e1.synchronize()
            calls, replays = graph_shape(e0.elapsed_time(e1) * 1e3, rotations)
    outer.wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(calls):
            call(i % rotations)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / calls)
    del g
    return statistics.median(times)


def time_call(call, rotations, stream=None, adaptive=False):
    """Median µs per call: CUDA-graph replay, or ``triton.testing.do_bench`` if capture fails.

    Returns (µs, method)."""
    try:
        return _time_graph(call, rotations, stream, adaptive), "graph"
    except Exception:
        import torch

        torch.cuda.synchronize()
        from triton.testing import do_bench

        it = itertools.cycle(range(rotations))
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            us = do_bench(lambda: call(next(it)), warmup=25, rep=100, return_mode="median") * 1e3
        return us, "do_bench"


def host_overhead_us(fn, n=50, batches=20):
    """Median wall time (µs) of one eager call with no synchronization: ``batches`` batches of ``n`` calls,
    each batch timed alone and followed by a synchronization; the median of the per-call means.

    Batches are short so that the GPU's launch queue never fills: with 500 calls in a batch, a row of three
    kernels taking 800 µs on the GPU queued 1500 launches and the host blocked on the queue, which the
    column then reported as host overhead (259 µs on (2, 64, 128³) NDHWC instance norm)."""
    import torch

    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def _error(e) -> str:
    return f"{type(e).__name__}: {e}"[:200]


# ----------------------------------------------------------------------------------------------------------
# forward


def bench_row(i, row, bw, systems=SYSTEMS, l2_bytes=60e6, compile_cache=None):
    """Check and time one row's forward for each system; returns a JSON-able dict."""
    import torch

    import normc

    _fresh_compile(compile_cache)
    nbytes = math.prod(row["shape"]) * ITEMSIZE[row["dtype"]]
    rot = rotations(nbytes, l2_bytes)
    spec, xs, sc, sh = make_inputs(row, copies=rot, seed=i)
    f = normc.compile(spec)
    t0 = time.perf_counter()
    ref = f(xs[0], sc, sh)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    plan = next(iter(f._table.values())).plan
    floor_us = 2 * nbytes / bw * 1e6
    out = {"row": i, "family": row["family"], "shape": row["shape"], "dtype": row["dtype"],
           "memory_order": row["memory_order"], "plan": f"{plan.strategy}/{plan.schedule}",
           "reads_x": plan.reads_x, "floor_us": floor_us,
           "first_call_s": first_s, "rotations": rot, "systems": {}}
    fns = {"normc": lambda x: f(x, sc, sh)}
    with torch_compile_settings():
        fns.update(peer_fns(row, spec, sc, sh, compile_cache))
        refd = ref.double()
        scale = refd.abs().max().item() or 1.0
        for name in systems:
            fn = fns.get(name)
            if fn is None:
                continue
            try:
                y = fn(xs[0])
                err = ((y.double() - refd).abs().max().item()) / scale
                us, method = time_call(lambda k: fn(xs[k]), rot)
                out["systems"][name] = {"us": us, "gbps": 2 * nbytes / (us * 1e-6) / 1e9,
                                        "frac_floor": floor_us / us, "err_vs_normc": err, "method": method}
            except Exception as e:  # a peer that fails on a row is reported, not fatal
                out["systems"][name] = {"error": _error(e)}
            torch.cuda.synchronize()
    out["host_us"] = host_overhead_us(lambda: f(xs[0], sc, sh))
    xs = None  # free the inputs before empty_cache (not "del": see copy_bandwidth)
    torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------------------------------------
# backward


def backward_floor(spec, shape, dtype, sms=132) -> dict:
    """Bytes the backward (and the forward before it) must move at least, for the floor.

    Backward: x, dy read and dx written (x's dtype, N elements each); scale read; mean (``norm`` only) and rstd
    read (float32, one per row = kept index); dscale and dshift written; and the float32 partial sums a
    single-read algorithm must pass between CTAs, each written once and read once (``partials``):

    * a row of x and dy that fits in one SM's registers (``ROW_ON_CHIP_BYTES``) is streamed whole through one
      CTA (route ``rows``): a parameter gradient summed over rows that different CTAs hold needs one partial
      per parameter element per CTA holding its rows: ``shares = min(rows per element, ceil(SMs / groups))``
      (groups: the parameter's extent along kept axes; ``shares`` = 1 needs none). Layer/RMS norm over T
      rows of D: ``min(T, SMs) x D`` per gradient; NCHW instance norm: ``min(N, ceil(SMs / C)) x C``.
    * a longer row is cut into SMs column ranges, each CTA holding its range of every row (route
      ``columns``): the row sums (2 per row for ``norm``, 1 for ``rms``) need ``SMs`` partials per row, and a
      parameter element whose contributions span ``ceil(SMs / R)`` ranges (R: the parameter's extent along
      reduced axes) one partial per range (none when R >= SMs, e.g. layer norm).

    Re-reads are never counted (a row too long to keep on chip is read twice by any algorithm; the report's
    ``passes`` column says how many times normc's plan reads x and dy). Forward (for forward + backward): x
    read, y written, scale and shift read, mean (``norm``) and rstd written.

    Returns:
        ``{"backward": {part: bytes, ..., "total": bytes}, "forward": {...}, "route": "rows" | "columns",
        "partial_floats": n}``.
    """
    sizes = spec.axis_sizes(tuple(shape))
    e = ITEMSIZE[dtype]
    n = math.prod(shape)
    kept = set(spec.kept)
    rows = math.prod(sizes[a] for a in spec.kept)
    per_row = math.prod(sizes[a] for a in spec.reduced)
    nq = 2 if spec.stat == "norm" else 1
    params = [axes for axes in (spec.scale, spec.shift) if axes is not None]
    pelems = [math.prod(sizes[a] for a in axes) for axes in params]
    route = "rows" if per_row * 2 * e <= ROW_ON_CHIP_BYTES else "columns"
    floats = 0
    if route == "rows":
        for axes, p in zip(params, pelems):
            groups = math.prod(sizes[a] for a in axes if a in kept)
            shares = min(rows // groups, math.ceil(sms / groups))
            if shares > 1:
                floats += p * shares
    else:
        floats += nq * rows * sms
        for axes, p in zip(params, pelems):
            along = math.prod(sizes[a] for a in axes if a not in kept)
            shares = math.ceil(sms / along)
            if shares > 1:
                floats += p * shares
    bwd = {"x": n * e, "dy": n * e, "dx": n * e,
           "scale": pelems[0] * e if spec.scale is not None else 0,
           "stats": nq * rows * 4, "dparams": sum(pelems) * e, "partials": 2 * 4 * floats}
    bwd["total"] = sum(bwd.values())
    fwd = {"x": n * e, "y": n * e, "params": sum(pelems) * e, "stats": nq * rows * 4}
    fwd["total"] = sum(fwd.values())
    return {"backward": bwd, "forward": fwd, "route": route, "partial_floats": floats}


def grad_errors(got, ref, dtype) -> dict:
    """Compare a peer's gradients with normc's: ``got``/``ref`` map dx, dscale, dshift to tensors (or
    None). Returns ``{"err": {name: max|got - ref| / max|ref|}, "err_vs_normc": max, "grads_ok": bool}``."""
    errs = {}
    for name, r in ref.items():
        g = got.get(name)
        if r is None or g is None:
            continue
        if g.numel() != r.numel():
            errs[name] = float("inf")
            continue
        a, b = g.float(), r.float()
        if a.shape != b.shape:
            a, b = a.reshape(-1), b.reshape(-1)
        den = b.abs().max().item() or 1.0
        errs[name] = (a - b).abs().max().item() / den
    worst = max(errs.values()) if errs else None
    ok = all(v <= GRAD_TOL[dtype] for v in errs.values())  # NaN compares False: not ok
    return {"err": errs, "err_vs_normc": worst, "grads_ok": ok}


def backward_passes(bp) -> int:
    """Times a :class:`normc.backward_plan.BackwardPlan` reads x and dy: 1 for the fused kernel, 2 for the
    general dx kernel (its parameter gradients, if any, from per-row or per-segment sums) and for the column
    pass (row sums, then dx with the parameter gradients), +1 when a parameter reduction re-reads them
    (parameters that vary along the rows without a column pass or segment sums: NHWC group norm's
    ``scale g k``; layer norm's ``scale d`` with
    ``normc.backward_plan.COLS`` off)."""
    return (1 if bp.fused is not None else 2) + (1 if bp.params else 0)


def _backward_plan_info(f):
    """(forward plan text, backward plan text, backward kernels, passes over x and dy) of a Compiled after
    one forward with stats and one backward."""
    fplan = next(iter(f._table.values())).plan
    bentry = next(iter(f.__dict__.get("_normc_backward", {}).values()))
    bp = bentry.plan
    passes = backward_passes(bp)
    if bp.fused is not None:
        bwd = "fused" + (f"/cluster{bp.fused.cluster}" if bp.fused.cluster > 1 else "")
    else:
        bwd = bp.dx.strategy + ("/cols" if bp.cols is not None else "") + (
            "/split" if bp.dx.splits > 1 else "")
    return f"{fplan.strategy}/{fplan.schedule}", bwd, len(bentry.kernels), passes


def bench_backward_row(i, row, bw, systems=SYSTEMS, l2_bytes=60e6, sms=132, compile_cache=None):
    """Check and time one row's backward and forward + backward for each system; returns a JSON-able dict.

    normc: ``Compiled.backward(dy, x, mean, rstd, scale)`` from saved statistics (``bwd``) and
    ``f(x, scale, shift, return_stats=True)`` then ``f.backward`` (``fwd+bwd``). Peers (x, scale and shift
    leaves with ``requires_grad``): ``torch.autograd.grad`` on an autograd graph built once and retained
    (``bwd``: only the backward kernels run in the replayed CUDA graph), and forward then
    ``torch.autograd.grad`` (``fwd+bwd``). Everything runs on one side stream, where the autograd graphs are
    built and the CUDA graphs captured."""
    import torch

    import normc

    _fresh_compile(compile_cache)
    shape, dtype = row["shape"], row["dtype"]
    nbytes = math.prod(shape) * ITEMSIZE[dtype]
    rot = rotations(2 * nbytes, l2_bytes)  # x and dy per call
    spec, xs, sc, sh = make_inputs(row, copies=rot, seed=i)
    dys = make_grads(row, copies=rot, seed=i)
    fl = backward_floor(spec, shape, dtype, sms)
    floor_us = fl["backward"]["total"] / bw * 1e6
    fb_floor_us = (fl["backward"]["total"] + fl["forward"]["total"]) / bw * 1e6
    out = {"row": i, "family": row["family"], "shape": shape, "dtype": dtype, "memory_order": row["memory_order"],
           "floor_us": floor_us, "fb_floor_us": fb_floor_us, "floor_bytes": fl["backward"],
           "fb_floor_bytes": fl["backward"]["total"] + fl["forward"]["total"], "floor_route": fl["route"],
           "rotations": rot, "systems": {}}
    names = ("dx", "dscale", "dshift")

    s = torch.cuda.Stream()

    def timings(ent, bwd_call, fb_call, before_bwd=None):
        ent["fb_us"], ent["fb_method"] = time_call(fb_call, rot, s, adaptive=True)
        ent["fb_frac_floor"] = fb_floor_us / ent["fb_us"]
        if before_bwd is not None:
            before_bwd()
        ent["bwd_us"], ent["bwd_method"] = time_call(bwd_call, rot, s, adaptive=True)
        ent["bwd_frac_floor"] = floor_us / ent["bwd_us"]

    s.wait_stream(torch.cuda.current_stream())
    ref = None
    with torch.cuda.stream(s), torch_compile_settings():
        # normc (also the reference the peers are checked against)
        ent = {}
        try:
            f = normc.compile(spec)
            t0 = time.perf_counter()
            y, m, r = f(xs[0], sc, sh, return_stats=True)
            ref = dict(zip(names, f.backward(dys[0], xs[0], m, r, sc)))
            torch.cuda.synchronize()
            ent["first_call_s"] = time.perf_counter() - t0
            del y, m, r
            out["plan"], out["bwd_plan"], out["bwd_kernels"], out["passes"] = _backward_plan_info(f)
            if "normc" in systems:
                stats = [f(x, sc, sh, return_stats=True)[1:] for x in xs]

                def normc_fb(k):
                    _, mk, rk = f(xs[k], sc, sh, return_stats=True)
                    return f.backward(dys[k], xs[k], mk, rk, sc)

                def normc_bwd(k):
                    return f.backward(dys[k], xs[k], stats[k][0], stats[k][1], sc)

                timings(ent, normc_bwd, normc_fb)
                stats.clear()
        except Exception as e:
            ent["error"] = _error(e)
        if "normc" in systems:
            out["systems"]["normc"] = ent
        torch.cuda.synchronize()
        for name in systems:
            if name == "normc":
                continue
            # fresh leaves per system: autograd nodes remember the stream they were made on
            xg = [x.detach().requires_grad_() for x in xs]
            scg = None if sc is None else sc.detach().requires_grad_()
            shg = None if sh is None else sh.detach().requires_grad_()
            fn = peer_fns(row, spec, scg, shg, compile_cache).get(name)
            if fn is None:
                continue
            params = [p for p in (scg, shg) if p is not None]
            which = ["dx"] + [n for n, p in (("dscale", scg), ("dshift", shg)) if p is not None]
            ent = {}
            try:
                t0 = time.perf_counter()
                got = torch.autograd.grad(fn(xg[0]), [xg[0]] + params, dys[0])
                torch.cuda.synchronize()
                ent["first_call_s"] = time.perf_counter() - t0
                if ref is not None:
                    ent.update(grad_errors(dict(zip(which, got)), ref, dtype))
                del got
                ys = []  # the retained autograd graphs of the bwd timing, built on s

                def peer_bwd(k):
                    return torch.autograd.grad(ys[k], [xg[k]] + params, dys[k], retain_graph=True)

                def peer_fb(k):
                    return torch.autograd.grad(fn(xg[k]), [xg[k]] + params, dys[k])

                timings(ent, peer_bwd, peer_fb, lambda: ys.extend(fn(x) for x in xg))
                ys.clear()
            except Exception as e:  # a peer that fails on a row is reported, not fatal
                ent["error"] = _error(e)
            out["systems"][name] = ent
            xg.clear()
            torch.cuda.synchronize()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for lst in (xs, dys, ref or {}):
        lst.clear()  # before empty_cache (the closures above still name these containers)
    torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------------------------------------
# precompiling normc's kernels in worker processes


def precompile_plans(row, kind="forward", cc=(9, 0), sms=132):
    """The plans ``normc.compile(spec)`` makes for this row's tensors (as :func:`make_inputs` allocates them,
    16-byte aligned) on a device of compute capability ``cc`` with ``sms`` multiprocessors: the forward
    (with statistics for ``kind="backward"``) and, for ``"backward"``, the backward plan (else ``None``).
    No GPU needed."""
    from .api import layout_strides
    from .canonical import dense_like
    from .planner import make_plan
    from .problem import make_problem
    from .runtime.backward import plan_backward
    from .runtime.tune import lookup

    spec = row_spec(row)
    shape, dt = tuple(row["shape"]), row["dtype"]
    strides = layout_strides(spec, shape, row["memory_perm"])
    dense = dense_like(shape, strides)
    arch = f"sm_{cc[0]}{cc[1]}"
    aligns = {"x": 16, "out": 16, "scale": 16, "shift": 16}
    pdt = {"scale_dtype": dt if spec.scale is not None else None,
           "shift_dtype": dt if spec.shift is not None else None}
    prob = make_problem(spec, shape, strides, dense, x_dtype=dt, out_dtype=dt, stats=kind == "backward",
                        aligns=aligns, **pdt)
    plan = make_plan(prob, arch=arch, sms=sms, schedule=lookup(prob, arch, sms))
    bplan = None
    if kind == "backward":
        bplan = plan_backward(spec, shape, dt, strides=strides, dy_dtype=dt, need_dscale=spec.scale is not None,
                              need_dshift=spec.shift is not None, arch=arch, sms=sms, fit_bounds=True, **pdt)
    return plan, bplan


def precompile(row, kind="forward", cc=(9, 0), sms=132) -> float:
    """Compile the kernels of :func:`precompile_plans` into normc's disk cache (NVVM, nvJitLink; no GPU
    needed), so the benchmark's first call of this row only loads them. Returns the seconds it took."""
    from .runtime import compiled_kernels
    from .runtime.backward import compiled_backward_kernels

    t0 = time.perf_counter()
    plan, bplan = precompile_plans(row, kind, cc, sms)
    compiled_kernels(plan, cc)
    if bplan is not None:
        compiled_backward_kernels(bplan, cc)
    return time.perf_counter() - t0


def default_jobs() -> int:
    """Worker processes precompiling rows ahead of the GPU loop: half the CPU cores, at most 8."""
    return min(8, (os.cpu_count() or 1) // 2)


class _Precompiler:
    """Rows' kernels compiled ahead in ``jobs`` spawned processes, in the order the rows will run."""

    def __init__(self, items, kind, cc, sms, jobs):
        import concurrent.futures as cf
        import multiprocessing as mp

        self.pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
        self.futures = {i: self.pool.submit(precompile, row, kind, tuple(cc), sms) for i, row in items}

    def wait(self, i):
        """Wait for row ``i``'s kernels (a failure is ignored: the benchmark then compiles them itself)."""
        fut = self.futures.pop(i, None)
        if fut is not None:
            try:
                fut.result()
            except Exception:
                pass

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------------------------------------
# summaries and reports


def _speedups(rows, key):
    """Best peer's time / normc's per row that has both, and the worst row."""
    speed, worst = [], None
    for r in rows:
        s = r["systems"]
        n = s.get("normc", {}).get(key)
        peers = [v[key] for k, v in s.items() if k != "normc" and key in v]
        if n and peers:
            sp = min(peers) / n
            speed.append(sp)
            if worst is None or sp < worst[1]:
                worst = (r["row"], sp)
    gm = math.exp(sum(map(math.log, speed)) / len(speed)) if speed else None
    return {"geomean_speedup_vs_best_peer": gm, "rows_faster_than_best_peer": sum(1 for s in speed if s > 1),
            "rows_compared": len(speed), "worst_row": worst}


def summarize(rows) -> dict:
    """Forward: geometric-mean speedup over the best peer, rows meeting the floor targets, worst row."""
    out = _speedups(rows, "us")
    big = [r for r in rows if r["floor_us"] >= 20 and "us" in r["systems"].get("normc", {})]
    meet = [r for r in big if r["systems"]["normc"]["frac_floor"] >= (0.85 if r["reads_x"] == 1 else 0.60)]
    out.update(rows_floor_ge_20us=len(big), rows_meeting_floor_target=len(meet))
    return out


def summarize_backward(rows) -> dict:
    """Backward: per mode (``backward`` alone, ``fwd_bwd``) the speedups over the best peer and the rows with
    a floor >= 20 µs at >= BACKWARD_TARGET of it; the gradient mismatches and the errors."""
    out = {}
    for mode, key, floor_key, frac_key in (("backward", "bwd_us", "floor_us", "bwd_frac_floor"),
                                           ("fwd_bwd", "fb_us", "fb_floor_us", "fb_frac_floor")):
        d = _speedups(rows, key)
        big = [r for r in rows if r[floor_key] >= 20 and key in r["systems"].get("normc", {})]
        d["rows_floor_ge_20us"] = len(big)
        d["rows_meeting_floor_target"] = sum(1 for r in big if r["systems"]["normc"][frac_key] >= BACKWARD_TARGET)
        out[mode] = d
    out["grad_mismatches"] = [[r["row"], k, v.get("err", {})] for r in rows for k, v in r["systems"].items()
                              if v.get("grads_ok") is False]
    out["errors"] = [[r["row"], k, v["error"]] for r in rows for k, v in r["systems"].items() if "error" in v]
    return out


def _session_lines(meta):
    sessions = meta.get("sessions", [])
    if len(sessions) <= 1:
        return []
    return [f"The run was resumed: {len(sessions)} sessions on the same machine kind (started "
            + ", ".join(f"{x['started']} with {x['rows_before']} rows done, copy "
                        f"{x['bandwidth_measured'] / 1e12:.2f} TB/s" for x in sessions)
            + "); the floor uses the first session's bandwidth.", ""]


def _pending_lines(meta):
    left = meta.get("rows_not_run")
    if not left:
        return []
    lines = [f"Incomplete: {len(left)} selected row(s) not run yet ({_ranges(left)}); `--resume` continues.", ""]
    failed = meta.get("rows_failed")
    if failed:
        lines += ["Failed (retried by `--resume`): " + "; ".join(f"row {i}: `{e}`" for i, e in failed) + ".", ""]
    return lines


def _ranges(idx) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts, idx = [], sorted(idx)
    for _, grp in itertools.groupby(enumerate(idx), key=lambda t: t[1] - t[0]):
        g = [v for _, v in grp]
        parts.append(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}")
    return ",".join(parts)


def markdown(result) -> str:
    """A Markdown report: the run's facts, the summary and one table row per workload (forward or backward,
    as ``result["meta"]["kind"]`` says)."""
    if result["meta"].get("kind") == "backward":
        return markdown_backward(result)
    meta, rows = result["meta"], result["rows"]
    lines = [f"# normc bench on {meta['device']}", "",
             f"{meta['date']}; copy bandwidth {meta['bandwidth'] / 1e12:.2f} TB/s (read + write), measured in this "
             f"run; normc {meta.get('normc', '?')}, torch {meta.get('torch', '?')}. Times are median µs per call "
             "(CUDA-graph replay over rotating inputs); floor = x read once + y written once at the copy bandwidth; "
             "reads = times normc's plan reads x.", ""]
    lines += _session_lines(meta) + _pending_lines(meta)
    sm = result["summary"]
    if sm["geomean_speedup_vs_best_peer"]:
        lines += [f"Geometric-mean speedup over the best peer: {sm['geomean_speedup_vs_best_peer']:.2f}x; faster "
                  f"than the best peer on {sm['rows_faster_than_best_peer']} of {sm['rows_compared']} rows; "
                  f"{sm['rows_meeting_floor_target']} of {sm['rows_floor_ge_20us']} rows with a floor >= 20 µs meet "
                  "the floor target (0.85 for one read, 0.60 for two).", ""]
    hdr = "| # | family | shape | dtype | order | plan | reads | floor | " + " | ".join(SYSTEMS) + " | normc/floor | host µs |"
    lines += [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    for r in rows:
        s = r["systems"]
        cells = [f"{s[k]['us']:.1f}" if k in s and "us" in s[k] else ("err" if k in s else "-") for k in SYSTEMS]
        frac = s.get("normc", {}).get("frac_floor")
        tail = f" | {frac:.2f} | {r['host_us']:.1f} |" if frac else " | - | - |"
        lines.append(f"| {r['row']} | {r['family']} | {'x'.join(map(str, r['shape']))} | {r['dtype']} | "
                     f"{r['memory_order']} | {r['plan']} | {r['reads_x']} | {r['floor_us']:.1f} | "
                     + " | ".join(cells) + tail)
    return "\n".join(lines) + "\n"


def _bwd_cell(ent, key):
    if ent is None:
        return "-"
    if key not in ent:
        return "err" if "error" in ent else "-"
    return f"{ent[key]:.1f}" + ("!" if ent.get("grads_ok") is False else "")


def _summary_line(title, d):
    line = (f"**{title}**: {d['rows_meeting_floor_target']} of {d['rows_floor_ge_20us']} rows with a floor >= 20 µs "
            f"reach >= {BACKWARD_TARGET:.2f} of it")
    if d["geomean_speedup_vs_best_peer"]:
        w = d["worst_row"]
        line += (f"; faster than the best peer on {d['rows_faster_than_best_peer']} of {d['rows_compared']} rows; "
                 f"geometric-mean speedup over the best peer {d['geomean_speedup_vs_best_peer']:.2f}x "
                 f"(worst: row {w[0]}, {w[1]:.2f}x)")
    return line + "."


def markdown_backward(result) -> str:
    """The backward report: how it was measured (and the floor's byte arithmetic), the summary, one table for
    the backward alone and one for forward + backward, then gradient mismatches and errors."""
    meta, rows, sm = result["meta"], result["rows"], result["summary"]
    tol = ", ".join(f"{k} {v:g}" for k, v in meta.get("grad_tol", GRAD_TOL).items())
    comp = ("dynamic shapes, one compile per family, dtype, rank and memory order" if meta.get("compile") == "dynamic"
            else "static shapes, one compile per row")
    lines = [
        f"# normc bench --backward on {meta['device']}", "",
        f"{meta['date']}; copy bandwidth {meta['bandwidth'] / 1e12:.2f} TB/s (read + write), measured in this run; "
        f"{meta.get('sms', '?')} SMs; normc {meta.get('normc', '?')}, torch {meta.get('torch', '?')}. Times are median "
        "µs per call of CUDA-graph replays over rotating inputs.", "",
        "- **bwd**: the backward alone. normc: `Compiled.backward(dy, x, mean, rstd, scale)` from the statistics "
        "its forward saved; torch: `torch.autograd.grad(y, (x, scale, shift), dy, retain_graph=True)` on an "
        "autograd graph built once, so the replayed graph holds only the backward kernels (torch.compile: its "
        "compiled backward).",
        "- **fwd+bwd**: normc `f(x, scale, shift, return_stats=True)` then `f.backward`; torch: the forward then "
        "`torch.autograd.grad`.",
        "- **floor (bwd)** = bytes / copy bandwidth, bytes = x read + dy read + dx written (N x itemsize each) + "
        "scale read + mean (norm) and rstd read (4 B per row) + dscale and dshift written + float32 partial sums "
        "passed between CTAs, written once and read once (8 B each; rows that fit in an SM's 256 KiB of "
        "registers: one per parameter element per CTA holding its rows, min(rows per element, ceil(SMs / "
        "groups)), e.g. min(T, SMs) x D per gradient for layer norm; longer rows: SMs per row sum and per "
        "parameter element constant along the row); re-reads are not counted. **floor (fwd+bwd)** adds x read, "
        "y written, scale and shift read, mean and rstd written. `bwd plan`: normc's dx kernel (fused, /clusterC "
        "when each row is spread over a cluster of C CTAs; else the general inner or outer one, /cols with the "
        "column pass, /split when split) and its number of kernels (k); "
        "`passes`: times it reads x and dy (1: fused; 2: the general dx kernel, parameter gradients from its "
        "per-row sums, or the row sums then the column pass; 3: plus a parameter reduction re-reading them).",
        f"- Gradients: each peer's dx, dscale and dshift against normc's, max|peer - normc| / max|normc| <= "
        f"{tol}; `!` marks a mismatch. torch.compile: {comp}.", ""]
    lines += _session_lines(meta) + _pending_lines(meta)
    lines += [_summary_line("Backward alone", sm["backward"]), "",
              _summary_line("Forward + backward", sm["fwd_bwd"]), ""]
    for title, key, floor_key, frac_key, plan_cols in (
            ("Backward alone", "bwd_us", "floor_us", "bwd_frac_floor", ("bwd plan", "passes")),
            ("Forward + backward", "fb_us", "fb_floor_us", "fb_frac_floor", ("fwd plan",))):
        hdr = ("| # | family | shape | dtype | order | " + " | ".join(plan_cols) + " | floor µs | "
               + " | ".join(SYSTEMS) + " | normc/floor | best peer / normc |")
        lines += [f"## {title}", "", hdr, "|" + "---|" * (hdr.count("|") - 1)]
        for r in rows:
            s = r["systems"]
            n = s.get("normc", {})
            peers = [v[key] for k, v in s.items() if k != "normc" and key in v]
            plan = ([f"{r.get('bwd_plan', '?')} ({r.get('bwd_kernels', '?')} k)", str(r.get("passes", "?"))]
                    if key == "bwd_us" else [r.get("plan", "?")])
            frac = f"{n[frac_key]:.2f}" if frac_key in n else "-"
            sp = f"{min(peers) / n[key]:.2f}x" if peers and key in n else "-"
            lines.append(f"| {r['row']} | {r['family']} | {'x'.join(map(str, r['shape']))} | {r['dtype']} | "
                         f"{r['memory_order']} | " + " | ".join(plan) + f" | {r[floor_key]:.1f} | "
                         + " | ".join(_bwd_cell(s.get(k), key) for k in SYSTEMS) + f" | {frac} | {sp} |")
        lines.append("")
    if sm["grad_mismatches"]:
        lines += ["Gradient mismatches: " + "; ".join(
            f"row {i} {k} (" + ", ".join(f"{g} {e:.1e}" for g, e in errs.items()) + ")"
            for i, k, errs in sm["grad_mismatches"]) + ".", ""]
    elif rows:
        lines += ["Gradients: every peer agrees with normc within the tolerance on every row it ran.", ""]
    if sm["errors"]:
        lines += ["Errors: " + "; ".join(f"row {i} {k}: `{e}`" for i, k, e in sm["errors"]) + ".", ""]
    return "\n".join(lines)


def _bars(ax, rows, key, title=None):
    w = 0.8 / len(SYSTEMS)
    for k, name in enumerate(SYSTEMS):
        vals = [r["systems"].get(name, {}).get(key, 0) for r in rows]
        ax.bar([i + k * w for i in range(len(rows))], vals, w, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(rows))], [str(r["row"]) for r in rows], fontsize=6)
    ax.set_ylabel("fraction of copy-bandwidth floor")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(ncol=len(SYSTEMS), fontsize=8)


def chart(result, path) -> bool:
    """PNG bar chart of the fraction of the floor per row per system (needs matplotlib; for a backward result
    two panels, backward alone and forward + backward). Returns success."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = result["rows"]
    width = max(8, 0.35 * len(rows))
    if result["meta"].get("kind") == "backward":
        fig, axes = plt.subplots(2, 1, figsize=(width, 8))
        _bars(axes[0], rows, "bwd_frac_floor", "backward alone")
        _bars(axes[1], rows, "fb_frac_floor", "forward + backward")
        axes[1].set_xlabel("anchor row")
    else:
        fig, ax = plt.subplots(figsize=(width, 4.5))
        _bars(ax, rows, "frac_floor")
        ax.set_xlabel("anchor row")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def load_result(path, kind="forward") -> dict:
    """The ``kind`` run (``"forward"`` or ``"backward"``) that :func:`drive` recorded in ``path``.

    Raises:
        normc.ArgumentError: the file cannot be read, is not JSON, or does not hold a ``kind`` run (an object of
            meta, rows and summary, meta's kind ``kind``, meta's bandwidth a number > 0).
    """
    from .errors import ArgumentError

    result = _read_json(path, path)
    meta = result.get("meta") if isinstance(result, dict) else None
    held = meta.get("kind", "forward") if isinstance(meta, dict) else None
    if held is None:
        raise ArgumentError(f"{path}: expected an object with meta, rows and summary, as normc bench writes them "
                            "(no meta object found)")
    if held != kind:
        raise ArgumentError(f"{path} holds a {held} run, not a {kind} one"
                            + (" (render it without --backward)" if held == "forward" else
                               " (render it with --backward)" if held == "backward" else ""))
    rows = result.get("rows")
    if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
            and isinstance(result.get("summary"), dict)):
        raise ArgumentError(f"{path}: expected rows (a list of objects) and a summary, as normc bench writes them")
    # the bandwidths divide every floor and the header: a bad one is named here, not as a row's TypeError
    sessions = meta.get("sessions", [])
    checks = [("meta's bandwidth", meta, "bandwidth")] + [
        (f"meta's sessions[{i}] bandwidth_measured", x, "bandwidth_measured")
        for i, x in enumerate(sessions if isinstance(sessions, list) else []) if isinstance(x, dict)]
    for name, holder, field in checks:
        if field not in holder:
            raise ArgumentError(f"{path}: not a {kind} run as normc bench writes it (no field {field!r})")
        if not _positive_finite(holder[field]):
            raise ArgumentError(f"{path}: not a {kind} run as normc bench writes it ({name} is "
                                f"{holder[field]!r}; expected bytes per second, finite and > 0)")
    return result


def _positive_finite(v) -> bool:
    """Whether ``v`` is an int or float (not a bool), finite as a float, and > 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v)) and v > 0
    except OverflowError:  # an int past float's range
        return False


def render(out_dir, kind="forward") -> tuple:
    """``normc bench --render``: rewrite ``<stem>.md`` and ``<stem>.png`` in ``out_dir`` from its ``<stem>.json``.

    Returns:
        (the Markdown, whether the chart was written: it needs matplotlib).

    Raises:
        normc.ArgumentError: the JSON cannot be read or is not a ``kind`` run as :func:`drive` writes it (a field
            missing or of the wrong kind; the Markdown is made before anything is written).
    """
    from .errors import ArgumentError

    path = os.path.join(out_dir, STEMS[kind] + ".json")
    result = load_result(path, kind)
    try:
        text = markdown(result)
        return text, write_reports(result, out_dir, kind)
    except OSError as e:
        raise ArgumentError(f"--out {out_dir}: cannot write the reports ({e.strerror or e}: "
                            f"{e.filename or out_dir})") from None
    except _MALFORMED as e:
        raise _malformed(path, kind, e, _failing_row(result)) from None


def _failing_row(result):
    """The ``row`` value (else list position) of the first row of ``result`` that :func:`markdown` fails on
    alone, ``"meta"`` when it fails with no rows at all, or None (for the error message of a malformed recorded
    run)."""
    try:
        markdown({**result, "rows": []})
    except _MALFORMED:
        return "meta"
    for i, r in enumerate(result["rows"]):
        try:
            markdown({**result, "rows": [r]})
        except _MALFORMED:
            return r.get("row", f"#{i}")
    return None


# what reading a recorded run with a field missing or of the wrong kind raises
_MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError)


def _malformed(path, kind, e, row=None):
    """The :class:`normc.ArgumentError` for a recorded run at ``path`` that reading failed on with ``e`` (in its
    row ``row``, where known)."""
    from .errors import ArgumentError

    what = f"no field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
    where = "" if row is None else " meta:" if row == "meta" else f" row {row!r}:"
    return ArgumentError(f"{path}:{where} not a {kind} run as normc bench writes it ({what})")


def _resumable(path, kind) -> dict:
    """The run recorded at ``path`` (:func:`load_result`), checked for what ``--resume`` reads from it before
    any row runs: the first session's bandwidth, the sessions, each row's index and the reports of its rows.

    Raises:
        normc.ArgumentError: as :func:`load_result`, or a field is missing or of the wrong kind.
    """
    prev = load_result(path, kind)
    try:
        sessions = prev["meta"].get("sessions", [])  # (the bandwidth is checked by load_result)
        if not isinstance(sessions, list):
            raise TypeError(f"meta's sessions is {sessions!r}; expected a list")
        for r in prev["rows"]:
            if isinstance(r["row"], bool) or not isinstance(r["row"], int):
                raise TypeError(f"a row's index is {r['row']!r}; expected an int")
        (summarize_backward if kind == "backward" else summarize)(prev["rows"])
        markdown(prev)  # what the end of the run writes from these rows and the new ones
    except _MALFORMED as e:
        raise _malformed(path, kind, e) from None
    return prev


def write_reports(result, out_dir, kind=None) -> bool:
    """Write ``<stem>.md`` and ``<stem>.png`` (stem ``bench`` or ``backward``) to ``out_dir``; returns whether
    the chart was written (it needs matplotlib)."""
    stem = STEMS[kind or result["meta"].get("kind", "forward")]
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(markdown(result))
    return chart(result, os.path.join(out_dir, stem + ".png"))


# ----------------------------------------------------------------------------------------------------------
# the run loop


def _now():
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def _row_line(kind, r) -> str:
    n = r["systems"].get("normc", {})
    if kind == "backward":
        b, fb = n.get("bwd_us"), n.get("fb_us")
        return f"normc bwd {b and round(b, 1)} µs, fwd+bwd {fb and round(fb, 1)} µs"
    u = n.get("us")
    return f"normc {u and round(u, 1)} µs"


def drive(kind, tab, idx, bench_one, measure_bw, meta, *, out_dir=None, resume=False, progress=True,
          budget_s=None, limit=None, precompiler=None, clock=time.perf_counter) -> dict:
    """The run loop both benchmarks share (no GPU code of its own).

    Runs ``bench_one(i, tab[i], bandwidth)`` for each row of ``idx`` not already in ``out_dir/<stem>.json``
    (with ``resume``), at most ``limit`` rows, starting no row once ``budget_s`` seconds have passed; writes
    the JSON after every row and the Markdown and chart at the end. ``measure_bw()`` gives the copy bandwidth
    (measured once per session; a resumed run keeps its first session's). ``precompiler(todo)`` (optional)
    returns an object with ``wait(i)`` (called before row i) and ``close()``.

    Returns:
        ``{"meta", "rows", "summary"}``; ``meta["rows_not_run"]`` lists the selected rows still missing.
    """
    start = clock()
    stem = STEMS[kind]
    path = os.path.join(out_dir, stem + ".json") if out_dir else None
    done, sessions, prev = {}, [], None
    if resume and path and os.path.exists(path):
        prev = _resumable(path, kind)
        done = {r["row"]: r for r in prev["rows"]}
        sessions = prev.get("meta", {}).get("sessions", [])
    todo = [i for i in idx if i not in done]
    if limit is not None:
        todo = todo[:max(0, limit)]
    # the workers compile while the copy bandwidth is measured and earlier rows run
    pre = precompiler(todo) if precompiler is not None and todo else None
    it, bar = todo, None
    try:
        bw = prev["meta"]["bandwidth"] if prev is not None else measure_bw()  # one floor for the whole run
        sessions.append({"started": _now(), "rows_before": len(done),
                         "bandwidth_measured": measure_bw() if done else bw})
        results = list(done.values())
        meta = {**meta, "kind": kind, "bandwidth": bw, "date": _now(), "sessions": sessions}
        summarize_fn = summarize_backward if kind == "backward" else summarize

        failed = {}  # row -> error of this session (a failed row is retried by --resume)

        def snapshot():
            res = {"meta": dict(meta), "rows": sorted(results, key=lambda r: r["row"])}
            have = {r["row"] for r in results}
            res["meta"]["rows_not_run"] = [i for i in idx if i not in have]
            res["meta"]["rows_failed"] = [[i, e] for i, e in failed.items() if i not in have]
            res["summary"] = summarize_fn(res["rows"])
            return res

        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
        if progress:
            try:
                from tqdm import tqdm

                it = bar = tqdm(todo, desc="normc bench" + (" --backward" if kind == "backward" else ""), unit="row")
            except ImportError:
                pass
        for n, i in enumerate(it):
            if budget_s is not None and clock() - start > budget_s:
                print(f"normc bench: the --budget of {budget_s:g} s is spent after {n} row(s); {len(todo) - n} "
                      "left (rerun with --resume to continue)", file=sys.stderr, flush=True)
                break
            if pre is not None:
                pre.wait(i)
            try:
                r = bench_one(i, tab[i], bw)
            except Exception as e:  # e.g. out of memory: report it and go on with the next row
                failed[i] = _error(e)
                print(f"normc bench: row {i} failed: {failed[i]}", file=sys.stderr, flush=True)
                r = None
            if r is not None:
                results.append(r)
            if path:  # after every row, so an interrupted run can be resumed
                tmp = path + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(snapshot(), f, indent=1)
                os.replace(tmp, path)
            if r is None:
                continue
            if bar is not None:
                bar.set_postfix_str(f"row {i}: {_row_line(kind, r)}", refresh=False)
            elif progress:
                print(f"row {i}: {r['family']} {r['shape']} {r['memory_order']}: {_row_line(kind, r)}", flush=True)
    finally:
        if bar is not None:
            bar.close()
        if pre is not None:
            pre.close()
    result = snapshot()
    if out_dir:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        write_reports(result, out_dir, kind)
    return result


def _gpu_setup(table, rows):
    """(table rows, selected indices, torch) after checking the selection and that torch and a GPU exist."""
    from .errors import ArgumentError

    tab = load_table(table)
    idx = list(range(len(tab))) if rows is None else list(dict.fromkeys(rows))
    bad = [i for i in idx if not 0 <= i < len(tab)]
    if bad:
        raise ArgumentError(f"row {bad[0]} is out of range: the table has {len(tab)} rows (0-{len(tab) - 1})")
    try:
        import torch
    except ImportError:
        raise ArgumentError("normc bench needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise ArgumentError("normc bench needs a CUDA GPU; none is available")
    return tab, idx, torch


def _meta(torch, table, **extra):
    import normc

    return {"device": torch.cuda.get_device_name(0), "normc": normc.__version__, "torch": torch.__version__,
            "python": platform.python_version(), "table": table or "bundled anchors", **extra}


def _precompiler(tab, kind, jobs):
    if jobs is None:
        jobs = default_jobs()
    if jobs <= 0:
        return None
    from .runtime import gpu

    cc, sms = gpu.device_cc(0), gpu.device_sms(0)
    return lambda todo: _Precompiler([(i, tab[i]) for i in todo], kind, cc, sms, jobs)


def run(table=None, rows=None, systems=SYSTEMS, out_dir=None, progress=True, resume=False, *, limit=None,
        budget_s=None, jobs=None, compile_dynamic=False) -> dict:
    """Benchmark the forward on the current GPU; write ``bench.json``, ``bench.md`` and ``bench.png`` to
    ``out_dir``.

    Args:
        table: path of a JSON table (default: bundled anchors).
        rows: indices to run (default: all).
        systems: subset of ``normc, eager, compile, liger``.
        out_dir: where to write the reports (default: don't write).
        progress: show a progress bar (tqdm when installed, else one line per row).
        resume: continue the run recorded in ``out_dir/bench.json`` (written after every row): rows already
            there are kept, not re-run; the copy bandwidth of each session is recorded in ``meta``.
        limit: run at most this many rows (of those not done yet).
        budget_s: start no new row after this many seconds (the rest: ``resume``).
        jobs: processes compiling normc's kernels for the coming rows ahead of the GPU loop (default:
            :func:`default_jobs`; 0: none).
        compile_dynamic: torch.compile with dynamic shapes, shared by rows of the same family, dtype, rank and
            memory order (default: static shapes, one compile per row).

    Raises:
        normc.ArgumentError: no CUDA GPU or no torch, or a row index out of range.
    """
    tab, idx, torch = _gpu_setup(table, rows)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60e6)
    cache = {} if compile_dynamic else None
    meta = _meta(torch, table, compile="dynamic" if compile_dynamic else "static")
    return drive("forward", tab, idx, lambda i, row, bw: bench_row(i, row, bw, systems, l2, cache), copy_bandwidth,
                 meta, out_dir=out_dir, resume=resume, progress=progress, budget_s=budget_s, limit=limit,
                 precompiler=_precompiler(tab, "forward", jobs))


def run_backward(table=None, rows=None, systems=SYSTEMS, out_dir=None, progress=True, resume=False, *, limit=None,
                 budget_s=None, jobs=None, compile_dynamic=False) -> dict:
    """Benchmark the backward on the current GPU (:func:`bench_backward_row` per row); write
    ``backward.json``, ``backward.md`` and ``backward.png`` to ``out_dir``. Arguments as :func:`run`.

    Raises:
        normc.ArgumentError: no CUDA GPU or no torch, or a row index out of range.
    """
    tab, idx, torch = _gpu_setup(table, rows)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60e6)
    sms = props.multi_processor_count
    cache = {} if compile_dynamic else None
    meta = _meta(torch, table, sms=sms, compile="dynamic" if compile_dynamic else "static", grad_tol=GRAD_TOL,
                 target=BACKWARD_TARGET)
    return drive("backward", tab, idx,
                 lambda i, row, bw: bench_backward_row(i, row, bw, systems, l2, sms, cache), copy_bandwidth, meta,
                 out_dir=out_dir, resume=resume, progress=progress, budget_s=budget_s, limit=limit,
                 precompiler=_precompiler(tab, "backward", jobs))
