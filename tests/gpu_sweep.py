"""Time anchor rows under variants of the planner's constants, side by side, in one run (on a GPU).

    python tests/gpu_sweep.py --rows 5,13 --set SPLIT_CTAS_PER_SM=2,4,8 --set LOOP_UNROLL=4,8 [--jobs 12]
                              [--schedule split] [--profile]

Every combination of the --set values is planned and compiled first in parallel worker processes (compiling
is CPU-bound: the disk cache then holds every kernel), then timed one after another in this process
(CUDA-graph replay over the row's inputs; --profile adds each kernel's time from the torch profiler). Each
variant's output is checked against the default plan's. This is how the planner's constants are chosen:
on measurements of the variants, not on guesses.
"""

from __future__ import annotations

import argparse
import itertools
import os


_ORIGINAL = None  # the planner's constants as imported (pool workers are reused across variants)


def apply(variant):
    """Set the planner constants of ``variant`` on top of the planner's original values."""
    global _ORIGINAL
    from normc import planner

    if _ORIGINAL is None:
        _ORIGINAL = {k: getattr(planner, k) for k in dir(planner) if k.isupper()}
    for k, v in {**_ORIGINAL, **variant}.items():
        setattr(planner, k, v)


def warm(task):
    """Worker: plan and compile one (row, variant) and run it once; returns the plan's one-line summary."""
    i, variant, schedule = task
    try:
        apply(variant)
        import torch

        import normc
        from normc.bench import load_table, make_inputs

        spec, xs, sc, sh = make_inputs(load_table()[i], copies=1, seed=i)
        f = normc.compile(spec, schedule=schedule)
        f(xs[0], sc, sh)
        torch.cuda.synchronize()
        plan = next(iter(f._table.values())).plan
        return f"{plan.strategy}/{plan.schedule} C={plan.cluster} vec={plan.vec} splits={plan.splits} " \
               f"grid={plan.grid} threads={plan.threads} per={plan.per_thread}"
    except Exception as e:  # reported in the table
        return f"ERROR {type(e).__name__}: {e}"[:200]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--set", action="append", default=[], help="NAME=v1,v2,... (a normc.planner constant)")
    ap.add_argument("--schedule", default=None)
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    rows = [int(r) for r in a.rows.split(",")]
    names, values = [], []
    for s in a.set:
        k, vs = s.split("=")
        names.append(k)
        values.append([int(v) if v.lstrip("-").isdigit() else float(v) for v in vs.split(",")])
    variants = [dict(zip(names, combo)) for combo in itertools.product(*values)] or [{}]
    from normc import planner

    default = {k: getattr(planner, k) for k in names}
    tasks = [(i, v, a.schedule) for i in rows for v in [{}] + variants]
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(a.jobs) as pool:
        plans = dict(zip([(t[0], tuple(t[1].items())) for t in tasks], pool.map(warm, tasks)))

    import torch
    import triton.testing as tt

    import normc
    from normc.bench import copy_bandwidth, load_table, make_inputs

    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; defaults {default}")
    for i in rows:
        row = load_table()[i]
        spec, xs, sc, sh = make_inputs(row, copies=1, seed=i)
        x = xs[0]
        fl = 2 * x.numel() * x.element_size() / bw * 1e6  # x read once + y written once
        ref = None
        print(f"row {i}: {row['family']} {row['shape']} {row['dtype']} {row['memory_order']}  floor {fl:.1f} us")
        for v in [{}] + variants:
            apply(default)
            apply(v)
            f = normc.compile(spec, schedule=a.schedule)
            try:
                y = f(x, sc, sh)
                torch.cuda.synchronize()
                if ref is None:
                    ref = y.float()
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                us = tt.do_bench_cudagraph(lambda: f(x, sc, sh)) * 1e3
                line = f"  {str(v or 'default'):40s} {us:8.1f} us  {fl / us:5.2f} floor  err {err:.1e}  " \
                       f"{plans[(i, tuple(v.items()))]}"
                if a.profile:
                    from torch.profiler import ProfilerActivity, profile

                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(10):
                            f(x, sc, sh)
                        torch.cuda.synchronize()
                    ks = {}
                    for e in prof.events():
                        if e.device_type.name == "CUDA":
                            nm = e.name.split("normc_")[-1].split("B")[0] if "normc_" in e.name else e.name[:20]
                            ks[nm] = ks.get(nm, 0.0) + getattr(e, "device_time_total", 0.0) / 10
                    line += "  [" + ", ".join(f"{k} {t:.1f}" for k, t in ks.items()) + "]"
                print(line, flush=True)
            except Exception as e:
                print(f"  {str(v):40s} ERROR {type(e).__name__}: {e}"[:300], flush=True)
        apply(default)


if __name__ == "__main__":
    main()
