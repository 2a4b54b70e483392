"""A/B of backward-planner constants on the GPU, side by side in one process (not a pytest file).

    python tests/gpu_backward_ab.py --rows 36-39,43,44 --configs "default;COLS=0" [--kernels] [--out DIR]

Each config is ``default`` or comma-separated ``NAME=INT`` assignments to module-level constants of
``normc.backward_plan`` (booleans as 1/0), or ``lowering.NAME=INT`` to those of ``normc.lowering.backward``
or ``codegen.NAME=INT`` to those of ``normc.lowering.codegen`` (kernel-source constants: they also go into
the kernel cache's key), applied on top of the defaults.
For each anchor row and each config, plans and times normc's backward (``normc.bench.bench_backward_row``, normc
only: CUDA-graph replay, rotating inputs) and checks that every config gives the same dx, dscale and dshift as
the first (largest error relative to the gradient's largest magnitude, against the dtype's gradient tolerance);
``--kernels`` adds each kernel's GPU time (torch.profiler, 20 calls). Prints one line per row and config and
writes ``ab.json`` to DIR ($OUT by default). Exits non-zero when a config disagrees or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def kernel_times(torch, call, n=20) -> dict:
    """GPU microseconds per call of each kernel ``call`` launches (torch.profiler over ``n`` calls), by the
    normc kernel name inside the mangled entry."""
    import re

    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            m = re.search(r"normc_[a-z_]+", e.name)
            key = m.group(0) if m else e.name[:40]
            out[key] = out.get(key, 0.0) + getattr(e, "device_time_total", 0.0) / n
    return {k: round(v, 1) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--configs", required=True, help='e.g. "default;COLS=0;COLS_CTAS_PER_SM=4,COLS_MAX_UNROLL=1"')
    ap.add_argument("--kernels", action="store_true", help="also time each kernel (torch.profiler)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args(argv)

    import torch

    import normc
    import normc.backward_plan as bpm
    from normc import runtime
    from normc.lowering import backward as lbm
    from normc.lowering import codegen as cgm

    def _mod(n):
        """(module, attribute) of a --configs name: lowering.NAME in normc.lowering.backward, codegen.NAME in
        normc.lowering.codegen, else backward_plan."""
        for prefix, mod in (("lowering.", lbm), ("codegen.", cgm)):
            if n.startswith(prefix):
                return mod, n[len(prefix):]
        return bpm, n

    lowered = set()  # kernel-source constants set by some config (their --configs names): in the cache's key
    versions = runtime.versions
    runtime.versions = lambda: {**versions(), "ab": sorted((n, getattr(*_mod(n))) for n in lowered)}
    from normc.bench import (GRAD_TOL, bench_backward_row, copy_bandwidth, load_table, make_grads, make_inputs,
                             parse_rows)

    configs = []
    for text in a.configs.split(";"):
        cfg = {}
        for part in ([] if text.strip() == "default" else text.split(",")):
            name, _, v = part.strip().partition("=")
            mod, attr = _mod(name)
            if not hasattr(mod, attr) or not v.lstrip("-").isdigit():
                ap.error(f"--configs: {part!r} is not NAME=INT for a constant of normc.backward_plan "
                         "(or lowering.NAME for normc.lowering.backward, codegen.NAME for normc.lowering.codegen)")
            if mod is not bpm:
                lowered.add(name)
            cfg[name] = (v == "1") if isinstance(getattr(mod, attr), bool) else int(v)
        configs.append((text.strip(), cfg))
    orig = {n: getattr(*_mod(n)) for _, c in configs for n in c}
    tab = load_table()
    rows = parse_rows(a.rows, len(tab))
    props = torch.cuda.get_device_properties(0)
    l2, sms = getattr(props, "L2_cache_size", 60e6), props.multi_processor_count
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s; configs {[t for t, _ in configs]}", flush=True)
    results, bad = [], 0
    for i in rows:
        row = tab[i]
        spec, xs, sc, sh = make_inputs(row, copies=1, seed=i)
        dy = make_grads(row, copies=1, seed=i)[0]
        first = None
        for text, cfg in configs:
            for n, v in orig.items():
                setattr(*_mod(n), cfg.get(n, v))
            try:
                f = normc.compile(spec)
                _, m, r = f(xs[0], sc, sh, return_stats=True)
                got = [g for g in f.backward(dy, xs[0], m, r, sc)]
                torch.cuda.synchronize()
                err = 0.0
                if first is None:
                    first = got
                else:
                    for p, q in zip(got, first):
                        if p is not None:
                            d = (p.float() - q.float()).abs().max().item()
                            err = max(err, d / (q.float().abs().max().item() or 1.0))
                ok = err <= GRAD_TOL[row["dtype"]]
                bad += not ok
                res = bench_backward_row(i, row, bw, ("normc",), l2, sms)
                ent = res["systems"]["normc"]
                line = {"row": i, "shape": row["shape"], "dtype": row["dtype"], "config": text,
                        "bwd_plan": res.get("bwd_plan"), "kernels": res.get("bwd_kernels"),
                        "passes": res.get("passes"), "bwd_us": ent.get("bwd_us"), "fb_us": ent.get("fb_us"),
                        "floor_us": res["floor_us"], "err_vs_first": err, "ok": ok, "error": ent.get("error")}
                if a.kernels:
                    line["kernel_us"] = kernel_times(torch, lambda: f.backward(dy, xs[0], m, r, sc))
            except Exception as e:  # a failing value is reported, the others still run
                bad += 1
                line = {"row": i, "config": text, "error": f"{type(e).__name__}: {e}"}
            results.append(line)
            print(json.dumps(line), flush=True)
        xs = dy = first = None  # free them before empty_cache
        torch.cuda.empty_cache()
    for n, v in orig.items():
        setattr(*_mod(n), v)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ab.json"), "w") as fh:
        json.dump({"configs": [t for t, _ in configs], "bw": bw, "rows": results}, fh, indent=1)
    print(f"{bad} disagreement(s) or failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
