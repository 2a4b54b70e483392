"""Hardware counters of normc's kernels on anchor rows, through Nsight Compute (on a GPU with ncu).

    python tests/gpu_ncu.py --rows 1,42,51 [--case CACHE_HINTS=0] [--out DIR]

Compiles each row's kernels (the default plan, or under the planner constants of ``--case``), then runs
``ncu --clock-control none`` over one launch of each (the row's input is already in memory; the kernels of
one call are profiled in order) and prints, per kernel: time (µs), DRAM MB read and written (the row's x
size is printed after), DRAM throughput and L2 hit rate (% of peak), achieved occupancy (% of the SM's
warps), registers per thread, millions of warp instructions issued and the schedulers' issue-slot use (% of
cycles an instruction issued: near 100 means instruction-bound); the raw CSV goes to ``--out``. These say
why a row misses its floor: more bytes than counted, too few warps, or too many instructions per byte.
ncu flushes the caches before each kernel (its default cache control), so L2 reuse *between* a split's
kernels does not show in the DRAM bytes.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import subprocess
import sys

METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "smsp__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
]


def child(rows, case):
    """Run once per row (under ncu): compile and warm outside the profiled range, then one profiled call."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_sweep import _compiled, _value

    from normc.bench import load_table, make_inputs

    variant = {k: _value(v) for k, v in (kv.split("=") for kv in case.split(","))} if case else {}
    for i in rows:
        f = _compiled(i, variant, None)
        _, xs, sc, sh = make_inputs(load_table()[i], copies=1, seed=i)
        torch.cuda.cudart().cudaProfilerStop()
        f(xs[0], sc, sh)
        f(xs[0], sc, sh)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        f(xs[0], sc, sh)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"ROW {i} done", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--case", default="")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args(argv)
    rows = [int(r) for r in a.rows.split(",")]
    if a.child:
        return child(rows, a.case)
    cmd = ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--csv", "--print-units", "base",
           "--metrics", ",".join(METRICS),
           sys.executable, os.path.abspath(__file__), "--child", "--rows", a.rows] + (["--case", a.case] if a.case else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    tag = a.case.replace("=", "").replace(",", "_") or "default"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"ncu-{tag}.csv"), "w") as fh:
        fh.write(res.stdout)
    if res.returncode:
        print(res.stderr[-3000:])
    from normc.bench import ITEMSIZE, load_table

    lines = [ln for ln in res.stdout.splitlines() if ln.startswith('"')]
    kern, order = {}, []
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        k = (r["ID"], r["Kernel Name"])
        if k not in kern:
            kern[k] = {}
            order.append(k)
        try:
            kern[k][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            pass
    print(f"{'kernel':24s} {'us':>7s} {'read MB':>8s} {'write MB':>8s} {'dram%':>6s} {'L2hit%':>6s} {'occ%':>5s} "
          f"{'regs':>4s} {'Minst':>7s} {'issue%':>6s}")
    for k in order:
        m = kern[k]
        name = k[1].split("normc_")[-1][:24] if "normc_" in k[1] else k[1][:24]
        v = [m.get(n, float("nan")) for n in METRICS]
        print(f"{name:24s} {v[0] / 1e3:7.1f} {v[1] / 1e6:8.1f} {v[2] / 1e6:8.1f} {v[3]:6.1f} {v[4]:6.1f} {v[5]:5.1f} "
              f"{v[6]:4.0f} {v[7] / 1e6:7.2f} {v[8]:6.1f}")
    for i in rows:
        row = load_table()[i]
        print(f"row {i}: x {math.prod(row['shape']) * ITEMSIZE[row['dtype']] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
