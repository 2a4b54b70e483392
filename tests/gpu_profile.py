"""Per-kernel device times of normc's plans for chosen anchor rows (torch profiler / CUPTI), on a GPU.

For rows whose time is far from the floor this says which kernel of a multi-kernel (split) plan costs what,
next to the bytes it must move, so planner changes are made on measurements:

    python tests/gpu_profile.py --rows 5,11,21 [--schedule split] [--reps 20]
"""

from __future__ import annotations

import argparse


def profile_row(i, schedule=None, reps=20):
    import torch
    from torch.profiler import ProfilerActivity, profile

    import normc
    from normc.bench import load_table, make_inputs

    row = load_table()[i]
    spec, xs, sc, sh = make_inputs(row, copies=1, seed=i)
    x = xs[0]
    f = normc.compile(spec, schedule=schedule)
    f(x, sc, sh)
    torch.cuda.synchronize()
    plan = next(iter(f._table.values())).plan
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            f(x, sc, sh)
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        if ev.device_type.name != "CUDA" or ev.count < reps:
            continue
        t = getattr(ev, "device_time", None) or getattr(ev, "cuda_time", 0)
        rows.append((ev.key, t, ev.count))
    nbytes = x.numel() * x.element_size()
    head = (f"{i:3d} {row['family']} {row['shape']} {row['dtype']} {row['memory_order']}: "
            f"{plan.strategy}/{plan.schedule} C={plan.cluster} splits={plan.splits} grid={plan.grid} "
            f"threads={plan.threads} vec={plan.vec}; x = {nbytes / 1e6:.1f} MB")
    lines = [head]
    total = 0.0
    for key, t, n in sorted(rows, key=lambda r: -r[1]):
        name = key.split("normc_")[-1].split("B")[0] if "normc_" in key else key[:40]
        lines.append(f"      {name:24s} {t:9.1f} us/call")
        total += t
    lines.append(f"      {'total':24s} {total:9.1f} us/call")
    del x, xs
    torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--schedule", default=None)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    for i in (int(t) for t in a.rows.split(",")):
        try:
            print(profile_row(i, a.schedule, a.reps), flush=True)
        except Exception as e:  # keep going: one row's failure must not hide the others
            print(f"{i:3d} ERROR {type(e).__name__}: {e}"[:300], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
