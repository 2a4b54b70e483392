"""Optional autotuning: time the schedules a problem admits on the device and remember the fastest.

``normc.autotune(spec, x, scale, shift)`` compiles the planner's choice and each forced alternative
(``looped``, ``split``), checks that they agree, times them with CUDA events and stores the winner in the
on-disk cache under a key made of the canonical problem, the target and the multiprocessor count. Every later
:class:`normc.runtime.Compiled` (in any process) that meets the same problem plans with that schedule. The
default planner does not need it: it is a way to check and override the heuristic where it misjudges.
"""

from __future__ import annotations

import dataclasses

from ..errors import ArgumentError, CompileError
from . import cache

SCHEDULES = (None, "persistent", "staged", "looped", "split", "coop", "cluster", "grid")


def _key(problem, arch, sms) -> str:
    from .. import __version__

    d = dataclasses.asdict(problem)
    return cache.make_key({"kind": "tuning", "problem": d, "arch": arch, "sms": sms, "normc": __version__})


def lookup(problem, arch, sms):
    """The tuned schedule for this problem on this target, or None."""
    payload = cache.load(_key(problem, arch, sms))
    return None if payload is None else payload.get("schedule")


def record(problem, arch, sms, schedule, timings=None) -> bool:
    """Store ``schedule`` as the tuned choice for ``problem`` on ``arch`` with ``sms`` multiprocessors."""
    if schedule not in SCHEDULES:
        raise ArgumentError(f"schedule is {schedule!r}; expected one of {SCHEDULES}")
    return cache.store(_key(problem, arch, sms), {"kernels": [], "schedule": schedule, "timings_us": timings or {},
                                                  "summary": f"tuned schedule: {schedule or 'planner default'}"})


def autotune(spec, x, scale=None, shift=None, *, reps=50):
    """Time each schedule for ``x`` (a CUDA torch tensor) and store the fastest for later processes.

    Args:
        spec: :class:`normc.Spec` or its text.
        x, scale, shift: as for a :class:`normc.runtime.Compiled` call (torch CUDA tensors).
        reps: timed calls per candidate (after 5 warm-up calls); the median of CUDA-event timings is used.

    Returns:
        dict with ``schedule`` (the winner; None means the planner's own choice), ``timings_us`` per candidate,
        and ``plan`` (the winning plan's description). A forced schedule that cannot be compiled or launched
        on this device (CompileError) is left out of the candidates.

    Raises:
        ArgumentError: reps is not a positive int, x is not a CUDA torch tensor, or the candidates disagree
            numerically (a bug).
        CompileError: the planner's own choice cannot be compiled or loaded.
    """
    import statistics

    from . import Compiled

    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ArgumentError(f"reps is {reps!r}; expected a positive int (timed calls per candidate)")
    if type(x).__module__.split(".")[0] != "torch" or not x.is_cuda:
        raise ArgumentError("autotune times CUDA torch tensors; x is not one (there is nothing to time on the "
                            "simulator)")
    import torch

    results, outputs, plans = {}, {}, {}
    for sched in SCHEDULES:
        f = Compiled(spec, schedule=sched, use_tuning=False)
        try:
            y = f(x, scale, shift)
        except CompileError:
            if sched is None:
                raise
            continue  # a forced schedule this device cannot run (e.g. a coop row wider than the co-resident grid)
        (entry,) = f._table.values()
        key = (entry.plan.schedule, entry.plan.splits)
        if key in {(p.schedule, p.splits) for p in plans.values()}:
            continue  # the same plan as an earlier candidate
        plans[sched], outputs[sched] = entry.plan, y
        for _ in range(5):
            f(x, scale, shift)
        times = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            f(x, scale, shift)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3)
        results[sched] = statistics.median(times)
    base = outputs[None].double()
    tol = 1e-5 if x.dtype == torch.float32 else 1e-2
    for sched, y in outputs.items():
        err = ((y.double() - base).abs().max() / base.abs().max().clamp_min(1e-30)).item()
        if err > tol:
            raise ArgumentError(f"schedule {sched!r} disagrees with the planner's choice ({err:.1e} > {tol}); "
                                "not recording a tuning")
    best = min(results, key=results.get)
    p = plans[best]
    f = Compiled(spec, use_tuning=False)
    f(x, scale, shift)
    (entry,) = f._table.values()
    prob = entry.problem
    record(prob, p.arch, p.sms, best, {str(k): v for k, v in results.items()})
    return {"schedule": best, "timings_us": {str(k): v for k, v in results.items()}, "plan": p.describe()}
