"""Why `normc bench`'s host-overhead column can read higher than a normc-only run (run on a GPU machine).

    python tests/gpu_host_state.py [--rows 0,45,17]

On the H200 (2026-12-06) the full bench reported a median host overhead of 11.0 us, and a `--systems normc` run
of the same table on the same machine 8.1 us, with the compile workers running in both. This script measures,
row by row, one eager call's host time (:func:`normc.bench.host_overhead_us`, as the bench column) of normc and
of the row's torch eager op in these process states, in order:

1. fresh: only normc's and torch eager's calls have run;
2. after the peers: :func:`normc.bench.bench_row` has timed every system on each row (torch.compile, Liger);
3. the same with ``gc.freeze()`` (objects alive so far moved out of the collector's generations);
4. the same with the collector disabled.

Each line also gives the collections per generation that ran during its measurements (``gc.callbacks``), the
objects the collector tracks, the 1-minute load average and torch's modes left active (torch-function and
dispatch mode stacks, grad mode, default device), so a difference can be told apart as the collector's, the
CPU's or torch's.
"""

import argparse
import gc
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="0,45,17", help="anchor rows (comma-separated indices)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]

    import torch

    import normc
    from normc import bench

    tab = bench.load_table()
    calls = {}
    for i in rows:
        spec, xs, sc, sh = bench.make_inputs(tab[i], copies=1, seed=i)
        f = normc.compile(spec)
        op = bench.torch_op(tab[i], spec)
        x = xs[0]
        calls[i] = {"normc": (lambda f, x, sc, sh: lambda: f(x, sc, sh))(f, x, sc, sh)}
        if op is not None:
            calls[i]["eager"] = (lambda op, x, sc, sh: lambda: op(x, sc, sh))(op, x, sc, sh)
    torch.cuda.synchronize()

    def measure(state):
        for i in rows:
            counts = [0, 0, 0]

            def cb(phase, info, counts=counts):
                if phase == "start":
                    counts[info["generation"]] += 1

            gc.callbacks.append(cb)
            try:
                us = {name: bench.host_overhead_us(fn) for name, fn in calls[i].items()}
            finally:
                gc.callbacks.remove(cb)
            cells = "  ".join(f"{name} {v:6.2f} us" for name, v in us.items())
            print(f"{state:22s} row {i:2d}: {cells}  gc runs (gen 0/1/2) {counts}  tracked "
                  f"{len(gc.get_objects())}  load {os.getloadavg()[0]:.1f}  {torch_state()}", flush=True)

    def torch_state():
        """What torch itself may add to every call: torch-function and dispatch modes left active (each torch
        call then goes through Python), grad mode, the default device (torch.set_default_device is a mode)."""
        fmodes = torch._C._len_torch_function_stack() if hasattr(torch._C, "_len_torch_function_stack") else "?"
        dmodes = torch._C._len_torch_dispatch_stack() if hasattr(torch._C, "_len_torch_dispatch_stack") else "?"
        dev = torch.get_default_device() if hasattr(torch, "get_default_device") else "?"
        return f"function modes {fmodes}  dispatch modes {dmodes}  grad {torch.is_grad_enabled()}  default {dev}"

    measure("1 fresh")
    for i in rows:
        r = bench.bench_row(i, tab[i], 4.27e12)
        t = {k: round(v.get("us", float("nan")), 1) for k, v in r["systems"].items()}
        print(f"bench_row {i}: host_us {r['host_us']:.2f}  kernel us {t}", flush=True)
    measure("2 after the peers")
    gc.freeze()
    measure("3 gc.freeze()")
    gc.unfreeze()
    gc.disable()
    measure("4 gc disabled")
    gc.enable()


if __name__ == "__main__":
    main()
