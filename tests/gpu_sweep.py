"""Time anchor rows under variants of the planner's constants, side by side, in one run (on a GPU).

    python tests/gpu_sweep.py --rows 5,13 --set SPLIT_CTAS_PER_SM=2,4,8 --set LOOP_UNROLL=4,8 [--jobs 12]
    python tests/gpu_sweep.py --rows 3,13 --case CACHE_HINTS=0 --case CACHE_HINTS=2 --case schedule=looped
                              [--schedule split] [--profile] [--json FILE]

A variant is a set of ``normc.planner`` constants (and optionally ``schedule=NAME``, a forced schedule).
``--set`` gives every combination of its values; each ``--case`` (comma-separated NAME=VALUE pairs) adds one
variant. Every (row, variant) is planned and compiled first in parallel worker processes (compiling is
CPU-bound: the disk cache then holds every kernel), then timed one after another in this process: CUDA-graph
replay rotating over enough input copies that one pass is 3x the L2 (as ``normc bench`` times), so rows that
fit in L2 are not timed from it. ``--profile`` adds each kernel's time from the torch profiler. Each variant's
output is checked against the default plan's. This is how the planner's constants are chosen: on
measurements of the variants, not on guesses.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

_ORIGINAL = None  # the planner's constants as imported (pool workers are reused across variants)


def apply(variant):
    """Set the constants of ``variant`` (its ``schedule`` key aside) on top of the original values: ``NAME`` is a
    ``normc.planner`` constant, ``codegen.NAME`` one of ``normc.lowering.codegen``. Codegen constants change
    the kernels of an unchanged plan, so they also go into the kernel cache's key (``runtime.versions``):
    each variant compiles and caches its own kernels."""
    global _ORIGINAL
    from normc import planner, runtime
    from normc.lowering import codegen

    if _ORIGINAL is None:
        _ORIGINAL = {k: getattr(planner, k) for k in dir(planner) if k.isupper()}
        _ORIGINAL.update({"codegen." + k: getattr(codegen, k) for k in dir(codegen) if k.isupper()})
        versions = runtime.versions
        runtime.versions = lambda: {**versions(), "sweep": runtime._sweep_codegen}
    runtime._sweep_codegen = sorted((k, v) for k, v in variant.items() if k.startswith("codegen."))
    for k, v in {**_ORIGINAL, **variant}.items():
        if k.startswith("codegen."):
            setattr(codegen, k[len("codegen."):], v)
        elif k != "schedule":
            setattr(planner, k, v)


def _table_path():
    """The ``--table`` file (passed to the worker processes through the environment), else None: the anchors."""
    return os.environ.get("NORMC_SWEEP_TABLE") or None


def _compiled(i, variant, schedule):
    import normc
    from normc.bench import load_table, row_spec

    apply(variant)
    return normc.compile(row_spec(load_table(_table_path())[i]), schedule=variant.get("schedule", schedule))


def warm(task):
    """Worker: plan and compile one (row, variant) and run it once; returns the plan's one-line summary."""
    i, variant, schedule = task
    try:
        import torch

        from normc.bench import load_table, make_inputs

        f = _compiled(i, variant, schedule)
        _, xs, sc, sh = make_inputs(load_table(_table_path())[i], copies=1, seed=i)
        f(xs[0], sc, sh)
        torch.cuda.synchronize()
        plan = next(iter(f._table.values())).plan
        return (f"{plan.strategy}/{plan.schedule} C={plan.cluster} vec={plan.vec} splits={plan.splits} "
                f"grid={plan.grid} threads={plan.threads} per={plan.per_thread} hints={plan.cache_hints}")
    except Exception as e:  # reported in the table
        return f"ERROR {type(e).__name__}: {e}"[:200]


def _value(v):
    """A constant's value from the command line: an int, else a float, else the text (a schedule name)."""
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def parse_variants(sets, cases):
    """Variants (dicts of planner constants, ``schedule`` included) from ``--set NAME=v1,v2`` texts (every
    combination of their values) and ``--case NAME=v,NAME=v`` texts (one variant each), in that order."""
    names, values = [], []
    for s in sets:
        k, vs = s.split("=")
        names.append(k)
        values.append([_value(v) for v in vs.split(",")])
    variants = [dict(zip(names, combo)) for combo in itertools.product(*values)] if names else []
    for c in cases:
        variants.append({k: _value(v) for k, v in (kv.split("=") for kv in c.split(","))})
    return variants


def _best_peer(i):
    """The best peer time of row ``i`` in docs/perf/bench.json (the last full bench run), or None."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "perf", "bench.json")
    try:
        rows = {r["row"]: r for r in json.load(open(path))["rows"]}
        t = [s["us"] for k, s in rows[i]["systems"].items() if k != "normc" and "us" in s]
        return min(t) if t else None
    except (OSError, KeyError, ValueError):
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--table", default=None, help="JSON table of the anchors.json form (default: the anchors)")
    ap.add_argument("--set", action="append", default=[], help="NAME=v1,v2,... (a normc.planner constant)")
    ap.add_argument("--case", action="append", default=[], help="NAME=v,NAME=v,... (one variant)")
    ap.add_argument("--schedule", default=None)
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=None, help="write every timing here")
    a = ap.parse_args(argv)
    if a.table:
        os.environ["NORMC_SWEEP_TABLE"] = os.path.abspath(a.table)
    rows = [int(r) for r in a.rows.split(",")]
    variants = [{}] + parse_variants(a.set, a.case)
    tasks = [(i, v, a.schedule) for i in rows for v in variants]
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(a.jobs) as pool:
        plans = dict(zip([(t[0], tuple(t[1].items())) for t in tasks], pool.map(warm, tasks)))

    import math

    import torch

    from normc.bench import ITEMSIZE, copy_bandwidth, load_table, make_inputs, rotations, time_call

    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    results = []
    for i in rows:
        row = load_table(_table_path())[i]
        nbytes = math.prod(row["shape"]) * ITEMSIZE[row["dtype"]]
        rot = rotations(nbytes, 60e6)
        spec, xs, sc, sh = make_inputs(row, copies=rot, seed=i)
        fl = 2 * nbytes / bw * 1e6  # x read once + y written once
        peer = None if a.table else _best_peer(i)
        ref = None
        print(f"row {i}: {row['family']} {row['shape']} {row['dtype']} {row['memory_order']}  floor {fl:.1f} us"
              + (f"  best peer {peer:.1f} us" if peer else ""), flush=True)
        for v in variants:
            try:
                f = _compiled(i, v, a.schedule)
                y = f(xs[0], sc, sh)
                torch.cuda.synchronize()
                if ref is None:
                    ref = y.float()
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                us, _ = time_call(lambda k: f(xs[k], sc, sh), rot)
                line = (f"  {str(v or 'default'):44s} {us:8.1f} us  {fl / us:5.2f} floor  "
                        + (f"{peer / us:5.2f}x peer  " if peer else "") + f"err {err:.1e}  "
                        f"{plans[(i, tuple(v.items()))]}")
                rec = {"row": i, "variant": v, "us": us, "floor_us": fl, "err": err,
                       "plan": plans[(i, tuple(v.items()))], "peer_us": peer}
                if a.profile:
                    from torch.profiler import ProfilerActivity, profile

                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for k in range(10):
                            f(xs[k % rot], sc, sh)
                        torch.cuda.synchronize()
                    ks = {}
                    for e in prof.events():
                        if e.device_type.name == "CUDA":
                            nm = e.name.split("normc_")[-1].split("B")[0] if "normc_" in e.name else e.name[:20]
                            ks[nm] = ks.get(nm, 0.0) + getattr(e, "device_time_total", 0.0) / 10
                    line += "  [" + ", ".join(f"{k} {t:.1f}" for k, t in ks.items()) + "]"
                    rec["kernels_us"] = ks
                results.append(rec)
                print(line, flush=True)
            except Exception as e:
                print(f"  {str(v):44s} ERROR {type(e).__name__}: {e}"[:300], flush=True)
        apply({})
        xs = sc = sh = ref = None  # free this row's inputs before the next row's
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"bandwidth": bw, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
