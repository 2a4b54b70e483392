"""Planning the backward pass: canonical problem -> the reductions the gradient kernels run, as plain data.

With ``xhat = (x - mean) * rstd`` (rms: ``x * rstd``), ``y = xhat * scale + shift`` and ``g = dy * scale``:

* **dx** needs two sums per kept index (row) over the spec's reduced axes R, ``sum_R(g)`` and
  ``sum_R(g * xhat)`` (rms: the second only), then an elementwise pass
  ``dx = rstd * (g - mean_R(g) - xhat * mean_R(g * xhat))``. This is a reduction with the *forward's*
  roles: kept axes index the rows, reduced axes are summed.
* **dscale / dshift** are ``sum(dy * xhat)`` / ``sum(dy)`` over every axis along which the parameter is
  broadcast (its stride is 0). This is a reduction with *other* roles: the parameter's own axes are kept,
  everything else is summed, whether it was kept or reduced in the forward (layer norm: summed over the
  rows, an outer reduction; instance norm: over n and the spatial axes; group norm: over n and h w, with
  ``(g k)`` kept).

Each reduction is re-canonicalized for its roles (:func:`normc.canonical.canonicalize`) and tiled like the
forward planner tiles (:mod:`normc.planner`): ``inner`` (innermost axis summed: ``tpr`` lanes along it) or
``outer`` (innermost axis kept: lanes along the contiguous columns, rows over y-threads and a loop), and
split over ``splits`` CTAs when there are too few rows or column tiles to fill the GPU. A split reduction
writes float32 partial sums per (split, kept index) to a workspace and a second kernel adds them in split
order, so every result is deterministic (no atomics; the same inputs give the same bits).

A tall layer norm such as ``(1, 1048576, 128)`` has one 128-column tile for dscale/dshift; the rows are
split over ``SPLIT_CTAS_PER_SM * sms`` CTAs (528 on 132 SMs), not over a few SMs.

**Fused path.** When dx is an inner reduction whose rows fit in registers (``FUSED_MAX_VALUES`` elements per
thread, up to 512 lanes), :class:`FusedPlan` replaces the dx reduction's kernels: one persistent kernel reads
x and dy once, writes dx, and produces the parameter gradients that vary only along the row (per-CTA
partials: layer/RMS norm) or only across rows (per-row sums: NCHW instance norm); the remaining parameter
reductions (e.g. group norm's ``scale g k``) keep the general path. ``schedule="looped"`` or ``"split"``
disables it.

**Column pass.** Without the fused kernel, a parameter that varies along every summed axis and no kept axis
(layer and RMS norm's ``scale d``) would need a third pass: a parameter reduction re-reading x and dy over the
rows. Instead (:class:`ColsPlan`) the dx kernel only takes the row sums (``normc_bwd_dx_partial``, split or
not), and a column kernel (``normc_bwd_dx_cols``) writes dx: each CTA owns a chunk of columns and a group of
rows, keeps the scale of its columns and the parameter sums of ``dy*xhat`` / ``dy`` in registers across the
rows, and writes them per row group (then added in group order by ``normc_bwd_cols_finish``) or, with one
group, directly. x and dy are read twice, not three times.

**Row sums.** Without the fused kernel, a parameter constant along every row (instance and batch norm's
``scale c``, in any layout) takes its gradient from the general dx kernel's per-row sums of ``dy`` and
``dy*xhat`` (``ReducePlan.row_outputs``; ``sum_R(g)`` is then the row's scale times ``sum_R(dy)``), added per
parameter element by a small kernel, instead of from a parameter reduction re-reading x and dy.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace

from .canonical import Axis, canonicalize
from .errors import ArgumentError
from .planner import (CLUSTER_SIZES, CTA_THREADS, DEFAULT_SMS, ITEMSIZE, LOOP_UNROLL, MAX_PERSISTENT_THREADS,
                      MAX_VECTOR_BYTES, SPLIT_CTAS_PER_SM, _axes_from_json, _clusters_ok, _json_fields, _json_object,
                      _why_from_json, check_grid, pick_vec)

__all__ = ["ReducePlan", "FusedPlan", "ColsPlan", "BackwardPlan", "make_backward_plan"]

# The schedules make_backward_plan acts on (its ``schedule`` argument; runtime.backward.plan_backward accepts
# only these).
SCHEDULES = (None, "split", "looped", "cluster")
# Up to this many splits are forced by ``schedule="split"`` (tests: covers the partial/finish kernels on tiny
# inputs).
FORCED_SPLITS = 2
# Fused dx kernel: at most this many elements of a row per thread (x and dy are held as xhat and g, plus two
# parameter partials per element: 4 x 16 float32 registers of data, which leaves room for addressing under the
# 128 registers a 512-thread CTA allows).
FUSED_MAX_VALUES = 16
# ... except that a row without lane-route outputs (instance norm: its parameter gradients come from per-row
# sums) that one warp holds at up to this many values a thread gets one warp: its row sums are warp shuffles,
# with no shared memory or barrier, and the 8 warps of a CTA run their rows independently (xhat and dy: 64
# float32 registers of data). Measured on the H200 (tests/gpu_backward_ab.py, 2026-12-03, backward us, 2 warps
# a row / 1): instance norm NCHW float16 (256, 128, 28, 28) 51.4 (3 CTAs per SM) / 46.5 (2 per SM, 108
# registers); float32 85.6 (prefetching) / 85.4-85.8.
FUSED_WARP_MAX_VALUES = 32
# Fused dx kernel: threads per SM the grid aims for (CTAs per SM = this / threads: 2 x 256 or 1 x 512, what
# fits at up to 128 registers per thread), each CTA looping over many rows; lowered one CTA per SM at a time
# (down to 1) while the parameter partials would exceed 1/FUSED_PARTIAL_FRACTION of the kernel's own traffic.
FUSED_THREADS_PER_SM = 512
FUSED_PARTIAL_FRACTION = 16
# Fused dx kernel: threads per SM the grid aims for under the launch bound .minnctapersm (3 CTAs of 256: at
# most 80 registers), for 16-bit x and at most one lane-route output (RMS norm's dscale; none for instance
# norm), where the kernel mostly fits that without spilling. ptxas through nvJitLink (sm_90; registers unbounded
# -> under the bound): instance norm NCHW float16 (256, 128, 28, 28) 84 -> 80, RMS bfloat16 16384 x 1024
# 95 -> 80, x 4096 95 -> 80 (tests/test_backward.py checks more shapes). Where ptxas would spill under the
# bound it drops it, and a grid sized for 3 CTAs per SM would run as 2 per SM plus a partial wave: the
# runtime then plans again without (make_backward_plan's fused_bound=False), e.g. RMS bfloat16 16384 x 2000
# and x 2400 (93 and 90 registers sign-extended; with codegen.UNSIGNED_INDEX, x 2000 fits the bound in 79, x 2400 does
# not). Left out: layer norm's two lane-route outputs (bfloat16 16384 x 768 / 1024 / 2048 and
# (1, 1048576, 128) take 112-124 registers; 16384 x 4096 fits 80) and float32 x ((256, 128, 28, 28): 83).
# Measured on the H200 (tests/gpu_backward_ab.py, 2026-12-03, one run), backward us, 2 per SM / 3 per SM
# bounded: instance norm float16 (256, 128, 28, 28) 61.1 / 51.3; RMS bfloat16 16384 x 1024 38.0 / 34.4,
# x 4096 131.8 / 119.8; layer norm bfloat16 16384 x 4096 148.3 / 143.5. Where the bound was dropped: float32
# (256, 128, 28, 28) 86.3 / 95.5, layer norm bfloat16 16384 x 1024 42.1 / 53.2, float32 100000 x 1000 308.5 /
# 341.2.
FUSED_BOUND_THREADS_PER_SM = 768
# ... for x of at most this many bytes per element; the bound is kept when ptxas spills at most
# FUSED_BOUND_MAX_SPILL bytes under it (normc.lowering's _bound_occupancy). float32 instance norm (256, 128, 28,
# 28) fits 80 registers with 4 bytes spilled: on the H200 (tests/gpu_backward_ab.py --kernels, 2026-12-03, one
# run) 85.2 against 86.3 us (fused kernel 79.5 / 81.2), within run-to-run spread, so float32 stays at 2 per SM.
FUSED_BOUND_ITEMSIZE = 2
FUSED_BOUND_MAX_SPILL = 0
# Fused dx kernel: each trip of a CTA's row loop first issues the next row's x and dy loads (FusedPlan.prefetch),
# so that they are in flight during this row's lane sums and barriers (without it, a CTA's loads of one row
# start only after the previous row's dx is stored: one memory latency per row with nothing in flight). The
# loaded values of two rows then take registers at once: the kernel carries the launch bound of its planned
# CTAs per SM, and where ptxas would spill under it the runtime plans again without prefetch. ptxas through
# nvJitLink (sm_90), registers without -> with, unbounded: instance norm NCHW float32 (256, 128, 28, 28)
# 83 -> 126, layer norm bfloat16 16384 x 8192 121 -> 128, x 4096 119 -> 150 (127 under the bound of 2 CTAs
# per SM), RMS bfloat16 x 8192 95 -> 124. It is planned only where it pays, measured on the H200
# (tests/gpu_backward_ab.py, 2026-12-03, backward us, without / with, the runtime's plans):
# - the row sums cross warps (more than 32 lanes a row: shared memory and barriers, during which one warp has
#   nothing else to load) and at most FUSED_THREADS_PER_SM threads a SM: layer norm float32 10000 x 10000
#   468.2 / 374.8; bfloat16 16384 x 1024 42.2 / 37.7, x 4096 146.7 / 128.5, x 8192 299.2 / 234.3; RMS
#   bfloat16 x 8192 266.2 / 215.8; instance norm NCHW float32 (256, 128, 28, 28) 87.2 / 85.2 (planned with
#   two warps a row then; now one, FUSED_WARP_MAX_VALUES);
# - not at 3 CTAs per SM (768 threads: enough warps to hide the latency): RMS bfloat16 16384 x 4096 119.6 /
#   127.9; instance norm float16 (256, 128, 28, 28) 51.0 / 51.3 (then prefetching at 2 per SM);
# - not with a row's lanes within one warp (no barriers): layer norm float32 10000000 x 10 (one lane a row)
#   329.7 / 432.6.
FUSED_PREFETCH = True
# Fused dx kernel over a thread-block cluster (sm_90+), for rows longer than one CTA holds: each of the C CTAs
# of a cluster holds a slice of the row (MAX_PERSISTENT_THREADS lanes x up to FUSED_CLUSTER_MAX_VALUES values
# each), the row sums are added over the cluster through distributed shared memory, and x and dy are still
# read once. The smallest cluster of planner.CLUSTER_SIZES up to FUSED_MAX_CLUSTER that holds the row is
# taken, for x of at least FUSED_CLUSTER_MIN_ITEMSIZE bytes. Without lane-route partials a thread holds xhat and
# dy only (2 x 32 float32 registers under the 128 a 512-thread CTA may use: 109-125 taken, no spills); with
# them (layer/RMS norm) FUSED_MAX_VALUES. Measured on the H200 (tests/gpu_backward_ab.py, 2026-12-03, one run;
# backward us, cluster vs the two-pass general path): float32 NCDHW instance norm (4, 256, 32^3) cluster of 2
# x 32 values 110.7 vs 165.4, (8, 256, 32^3) 208.3 vs 319.4, (2, 128, 32^3) 35.1 vs 46.8; NCHW (1, 128,
# 160^2) 17.5 vs 23.3, (1, 64, 320^2) cluster of 8 44.2 vs 45.1; layer norm 10000 x 10000 cluster of 2 472.8
# vs 507.0 (column pass). Slower, hence the limits: clusters of 16 (float32 (2, 64, 64^3) 212.4 vs 174.3,
# (8, 64, 64^3) 823.9 vs 637.4, layer norm 1000 x 100000 1264.2 vs 496.9: at most 7-8 such clusters are
# co-resident and every row waits at a 16-CTA barrier); 16-bit x, before the prefetch (float16 (2, 128, 32^3)
# 23.9 vs 22.1, NCHW batch statistics (256, 256, 28, 28) 334.4 vs 131.9, bfloat16 layer norm 16384^2 721.0 vs
# 673.4, group norm 8 x 320 x 64^2 64.3 vs 40.1: a thread's 32 values are half the bytes in flight of float32's,
# and the general path's re-read of a 16-bit row mostly hits L2); 16 values per thread in twice the CTAs
# (float32 (4, 256, 32^3) cluster of 4: 205.7 vs 108.6 for 2 x 32).
FUSED_CLUSTER = True
FUSED_CLUSTER_MAX_VALUES = 32
FUSED_MAX_CLUSTER = 8
FUSED_CLUSTER_MIN_ITEMSIZE = 4
# ... or 16-bit x, where x and dy together take more than this many bytes: the general path's re-read then comes
# from HBM, not L2 (the H200's L2 is 60 MB). Only with the prefetch (FUSED_PREFETCH; without it the cluster was
# slower, see above). On the H200
# (tests/gpu_backward_ab.py, 2026-12-03, backward us, general path / cluster of 2): bfloat16 16384^2 layer norm
# 674.7 / 601.7, RMS norm 646.6 / 562.6 (1 GiB); below it, float16 NCDHW instance norm (2, 128, 32^3) (34 MB)
# 20.6 / 20.8, NCHW group norm (8, 320, 64^2) (42 MB, a cluster of 4) 29.8 / 56.4.
FUSED_CLUSTER_16BIT_MIN_BYTES = 60 * 10**6
# Outer splits (innermost axis kept): CTAs per SM the grid aims for, and whether the split kernels carry the
# launch bound .minnctapersm of that many CTAs (at most 64 registers; dropped when that spills). Unbounded they
# took 71-80 registers (3 CTAs per SM for a grid of 4 per SM: a partial second wave). Measured on the H200
# (tests/gpu_backward_ab.py, 2026-12-03, one run), backward us, unbounded / bound 4 / 3 per SM bound / 2 bound:
# NDHWC f16 (2, 32, 128^3) 391.4 / 336.9 / 343.9 / 373.8; (2, 64, 64^3) 113.3 / 98.1 / 97.5 / 105.4;
# (2, 128, 32^3) 35.9 / 28.9 / 29.3 / 31.3; NDHWC f32 (2, 32, 128^3) 660.7 / 647.7 / 655.1 / 712.0;
# (8, 256, 32^3) 333.0 / 327.4 / 349.5 / 365.4; NHWC f32 (1, 128, 160, 160) 26.6 / 23.5 / 22.9 / 23.7;
# NHWC batch statistics f16 (256, 256, 28, 28) 164.1 / 157.0 / 143.0 / 157.6 (its finish kernel spills at
# 64 registers, keeps 72 and runs 3 per SM: the one row where 3 per SM is faster); others within 3%.
OUTER_SPLIT_CTAS_PER_SM = SPLIT_CTAS_PER_SM
OUTER_SPLIT_BOUND = 1
# Inner splits (rows too long for one CTA and fewer rows than SMs): CTAs per SM the grid aims for, and whether
# the split count rounds up (ceil(INNER_SPLIT_CTAS_PER_SM * sms / rows)) or down. Rounding up overshoots by up
# to a row's worth of CTAs: 32 rows got 17 splits, 544 CTAs of 512 threads where 2 x 132 fit at a time (the
# partial and finish kernels take 54-56 registers), a third wave of 16 CTAs. Measured on the H200
# (tests/gpu_backward_ab.py, 2026-12-03, one run), backward us, round down / up / down with 2 CTAs per SM:
# NCHW (1, 32, 640^2) float32 72.8 / 84.4 / 71.4; NCDHW float32 (2, 64, 64^3) 165.2 / 172.0 / 166.2, (2, 64,
# 128^3) 1262.3 / 1353.3 / 1256.1; float16 (2, 32, 128^3) 334.8 / 345.4 / 322.3, (2, 64, 64^3) 88.4 / 93.8 /
# 89.3; layer norm float32 100 x 1M 483.1 / 490.8 / 486.1, 10 x 10M 553.8 / 555.0 / 537.6 (2 per SM: within
# 4% either way, not taken).
INNER_SPLIT_CTAS_PER_SM = SPLIT_CTAS_PER_SM
INNER_SPLIT_ROUND_UP = False
# dx outer split: merge each row's split partials once in their own kernel (ReducePlan.merged) rather than in
# every finish CTA. Each of the S finish CTAs of a column tile used to add all S partials of its columns: S^2 x
# tile x sums float32 reads, 571 MB from L2 for NHWC batch statistics (256, 256, 28, 28) (S = 528, tile 256).
# Measured on the H200 (tests/gpu_backward_ab.py, 2026-12-03), backward us without -> with: that row 207.9 ->
# 164.5; NHWC f32 (1, 128, 160, 160) 58.0 -> 28.8, (1, 32, 640, 640) 114.2 -> 83.5, (1, 64, 320, 320) 83.1 ->
# 49.8; NDHWC f16 (2, 128, 32^3) 54.7 -> 37.0, (2, 64, 64^3) 135.4 -> 114.9; f32 (8, 256, 32^3) 366.7 -> 336.5.
DX_MERGE = True
# The re-read of x and dy by the dx finish kernel of a split runs backwards: its CTAs take the work items in
# reverse order and walk their slices last-first, so it starts on the lines the partial kernel read last,
# which are still in L2 (as the forward's split finish kernel does: normc.lowering.codegen's stream_loop); a
# forward re-read of tensors larger than L2 misses almost everywhere (LRU under a cyclic scan). Measured on the
# H200 (tests/gpu_backward_ab.py, 2026-12-03, one run), backward us, reversed / not: inner splits NCDHW f32
# (2, 64, 64^3) 160.5 / 164.8, f16 (2, 32, 128^3) 329.6 / 334.7, NCHW f32 (1, 32, 640^2) 70.5 / 72.3; outer
# splits NDHWC f32 (2, 64, 64^3) 165.4 / 172.4, f16 (2, 32, 128^3) 327.0 / 331.9, NHWC f32 (1, 32, 640^2)
# 76.5 / 79.2, NHWC batch statistics f16 (256, 256, 28, 28) 154.4 / 158.5; within 1% on f32 (2, 64, 128^3)
# and f16 (2, 64, 64^3) (1.1 GB and 67 MB: a slice's tail in L2 is a few % of it, or all of it fits anyway).
# The column kernel (COLS_REVERSE) gained nothing and lost on one row: layer norm 4 x 10,000,001 323.5 / 313.4,
# 100 x 1M 486.3 / 485.8, 10 x 10M 556.8 / 556.7.
REVERSE_REREAD = True
COLS_REVERSE = False
# Unsplit dx (one CTA reads its rows or column tile twice, the sums then dx): the dx pass walks the rows
# last-first, starting on the part of its slice that the sums pass read last and L2 still holds (each CTA's
# share of L2, e.g. 60 MB / 256 resident CTAs = 234 KB of a 401 KB float16 batch-statistics row of x and dy).
# Measured on the H200 (tests/gpu_backward_ab.py, 2026-12-03, one run), backward us, reversed / not: NCHW
# batch statistics f16 (256, 256, 28, 28) 125.3 / 129.6; NHWC instance norm (256, 128, 28, 28) f32 141.2 /
# 147.2, f16 78.1 / 81.8; NCDHW f32 (4, 64, 64^3) 313.1 / 318.4, (8, 32, 64^3) 312.8 / 317.8, (8, 64, 64^3)
# 627.4 / 632.1; group norm f16 NCHW (8, 320, 64, 64) 30.0 / 31.2, NHWC (8, 640, 32, 32) 34.6 / 36.1; within
# 1% on (8, 640, 32, 32) and (8, 1280, 16, 16) NCHW and NCDHW f16 (2, 128, 32^3); slower on NHWC group norm
# (8, 320, 64, 64): 97.0 / 93.8.
REVERSE_LOOPED = True
# The dx pass of the general path (the split's finish kernel, the unsplit dx kernel's pass 2; inner and outer)
# loads this many vectors of x and dy per thread before it computes and stores any dx (ReducePlan.unroll). The
# stores cannot move above later loads (ptxas cannot prove that dx does not alias x or dy), so with one vector a
# trip each thread has one vector of x and one of dy in flight, 32 B: 32 KiB a SM at 1024 threads, what copy
# bandwidth needs at a 1 us loaded latency and no more (the reading passes: NVVM unrolls them by 4 on its own).
# Two vectors: H200 A/B, backward us, 1 / 2 / 4 vectors: f16 NCDHW (2, 32, 128^3) instance norm (split)
# 334.2 / 319.9 / 319.2 (its finish kernel 204.8 -> 191.4); f32 NCDHW (2, 64, 64^3) 164.1 / 160.4 / 161.1; f32
# NCHW (1, 32, 640^2) 71.6 / 70.1 / 72.0; f16 NCHW group norm (8, 320, 64^2) 30.7 / 29.3 / 34.2; f16 NCHW batch
# statistics (256, 256, 28^2) 127.2 / 126.2 / 149.9; the f32 NCDHW (2 and 4, 64, ...) rows within 1%. Four
# vectors lose: 68 registers a thread (32 at one, 48 at two) leave one 1024-thread CTA a SM, not two of 512.
DX_UNROLL = 2
# ... for an outer dx reduction (lanes along the kept innermost axis, rows over y-threads). One: at two the
# float16 NHWC batch-statistics (256, 256, 28^2) finish kernel grows from 64 registers to 80 and loses (138.6 ->
# 143.5 us); the f32 channels-last instance norms move within 1% (NDHWC (2, 64, 64^3) 169.6 -> 167.1, NHWC
# (1, 32, 640^2) 78.3 -> 77.5, NDHWC (2, 64, 128^3) 1272.4 -> 1282.6).
DX_UNROLL_OUTER = 1
# Outer dx, pass 2: rstd, mean and scale constant along the rows (hoisted per column) are folded with the row
# means into three factors per column, dx = A*dy - C - ((x - mean)*S)*|S| with S*|S| = rstd^2 * mean(g*xhat)
# (normc.lowering.backward's _Red.fold_dx, which says why not one factor rstd^2 * mean(g*xhat): its range):
# four values held per column instead of five. The float16 NHWC batch-statistics finish kernel (8 columns per
# thread) then fits 64 registers, the bound of 4 CTAs per SM, without spilling (72 registers and 3 per SM
# before, for a grid sized for 4: a second partial wave).
FOLD_DX = True
# Segment route (ReducePlan.seg_outputs): a parameter that varies along the outer summed axes of a row and is
# constant along the inner ones (group norm's scale g k over rows of k h w: 10 segments of h*w elements) gets
# its gradient from per-segment sums that the unsplit inner dx kernel takes in pass 1 (each warp adds dy and
# dy*xhat over its 32 vectors, which lie in one segment, into a shared-memory slot; the slots of a segment are
# then added in order), instead of a parameter reduction re-reading x and dy. Taken when a warp's 32 vectors
# never straddle two segments (segment length a multiple of 32 x vec, 32+ lanes per row) and the slots fit
# SEG_MAX_SHARED bytes per CTA.
SEGMENTS = True
SEG_MAX_SHARED = 16384
# Programmatic dependent launch between the backward's kernels (BackwardPlan.pdl; sm_90+): each kernel after
# the first waits for the one before it (griddepcontrol.wait, its first statement) and is launched as its
# programmatic dependent, so its CTAs take the SMs the previous kernel's last wave frees instead of being
# launched after that grid drains (normc.lowering.codegen.PDL: the forward's split kernels). 0: never; 1: plans
# with no outer reduction (dx or parameters) and no fused kernel with lane-route outputs (layer and RMS
# norm's per-CTA dscale partials); 2: every plan (A/B only). Measured on the H200 (tests/gpu_backward_ab.py,
# 2026-12-04, backward us, off / on): where 1 chains, fused instance norm (row sums) NCHW (256, 128, 28^2)
# float32 85.5 / 84.1, float16 46.4 / 45.6, NCDHW (2, 128, 32^3) float32 cluster 33.6 / 32.5, group norm NCHW
# (8, 1280, 16^2) float16 10.0 / 9.5, (1, 128, 160^2) float32 16.2 / 15.3, inner splits NCDHW float16 (2, 64,
# 64^3) 85.8 / 84.6, float32 (2, 64, 64^3) 159.5 / 157.9, the column pass 4 x 400,001 float32 15.6 / 15.1,
# batch statistics NCHW float16 126.8 / 125.1; the rest within 0.5%. Where it does not: outer dx NHWC batch
# statistics float16 (256, 256, 28^2) 136.3 / 140.7 and 138.5 / 139.6 (two runs), NHWC (1, 64, 320^2) float32
# 45.6 / 48.0, (256, 128, 28^2) float16 76.6 / 78.3; outer parameter reduction, NHWC group norm (8, 1280, 16^2)
# float16 17.6 / 18.7 and 17.8 / 18.7; fused layer norm with lane outputs, bfloat16 (16384, 4096) 129.1 /
# 133.9, RMS 119.8 / 123.8, float32 (10000, 10000) 374.3 / 377.2.
BWD_PDL = 1
# Column pass (ColsPlan): on/off (A/B measurements; off gives the three-pass general path).
COLS = True
# Column kernel: threads per CTA, and at most this many elements per thread per row (vectors x vec): its scale
# values and two parameter sums per element stay in registers (3 x 16 float32), plus 16 loaded x/dy values in
# flight per row (16 B vectors: 8 loads of 16 B per thread), the same budget as the fused kernel.
COLS_THREADS = 256
COLS_MAX_VALUES = 16
# Column kernel: CTAs of 256 threads per SM. The grid aims for exactly this many per SM (column chunks x row
# groups: one full wave when there are enough rows) and the kernel carries the launch bound ``.minnctapersm``
# (ptxas keeps it at or under 128 registers; dropped if that spills). Unbounded, the float32 kernels took
# 128-135 registers (one CTA per SM) and the bfloat16 ones 80-111 (2-3 per SM for a grid sized for 4: a
# partial last wave).
COLS_CTAS_PER_SM = 2
# Column kernel: bytes of x and dy loads a thread issues before using them (rows unrolled by up to
# COLS_MAX_UNROLL, all their loads first): with 512 threads per SM, 128 B each keeps 64 KiB per SM in flight,
# twice the 32 KiB that copy bandwidth (4.27 TB/s / 132 SMs = 32 B/ns) needs at a 1 us loaded latency.
COLS_LOAD_BYTES = 128
COLS_MAX_UNROLL = 4
# Column kernel: at most this many rows per group: their mean(g) and mean(g*xhat) sit in static shared memory
# (2 x 4 B a row: 32 KiB, under the 48 KiB a kernel may declare statically). More rows make more groups.
COLS_MAX_GROUP_ROWS = 4096
# Row groups are capped so that the float32 parameter partials (8 B per group, parameter element and output:
# written once, read once) stay under 1/COLS_PARTIAL_FRACTION of the x, dy and dx traffic.
COLS_PARTIAL_FRACTION = 16


@dataclass(frozen=True)
class ReducePlan:
    """One reduction of the backward pass and its tiling.

    Attributes:
        role: ``"dx"`` (row sums then dx) or ``"param"`` (dscale and/or dshift).
        outputs: for ``param``: the gradients it produces, a subset of ``("dscale", "dshift")`` in that order.
        strategy: ``"inner"`` (innermost axis summed) or ``"outer"`` (innermost axis kept).
        axes: canonical axes for this reduction's roles (``reduced`` = summed), outermost-first.
        key: the tensor whose element offset numbers the kept indices (``"stat"`` for dx; ``"scale"`` or
            ``"shift"`` for parameters): dense, in ``[0, keys)``.
        keys: number of kept indices; reduced: elements summed per kept index.
        nq: float32 sums per kept index (``len(sums)``).
        vec: elements per vector access of x, dy and dx along the innermost axis.
        scale_vec, stat_vec: whether scale / mean-rstd are read ``vec``-wide along the innermost axis.
        threads: threads per CTA. tpr, rows_per_cta: inner tiling. nxc, ry, tile: outer tiling (x-threads
            along columns, y-threads along rows, columns per CTA).
        splits: CTAs per kept index (inner) or per column tile (outer); > 1 adds a second kernel.
        grid: CTAs of the (first) kernel.
        ws_offset: float32 offset of this reduction's partials (``splits * keys * nq`` floats) in the
            workspace; only used when ``splits > 1``.
        sums: the float32 sums taken per kept index, in workspace order: ``"g"``, ``"gx"`` (of ``g = dy*scale``
            and ``g*xhat``), ``"dy"``, ``"dyx"`` (of ``dy`` and ``dy*xhat``). dx: ``g, gx`` (rms: ``gx``); with
            ``row_outputs`` and a scale constant along the row (or none) ``dy, dyx`` (rms: ``dyx``, plus
            ``dy`` for dshift), g's sums being the row's scale times them; else ``g, gx`` plus ``dy`` for
            dshift. param: ``dyx`` for dscale, ``dy`` for dshift.
        row_outputs: dx only: the parameter gradients that are constant along every row (their stride is 0
            along the summed axes: instance norm's, batch norm's ``scale c``), produced from the per-row sums
            pass 1 takes: one float32 per (row, output) at ``row_ws_offset + row * len(row_outputs)``, added
            per parameter element in a fixed order by ``normc_bwd_row_finish`` (no parameter reduction
            re-reading x and dy).
        sums_only: dx only: the kernel takes the row sums and writes them to the workspace (per split, even
            when not split); dx is written by the column kernel of :class:`ColsPlan`.
        min_ctas: the launch bound of the split kernels (CTAs per SM; 0: none).
        fold: dx outer only: pass 2 folds rstd, mean, scale and the row means into per-column factors where they
            are constant along the rows (FOLD_DX).
        seg_outputs: dx only (inner, not split): the parameter gradients that vary along the outer summed axes
            of a row and are constant along the inner ones (group norm's ``scale g k``), produced from
            per-segment sums of ``dy*xhat`` / ``dy`` that pass 1 takes: the row splits into ``reduced //
            seg_len`` segments of ``seg_len`` elements; one float32 per (row, segment, output) at
            ``seg_offset``, added per parameter element by ``normc_bwd_seg_finish``.
        seg_len: elements per segment (0: no segment route).
        unroll: dx only: vectors of x and dy (``tpr`` or ``ry`` apart) each thread of the dx pass loads before it
            computes and stores any of their dx (DX_UNROLL; the loads of a trip past the slice's end are masked).
        reverse: dx only: the re-read starts where the reading pass ended, in L2. Split: the finish kernel
            takes the work items in reverse order and walks its slice backwards (REVERSE_REREAD); not split:
            the dx pass walks the CTA's rows backwards (REVERSE_LOOPED).
        merged: dx outer split only: ``normc_bwd_dx_merge`` adds each row's split partials once (to
            ``merge_offset``, and writes the per-row sums of ``row_outputs``) before the finish kernel, whose
            CTAs then read one merged sum per column instead of every split's partial.
    """

    role: str
    outputs: tuple
    strategy: str
    axes: tuple
    key: str
    keys: int
    reduced: int
    nq: int
    vec: int
    scale_vec: bool
    stat_vec: bool
    threads: int
    tpr: int
    rows_per_cta: int
    nxc: int
    ry: int
    tile: int
    splits: int
    grid: int
    ws_offset: int
    sums: tuple = ()
    row_outputs: tuple = ()
    row_ws_offset: int = 0
    sums_only: bool = False
    merged: bool = False
    min_ctas: int = 0
    reverse: bool = False
    fold: bool = False
    seg_outputs: tuple = ()
    seg_len: int = 0
    unroll: int = 1

    @property
    def segments(self) -> int:
        """Segments per row of the segment route (0: none)."""
        return self.reduced // self.seg_len if self.seg_outputs else 0

    @property
    def seg_slots(self) -> int:
        """Shared-memory slots per row and segment-route output: one per warp-wide span of 32 vectors."""
        return self.reduced // (32 * self.vec)

    @property
    def seg_offset(self) -> int:
        """float32 offset of the per-segment sums (``seg_outputs``): after everything else of this reduction."""
        return self.merge_offset + (self.keys * self.nq if self.merged else 0)

    @property
    def merge_offset(self) -> int:
        """float32 offset of the merged row sums (``merged``): after the split partials and per-row sums."""
        part = self.splits > 1 or self.sums_only
        return self.ws_offset + (self.splits * self.keys * self.nq if part else 0) + self.keys * len(self.row_outputs)

    @property
    def workspace_floats(self) -> int:
        """float32 elements of partial sums this reduction needs (split partials, per-row sums, merged sums,
        per-segment sums)."""
        return self.seg_offset - self.ws_offset + self.keys * self.segments * len(self.seg_outputs)

    def describe(self) -> str:
        """One line: what this reduction computes (dx or dscale/dshift), its axes (S summed, K kept) and tiling."""
        ax = " ".join(f"[{a.size}{'S' if a.reduced else 'K'} x:{a.x}]" for a in self.axes)
        what = "dx" if self.role == "dx" else "+".join(self.outputs)
        if self.strategy == "inner":
            til = f"vec={self.vec} threads/row={self.tpr} rows/CTA={self.rows_per_cta}"
        else:
            til = f"vec={self.vec} column tile={self.tile} (x-threads={self.nxc}, y-threads={self.ry})"
        nk = 1 if self.sums_only else 3 if self.merged else 2 if self.splits > 1 else 1
        if self.sums_only:
            til += " (row sums only: dx by the column kernel)"
        if self.reverse:
            til += " (finish re-reads last-first)" if self.splits > 1 else " (dx pass re-reads last-first)"
        rows = (f"; {'+'.join(self.row_outputs)} from its per-row sums ({','.join(self.sums)}), added by "
                f"normc_bwd_row_finish" if self.row_outputs else "")
        if self.seg_outputs:
            rows += (f"; {'+'.join(self.seg_outputs)} from per-segment sums ({self.segments} segments of "
                     f"{self.seg_len}), added by normc_bwd_seg_finish")
        return (f"{what}: {self.strategy}, {self.keys} sums x {self.reduced} elements, axes {ax} "
                f"(S summed, K kept); {til} splits={self.splits}; {nk} kernel(s), grid={self.grid} "
                f"block={self.threads}{rows}")


@dataclass(frozen=True)
class FusedPlan:
    """The fused dx kernel of an inner reduction whose rows fit in registers (x and dy read once).

    CTA ``b`` loops over the groups of ``rows_per_cta`` rows ``[b*groups//grid, (b+1)*groups//grid)`` (at most
    ``groups_per_cta``); ``tpr`` lanes hold a
    row's ``per`` vectors of ``vec`` elements each (as xhat and g), the row sums are combined across the
    lanes, dx is written, and the parameter gradients are accumulated on the way:

    * ``lane_outputs`` (the parameter varies along every summed axis and no kept axis: layer/RMS norm): each
      thread keeps float32 sums of ``dy*xhat`` / ``dy`` per element it holds, in registers across the CTA's
      rows; the CTA writes one partial per (output, CTA, parameter element) (``lane_params`` elements) at
      ``ws_offset`` and ``normc_bwd_fparam_finish`` adds the ``grid`` partials in CTA order.
    * ``row_outputs`` (the parameter is constant along the row: NCHW instance norm): each row writes its
      sums of ``dy*xhat`` / ``dy`` (``row_nq`` floats per row, at ``row_ws_offset + row*row_nq``) and
      ``normc_bwd_frow_finish`` adds the rows of each parameter element in a fixed order.

    Attributes:
        tpr, per, vec, threads, rows_per_cta: tiling (lanes per row, vectors per lane, elements per vector,
            threads per CTA, rows per CTA at a time).
        groups: row groups (``ceil(keys / rows_per_cta)``); groups_per_cta: most consecutive groups of a CTA.
        grid: CTAs of the fused kernel.
        scale_mode: ``"none"``, ``"lane"`` (varies along the summed axes only: loaded once per CTA),
            ``"row"`` (one value per row) or ``"mixed"`` (loaded per element of every row).
        lane_outputs, row_outputs: the parameter gradients produced through each route.
        lane_params: parameter elements of the lane route (= elements per row).
        ws_offset, row_ws_offset, row_nq: workspace layout (float32 offsets).
        keys: rows (the forward's kept indices).
        cluster: CTAs per thread-block cluster sharing each row (1: none). With C > 1, ``rows_per_cta`` is 1,
            ``grid`` counts CTAs (a multiple of C), cluster ``b // C`` loops over the row groups as a CTA does
            above, and its CTA of rank ``r = b % C`` holds the row's vectors ``lane + tpr*(r + C*e)``,
            ``e < per``; the lane-route partials are one set per cluster (each CTA writes its own elements).
        min_ctas: the launch bound (CTAs of ``threads`` per SM; 0: none); max_spill: bytes ptxas may spill under
            it before the bound is dropped.
        prefetch: each trip of the row loop first issues the next row's x and dy loads (kept as loaded, 16-bit
            values as 32-bit words), so they are in flight during this row's reductions and barriers
            (FUSED_PREFETCH).
    """

    tpr: int
    per: int
    vec: int
    threads: int
    rows_per_cta: int
    groups: int
    groups_per_cta: int
    grid: int
    scale_mode: str
    lane_outputs: tuple
    row_outputs: tuple
    lane_params: int
    ws_offset: int
    row_ws_offset: int
    row_nq: int
    keys: int
    cluster: int = 1
    min_ctas: int = 0
    max_spill: int = 0
    prefetch: bool = False

    @property
    def partial_sets(self) -> int:
        """Sets of lane-route parameter partials: one per CTA, or per cluster."""
        return self.grid // self.cluster

    @property
    def workspace_floats(self) -> int:
        """float32 elements of partial sums: per-CTA (per-cluster) parameter partials, then per-row sums."""
        return len(self.lane_outputs) * self.partial_sets * self.lane_params + self.keys * self.row_nq

    def describe(self) -> str:
        """One line: the fused kernel's tiling (lanes, vectors, rows per CTA, grid) and its partial workspace."""
        parts = [f"fused dx: {self.tpr} lanes x {self.per} vectors x {self.vec} per row (x, dy read once), "
                 f"{self.rows_per_cta} rows/CTA at a time, {self.groups_per_cta} row groups per CTA, grid={self.grid} "
                 f"block={self.threads}, scale {self.scale_mode}"
                 + (f", cluster of {self.cluster} CTAs per row (row sums added through distributed shared memory)"
                    if self.cluster > 1 else "")
                 + (f", launch bound {self.min_ctas} CTAs/SM" if self.min_ctas else "")
                 + (", next row's loads issued before this row's work" if self.prefetch else "")]
        if self.lane_outputs:
            who = "cluster" if self.cluster > 1 else "CTA"
            parts.append(f"{'+'.join(self.lane_outputs)} from per-{who} partials ({self.partial_sets} x "
                         f"{self.lane_params}), added in {who} order by normc_bwd_fparam_finish")
        if self.row_outputs:
            parts.append(f"{'+'.join(self.row_outputs)} from per-row sums, added by normc_bwd_frow_finish")
        return "; ".join(parts)


@dataclass(frozen=True)
class ColsPlan:
    """The column kernel that writes dx of a general inner reduction and the lane-route parameter gradients.

    Runs after the dx kernel has written every row's sums (``BackwardPlan.dx.sums_only``: ``sum_splits``
    float32 partials per row and sum, at ``dx.ws_offset``). CTA ``b`` takes column chunk ``b % chunks`` (each
    of ``threads * per`` vectors of ``vec`` elements, thread ``t`` holding vectors ``t + e*threads``) of the
    rows ``[g*rows_per_group, (g+1)*rows_per_group)`` of group ``g = b // chunks``: it first turns its rows'
    sums into mean(g) and mean(g*xhat) (in shared memory), then per row reads x and dy, writes dx and adds
    ``dy*xhat`` / ``dy`` to one float32 register per element it holds. With one group those are the
    gradients; with more, each group writes a partial per parameter element (``ws_offset + (output*groups +
    group)*params + element``) and ``normc_bwd_cols_finish`` adds them in group order.

    Attributes:
        threads, per, vec: CTA size, vectors per thread, elements per vector.
        chunks: column chunks of a row; groups, rows_per_group: row groups and their size; grid: CTAs.
        unroll: rows a thread loads before it computes (their loads all in flight).
        min_ctas: the launch bound (CTAs of ``threads`` per SM; 0: none).
        reverse: CTA ``b`` takes the work item ``grid - 1 - b`` and walks its group's rows last-first
            (COLS_REVERSE, off by default: measured no faster).
        outputs: the parameter gradients it produces (``dscale`` and/or ``dshift``).
        params: parameter elements (= elements per row); keys: rows; sum_splits: partials per row sum.
        ws_offset: float32 offset of the group partials (only when ``groups > 1``).
    """

    threads: int
    per: int
    vec: int
    chunks: int
    groups: int
    rows_per_group: int
    grid: int
    outputs: tuple
    params: int
    keys: int
    sum_splits: int
    ws_offset: int
    unroll: int = 1
    min_ctas: int = 0
    reverse: bool = False

    @property
    def workspace_floats(self) -> int:
        """float32 elements of group partials (0 with one group)."""
        return len(self.outputs) * self.groups * self.params if self.groups > 1 else 0

    def describe(self) -> str:
        """One line: the column kernel's tiling and where its parameter gradients go."""
        dest = ("written directly" if self.groups == 1 else
                f"per-group partials ({self.groups} x {self.params}) added in group order by normc_bwd_cols_finish")
        return (f"dx columns: {self.chunks} chunks of {self.threads} threads x {self.per} x {self.vec}, "
                f"{self.groups} row groups of {self.rows_per_group} rows ({self.unroll} at a time"
                f"{', last-first' if self.reverse else ''}), "
                f"grid={self.grid} block={self.threads}; "
                f"{'+'.join(self.outputs)} {dest}")


@dataclass(frozen=True)
class BackwardPlan:
    """Everything the backward kernels need: the dx reduction and the parameter reductions.

    Attributes:
        stat, eps: as the forward (``"norm"`` or ``"rms"``).
        x_dtype, dy_dtype: dtypes of x and dy (dx has x's dtype).
        scale_dtype: dtype of the scale read to form ``g = dy * scale``; ``None`` when the spec has no scale.
        dscale_dtype, dshift_dtype: dtypes of the gradients written (``None`` when not produced).
        dx: the :class:`ReducePlan` of dx.
        params: the parameter :class:`ReducePlan` s (0, 1 or 2).
        kept, reduced: the forward's number of rows and elements per row.
        arch, sms: target and multiprocessor count the grids were sized for.
        fused: the :class:`FusedPlan` when dx runs as the fused register kernel (``dx`` then only describes
            the row reduction; ``params`` holds the parameter reductions it does not produce), else ``None``.
        cols: the :class:`ColsPlan` when dx is written by the column kernel (``dx.sums_only``), else ``None``.
        pdl: each kernel after the first is a programmatic dependent of the one before it (``BWD_PDL``; sm_90+).
        why: reasons, one line each.
    """

    stat: str
    eps: float
    x_dtype: str
    dy_dtype: str
    scale_dtype: str | None
    dscale_dtype: str | None
    dshift_dtype: str | None
    dx: ReducePlan
    params: tuple
    kept: int
    reduced: int
    arch: str
    sms: int
    fused: FusedPlan | None = None
    cols: ColsPlan | None = None
    pdl: bool = False
    why: tuple = field(default=(), compare=False)

    @property
    def workspace_floats(self) -> int:
        """float32 scratch elements one backward call needs (0: no workspace, also for a zero-size input, where
        nothing launches)."""
        if self.kept * self.reduced == 0:
            return 0
        fz = self.fused.workspace_floats if self.fused is not None else 0
        fz += self.cols.workspace_floats if self.cols is not None else 0
        return fz + sum(r.workspace_floats for r in ((() if self.fused else (self.dx,)) + self.params))

    def to_dict(self) -> dict:
        """Plain-data (JSON-serializable) form; keys the kernel cache."""
        d = asdict(self)
        d["why"] = list(self.why)
        return d

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict` (plain data: reductions, fused tiling, dtypes, workspace size); it
        round-trips through :meth:`from_json`."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "BackwardPlan":
        """The plan written by :meth:`to_json` (``normc plan --backward --json``), equal to the one written.

        Raises:
            normc.ArgumentError: (a ValueError) ``text`` is not a str, bytes or bytearray, is not JSON, or not a
                backward plan's JSON object; the message names the missing, unknown or malformed field (a value of
                the wrong type, a dtype or statistic normc does not know, an eps :func:`normc.spec` refuses).
        """
        d = _json_object(text, cls, _WRITER)
        params = d["params"]
        if not isinstance(params, list):
            raise ArgumentError(f"text: params is {params!r}; expected a list of reduction objects")
        d["dx"] = _reduce_from_json(d["dx"], "text: dx")
        d["params"] = tuple(_reduce_from_json(r, f"text: params[{i}]") for i, r in enumerate(params))
        for name, sub in (("fused", FusedPlan), ("cols", ColsPlan)):
            if d.get(name) is not None:
                d[name] = sub(**_tuples(_json_fields(d[name], sub, f"text: {name}", _WRITER)))
        d["why"] = _why_from_json(d)
        return cls(**{k: v if k in ("dx", "params", "fused", "cols") else _tuples(v) for k, v in d.items()})

    def describe(self) -> str:
        """Multi-line summary: each reduction's strategy, tiling and launch, then why."""
        lines = [f"backward: {self.kept} rows x {self.reduced} elements, x {self.x_dtype}, dy {self.dy_dtype}, "
                 f"stat={self.stat}, workspace={self.workspace_floats} floats"]
        if self.kept * self.reduced == 0:  # the runtime returns before any launch (as the forward's listing says)
            lines.append("launch:   none (zero-size input: dx is empty; dscale and dshift, where asked for, are "
                         "zeros)")
            return "\n".join(lines)
        if self.fused is not None:
            lines.append(self.fused.describe())
            lines += [r.describe() for r in self.params]
        else:
            lines.append(self.dx.describe())
            if self.cols is not None:
                lines.append(self.cols.describe())
            lines += [r.describe() for r in self.params]
        if self.pdl:
            lines.append("launch:   each kernel after the first as a programmatic dependent of the one before it")
        lines += [f"why:      {w}" for w in self.why]
        return "\n".join(lines)

    __str__ = describe


_WRITER = "BackwardPlan.to_json()"  # named in from_json's messages


def _tuples(v):
    """``v`` read from JSON with its lists made tuples, recursively (the plans hold tuples: hashable, equal)."""
    if isinstance(v, list):
        return tuple(_tuples(e) for e in v)
    if isinstance(v, dict):
        return {k: _tuples(e) for k, e in v.items()}
    return v


def _reduce_from_json(d, what) -> ReducePlan:
    """A :class:`ReducePlan` from its JSON object ``d`` (``what`` names it in errors)."""
    d = _json_fields(d, ReducePlan, what, _WRITER)
    axes = _axes_from_json(d["axes"], what, _WRITER)
    return ReducePlan(**{**_tuples(d), "axes": axes})


def _pdl(arch, fused, dx, params) -> bool:
    """Whether the plan's kernels are chained by programmatic dependent launch (see BWD_PDL; sm_90+, as
    clusters)."""
    if not _clusters_ok(arch) or not BWD_PDL:
        return False
    if BWD_PDL == 2:
        return True
    outer = (fused is None and dx.strategy == "outer") or any(r.strategy == "outer" for r in params)
    return not outer and not (fused is not None and fused.lane_outputs)


def _pow2_ceil(n):
    return 1 << max(n - 1, 0).bit_length()


def _param_axes(axes, which):
    """Canonical axes of the reduction of parameter ``which``: kept where its stride is not 0."""
    recs = [Axis(a.size, a.stride(which) == 0, a.x, a.out, a.scale, a.shift, a.stat) for a in axes if a.size > 1]
    out = canonicalize(recs)
    if not any(a.reduced for a in out):
        out = out + (Axis(1, True, 0, 0, 0, 0, 0),)
    return out


def _vec_ok(axes, tensor, vec, itemsize, align):
    """Whether ``tensor`` (scale or stat) can be read ``vec``-wide along the innermost axis."""
    inner = axes[-1]
    return (vec > 1 and inner.stride(tensor) == 1 and vec * itemsize <= MAX_VECTOR_BYTES
            and align % (vec * itemsize) == 0 and all(a.stride(tensor) % vec == 0 for a in axes[:-1]))


def _reduce_plan(role, outputs, axes, key, sums, dbytes, aligns, scale_info, sms, forced, why):
    nq = len(sums)
    inner = axes[-1]
    keys = math.prod(a.size for a in axes if not a.reduced)
    reduced = math.prod(a.size for a in axes if a.reduced)
    unit = inner.x == 1 and inner.out == 1
    vec = pick_vec(axes, inner.size, dbytes, aligns, tensors=("x", "out")) if unit else 1
    scale_vec = scale_info is not None and _vec_ok(axes, "scale", vec, scale_info[0], scale_info[1])
    stat_vec = _vec_ok(axes, "stat", vec, 4, 16)
    name = "dx" if role == "dx" else "+".join(outputs)
    if inner.reduced:
        nc = reduced // vec
        tpr = max(1, min(MAX_PERSISTENT_THREADS, _pow2_ceil(nc)))
        splits = 1
        if 0 < keys < sms and nc > tpr * LOOP_UNROLL:  # (no rows: nothing is launched, nothing to split)
            want = INNER_SPLIT_CTAS_PER_SM * sms
            splits = max(1, min(-(-want // keys) if INNER_SPLIT_ROUND_UP else want // keys, nc // (tpr * LOOP_UNROLL)))
        if forced:
            splits = FORCED_SPLITS
        if splits > 1:
            rpc, threads, grid = 1, tpr, keys * splits
            why.append(f"{name}: {keys} sums of {reduced} (< {sms} SMs): each split over {splits} CTAs, "
                       f"float32 partials added in split order by a second kernel")
        else:
            rpc = CTA_THREADS // tpr if tpr < CTA_THREADS else 1
            threads = max(tpr, CTA_THREADS)
            grid = -(-keys // rpc)
            why.append(f"{name}: innermost axis summed: {tpr} lanes per sum, {rpc} sums per CTA")
        return ReducePlan(role, outputs, "inner", axes, key, keys, reduced, nq, vec, scale_vec, stat_vec,
                          threads, tpr, rpc, 0, 0, 0, splits, grid, 0, sums)
    cb = inner.size
    nxc = max(1, min(cb // vec, 32))  # no columns (an empty kept axis): one, of no tiles (nothing is launched)
    threads = CTA_THREADS
    ry = threads // nxc
    tile = nxc * vec
    base = (keys // max(cb, 1)) * -(-cb // tile)
    splits = 1
    if 0 < base < sms:  # (no column tiles: nothing is launched)
        splits = max(1, min(-(-OUTER_SPLIT_CTAS_PER_SM * sms // base), reduced // (ry * LOOP_UNROLL)))
    if forced:
        splits = FORCED_SPLITS
    if splits > 1:
        why.append(f"{name}: innermost axis kept: lanes along {cb} columns; only {base} column tiles: rows "
                   f"split over {splits} CTAs each ({base * splits} CTAs), float32 partials added in split "
                   f"order by a second kernel")
    else:
        why.append(f"{name}: innermost axis kept: lanes along {cb} columns, {base} column tiles, rows over "
                   f"{ry} y-threads")
    return ReducePlan(role, outputs, "outer", axes, key, keys, reduced, nq, vec, scale_vec, stat_vec,
                      threads, 0, 0, nxc, ry, tile, splits, base * splits, 0, sums,
                      min_ctas=OUTER_SPLIT_CTAS_PER_SM if splits > 1 and OUTER_SPLIT_BOUND else 0)


def _route(axes, tensor):
    """How the fused kernel produces the gradient of parameter ``tensor``: ``"lane"`` (it varies along every
    summed axis and no kept axis), ``"row"`` (constant along each row), or ``None`` (general path)."""
    red = [a for a in axes if a.reduced and a.size > 1]
    kep = [a for a in axes if not a.reduced and a.size > 1]
    if all(a.stride(tensor) == 0 for a in kep) and all(a.stride(tensor) != 0 for a in red):
        return "lane"
    if all(a.stride(tensor) == 0 for a in red) and _dense_kept(kep, tensor):
        return "row"
    return None


def _segment_len(axes, tensor, dx):
    """Elements per segment when parameter ``tensor`` can take the segment route of the unsplit inner dx
    kernel ``dx`` (see SEGMENTS), else 0: it varies along the outer summed axes of a row, is constant along the
    inner ones (together ``seg_len`` elements, a multiple of a warp's 32 vectors), and its elements form a
    dense mixed radix over the axes it varies along."""
    if not SEGMENTS or dx.strategy != "inner" or dx.splits != 1 or dx.tpr < 32:
        return 0
    red = [a for a in axes if a.reduced and a.size > 1]
    kep = [a for a in axes if not a.reduced and a.size > 1]
    var = [a.stride(tensor) != 0 for a in red]
    if not any(var) or all(var) or var.index(False) != sum(var):  # varying axes first, then constant ones
        return 0
    seg = math.prod(a.size for a, v in zip(red, var) if not v)
    if seg % (32 * dx.vec) or not _dense_kept(kep + [a for a, v in zip(red, var) if v], tensor):
        return 0
    return seg


def _sum_name(output):
    """The per-row / per-element sum a parameter gradient is made of: ``dyx`` (dscale) or ``dy`` (dshift)."""
    return "dyx" if output == "dscale" else "dy"


def _dx_sums(p, row_outputs):
    """The sums the general dx kernel takes per row (see :class:`ReducePlan` ``sums``)."""
    norm = p.stat == "norm"
    if not row_outputs:
        return ("g", "gx") if norm else ("gx",)
    if p.scale_dtype is None or all(a.scale == 0 for a in p.axes if a.reduced and a.size > 1):
        return (("dy",) if norm or "dshift" in row_outputs else ()) + ("dyx",)
    return (("g",) if norm else ()) + ("gx",) + tuple(_sum_name(o) for o in row_outputs)


def _dense_kept(kep, tensor):
    """Whether the parameter's offsets over its kept axes are a dense mixed radix (the row-finish kernel
    decomposes a parameter index that way)."""
    ax = sorted((a for a in kep if a.stride(tensor) != 0), key=lambda a: -a.stride(tensor))
    want = 1
    for a in reversed(ax):
        if a.stride(tensor) != want:
            return False
        want *= a.size
    return True


def _cta_values(tpr, lane):
    """Values of a row a thread of a one-CTA fused dx kernel may hold with ``tpr`` lanes a row and the
    lane-route outputs ``lane`` (FUSED_MAX_VALUES; FUSED_WARP_MAX_VALUES for a row in one warp without them)."""
    return FUSED_WARP_MAX_VALUES if not lane and tpr <= 32 else FUSED_MAX_VALUES


def _fused_plan(p, dx, want, dbytes, sms, ws_offset, why, arch="sm_90", max_cluster=None, force_cluster=False,
                bound=True, prefetch=True):
    """The :class:`FusedPlan` for dx (inner strategy) when a row fits in the registers of one CTA or of a
    thread-block cluster (up to ``max_cluster`` CTAs; ``force_cluster``: the smallest cluster and lanes that
    hold the row, for tests), else ``None``."""
    if dx.strategy != "inner":
        return None, want
    V = dx.vec
    nc = p.reduced // V
    routes = {o: _route(p.axes, t) for o, t in want}
    lane = tuple(o for o, _ in want if routes[o] == "lane")
    row = tuple(o for o, _ in want if routes[o] == "row")
    rest = [(o, t) for o, t in want if routes[o] is None]
    csizes = tuple(c for c in CLUSTER_SIZES if max_cluster is None or c <= max_cluster) if (
        FUSED_CLUSTER and _clusters_ok(arch)) else ()
    if not force_cluster:  # the measured limits (see FUSED_MAX_CLUSTER, FUSED_CLUSTER_MIN_ITEMSIZE)
        nbytes = p.kept * p.reduced * (dbytes["x"] + dbytes["out"])  # x and dy
        big = bool(FUSED_PREFETCH) and nbytes > FUSED_CLUSTER_16BIT_MIN_BYTES
        csizes = tuple(c for c in csizes if c <= FUSED_MAX_CLUSTER) if (
            dbytes["x"] >= FUSED_CLUSTER_MIN_ITEMSIZE or big) else ()
    # values a cluster CTA's thread may hold: xhat and dy, plus two partials per value with lane outputs
    climit = FUSED_MAX_VALUES if lane else FUSED_CLUSTER_MAX_VALUES
    cluster = 1
    if force_cluster and csizes and nc > 1:
        C = csizes[0]
        tpr = min(max(_pow2_ceil(-(-nc // C)), 32), MAX_PERSISTENT_THREADS)
        if -(-nc // (C * tpr)) * V <= climit:
            cluster = C
    if cluster == 1:
        tpr = 1
        while tpr < MAX_PERSISTENT_THREADS and -(-nc // tpr) * V > FUSED_MAX_VALUES:
            tpr *= 2
        if not lane and tpr > 32 and -(-nc // 32) * V <= FUSED_WARP_MAX_VALUES:  # one warp a row (see there)
            tpr = 32
        # few rows: more lanes per row (fewer rows per CTA) until the row groups cover the SMs
        while tpr < MAX_PERSISTENT_THREADS and tpr < nc and -(-dx.keys * tpr // max(tpr, CTA_THREADS)) < sms:
            tpr *= 2
        if -(-nc // tpr) * V > _cta_values(tpr, lane):
            for C in csizes:
                if -(-nc // (C * MAX_PERSISTENT_THREADS)) * V <= climit:
                    tpr, cluster = MAX_PERSISTENT_THREADS, C
                    break
    per = -(-nc // (cluster * tpr))
    if per * V > (climit if cluster > 1 else _cta_values(tpr, lane)):
        why.append(f"dx: row of {p.reduced} exceeds {MAX_PERSISTENT_THREADS} threads x {FUSED_MAX_VALUES} values"
                   + (f" and a cluster of {csizes[-1]} CTAs x {climit} values" if csizes else "")
                   + ": general (two-pass) path")
        return None, want
    threads = tpr if cluster > 1 else max(tpr, CTA_THREADS)
    rpc = threads // tpr
    keys = dx.keys
    groups = -(-keys // rpc)
    cps = max(1, FUSED_THREADS_PER_SM // threads)
    if (bound and cluster == 1 and dbytes["x"] <= FUSED_BOUND_ITEMSIZE and len(lane) <= 1
            and per * V <= FUSED_MAX_VALUES):  # more values than that do not fit the bound's 80 registers
        cps = max(cps, FUSED_BOUND_THREADS_PER_SM // threads)
    traffic = p.kept * p.reduced * (2 * dbytes["x"] + dbytes["out"])
    while cps > 1 and len(lane) * cps * sms * p.reduced * 4 * FUSED_PARTIAL_FRACTION > traffic:
        cps -= 1
    ctas_bound = cps if cps * threads > FUSED_THREADS_PER_SM else 0  # more CTAs than fit at 128 registers
    grid = min(groups, max(1, cps * sms // cluster)) * cluster
    gpc = -(-groups // (grid // cluster))
    # where it pays (see FUSED_PREFETCH): a CTA has a next row, the row sums cross warps (or CTAs of a
    # cluster), at most FUSED_THREADS_PER_SM threads a SM
    prefetch = (bool(FUSED_PREFETCH) and prefetch and bound and gpc > 1 and (tpr > 32 or cluster > 1)
                and cps * threads <= FUSED_THREADS_PER_SM)
    if prefetch:  # under a bound of the planned CTAs per SM: where ptxas would spill, the runtime plans again
        ctas_bound = max(ctas_bound, cps)  # without prefetch (then, if that spills too, without the bound)
    red = [a for a in p.axes if a.reduced]
    kep = [a for a in p.axes if not a.reduced]
    if p.scale_dtype is None:
        smode = "none"
    elif all(a.scale == 0 for a in kep):
        smode = "lane"
    elif all(a.scale == 0 for a in red):
        smode = "row"
    else:
        smode = "mixed"
    nlane = len(lane) * (grid // cluster) * p.reduced
    fz = FusedPlan(tpr=tpr, per=per, vec=V, threads=threads, rows_per_cta=rpc, groups=groups, groups_per_cta=gpc,
                   grid=grid, scale_mode=smode, lane_outputs=lane, row_outputs=row, lane_params=p.reduced,
                   ws_offset=ws_offset, row_ws_offset=ws_offset + nlane, row_nq=len(row), keys=keys,
                   cluster=cluster, min_ctas=ctas_bound,
                   max_spill=FUSED_BOUND_MAX_SPILL if ctas_bound else 0, prefetch=prefetch)
    where = (f"a cluster of {cluster} CTAs x {tpr} lanes x {per} x {V}, row sums added through distributed "
             f"shared memory" if cluster > 1 else f"{tpr} lanes x {per} x {V}")
    why.append(f"dx fused: row of {p.reduced} held in registers ({where}); x and dy read once, "
               f"{grid} CTAs x {gpc} groups of {rpc} rows"
               + (f" ({ctas_bound} CTAs per SM under the launch bound .minnctapersm {ctas_bound})"
                  if ctas_bound else "")
               + ("; each row's loads issued one row ahead (prefetch)" if prefetch else "")
               + (f"; {'+'.join(lane)} from per-{'cluster' if cluster > 1 else 'CTA'} partials" if lane else "")
               + (f"; {'+'.join(row)} from per-row sums" if row else ""))
    return fz, rest


def _cols_plan(p, dx, outputs, dbytes, sms, ws_offset, forced, why):
    """The :class:`ColsPlan` writing dx and ``outputs`` (lane-route gradients) of a general inner dx."""
    V = dx.vec
    nc = p.reduced // V
    T = max(32, min(COLS_THREADS, _pow2_ceil(nc)))  # short rows: down to one warp per CTA
    keys = dx.keys
    traffic = keys * p.reduced * (2 * dbytes["x"] + dbytes["out"])
    gcap = max(1, min(keys, traffic // (len(outputs) * p.reduced * 8 * COLS_PARTIAL_FRACTION)))
    per_sm = COLS_CTAS_PER_SM * (COLS_THREADS // T)
    want = per_sm * sms
    # as many values per thread as fit, fewer when the chunks times the row groups allowed would not make
    # `want` CTAs (few rows: 4 x 400001 gets 521 chunks of 3 values per thread, not 98 of 16)
    per = min(max(1, COLS_MAX_VALUES // V), -(-nc // (T * -(-want // gcap))))
    chunks = -(-nc // (T * per))
    per = -(-nc // (chunks * T))  # the same chunks, as few vectors per thread as cover the row
    # row groups: whole waves (at most `want` CTAs; never a few CTAs in a last wave of their own)
    groups = max(1, min(gcap, want // chunks))
    if forced:
        groups = min(FORCED_SPLITS, keys)
    groups = max(groups, -(-keys // COLS_MAX_GROUP_ROWS))
    rpg = -(-keys // groups)
    groups = -(-keys // rpg)
    row_bytes = T * per * V * (dbytes["x"] + dbytes["out"])  # x and dy loads of a row, per CTA
    unroll = max(1, min(COLS_MAX_UNROLL, rpg, -(-COLS_LOAD_BYTES * T // row_bytes)))
    unroll = -(-rpg // -(-rpg // unroll))  # the same trips, evened out (4 rows: 2 + 2, not 3 + 1 masked)
    cp = ColsPlan(threads=T, per=per, vec=V, chunks=chunks, groups=groups, rows_per_group=rpg,
                  grid=chunks * groups, outputs=tuple(outputs), params=p.reduced, keys=keys,
                  sum_splits=dx.splits, ws_offset=ws_offset, unroll=unroll, min_ctas=min(32, per_sm),
                  reverse=COLS_REVERSE)
    why.append(f"{'+'.join(outputs)}: vary along the row only: accumulated by the column kernel that writes dx "
               f"({chunks} column chunks x {groups} row groups of {rpg} rows), x and dy read twice, not three "
               f"times")
    return cp


def make_backward_plan(problem, *, dy_dtype=None, dy_align=16, need_dscale=True, need_dshift=True,
                       dshift_dtype=None, arch="sm_90", sms=DEFAULT_SMS, schedule=None,
                       max_cluster=None, fused_bound=True, fused_prefetch=True) -> BackwardPlan:
    """Plan the gradient kernels of a forward :class:`normc.problem.Problem`.

    Args:
        problem: the forward problem, made with dx's strides as its ``out`` strides (dy must be laid out
            like dx) and x's dtype as ``out_dtype`` (dx has x's dtype).
        dy_dtype: dy's dtype (default: x's); dy_align: byte alignment of dy's base pointer.
        need_dscale, need_dshift: whether to produce them (ignored when the spec has no such step).
        dshift_dtype: dtype of dshift (default: the problem's shift dtype).
        arch, sms: target and multiprocessor count used to size the grids.
        schedule: ``"split"`` forces 2 splits in every reduction (tests); ``"looped"`` keeps the general (unfused)
            kernels; ``"cluster"`` spreads a fused dx's rows over a cluster of the smallest size (2) with the
            fewest lanes that hold them, without the FUSED_MAX_CLUSTER / itemsize limits (sm_90+, tests); where
            2 CTAs cannot hold a row (or it is one vector), the default choice applies; ignored where dx cannot
            be fused; other values are ignored.
        max_cluster: largest thread-block cluster the fused dx kernel may use (default: the largest of
            ``planner.CLUSTER_SIZES``; 1: none); the runtime lowers it when the device cannot co-schedule the
            planned cluster.
        fused_bound: whether a fused dx kernel with 16-bit x may aim for 3 CTAs per SM under a launch bound
            (FUSED_BOUND_THREADS_PER_SM), and may prefetch (which needs a bound too); the runtime plans again
            with False when its kernel would spill under the bound (ptxas drops it then).
        fused_prefetch: whether a fused dx kernel may prefetch the next row (FUSED_PREFETCH, under the bound of
            its CTAs per SM); the runtime first plans again with False when a prefetching kernel would spill.

    Returns:
        :class:`BackwardPlan`.
    """
    p = problem
    dy_dtype = dy_dtype or p.x_dtype
    why = []
    al = p.align
    isz = max(ITEMSIZE[dy_dtype], ITEMSIZE[p.x_dtype])
    dbytes = {"x": ITEMSIZE[p.x_dtype], "out": isz}
    aligns = {"x": al["x"], "out": min(al["out"], dy_align)}
    scale_info = None if p.scale_dtype is None else (ITEMSIZE[p.scale_dtype], al["scale"])
    forced = schedule == "split"
    dx_why = []
    dx = _reduce_plan("dx", (), p.axes, "stat", _dx_sums(p, ()), dbytes, aligns, scale_info, sms, forced, dx_why)
    want = []
    if need_dscale and p.scale_dtype is not None:
        want.append(("dscale", "scale"))
    if need_dshift and p.shift_dtype is not None:
        want.append(("dshift", "shift"))
    fused = cols = None
    empty = p.kept * p.reduced == 0  # nothing to launch (the runtime returns early): the general plan describes it
    if schedule not in ("split", "looped") and not empty:
        fused, want = _fused_plan(p, dx, want, dbytes, sms, 0, why, arch=arch, max_cluster=max_cluster,
                                  force_cluster=schedule == "cluster", bound=fused_bound,
                                  prefetch=fused_prefetch)
    if fused is None:
        # parameters constant along every row: their gradients from dx's per-row sums (x and dy read twice)
        row = tuple(o for o, t in want if _route(p.axes, t) == "row")
        if row:
            want = [(o, t) for o, t in want if o not in row]
            sums = _dx_sums(p, row)
            dx = replace(dx, sums=sums, nq=len(sums))
            dx = replace(dx, row_outputs=row, row_ws_offset=dx.workspace_floats)
            dx_why.append(f"{'+'.join(row)}: constant along each row: from dx's per-row sums of "
                          f"{', '.join(sums)}, added per parameter element by normc_bwd_row_finish")
        lane = [o for o, t in want if _route(p.axes, t) == "lane"]
        use_cols = COLS and not row and lane and dx.strategy == "inner" and not empty
        # parameters varying along the outer summed axes only: from dx's per-segment sums (x and dy read twice);
        # not with the column pass, whose dx kernel only takes the row sums (the other parameter then keeps
        # its own reduction)
        segs = [(o, _segment_len(p.axes, t, dx)) for o, t in want] if not use_cols else []
        first = next((n for _, n in segs if n), 0)  # one segment length per kernel: the first output's
        segs = [(o, n) for o, n in segs if n and n == first]
        slots = dx.rows_per_cta * dx.seg_slots * len(segs)
        if segs and 4 * slots <= SEG_MAX_SHARED:
            seg = tuple(o for o, _ in segs)
            want = [(o, t) for o, t in want if o not in seg]
            dx = replace(dx, seg_outputs=seg, seg_len=segs[0][1])
            dx_why.append(f"{'+'.join(seg)}: constant along the inner {segs[0][1]} elements of each row: from dx's "
                          f"per-segment sums ({dx.segments} a row, one shared-memory slot per warp and vector), "
                          f"added per parameter element by normc_bwd_seg_finish")
        if use_cols:
            dx = replace(dx, sums_only=True)
            want = [(o, t) for o, t in want if o not in lane]
            cols = _cols_plan(p, dx, lane, dbytes, sms, dx.workspace_floats, forced, dx_why)
        if DX_MERGE and dx.strategy == "outer" and dx.splits > 1 and not dx.sums_only:
            dx = replace(dx, merged=True)
            dx_why.append(f"dx: the {dx.splits} split partials of each of the {dx.keys} rows added once by "
                          f"normc_bwd_dx_merge, not by each finish CTA")
        if FOLD_DX and dx.strategy == "outer":
            dx = replace(dx, fold=True)
            dx_why.append("dx: pass 2 folds rstd, mean, scale and the row means into three factors per column "
                          "where they are constant along the rows (dx = A*dy - C - ((x - mean)*S)*|S|)")
        if REVERSE_REREAD and dx.splits > 1 and not dx.sums_only:
            dx = replace(dx, reverse=True)
            dx_why.append("dx: the finish kernel re-reads x and dy in reverse (work items and slices last-first), "
                          "starting on what the partial kernel left in L2")
        elif REVERSE_LOOPED and dx.splits == 1 and not dx.sums_only:
            dx = replace(dx, reverse=True)
            dx_why.append("dx: the dx pass re-reads each CTA's rows last-first, starting on what its sums pass "
                          "left in L2")
        unroll = DX_UNROLL if dx.strategy == "inner" else DX_UNROLL_OUTER
        if unroll > 1 and not dx.sums_only:
            dx = replace(dx, unroll=unroll)
            dx_why.append(f"dx: the dx pass loads {unroll} vectors of x and dy per thread before storing any")
        why[:0] = dx_why
    groups = []
    if len(want) == 2 and all(a.scale == a.shift for a in p.axes):
        groups.append((("dscale", "dshift"), "scale"))
    else:
        groups += [((o,), t) for o, t in want]
    params = []
    off = fused.workspace_floats if fused is not None else dx.workspace_floats
    off += cols.workspace_floats if cols is not None else 0
    for outs, key in groups:
        axes = _param_axes(p.axes, key)
        rp = _reduce_plan("param", outs, axes, key, tuple(_sum_name(o) for o in outs), dbytes, aligns, None, sms,
                          forced, why)
        rp = replace(rp, ws_offset=off)
        off += rp.workspace_floats
        params.append(rp)
    grids = [r.grid for r in params] + [dx.grid if fused is None else fused.grid]
    check_grid(max(grids + ([cols.grid] if cols is not None else [])), p.kept, p.reduced)
    produced = {o for r in params for o in r.outputs} | set(dx.row_outputs) | set(dx.seg_outputs)
    if cols is not None:
        produced |= set(cols.outputs)
    if fused is not None:
        produced |= set(fused.lane_outputs + fused.row_outputs)
    plan = BackwardPlan(
        stat=p.stat, eps=p.eps, x_dtype=p.x_dtype, dy_dtype=dy_dtype, scale_dtype=p.scale_dtype,
        dscale_dtype=p.scale_dtype if "dscale" in produced else None,
        dshift_dtype=(dshift_dtype or p.shift_dtype) if "dshift" in produced else None,
        dx=dx, params=tuple(params), kept=p.kept, reduced=p.reduced, arch=arch, sms=sms, fused=fused,
        cols=cols, pdl=_pdl(arch, fused, dx, params), why=tuple(why),
    )
    if plan.pdl:  # a single kernel has nothing to chain
        from .lowering.backward import kernel_count

        if kernel_count(plan) < 2:
            plan = replace(plan, pdl=False)
    return plan
