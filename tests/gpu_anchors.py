"""Run every anchor workload through ``normc.compile`` on torch CUDA tensors in its memory order.

For each row of ``normc/data/anchors.json``: build x in the row's memory order, run normc (y, mean, rstd),
compare with a float64 torch reference (max |err| / max |ref|), and time the call with CUDA events
(``triton.testing.do_bench``, median) next to the floor (bytes read + written over the copy bandwidth
measured in the same run). Prints a table; with ``--json FILE`` writes the rows.

    python tests/gpu_anchors.py [--rows 0,5,9] [--json out.json]

Used by tests/test_gpu.py (``pytest -m gpu``) for the correctness part.
"""

from __future__ import annotations

import argparse
import json
import time

TOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}


def anchors():
    """Rows of the bundled anchor table (normc.bench.load_table)."""
    from normc.bench import load_table

    return load_table()


def make_inputs(row, seed=0):
    """Spec, x (in the row's memory order), scale, shift: normc.bench.make_inputs with one copy of x."""
    from normc.bench import make_inputs as bench_inputs

    s, xs, sc, sh = bench_inputs(row, copies=1, seed=seed)
    return s, xs[0], sc, sh


def reference(s, x, sc, sh):
    """float64 reference on the GPU for any spec: expand split dims, reduce, normalize, affine."""
    import torch

    sizes = s.axis_sizes(tuple(x.shape))
    xe = x.double().reshape([sizes[a] for a in s.axes])
    red = [s.axes.index(a) for a in s.reduced]
    if s.stat == "norm":
        mean = xe.mean(dim=red, keepdim=True)
        var = ((xe - mean) ** 2).mean(dim=red, keepdim=True)
        rstd = torch.rsqrt(var + s.eps)
        y = (xe - mean) * rstd
    else:
        mean = torch.zeros((), dtype=torch.float64, device=x.device)
        rstd = torch.rsqrt((xe * xe).mean(dim=red, keepdim=True) + s.eps)
        y = xe * rstd
    for p, axes, op in ((sc, s.scale, "mul"), (sh, s.shift, "add")):
        if p is None:
            continue
        shp = [sizes[a] if a in axes else 1 for a in s.axes]
        pv = p.double().reshape(shp)
        y = y * pv if op == "mul" else y + pv
    return y.reshape(x.shape), mean, rstd


def run_row(i, row, bw, timing=True):
    import torch

    import normc

    s, x, sc, sh = make_inputs(row, seed=i)
    f = normc.compile(s)
    t0 = time.perf_counter()
    y, mean, rstd = f(x, sc, sh, return_stats=True)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    yr, mr, rr = reference(s, x, sc, sh)
    err = ((y.double() - yr).abs().max() / yr.abs().max()).item()
    if s.stat == "norm":
        merr = ((mean.double().reshape(-1) - mr.reshape(-1)).abs().max() / mr.abs().max().clamp_min(1)).item()
    else:
        merr = 0.0
    rerr = ((rstd.double().reshape(-1) - rr.reshape(-1)).abs().max() / rr.abs().max()).item()
    same_order = y.stride() == x.stride() or y.is_contiguous(memory_format=torch.channels_last) == x.is_contiguous(
        memory_format=torch.channels_last) if x.dim() == 4 else True
    plan = next(iter(f._table.values())).plan
    del yr, mr, rr
    res = {
        "row": i, "family": row["family"], "shape": row["shape"], "dtype": row["dtype"],
        "memory_order": row["memory_order"], "strategy": plan.strategy, "schedule": plan.schedule,
        "vec": plan.vec, "splits": plan.splits, "cluster": plan.cluster, "err": err, "mean_err": merr, "rstd_err": rerr,
        "ok": err <= TOL[row["dtype"]] and merr <= 1e-4 and rerr <= 1e-3 and bool(same_order),
        "first_call_s": first,
    }
    if timing:
        from triton.testing import do_bench

        nbytes = x.numel() * x.element_size() * 2
        ms = do_bench(lambda: f(x, sc, sh), warmup=25, rep=100, return_mode="median")
        # host overhead of one eager call (output allocated by normc), no sync
        torch.cuda.synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            f(x, sc, sh)
        host = (time.perf_counter() - t0) / n
        torch.cuda.synchronize()
        res.update({"us": ms * 1e3, "floor_us": nbytes / bw * 1e6, "frac_floor": nbytes / bw / (ms * 1e-3),
                    "host_us": host * 1e6})
    x = y = None  # free them before empty_cache
    torch.cuda.empty_cache()
    return res


def compare_schedules(i, row):
    """Time each schedule the planner can be forced into for one row (for tuning the planner)."""
    import torch
    from triton.testing import do_bench

    import normc

    s, x, sc, sh = make_inputs(row, seed=i)
    yr = None
    out = []
    for sched in (None, "looped", "split", "cluster"):
        f = normc.compile(s, schedule=sched)
        y = f(x, sc, sh)
        if yr is None:
            yr = y.double()
        err = ((y.double() - yr).abs().max() / yr.abs().max().clamp_min(1e-30)).item()
        plan = next(iter(f._table.values())).plan
        ms = do_bench(lambda: f(x, sc, sh), warmup=25, rep=100, return_mode="median")
        out.append(f"{sched or 'default'}={plan.schedule}(s={plan.splits},C={plan.cluster}) {ms * 1e3:.1f}us d={err:.0e}")
    torch.cuda.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=None, help="comma-separated row indices (default: all)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--schedules", default=None, help="comma-separated rows: time every schedule, then exit")
    a = ap.parse_args(argv)
    rows = anchors()
    if a.schedules:
        for i in (int(t) for t in a.schedules.split(",")):
            r = rows[i]
            print(f"{i:3d} {r['family']:8s} {str(r['shape']):24s} {r['dtype']:8s} {r['memory_order']:10s} "
                  + " | ".join(compare_schedules(i, r)), flush=True)
        return 0
    idx = [int(t) for t in a.rows.split(",")] if a.rows else range(len(rows))
    from normc.bench import copy_bandwidth

    bw = copy_bandwidth()
    print(f"copy bandwidth: {bw / 1e12:.2f} TB/s (read + write)")
    out = []
    for i in idx:
        try:
            r = run_row(i, rows[i], bw, timing=not a.no_timing)
        except Exception as e:  # report and go on: one broken row must not hide the others
            r = {"row": i, "family": rows[i]["family"], "shape": rows[i]["shape"], "dtype": rows[i]["dtype"],
                 "memory_order": rows[i]["memory_order"], "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
        out.append(r)
        if "error" in r:
            print(f"{i:3d} {r['family']:8s} {str(r['shape']):24s} {r['dtype']:8s} {r['memory_order']:10s} ERROR {r['error']}",
                  flush=True)
            continue
        t = f" {r['us']:9.1f}us floor {r['floor_us']:7.1f} ({r['frac_floor']:.2f}) host {r['host_us']:5.1f}us" if "us" in r else ""
        print(f"{i:3d} {r['family']:8s} {str(r['shape']):24s} {r['dtype']:8s} {r['memory_order']:10s} "
              f"{r['strategy']:6s} {r['schedule']:10s} C={r['cluster']:<2d} err {r['err']:.1e} mean {r['mean_err']:.1e} rstd {r['rstd_err']:.1e} "
              f"{'ok' if r['ok'] else 'FAIL'} first {r['first_call_s']:.2f}s{t}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bandwidth": bw, "rows": out}, f, indent=1)
    bad = [r["row"] for r in out if not r["ok"]]
    print(f"{len(out) - len(bad)}/{len(out)} rows ok" + (f"; failing: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
