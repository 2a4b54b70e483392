"""compute-sanitizer over one small case of every strategy x schedule (issue 5, part 2).

    python tests/gpu_sanitize.py [--tools memcheck,racecheck] [--out DIR] [--sanitizer PATH] [--only NAME,...]

Runs this file's cases (``--run-cases``: inner/outer/mixed x persistent/looped/split, thread-block clusters,
odd extents, views offset by one element, float32 and half precision, with mean/rstd, then the backward
kernels of each case; ``--only``: the cases whose names contain one of the given parts) once under each
tool, watching only normc's kernels, writes each tool's log and a summary (DIR/sanitize-summary.txt; DIR
defaults to $OUT or ./sanitize-out), and exits non-zero if the sanitizer is missing, reports any error, or a
case fails or gives a wrong result.

torch's caching allocator is switched off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) so that every tensor is its
own allocation, exactly sized: an access one element past x, y, scale, shift, mean, rstd or the split
workspace lands outside any allocation and memcheck reports it.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

# (name, spec text, spec sizes, shape, memory order (dims outermost-first) or None, dtype, schedule)
CASES = [
    ("inner-persistent", "t d : norm over d ; scale d ; shift d", {}, (37, 1003), None, "float32", None),
    # odd rows held in registers: peeled (PEEL_PERSISTENT_MIN_VECTORS), the edges by one thread of each row
    ("inner-persistent-peeled-f16", "t d : norm over d ; scale d ; shift d", {}, (5, 1031), None, "float16", None),
    ("inner-persistent-rms-bf16", "t d : rms over d ; scale d", {}, (33, 520), None, "bfloat16", None),
    # short rows through shared memory; 1037 x 10 is not whole 16-byte vectors (a ragged last vector)
    ("inner-staged", "t d : norm over d ; scale d ; shift d", {}, (1037, 10), None, "float32", None),
    ("inner-staged-rms-f16", "t d : rms over d ; scale d", {}, (333, 5), None, "float16", None),
    ("inner-looped", "t d : norm over d ; scale d ; shift d", {}, (5, 20011), None, "float16", "looped"),
    ("inner-split", "t d : norm over d ; scale d ; shift d", {}, (3, 30001), None, "float32", "split"),
    # per-row parameters: the row-wise second kernel (layer norm above takes the column-major one)
    ("inner-split-instance", "n c h w : norm over h w ; scale c ; shift c", {}, (2, 3, 97, 101), None,
     "float16", "split"),
    # flat normalize kernel (planner constants for this case): partials, a middle kernel merging each row's
    # partials, then several normalize CTAs per split reading the row's mean and factor; odd rows (peeled)
    ("inner-split-flat", "n c h w : norm over h w ; scale c ; shift c", {}, (2, 3, 97, 101), None, "float32",
     "split", {"INNER_FLAT_MIN_TRIPS": 0, "INNER_FINISH_TRIPS": 0.1}),
    ("inner-split-flat-bf16", "n c l : rms over l ; scale c", {}, (2, 2, 40000), None, "bfloat16", "split",
     {"INNER_FLAT_MIN_TRIPS": 0, "INNER_FINISH_TRIPS": 0.1}),
    # cooperative grid: CTAs spin on per-row arrival counters
    ("inner-coop", "t d : norm over d ; scale d ; shift d", {}, (3, 30001), None, "float32", "coop"),
    ("inner-coop-bf16", "t d : rms over d ; scale d", {}, (5, 40000), None, "bfloat16", "coop"),
    # one row in flight (planner constants for this case): 7 CTAs walk 49 items in 7 pipelined steps, each
    # waiting for the row of its previous step
    ("inner-coop-steps", "t d : norm over d ; scale d ; shift d", {}, (7, 30001), None, "float32", "coop",
     {"COOP_L2_BYTES": 30001 * 4}),
    # rows held over a co-resident grid (GRID_PERSISTENT): CTAs spin on per-row arrival counters, warp 0
    # merges the row's partials; the planner's choice for 3 x 400,001 (peeled), forced for the others
    ("inner-grid", "t d : norm over d ; scale d ; shift d", {}, (3, 400001), None, "float32", None),
    ("inner-grid-rms-bf16", "t d : rms over d ; scale d", {}, (2, 70000), None, "bfloat16", "grid"),
    ("outer-persistent", "n c h w : norm over h w ; scale c ; shift c", {}, (3, 37, 5, 7), (0, 2, 3, 1),
     "float32", None),
    ("outer-looped", "n c h w : norm over h w ; scale c ; shift c", {}, (2, 40, 9, 11), (0, 2, 3, 1),
     "float16", "looped"),
    ("outer-split", "n c h w : norm over h w ; scale c ; shift c", {}, (1, 24, 31, 33), (0, 2, 3, 1),
     "bfloat16", "split"),
    ("outer-split-finish", "n c h w : norm over h w ; scale c ; shift c", {}, (1, 128, 16, 16), (0, 2, 3, 1),
     "float32", "split"),  # 2 normalize CTAs per split CTA (Plan.finish_splits)
    ("outer-batch-stats-split", "n c h w : norm over n h w ; scale c ; shift c", {}, (3, 13, 7, 9),
     (0, 2, 3, 1), "float32", "split"),
    ("mixed-persistent", "n (g k) h w : norm over k h w ; scale g k ; shift g k", {"g": 4}, (2, 12, 5, 7),
     (0, 2, 3, 1), "float32", None),
    ("mixed-looped", "n (g k) h w : norm over k h w ; scale g k ; shift g k", {"g": 4}, (2, 12, 5, 7),
     (0, 2, 3, 1), "float16", "looped"),
    ("mixed-split", "n (g k) h w : norm over k h w ; scale g k ; shift g k", {"g": 2}, (1, 6, 23, 29),
     (0, 2, 3, 1), "float32", "split"),
    # NHWC group norm's split kernels keep the 4-CTA launch bound at a few spilled bytes (STREAM_MAX_SPILL)
    ("mixed-split-spill", "n (g k) h w : norm over k h w ; scale g k ; shift g k", {"g": 32}, (2, 320, 12, 12),
     (0, 2, 3, 1), "float16", "split"),
    ("inner-offset-view", "t d : norm over d ; scale d ; shift d", {}, (9, 257), "offset", "float16", None),
    # thread-block clusters (distributed shared memory): the reduction spread over 2-16 CTAs
    ("inner-cluster", "t d : norm over d ; scale d ; shift d", {}, (2, 70001), None, "float32", "cluster"),
    ("inner-cluster-bf16", "t d : rms over d ; scale d", {}, (3, 150001), None, "bfloat16", "cluster"),
    ("outer-cluster", "n c h w : norm over h w ; scale c ; shift c", {}, (1, 16, 61, 67), (0, 2, 3, 1),
     "float32", "cluster"),
    ("outer-cluster-f16", "n c h w : norm over h w ; scale c ; shift c", {}, (2, 8, 80, 80), (0, 2, 3, 1),
     "float16", "cluster"),
    # rows too long for the fused backward: the column pass (per-row sums, then dx and per-group parameter
    # partials in one pass, 2 row groups) and its finish kernel
    # (schedule "looped": the fused backward over a cluster would hold these rows)
    ("inner-cols-groups", "t d : norm over d ; scale d ; shift d", {}, (100, 9001), None, "bfloat16", "looped"),
    # the column pass with a scale along the kept axis too (loaded per row; 2026-12-05 fix)
    ("inner-cols-row-scale", "t d : norm over d ; scale t d ; shift d", {}, (37, 1003), None, "float32", "looped"),
    # the fused backward over a cluster of 4 CTAs (row sums through distributed shared memory), row-route
    # parameter sums; the forward is its default for the shape
    ("fused-bwdcluster-instance", "n c d h w : norm over d h w ; scale c ; shift c", {}, (2, 4, 32, 32, 33), None,
     "float32", None),
    # group norm NCHW: parameter gradients from per-segment sums (shared-memory slots per warp), one row and
    # four rows (ragged) per CTA
    ("inner-segments", "n (g k) h w : norm over k h w ; scale g k ; shift g k", {"g": 2}, (2, 8, 16, 32), None,
     "float16", "looped"),
    ("inner-segments-rows", "n (g k) h w : norm over k h w ; scale g k ; shift g k", {"g": 2}, (3, 4, 2, 64),
     None, "float32", "looped"),
    # fused backward with 16-bit x under the launch bound of 3 CTAs per SM
    ("fused-bound-instance-f16", "n c h w : norm over h w ; scale c ; shift c", {}, (64, 32, 28, 28), None,
     "float16", None),
    # fused backward that prefetches the next row's x and dy (FusedPlan.prefetch): float32 instance norm at 2 CTAs
    # per SM with masked rows (1073 values: past FUSED_WARP_MAX_VALUES x 32, so the row spans warps; a row of
    # one warp does not prefetch), 16-bit layer norm kept as words, a masked row of 4000 at 1 CTA per SM
    # (tests/test_backward.py::test_sanitizer_prefetch_cases checks, without a GPU, that both plan the prefetch)
    ("fused-prefetch-instance", "n c h w : norm over h w ; scale c ; shift c", {}, (64, 32, 37, 29), None,
     "float32", None),
    ("fused-prefetch-ln-bf16", "t d : norm over d ; scale d ; shift d", {}, (600, 4000), None, "bfloat16", None),
]
TOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}


def selected_cases(only=None):
    """CASES whose name contains one of the comma-separated ``only`` (default $NORMC_SAN_ONLY; empty: all)."""
    only = [s for s in (os.environ.get("NORMC_SAN_ONLY", "") if only is None else only).split(",") if s]
    return [c for c in CASES if not only or any(s in c[0] for s in only)]


def run_cases() -> int:
    """Run every selected case once on the GPU (the part compute-sanitizer watches); 0 if all are right."""
    import math

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_anchors import reference

    import normc

    bad = 0
    from normc import planner

    for name, text, sizes, shape, perm, dtype, schedule, *consts in selected_cases():
        consts = consts[0] if consts else {}
        saved = {k: getattr(planner, k) for k in consts}
        for k, v in consts.items():
            setattr(planner, k, v)
        spec = normc.spec(text, **sizes)
        dt = getattr(torch, dtype)
        g = torch.Generator(device="cuda").manual_seed(0)
        if perm == "offset":  # view starting one element into its allocation, rows padded by one
            T, D = shape
            base = torch.randn(T * (D + 1) + 1, device="cuda", generator=g).to(dt)
            x = base[1:].view(T, D + 1)[:, :D]
        elif perm is not None:
            phys = [shape[d] for d in perm]
            inv = sorted(range(len(perm)), key=lambda i: perm[i])
            x = torch.randn(phys, device="cuda", generator=g).to(dt).permute(*inv)
        else:
            x = torch.randn(shape, device="cuda", generator=g).to(dt)
        ax = spec.axis_sizes(tuple(x.shape))
        sc = sh = None
        if spec.scale is not None:
            sc = (1 + torch.randn(math.prod(ax[a] for a in spec.scale), device="cuda", generator=g)).to(dt)
        if spec.shift is not None:
            sh = torch.randn(math.prod(ax[a] for a in spec.shift), device="cuda", generator=g).to(dt)
        try:
            f = normc.compile(spec, schedule=schedule)
            y, mean, rstd = f(x, sc, sh, return_stats=True)
            torch.cuda.synchronize()
            plan = next(iter(f._table.values())).plan
            kernels = next(iter(f._table.values())).kernels
            yr = reference(spec, x, sc, sh)[0]
            err = ((y.double() - yr).abs().max() / yr.abs().max().clamp_min(1)).item()
            want = name.split("-")[:2]  # the plan the case is named after, where the name says
            ok = err <= TOL[dtype]
            if want[1] in ("persistent", "looped", "split", "coop"):
                ok = ok and [plan.strategy, plan.schedule] == want
            if want[1] == "cluster":
                ok = ok and plan.strategy == want[0] and plan.cluster > 1
            # the backward kernels of the same spec (dx, dscale, dshift) on the same input
            berr = backward_error(spec, f, x, sc, sh, mean, rstd, g)
            ok = ok and berr <= 10 * TOL[dtype]
            bplan = next(iter(f._normc_backward.values())).plan
            if want == ["fused", "prefetch"]:  # the backward plan that ran prefetches (it would not where it spills)
                ok = ok and bplan.fused is not None and bplan.fused.prefetch
            print(f"CASE {name:26s} {plan.strategy}/{plan.schedule} vec={plan.vec} splits={plan.splits} "
                  f"cluster={plan.cluster} finish_splits={plan.finish_splits} kernels={len(kernels)} "
                  f"launched={kernels[-1].grid}x{kernels[-1].block} err={err:.1e} "
                  f"backward_err={berr:.1e} {'ok' if ok else 'FAIL'}",
                  flush=True)
            bad += not ok
        except Exception as e:  # report and go on
            print(f"CASE {name:26s} ERROR {type(e).__name__}: {e}"[:400], flush=True)
            bad += 1
        finally:
            for k, v in saved.items():
                setattr(planner, k, v)
    return 1 if bad else 0


def backward_error(spec, f, x, sc, sh, mean, rstd, g):
    """Run ``f.backward`` on a random dy and return its largest error (relative to each gradient's largest
    magnitude) against float64 autograd through the reference."""
    import torch
    from gpu_anchors import reference

    dy = torch.randn(x.shape, device="cuda", generator=g).to(x.dtype)
    dx, dsc, dsh = f.backward(dy, x, mean, rstd, sc)
    torch.cuda.synchronize()
    leaves = [t.detach().double().requires_grad_(True) if t is not None else None for t in (x, sc, sh)]
    yr = reference(spec, *leaves)[0]
    want = torch.autograd.grad(yr, [t for t in leaves if t is not None], dy.double())
    got = [dx] + [d for d, t in ((dsc, sc), (dsh, sh)) if t is not None]
    return max(((a.double() - w).abs().max() / w.abs().max().clamp_min(1)).item() for a, w in zip(got, want))


def find_sanitizer(explicit=None):
    """Path of compute-sanitizer: --sanitizer, $COMPUTE_SANITIZER, PATH, CUDA installs, pip packages."""
    cands = [explicit, os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer")]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(os.path.join(os.environ[env], "bin", "compute-sanitizer"))
            cands.append(os.path.join(os.environ[env], "compute-sanitizer", "compute-sanitizer"))
    cands += sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"), reverse=True)
    cands += sorted(glob.glob("/usr/local/cuda*/compute-sanitizer/compute-sanitizer"), reverse=True)
    cands += sorted(glob.glob("/opt/nvidia/*/compute-sanitizer*/compute-sanitizer"), reverse=True)
    cands += sorted(glob.glob("/opt/cuda*/bin/compute-sanitizer"), reverse=True)
    for sp in sys.path:  # pip: nvidia-cuda-sanitizer-api* wheels ship the binary
        cands += glob.glob(os.path.join(sp, "nvidia", "cuda_sanitizer_api", "compute-sanitizer", "compute-sanitizer"))
        cands += glob.glob(os.path.join(sp, "nvidia", "cu*", "compute-sanitizer", "compute-sanitizer"))
        cands += glob.glob(os.path.join(sp, "nvidia", "cu*", "bin", "compute-sanitizer"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-cases", action="store_true", help="run the cases (what the sanitizer watches)")
    ap.add_argument("--tools", default="memcheck,racecheck", help="comma-separated compute-sanitizer tools "
                    "(also: synccheck, initcheck)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "sanitize-out")
    ap.add_argument("--sanitizer", default=None, help="path of compute-sanitizer (default: searched)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per tool")
    ap.add_argument("--only", default="", help="comma-separated parts of case names: run only those cases")
    a = ap.parse_args(argv)
    if a.run_cases:
        return run_cases()

    os.makedirs(a.out, exist_ok=True)
    summary = os.path.join(a.out, "sanitize-summary.txt")
    san = find_sanitizer(a.sanitizer)
    if san is None:
        msg = ("compute-sanitizer NOT FOUND (looked at --sanitizer, $COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin, "
               "/usr/local/cuda*/bin, /opt/nvidia, pip nvidia/* packages). Install the CUDA toolkit's "
               "compute-sanitizer or pass --sanitizer PATH.")
        print(msg)
        with open(summary, "w") as f:
            f.write(msg + "\n")
        return 2
    ver = subprocess.run([san, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    cases_run = selected_cases(a.only)
    lines = [f"compute-sanitizer: {san} ({ver[-1] if ver else '?'})", f"cases: {len(cases_run)}"]
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1", NORMC_SAN_ONLY=a.only)
    failed = False
    for tool in [t.strip() for t in a.tools.split(",") if t.strip()]:
        # --report-api-errors no: cuda-bindings probes driver entry points with cuGetProcAddress, and the
        # ones this driver lacks come back CUDA_ERROR_INVALID_VALUE; those host-side API returns are not
        # kernel errors (memcheck counted 34 of them per run on the H200, 2026-12-01). Launch failures still
        # surface as a failed case.
        cmd = [san, "--tool", tool, "--error-exitcode", "86", "--print-limit", "100",
               "--target-processes", "all", "--report-api-errors", "no",
               # only normc's kernels (every entry is named normc_*): the float64 torch reference's own
               # reduce kernels drew 100 racecheck reports inside at::native::reduce_kernel on the H200
               "--kernel-name", "kns=normc"]
        if tool == "memcheck":
            cmd += ["--leak-check", "no"]
        if tool == "racecheck":
            cmd += ["--racecheck-report", "all"]
        cmd += [sys.executable, os.path.abspath(__file__), "--run-cases"]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = (e.stdout or b"").decode(errors="replace") + "\nTIMEOUT", -1
        log = os.path.join(a.out, f"sanitize-{tool}.log")
        with open(log, "w") as f:
            f.write(out)
        # memcheck ends with "ERROR SUMMARY: N errors"; racecheck with "RACECHECK SUMMARY: H hazards displayed
        # (E errors, W warnings)" (hazards count as errors: racecheck reports every race as one of the two)
        m = re.findall(r"ERROR SUMMARY: (\d+) error", out)
        m += [int(e) + int(w) for e, w in re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)", out)]
        nerr = sum(int(v) for v in m) if m else None
        cases = [ln for ln in out.splitlines() if ln.startswith("CASE ")]
        bad_cases = [ln for ln in cases if not ln.rstrip().endswith(" ok")]
        ok = rc == 0 and nerr == 0 and len(cases) == len(cases_run) and not bad_cases
        failed |= not ok
        lines.append(f"{tool:10s} {'CLEAN' if ok else 'FAIL'}  errors={nerr if nerr is not None else '?'} rc={rc} "
                     f"cases={len(cases) - len(bad_cases)}/{len(cases_run)} ok  {time.time() - t0:.0f}s  log={log}")
        for ln in bad_cases:
            lines.append("    " + ln)
        if nerr:
            for ln in [ln for ln in out.splitlines() if re.search(r"^=+ +(Invalid|Error|Race|.*hazard)", ln)][:10]:
                lines.append("    " + ln.strip())
    text = "\n".join(lines)
    print(text)
    with open(summary, "w") as f:
        f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
