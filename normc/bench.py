"""``normc bench``: time normc against PyTorch eager, torch.compile and Liger on a table of workloads.

One run, on one GPU: measure the device-to-device copy bandwidth (the floor: a normalization reads x once
and writes y once), then for every row build x in its memory order, run each system, check its output
against normc's, and time it. Kernel time is the median per call of a CUDA-graph replay of several calls
over rotating inputs (so rows that fit in L2 are not timed from L2), falling back to
``triton.testing.do_bench`` when a system cannot be captured; the host overhead of one eager normc call is
measured separately. Results go to JSON, a Markdown table and (with matplotlib) a PNG chart.

    normc bench [--table FILE] [--rows 0,5] [--out DIR] [--systems normc,eager,compile,liger]

The table is the bundled anchor table (``normc/data/anchors.json``) unless a JSON file of the same form is
given. Needs a CUDA GPU and torch; Liger and matplotlib are optional.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import statistics
import time
from importlib import resources

SYSTEMS = ("normc", "eager", "compile", "liger")
# Rotate among enough input copies that one pass over them is this many times the L2 size (60 MB on the
# H200), so repeated calls are served from HBM as in a real model, not from cache.
ROTATE_L2_MULTIPLE = 3
MAX_ROTATIONS = 16
# Calls captured per CUDA graph and graph replays timed (median over replays).
GRAPH_CALLS = 10
GRAPH_REPLAYS = 20


def load_table(path=None) -> list:
    """Rows of a workload table (default: the bundled anchors). Each row has family, shape, dtype,
    memory_order, memory_perm, spec, sizes (see anchors.json's "about")."""
    if path is None:
        with resources.files("normc").joinpath("data/anchors.json").open() as f:
            return json.load(f)["rows"]
    with open(path) as f:
        return json.load(f)["rows"]


def row_spec(row):
    """The :class:`normc.Spec` of a table row (eps: the row's, else 1e-6 for rms and 1e-5 otherwise)."""
    import normc

    return normc.spec(row["spec"], eps=row.get("eps", 1e-6 if " rms " in f" {row['spec']} " else 1e-5),
                      **row.get("sizes", {}))


def make_inputs(row, copies=1, seed=0):
    """x (``copies`` independent tensors in the row's memory order), scale, shift as torch CUDA tensors."""
    import torch

    spec = row_spec(row)
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape, perm = row["shape"], row["memory_perm"]
    dt = getattr(torch, row["dtype"])
    inv = [perm.index(d) for d in range(len(perm))]
    xs = []
    for _ in range(copies):
        x = torch.empty([shape[d] for d in perm], dtype=dt, device="cuda").normal_(0.5, 2.0, generator=g)
        xs.append(x.permute(*inv))
    sizes = spec.axis_sizes(tuple(shape))
    sc = sh = None
    if spec.scale:
        sc = torch.empty(math.prod(sizes[a] for a in spec.scale), dtype=dt, device="cuda").normal_(1, .5, generator=g)
    if spec.shift:
        sh = torch.empty(math.prod(sizes[a] for a in spec.shift), dtype=dt, device="cuda").normal_(0, .5, generator=g)
    return spec, xs, sc, sh


def peer_fns(row, spec, sc, sh):
    """Callables x -> y for each peer that has this op: ``{"eager": fn, "compile": fn, "liger": fn}``."""
    import torch
    import torch.nn.functional as F

    fam, eps = row["family"], spec.eps
    shape = row["shape"]
    if fam == "instance":
        def eager(x):
            return F.instance_norm(x, weight=sc, bias=sh, eps=eps)
    elif fam == "layer":
        def eager(x):
            return F.layer_norm(x, (shape[-1],), sc, sh, eps)
    elif fam == "rms":
        def eager(x):
            return F.rms_norm(x, (shape[-1],), sc, eps)
    elif fam == "group":
        groups = row["sizes"]["g"]

        def eager(x):
            return F.group_norm(x, groups, sc, sh, eps)
    elif fam == "batch":
        def eager(x):
            return F.batch_norm(x, None, None, sc, sh, training=True, eps=eps)
    else:
        return {}
    fns = {"eager": eager, "compile": torch.compile(eager, dynamic=False)}
    try:
        from liger_kernel.transformers import functional as LF
    except Exception:
        LF = None
    if LF is not None:
        if fam == "layer":
            fns["liger"] = lambda x: LF.liger_layer_norm(x, sc, sh, eps)
        elif fam == "rms":
            fns["liger"] = lambda x: LF.liger_rms_norm(x, sc, eps, in_place=False)
        elif fam == "group":
            fns["liger"] = lambda x: LF.liger_group_norm(x, sc, sh, shape[1], row["sizes"]["g"], eps)
    return fns


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
    del a, b
    return 2 * 2**31 / (ms * 1e-3)


def _time_graph(call, rotations):
    """Median µs per call of ``call(i)`` (i cycling over rotations) from CUDA-graph replays."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            call(i % rotations)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(GRAPH_CALLS):
            call(i % rotations)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(GRAPH_REPLAYS):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / GRAPH_CALLS)
    return statistics.median(times)


def time_call(call, rotations):
    """Median µs per call: CUDA-graph replay, or ``triton.testing.do_bench`` if capture fails.

    Returns (µs, method)."""
    try:
        return _time_graph(call, rotations), "graph"
    except Exception:
        import torch

        torch.cuda.synchronize()
        from triton.testing import do_bench

        it = itertools.cycle(range(rotations))
        return do_bench(lambda: call(next(it)), warmup=25, rep=100, return_mode="median") * 1e3, "do_bench"


def host_overhead_us(fn, n=500):
    """Median wall time (µs) of one eager call with no synchronization, over 5 batches of ``n`` calls."""
    import torch

    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def bench_row(i, row, bw, systems=SYSTEMS, l2_bytes=60e6):
    """Check and time one row for each system; returns a JSON-able dict."""
    import torch

    import normc

    nbytes = math.prod(row["shape"]) * {"float32": 4, "float16": 2, "bfloat16": 2}[row["dtype"]]
    rot = max(1, min(MAX_ROTATIONS, math.ceil(ROTATE_L2_MULTIPLE * l2_bytes / max(nbytes, 1))))
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
           "reads_x": 1 if plan.schedule == "persistent" else 2, "floor_us": floor_us,
           "first_call_s": first_s, "rotations": rot, "systems": {}}
    fns = {"normc": lambda x: f(x, sc, sh)}
    fns.update(peer_fns(row, spec, sc, sh))
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
            out["systems"][name] = {"error": f"{type(e).__name__}: {e}"[:200]}
        torch.cuda.synchronize()
    out["host_us"] = host_overhead_us(lambda: f(xs[0], sc, sh))
    del xs
    torch.cuda.empty_cache()
    return out


def summarize(rows) -> dict:
    """Geometric-mean speedup over the best peer, rows meeting the floor targets, worst row."""
    speed, worst = [], None
    for r in rows:
        s = r["systems"]
        n = s.get("normc", {}).get("us")
        peers = [v["us"] for k, v in s.items() if k != "normc" and "us" in v]
        if n and peers:
            sp = min(peers) / n
            speed.append(sp)
            if worst is None or sp < worst[1]:
                worst = (r["row"], sp)
    gm = math.exp(sum(map(math.log, speed)) / len(speed)) if speed else None
    big = [r for r in rows if r["floor_us"] >= 20 and "us" in r["systems"].get("normc", {})]
    meet = [r for r in big if r["systems"]["normc"]["frac_floor"] >= (0.85 if r["reads_x"] == 1 else 0.60)]
    return {"geomean_speedup_vs_best_peer": gm, "rows_faster_than_best_peer": sum(1 for s in speed if s > 1),
            "rows_compared": len(speed), "worst_row": worst, "rows_floor_ge_20us": len(big),
            "rows_meeting_floor_target": len(meet)}


def markdown(result) -> str:
    """A Markdown report: the run's facts, the summary and one table row per workload."""
    meta, rows = result["meta"], result["rows"]
    lines = [f"# normc bench on {meta['device']}", "",
             f"{meta['date']}; copy bandwidth {meta['bandwidth'] / 1e12:.2f} TB/s (read + write), measured in this "
             f"run; normc {meta['normc']}, torch {meta.get('torch', '?')}. Times are median µs per call "
             "(CUDA-graph replay over rotating inputs); floor = x read once + y written once at the copy bandwidth; "
             "reads = times normc's plan reads x.", ""]
    sessions = meta.get("sessions", [])
    if len(sessions) > 1:
        lines += [f"The run was resumed: {len(sessions)} sessions on the same machine kind (started "
                  + ", ".join(f"{x['started']} with {x['rows_before']} rows done, copy "
                              f"{x['bandwidth_measured'] / 1e12:.2f} TB/s" for x in sessions)
                  + "); the floor uses the first session's bandwidth.", ""]
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


def chart(result, path) -> bool:
    """PNG bar chart of the fraction of the floor per row per system (needs matplotlib). Returns success."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(rows)), 4.5))
    w = 0.8 / len(SYSTEMS)
    for k, name in enumerate(SYSTEMS):
        vals = [r["systems"].get(name, {}).get("frac_floor", 0) for r in rows]
        ax.bar([i + k * w for i in range(len(rows))], vals, w, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(rows))], [str(r["row"]) for r in rows], fontsize=6)
    ax.set_ylabel("fraction of copy-bandwidth floor")
    ax.set_xlabel("anchor row")
    ax.legend(ncol=len(SYSTEMS), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def run(table=None, rows=None, systems=SYSTEMS, out_dir=None, progress=True, resume=False) -> dict:
    """Benchmark the table on the current GPU; write ``bench.json``, ``bench.md`` and ``bench.png`` to ``out_dir``.

    Args:
        table: path of a JSON table (default: bundled anchors).
        rows: indices to run (default: all).
        systems: subset of ``normc, eager, compile, liger``.
        out_dir: where to write the reports (default: don't write).
        progress: show a progress bar (tqdm when installed, else one line per row).
        resume: continue the run recorded in ``out_dir/bench.json`` (written after every row): rows already
            there are kept, not re-run; the copy bandwidth of each session is recorded in ``meta``.

    Raises:
        normc.ArgumentError: no CUDA GPU or no torch.
    """
    from .errors import ArgumentError

    try:
        import torch
    except ImportError:
        raise ArgumentError("normc bench needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise ArgumentError("normc bench needs a CUDA GPU; none is available")
    import normc

    tab = load_table(table)
    idx = list(range(len(tab))) if rows is None else list(rows)
    done, sessions = {}, []
    path = os.path.join(out_dir, "bench.json") if out_dir else None
    if resume and path and os.path.exists(path):
        with open(path) as f:
            prev = json.load(f)
        done = {r["row"]: r for r in prev.get("rows", [])}
        sessions = prev.get("meta", {}).get("sessions", [])
        bw = prev["meta"]["bandwidth"]  # one floor for the whole run
    else:
        bw = copy_bandwidth()
    sessions.append({"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows_before": len(done),
                     "bandwidth_measured": copy_bandwidth() if done else bw})
    idx = [i for i in idx if i not in done]
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60e6)
    it = idx
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            it = bar = tqdm(idx, desc="normc bench", unit="row")
        except ImportError:
            pass
    results = list(done.values())

    def snapshot():
        res = {"meta": meta, "rows": sorted(results, key=lambda r: r["row"])}
        res["summary"] = summarize(res["rows"])
        return res

    meta = {"device": torch.cuda.get_device_name(0), "bandwidth": bw, "normc": normc.__version__,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "python": platform.python_version(), "table": table or "bundled anchors", "sessions": sessions}
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    for i in it:
        r = bench_row(i, tab[i], bw, systems, l2)
        results.append(r)
        if path:  # after every row, so an interrupted run can be resumed
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(snapshot(), f, indent=1)
            os.replace(tmp, path)
        if progress and bar is None:
            n = r["systems"].get("normc", {}).get("us")
            print(f"row {i}: {r['family']} {r['shape']} {r['memory_order']}: normc {n and round(n, 1)} µs", flush=True)
    result = snapshot()
    if out_dir:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(out_dir, "bench.md"), "w") as f:
            f.write(markdown(result))
        chart(result, os.path.join(out_dir, "bench.png"))
    return result
