"""The planner: canonical problem -> strategy, schedule and tiling, as a frozen, printable :class:`Plan`.

Decision tree (``docs/planner.md`` explains it at length; the constants below carry their reasons):

* **strategy** from the innermost canonical axis (the one with the smallest x stride):
    - ``inner``: it is a reduction axis (layer/RMS norm, NCHW instance/group norm, NCHW batch statistics).
      Lanes run along the reduction; a row (one kept index) is owned by ``tpr`` threads.
    - ``outer``: it is a kept axis (NHWC instance norm, NHWC batch statistics). Lanes run along the
      contiguous kept axis ("columns"), rows of the reduction over y-threads and a serial loop, then a
      cross-row combine in shared memory.
    - ``mixed``: it is a *short* reduction axis (under ``MIXED_MAX_RUN_BYTES``) sitting inside a contiguous
      kept axis, with more reduction axes outside (NHWC group norm ``n h w (g k)``). The contiguous
      ``(g k)`` block is treated as columns as in ``outer``, then columns of one group are merged.
* **schedule**:
    - ``persistent``: every value of a reduction is held in registers by the threads that own it (one CTA, a
      thread-block cluster, or CTAs of a co-resident grid: ``GRID_PERSISTENT``): x is read
      once (two-pass mean/variance from registers, then normalize).
    - ``looped``: one CTA (or sub-warp) per reduction, a statistics loop (per-thread sums shifted by the
      thread's first value), then a second pass that re-reads x (mostly from L2).
    - ``split``: too few reductions to fill the GPU: each reduction is spread over ``splits`` CTAs; kernel 1
      writes partial statistics (n, mean, M2) to a float32 workspace; then (inner) kernel 2 merges them
      (Chan) and normalizes, or (outer/mixed) kernel 2 merges them once per column tile and kernel 3 normalizes.
    - ``coop`` (inner, only when forced or autotuned): the split's two halves in one cooperative kernel
      over a co-resident grid. A CTA writes its slice's partial statistics, waits on a per-reduction arrival
      counter until the other ``splits - 1`` have written theirs, merges them and normalizes its slice,
      re-reading it from L2, so x comes from HBM about once. Measured slower than ``split`` on the H200
      (2026-12-01, tests/gpu_sweep.py): 64 x 2M float32 523-543 us vs 466; 64 x 2M float16 296-311 vs 268;
      10 x 10M float32 616-631 vs 447; 100 x 1M 549-560 vs 391; 4 x 10M 477-498 vs 286. Its kernels need
      62-109 registers, so one 512-thread CTA per SM runs, and every CTA idles while its row's slowest CTA
      finishes (more splits per row were slower still: 132 splits 856 us vs 44 splits 543 us). Not the waits
      alone: a version pipelined by one round (reduce item k, then finish item k - 1, whose row was complete
      a round earlier) was no faster (64 x 2M float32: 530 us vs 523; 4 x 10M: 472 vs 477); one 512-thread
      CTA per SM keeps too few loads in flight. ``COOP_DEFAULT`` switches it on for sweeps.
* **tiling**: vector width from alignment and extents (never from the dtype alone), threads per row,
  rows per CTA, values per thread.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields

from .canonical import Axis
from .errors import ArgumentError
from .problem import DTYPES
from .spec import STATS
from .lowering.codegen import STREAM_THREADS_PER_SM  # the streaming kernels' launch bounds: grids are sized to them
from .lowering.codegen import columns_finish, row_shared_params  # inner splits: column-major second kernel?

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}

# 16-byte vectors are the widest global load/store (LDG.128); they maximize bytes per instruction
# (HOPPER.md, "16-byte accesses per thread").
MAX_VECTOR_BYTES = 16
# Values a thread may hold in registers for a persistent schedule: 32 float32 registers of data leaves
# room for addressing and statistics under 64 registers/thread, which still allows 1024-thread CTAs
# (64K registers per SM). nvFuser caps its persistent buffer at about half the register file for the same
# reason (design/anchors.md).
MAX_VALUES_PER_THREAD = 32
# CTA size for inner schedules with several rows per CTA and for outer schedules: 256 threads (8 warps)
# balances occupancy and per-CTA combine cost; nvFuser's outer persistent grid uses 256-thread CTAs
# (design/anchors.md), and odd sizes such as 400 are what made Fuser#443 slow.
CTA_THREADS = 256
# Largest CTA for a persistent row: 1024 threads would cap registers at 64/thread (64K per SM).
MAX_PERSISTENT_THREADS = 512
# 16-bit inner rows too long for one CTA: with at least SMs / LOOPED_16BIT_MIN_ROWS_PER_SM rows, one streaming
# CTA per row (looped) instead of a cluster that holds the row in float32 registers (64 values, 98-128
# registers: one 512-thread CTA per SM, for 16 bytes streamed per 8 values). Measured on the H200
# (tests/gpu_sweep.py, 2026-12-02): NCHW batch statistics (256, 256, 28, 28) float16 cluster 122.3 us, looped
# 87.2 us; NCDHW instance norm (2, 64, 64^3) float16 (128 rows) 60.5 vs 56.3 us. float32 rows keep the cluster
# ((2, 64, 64^3) float32: 88.6 vs 108.5 us looped; 1000 x 100,000: 286 vs 342 us).
LOOPED_16BIT_MIN_ROWS_PER_SM = 2
# Threads of an inner CTA whose threads hold up to 2 x MAX_VALUES_PER_THREAD values (a row too long for
# MAX_PERSISTENT_THREADS x MAX_VALUES_PER_THREAD), and of the CTAs of an inner cluster. 512 threads at up to
# 128 registers fit one CTA per SM; 256 fit two, so one CTA's loads overlap the other's reduction and stores.
INNER_WIDE_THREADS = 512
# A looped/split CTA streams its reduction with 512 threads: 4 such CTAs fill an SM (2048 threads).
STREAM_THREADS = 512
# Vectors loaded before any is used in looped schedules (memory-level parallelism: several independent
# loads in flight per thread, PyTorch's channels-last batch norm uses 4).
LOOP_UNROLL = 4
# Inner looped/split schedules whose vectors are narrower than 16 bytes (rows not aligned for wider ones, e.g.
# 4 x 10,000,001 float32: scalar accesses) load more of them per trip, so each thread keeps as many bytes in
# flight as LOOP_UNROLL 16-byte vectors would: at most this many vectors per trip (1 keeps LOOP_UNROLL).
# Measured on the H200 (tests/gpu_sweep.py, 2026-12-02): 4 x 10,000,001 float32 split 269.1 -> 259.1 us.
NARROW_LOOP_UNROLL = 16
# Outer/mixed clusters: the most values a thread of a cluster CTA may hold (float32 registers); the smallest
# cluster whose CTAs fit is taken. 32 was measured slower on the H200 (tests/gpu_sweep.py, 2026-12-02): the
# outer kernels take 80-127 registers whatever they hold (addressing and per-column statistics), so fewer
# values only add CTAs and cluster barriers: NHWC instance norm (256, 128, 28, 28) float32 76.4 -> 82.4 us
# (64-column tiles) or 99.0 (32 columns); NHWC group norm (8, 640, 32, 32) float16 27.0 -> 50.2 us.
OUTER_CLUSTER_MAX_VALUES = 2 * MAX_VALUES_PER_THREAD
# Outer strategy: vectors of the contiguous kept block one column tile spans (32 x 16 B = 512 B: one warp
# covers a tile row); narrower tiles mean more, smaller CTAs (or clusters) per reduction's rows. Measured on an
# H100 (tests/gpu_sweep.py, 2026-12-05), us, 32 / 8 / 4 / 2 vectors: NHWC instance norm (256, 128, 28, 28)
# float32 93.4 (cluster) / 102.3 / 141.4 (one CTA, no cluster) / 110.0, float16 54.5 / 55.6 / 56.6 / 204.0
# (persistent); NDHWC float32 (2, 64, 64^3) split 146.6 / 154.1 / 215.8 / 328.3 (docs/performance.md).
OUTER_TILE_VECTORS = 32
# Threads of an outer/mixed CTA that streams its rows (looped and split schedules).
OUTER_STREAM_THREADS = CTA_THREADS
# ... except the outer looped schedule's one CTA per column tile (enough tiles for the SMs): 512 threads, each
# loading 8 vectors a loop trip (statistics and re-read), so each tile has 16 KB more in flight. Measured
# (tests/gpu_sweep.py, NHWC instance norm (256, 128, 28, 28) float16, the one anchor row planned so), µs,
# 256 threads x 4 vectors / 512 x 4 / 512 x 8: H100 (2026-12-07) 53.7 / 54.0 / 48.6; H200 (2026-12-05)
# 43.2 / 42.1 / 41.3. As the default, on another H100 in two processes: 48.1 and 48.2 against 54.9 and 54.3.
# The split schedules and the mixed strategy's looped one (not measured: no anchor row) keep
# OUTER_STREAM_THREADS and LOOP_UNROLL: 512 threads cost the mixed split of NHWC group norm (8, 320, 64, 64)
# 37.0 -> 60.2 us, 8 vectors the NDHWC float16 split (2, 64, 64^3) 61.5 -> 65.2 (H200, 2026-12-05).
OUTER_LOOPED_THREADS = 512
OUTER_LOOPED_UNROLL = 8
# A reduction run shorter than this many bytes is too short to coalesce along: prefer the mixed strategy.
# One warp access should touch >= 128 contiguous bytes (quack coalescing notes, design/anchors.md); with
# 16-byte vectors a 256-byte run feeds 16 lanes.
MIXED_MAX_RUN_BYTES = 256
# Mixed strategy: a CTA's column tile holds whole groups and spans at least this many contiguous bytes
# (one 128-byte line per row, so a warp's accesses stay coalesced) before it holds more groups.
MIXED_MIN_TILE_BYTES = 128
# Outer reductions too long for registers: one CTA per column tile (single kernel, the re-read mostly hits
# L2) once there is a tile per SM; below that, split the rows over CTAs. Measured on the H200 for NHWC
# instance norm (256, 128, 28, 28): float16 74.4 us looped vs 78.3 us split, float32 108.7 vs 101.2.
OUTER_LOOPED_MIN_TILES_PER_SM = 1
# Inner rows too long for registers: one streaming CTA per row once there is a row per SM; below that, split.
# Measured on the H200 (tests/gpu_anchors.py --schedules): 256 rows x 25,088 (group norm NCHW) 30.8 us looped
# vs 54.2 us split; 100 rows x 1M 456 us looped vs 396 us split; 32 rows x 409,600 152 us vs 79 us.
INNER_LOOPED_MIN_ROWS_PER_SM = 1
# Mixed (NHWC group norm) split: the second kernel merges splits x tile partials in one CTA per tile, so
# bound their product. Measured: 8 x 1280 x 16 x 16 with 64 splits 156 us vs 4 splits 76 us.
MIXED_MAX_SPLIT_PARTIALS = 32768
# Backward splits (normc.backward_plan): 512-thread-equivalents of CTAs per SM their grids aim for.
SPLIT_CTAS_PER_SM = 4
# Forward outer/mixed split: 512-thread-equivalents of CTAs per SM its grid aims for (2 x 512 threads: with
# STREAM_THREADS_PER_SM resident, one wave), so each CTA streams more rows and the merge has fewer partials.
# Measured on the H200 (tests/gpu_sweep.py, 2026-12-02): first where x fits in the L2, 4 -> 2: NDHWC float16
# (2, 128, 32^3) 28.9 -> 26.2 us; NHWC float32 (1, 32, 640, 640) 54.3 -> 50.4, (1, 64, 320, 320) 31.0 ->
# 27.1, (1, 128, 160, 160) 20.1 -> 20.5; NHWC group norm (8, 320, 64, 64) float16 48.6 -> 40.8 (larger x then
# lost or held, with per-value Welford updates and without PDL). Then, with shifted sums and PDL, for every
# size, 4 -> 2 (8): NDHWC (2, 64, 64^3) float16 67.4 -> 63.2 (77.8), NHWC batch statistics (256, 256, 28,
# 28) float16 97.8 -> 93.6 (106.8), NDHWC float32 (2, 64, 64^3) 113.1 -> 111.5 (115.7), (2, 32, 128^3)
# float16 219.4 -> 215.9 (233.2), float32 (4, 64, 64^3) 207.5 -> 208.9, (2, 64, 128^3) 801.8 -> 803.2,
# (4, 256, 32^3) 110.3 -> 110.2. The splits are rounded down so the grid never spills into a second wave:
# rounded up, NHWC group norm (8, 320, 64, 64) float16 got 17 splits x 32 tiles = 544 CTAs for 528 slots.
OUTER_SPLIT_CTAS_PER_SM = 2
# Outer split, third kernel (normalize): CTAs per split (Plan.finish_splits), each re-reading 1/k of the
# split's rows, while the partial kernel keeps its one-wave grid (and the merge its `splits` partials). Its
# CTAs stream with nothing to merge (the per-column factors are in the workspace), so more, shorter CTAs
# cost little and shorten the tail. Capped so that each CTA keeps at least one loop trip of rows. Measured on
# the H200 (tests/gpu_sweep.py, 2026-12-04, one run), us, 1 / 2 / 4 / 8: NDHWC float32 (4, 64, 64^3) 209.5 /
# 207.6 / 207.1 / 204.9, (2, 64, 64^3) 111.6 / 111.6 / 110.5 / 109.1; float16 (2, 64, 64^3) 63.7 / 62.4 /
# 61.4 / 61.0, (2, 32, 128^3) 216.5 / 215.0 / 218.2 / 214.6; NHWC batch statistics float16 (256, 256, 28,
# 28) 94.0 / 92.4 / 92.3 / 92.6; NHWC float32 (1, 32, 640, 640) 50.9 / 50.3 / 50.0 / 49.9. The inner split's
# finish also merges the partials in every CTA; there 8 gained 1.4% on 128 rows of 2M float32 and lost on
# rows of 100-400K (forced split: 52.1 -> 53.1, 29.5 -> 34.8 us at 2), so the inner split keeps 1.
OUTER_FINISH_SPLITS = 8
# The same for the mixed strategy (NHWC group norm), whose split shares the outer kernels.
MIXED_FINISH_SPLITS = 1
# Inner split, normalize kernel as a flat grid: where a split's slice is at least INNER_FLAT_MIN_TRIPS loop
# trips (TPR x per_thread vectors each), three kernels instead of two: the partial statistics; a middle
# kernel merging each row's partials once (a thread per row) into its mean and factor; a normalize kernel of
# Plan.finish_splits CTAs per split, each INNER_FINISH_TRIPS trips, with nothing to merge. (Two kernels: each
# CTA of the second merges its row's partials, then loops over the split's whole slice.) A pointwise
# kernel over 1 GB float32 on an H100 (Triton, 2026-12-06): one tile per CTA 725 us, 264-1056 CTAs each
# looping over a contiguous slice 775-778, grid-stride 766-769, torch's copy 716: a streaming loop per CTA
# costs about 7%. Measured on the H100 (tests/gpu_sweep.py, 2026-12-06, one run; trips 0 (two kernels) / 1 /
# 4 / 16), us: NCDHW instance norm float32 (2, 64, 128^3) 1113.8 / 1065.8 / 1077.0 / 1100.4, (4, 32, 128^3)
# 1117.0 / 1065.3 / 1076.8 / 1099.9, (2, 32, 128^3) 568.0 / 541.5 / 546.1 / 558.7, float16 (2, 32, 128^3)
# 286.4 / 276.2 / 279.1 / 283.3 (slices of 128, 128, 64 and 32 trips). Shorter slices keep two kernels: the
# middle kernel's launch and merge (a few us) are unmeasured against them.
INNER_FINISH_TRIPS = 1
INNER_FLAT_MIN_TRIPS = 16
# Inner split: the grid (rows x splits) is sized in waves of resident CTAs (STREAM_THREADS_PER_SM / 512 per
# SM): the fewest waves, at least SPLIT_MIN_WAVES, in which rows x splits fills at least SPLIT_MIN_FILL of
# the slots. Before, splits = ceil(4 x SMs / rows) gave 2.2-4.4 waves (64 rows: 576 CTAs for 264 slots, the
# third wave 18% full). A single full wave is also robust to a kernel that fits more CTAs per SM than
# planned (fewer registers): the grid still lands two per SM.
SPLIT_MIN_WAVES = 1
SPLIT_MIN_FILL = 0.9
# Whether inner rows too long for one CTA and too few to fill the GPU get the coop schedule (1) or the
# two-kernel split (0) by default; forced or autotuned plans can use either. 0: coop measured slower or level
# (below, and docs/performance.md).
COOP_DEFAULT = 0
# Coop schedule: CTAs per SM the co-resident grid is planned with (rows in flight x CTAs per row; a row gets at
# most one CTA per SM, so the runtime's grid of min(planned, co-resident) CTAs always covers it), and their size. Its kernel is
# pipelined by one item (lowering.codegen: a CTA's wait overlaps its next read); four 256-thread CTAs per SM
# overlap one CTA's reductions and waits with the others' streaming (codegen COOP_SM_THREADS bounds the float32
# kernels to 64 registers, no spills). Measured on an H100 (tests/gpu_sweep.py, 2026-12-05, COOP_DEFAULT=1,
# split default for comparison): 2 x 32 x 128^3 float32 NCDHW: one 512-thread CTA per SM 650.9 us, 3 x 256
# 577.5, 4 x 256 571.6 (559.9 with COOP_CACHE_HINTS 2), 1 x 1024 759.1, split 564.7; 100 x 1M float32 layer
# norm: 618.1 / 529.2 / 531.7 / 770.0, split 440.5; float16 2 x 32 x 128^3: 361.7 / 330.3 / 345.5 / 440.6,
# split 286.5. Smaller steps (COOP_L2_BYTES 16 or 8 MiB: more CTAs per row) were slower on every row.
# (A row is now capped at one CTA per SM, below: the first row's plan is 132 CTAs x 3 rows, the 3 x 256 variant.)
COOP_CTAS_PER_SM = 4
COOP_THREADS = CTA_THREADS
# Coop schedule: vectors each thread loads per loop trip.
COOP_UNROLL = LOOP_UNROLL
# Coop schedule: bytes of x in flight (rows being reduced at once) kept under this so that a CTA's re-read of
# its slice, a step after its first read, hits L2: half the H200's 60 MB L2, as LOOPED_L2_BYTES.
COOP_L2_BYTES = 30 * 2**20
# Coop schedule: L2 cache hints (as CACHE_HINTS: 1 marks x's re-read and y's stores evict-first, 2 also x's
# first read evict-last, what the next step re-reads). 2 measured 559.9 us against 571.6 with 1 on the
# 2 x 32 x 128^3 float32 row above, 1128.8 against 1147.0 on 2 x 64 x 128^3; the other rows within 0.1%.
COOP_CACHE_HINTS = 2
# CTAs per thread-block cluster tried for reductions too large for one CTA's registers (sm_90+): 8 is the
# largest portable cluster size (CUDA programming guide, "Thread Block Clusters"); the CTAs of a cluster are
# co-scheduled on one GPC and read each other's shared memory (DSMEM), so the partial statistics of a
# reduction spread over them merge without a second pass over x (QuACK's cluster reductions,
# design/anchors.md).
CLUSTER_SIZES = (2, 4, 8, 16)
# Inner rows held in registers over a cluster when rows x cluster CTAs would fill at most this fraction of the
# SMs (a cluster holds at most 16 CTAs: 4 rows of 400,001 float32 got 64 CTAs on 132 SMs) are held instead over
# sms // rows CTAs of a co-resident grid, one per SM, launched cooperatively: each CTA writes its partial sum
# to a workspace and waits on its row's arrival counter (zeroed by a first, tiny kernel) instead of a cluster
# barrier (GRID_PERSISTENT 1: on, 0: off). Measured on an H100 (tests/gpu_sweep.py, 2026-12-06, grid / cluster
# or split, us): 4 x 400,001 float32 13.9 / 16.4 (cluster 16), 1 x 2M 17.3 / 45.3 (split), 3 x 1M 18.2 / 30.0,
# 2 x 1,048,576 float16 12.8 / 17.9; 8 x 262,144 float32 12.9 / 12.6 (cluster 8); docs/performance.md.
GRID_PERSISTENT = 1
GRID_PERSISTENT_MAX_FILL = 0.75
# ... only clusters of at least this many CTAs are replaced so: 8 x 262,144 float32 kept its cluster of 8 at
# level speed (12.6 us against the grid's 12.9 on the H100 above; 64 against 128 CTAs), while 4 x 400,001
# (cluster of 16, 64 CTAs) gained 2.5 us. Smaller clusters exchange through distributed shared memory without
# the grid's counter-zeroing kernel (1.0 us).
GRID_PERSISTENT_MIN_CLUSTER = 16
# Most CTAs a 1D grid may have (gridDim.x <= 2^31 - 1: CUDA programming guide, "Compute capabilities").
MAX_GRID_X = 2**31 - 1
# Sizes above 8 are "non-portable": the runtime sets cudaFuncAttributeNonPortableClusterSizeAllowed (H100/H200
# accept 16).
PORTABLE_CLUSTER = 8
# Clusters need compute capability 9.0 (Hopper) or newer.
CLUSTER_MIN_CC = (9, 0)
# Short rows (<= 32 vectors): vectors per thread, so that each row needs only log2(vectors / 4) shuffle
# steps and each thread issues several independent loads (memory-level parallelism).
SHORT_ROW_VECTORS = 4
# A looped schedule (one CTA per reduction, re-reading its values) reads HBM about once when the values of
# the reductions in flight (one per SM) stay in L2: below this many bytes it is preferred to a cluster.
# Half the H200's 60 MB L2; measured on the H200: NHWC instance norm (256, 128, 28, 28) float16 (26.5 MB in
# flight) looped 61 us vs cluster 77 us; float32 (53 MB) looped 108 us vs cluster 79 us.
LOOPED_L2_BYTES = 30 * 2**20
# L2 cache hints of the schedules that read x twice (Plan.cache_hints): 1 marks x's last read and y's stores
# evict-first (ld/st.global.cs), so the lines of x that the second pass has yet to read are not the ones L2
# replaces (torch.compile's two-loop reductions do the same through Triton's eviction_policy: 'evict_last'
# on the first loop's loads, 'evict_first' on the last loop's); 2 also marks x's first read evict-last.
CACHE_HINTS = 1
# ... only where x is at most this large (4 x LOOPED_L2_BYTES, twice the H200's L2): above it most of the
# second pass misses L2 whatever the hints, and the six NDHWC float32 instance-norm splits of 256-512 MB ran
# 2-3% slower with them in the 2026-12-02 bench (e.g. (2, 64, 128^3) 813 -> 835 us) while the rows under it
# gained or held.
HINTS_MAX_X_BYTES = 4 * LOOPED_L2_BYTES
# L2 cache hints of inner persistent rows (x read once, no cluster) of 16-bit x with scale or shift along the
# row (layer/RMS norm): 1 marks x's read and y's stores evict-first (0: none). Measured on the H200
# (tests/gpu_sweep.py, 2026-12-02), without -> with: bfloat16 16384 x 1024 layer 19.9 -> 18.0 us, RMS
# 19.4 -> 17.5; x 4096 69.2 -> 68.6 and 67.6 -> 69.5; x 8192 132.2 -> 130.6 and 132.3 -> 131.3; x 16384
# 274.8 -> 270.2 and 255.5 -> 255.8; a second sweep: 20.2 -> 18.6, 19.6 -> 18.1, 69.9 -> 67.8, 67.9 -> 66.9,
# 275.8 -> 270.2. RMS x 4096 is the exception: slower with them in two of three runs (the full bench after:
# 67.4 -> 70.8 us). float32 rows lost 1-12% with them (1M x 100: 200.3 -> 224.1 us;
# (256, 128, 28, 28) instance norm 51.6 -> 53.5), and so did float16 instance norm (27.2 -> 27.6): none there.
PERSISTENT_CACHE_HINTS = 1
# Staged schedule (inner, short contiguous rows): rows of at most this many bytes whose block of rows is one
# contiguous run are loaded as flat 16-byte vectors into shared memory, reduced one row per thread there, and
# stored back as flat vectors, instead of each row being read with vectors no wider than its own alignment
# allows (a 40-byte float32 row gets 8-byte vectors, 2 threads per row, 62% of warps active). Measured on the
# H200 (tests/gpu_sweep.py, 2026-12-02, persistent -> staged, float32): 10M x 10 311 -> 191 us (torch.compile
# 191), 16M x 6 327 -> 203 (compile 334), 12M x 3 118 -> 76 (compile 140), 6M x 16 322 -> 189 (compile 184).
# 0 turns it off (16-bit rows included).
STAGED_MAX_ROW_BYTES = 64
# ... for 16-bit x: its rows were slower staged above 16 bytes (8M x 12 float16: 164 -> 180 us; 4M x 30:
# 211 -> 427) and faster at 10 bytes (20M x 5: 251 -> 149).
STAGED_MAX_ROW_BYTES_16BIT = 16
# Threads of a staged CTA, and the range of 16-byte vectors each thread moves: the rows per CTA are the most
# whole rows that T x E vectors hold (their bytes a multiple of 16, so every CTA's chunk starts aligned); E is
# picked in this range to waste the fewest vector slots and threads of the one-row-per-thread step (10 float32
# values: E = 5 holds 512 rows exactly, two per thread).
STAGED_THREADS = 256
STAGED_VECTORS = (2, 8)
# ... within the static shared memory a kernel may declare (48 KiB): the padded chunk (33 words per 32) plus
# scale and shift. 16-bit rows of 7 values once took E = 7 (58 KiB) and failed to assemble.
STAGED_MAX_SHARED_BYTES = 48 * 1024
# Alignment peeling (1: on) for the inner schedules that stream rows (looped, split, coop) or hold them
# (persistent, see PEEL_PERSISTENT_MIN_VECTORS): rows whose length (or stride) is not a multiple of the
# 16-byte vector start at varying alignments, so pick_vec can only give scalar accesses. Peeled, each row's values before its first 16-byte boundary (at most vec - 1) and after
# its last whole vector are handled one at a time by one thread, the rest as aligned 16-byte vectors (scale
# and shift, misaligned against them, are read one value at a time). Needs x and out 16-byte aligned, one
# contiguous reduced run, and row offsets of x and out equal modulo the vector (the same head in both).
# Measured on the H200: see docs/performance.md.
PEEL = 1
# ... and for the persistent schedule (held in registers, also over a cluster) where a row has at least this many
# whole vectors: the edges are then a small part of a row. Shorter rows (several per warp) keep their narrower
# aligned accesses. Measured on an H100 (4 x 400,001 float32, a cluster of 16 x 512 threads): see
# docs/performance.md.
PEEL_PERSISTENT_MIN_VECTORS = 32
# Default multiprocessor count when planning without a GPU: H100/H200 SXM have 132 SMs.
DEFAULT_SMS = 132


@dataclass(frozen=True)
class Plan:
    """A complete, device-independent description of the kernels for one problem.

    Plain data: printable (``str``), JSON-serializable (:meth:`to_json`), hashable; the lowering turns it
    into PTX without consulting anything else.

    Attributes:
        strategy: ``"inner"``, ``"outer"`` or ``"mixed"`` (see the module docstring).
        schedule: ``"persistent"``, ``"looped"``, ``"split"``, ``"coop"`` or ``"staged"`` (inner, short contiguous
            rows through shared memory: ``vec`` is then the flat vector width, ``per_thread`` the flat vectors
            per thread, ``rows_per_cta`` the rows one CTA reduces, one per thread at a time).
        axes: canonical axes, outermost-first (:mod:`normc.canonical`).
        stat: ``"norm"`` (mean and biased variance) or ``"rms"`` (mean square).
        eps: added to the variance (or mean square) before rsqrt.
        x_dtype, out_dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``.
        scale_dtype, shift_dtype: dtype of the affine vectors, or ``None`` when the step is absent.
        stats: whether float32 mean and rstd are written (one per kept index).
        vec: elements per vector access of x/out (1, 2, 4, 8; vec * itemsize <= 16 bytes).
        scale_vec, shift_vec: whether the affine vectors are read with ``vec``-wide accesses too.
        threads: threads per CTA.
        tpr: inner: threads per row (a power of two; < 32 means several rows per warp).
        rows_per_cta: inner: rows handled by one CTA.
        nxc: outer/mixed: threads along the column tile; ``ry`` threads along rows.
        ry: outer/mixed: rows processed in parallel by one CTA.
        tile: outer/mixed: columns per CTA tile (``nxc * vec``).
        group: mixed: columns per kept group (the short reduced axis' extent); 1 for outer.
        per_thread: persistent: vectors held per thread; looped/split: vectors loaded per loop trip.
        splits: CTAs per reduction (split and coop schedules; persistent rows held over a co-resident grid,
            ``GRID_PERSISTENT``), else 1.
        cluster: CTAs per thread-block cluster sharing one reduction through distributed shared memory
            (persistent schedule on sm_90+), else 1.
        peel: inner streaming and persistent schedules: rows start at varying alignments within a ``vec`` vector
            (PEEL, PEEL_PERSISTENT_MIN_VECTORS);
            each row's first values up to a vector boundary and its last values after its last whole vector
            are handled one at a time by one thread, the rest as aligned vectors.
        finish_splits: outer/mixed split: CTAs of the normalize (third) kernel per split CTA, each
            normalizing 1/finish_splits of the split's rows (``OUTER_FINISH_SPLITS``); inner split: > 1
            gives three kernels, the last a flat normalize grid of finish_splits CTAs per split
            (``INNER_FINISH_TRIPS``); else 1.
        cache_hints: L2 cache hints of the schedules that read x twice (looped, split, coop; ignored by
            persistent ones): 0 none; 1 x's last read and y's stores evict-first (``ld/st.global.cs``), so L2
            keeps the lines of x the second pass has yet to read; 2 also the first read of x evict-last.
        grid: CTAs of the (each) kernel, but the normalize kernel of an outer/mixed split, which has
            ``grid * finish_splits``; coop: the most CTAs its cooperative kernel uses (``splits`` x the
            reductions in flight).
        kept, reduced: number of kept indices (reductions) and elements per reduction.
        arch: compute capability the plan was made for, e.g. ``"sm_90"``.
        sms: multiprocessor count assumed.
        why: human-readable reasons for each decision.
    """

    strategy: str
    schedule: str
    axes: tuple
    stat: str
    eps: float
    x_dtype: str
    out_dtype: str
    scale_dtype: str | None
    shift_dtype: str | None
    stats: bool
    vec: int
    scale_vec: bool
    shift_vec: bool
    threads: int
    tpr: int
    rows_per_cta: int
    nxc: int
    ry: int
    tile: int
    group: int
    per_thread: int
    splits: int
    grid: int
    kept: int
    reduced: int
    arch: str
    sms: int
    cluster: int = 1
    cache_hints: int = 0
    peel: bool = False
    finish_splits: int = 1
    why: tuple = field(default=(), compare=False)

    @property
    def reads_x(self) -> int:
        """Times the kernels read x from memory: 1 for the persistent and staged schedules (x held on chip
        between its reduction and its normalization), 2 for the others."""
        return 1 if self.schedule in ("persistent", "staged") else 2

    @property
    def grid_persistent(self) -> bool:
        """Whether each row is held in registers over ``splits`` (> 1) CTAs of a co-resident, cooperatively
        launched grid (``GRID_PERSISTENT``): the persistent schedule with splits, partial sums exchanged
        through the workspace."""
        return self.schedule == "persistent" and self.splits > 1

    @property
    def workspace_floats(self) -> int:
        """float32 elements of scratch the split and coop schedules need (0 otherwise)."""
        if self.schedule == "coop":
            return 3 * self.kept * self.splits + self.kept  # partial (n, mean, m2) per split, a counter per row
        if self.grid_persistent:
            return 3 * self.kept * self.splits + self.kept  # (count, mean, M2) or q per CTA, a counter per row
        if self.schedule != "split":
            return 0
        if self.strategy == "inner":  # partials; a flat normalize kernel (finish_splits > 1): mean, factor per row
            return 3 * self.kept * self.splits + (2 * self.kept if self.finish_splits > 1 else 0)
        cols = self.grid // self.splits * self.tile  # (kept-outer x tiles) x tile columns
        return 3 * cols * self.splits + 3 * cols  # partial (n, mean, m2) per split, then a, b, c per column

    def to_dict(self) -> dict:
        """Plain-data form of the plan (axes as dicts, why as a list); JSON-serializable."""
        d = asdict(self)
        d["axes"] = [asdict(a) for a in self.axes]
        d["why"] = list(self.why)
        return d

    def to_json(self) -> str:
        """JSON text of the plan (round-trips through :meth:`from_json`)."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """The plan written by :meth:`to_json`.

        Raises:
            normc.ArgumentError: (a ValueError) ``text`` is not a str, bytes or bytearray, is not JSON, or not a
                plan's JSON object; the message names the missing, unknown or malformed field (a value of the wrong
                type, a dtype or statistic normc does not know, an eps :func:`normc.spec` refuses).
        """
        d = _json_object(text, cls, "Plan.to_json()")
        d["axes"] = _axes_from_json(d["axes"], "text", "Plan.to_json()")
        d["why"] = _why_from_json(d)
        _check_plan_values(d)
        return cls(**d)

    def describe(self) -> str:
        """A multi-line human summary: strategy, tiling, launch, and why."""
        ax = " ".join(
            f"[{a.size}{'R' if a.reduced else 'K'} x:{a.x}]" for a in self.axes
        )
        lines = [
            f"strategy: {self.strategy} / {self.schedule}",
            f"problem:  {self.kept} reductions x {self.reduced} elements, {self.x_dtype} -> {self.out_dtype}, stat={self.stat}",
            f"axes:     {ax}  (outermost first; R reduced, K kept; x: element stride)",
        ]
        if self.strategy == "inner":
            lines.append(
                f"tiling:   vec={self.vec} threads/row={self.tpr} rows/CTA={self.rows_per_cta} "
                f"vectors/thread={self.per_thread} splits={self.splits}"
            )
        else:
            lines.append(
                f"tiling:   vec={self.vec} column tile={self.tile} (x-threads={self.nxc}, y-threads={self.ry}) "
                f"group={self.group} vectors/thread={self.per_thread} splits={self.splits}"
            )
        if self.peel:
            lines.append(f"peel:     each row's values before its first {self.vec}-wide boundary and after its last "
                         "whole vector one at a time (rows start at varying alignments)")
        if self.cluster > 1:
            lines.append(f"cluster:  {self.cluster} CTAs per reduction, partial statistics merged through "
                         "distributed shared memory")
        if self.grid_persistent:
            lines.append(f"grid:     {self.splits} CTAs per reduction of a co-resident (cooperative) grid, partial "
                         "sums exchanged through a workspace; counters zeroed by a first tiny kernel")
        if self.schedule == "coop":
            lines.append(f"coop:     cooperative grid of up to {self.grid} co-resident CTAs, "
                         f"{self.grid // self.splits} reductions in flight; counters zeroed by a first tiny kernel")
        nk = {"split": 2 if self.strategy == "inner" and self.finish_splits == 1 else 3,
              "coop": 2}.get(self.schedule, 2 if self.grid_persistent else 1)
        if self.kept * self.reduced == 0:
            lines.append("launch:   none (zero-size input: nothing to compute)")
        else:
            grids = f"grid={self.grid}" + (f" (normalize kernel: {self.grid * self.finish_splits})"
                                           if self.finish_splits > 1 else "")
            lines.append(f"launch:   {nk} kernel(s), {grids} block={self.threads} arch={self.arch}")
        if self.stats:
            lines.append("stats:    float32 mean and rstd written, one per reduction")
        lines.extend(f"why:      {w}" for w in self.why)
        return "\n".join(lines)

    __str__ = describe


def _json_fields(d, cls, what, writer="Plan.to_json()") -> dict:
    """``d``, a JSON value read as the fields of dataclass ``cls``; :class:`normc.ArgumentError` naming
    ``what`` unless it is an object with each field ``cls`` requires and none it lacks (``writer``: what
    writes such JSON, for the message)."""
    if not isinstance(d, dict):
        raise ArgumentError(f"{what} holds a JSON {type(d).__name__}; expected an object of {cls.__name__} "
                            f"fields, as {writer} writes")
    missing = [f.name for f in fields(cls)
               if f.name not in d and f.default is MISSING and f.default_factory is MISSING]
    unknown = sorted(set(d) - {f.name for f in fields(cls)})
    problems = ([f"lacks {cls.__name__} field(s) {', '.join(missing)}"] if missing else []) + (
        [f"has unknown field(s) {', '.join(unknown)}"] if unknown else [])
    if problems:
        raise ArgumentError(f"{what} {' and '.join(problems)}; expected the JSON {writer} writes")
    for f in fields(cls):
        if f.name in d:
            _check_json_value(d[f.name], f, what, writer)
    return dict(d)


# JSON types of the plain field annotations of the plan dataclasses; other annotations (tuple, nested plans) are
# read by their own readers
_JSON_TYPES = {"int": int, "float": (int, float), "str": str, "bool": bool}
_JSON_CHOICES = {"stat": STATS, "strategy": ("inner", "outer", "mixed"),
                 **{n: DTYPES for n in ("x_dtype", "out_dtype", "scale_dtype", "shift_dtype", "dy_dtype", "dx_dtype")}}


# Plan fields that count threads, CTAs or multiprocessors: at least 1 in any plan the planner makes (grid and
# per_thread are 0 for zero-size inputs); those of one strategy's tiling (the other's are 0)
_PLAN_COUNTS = ("threads", "group", "splits", "sms", "cluster", "finish_splits")
_PLAN_TILING = {"inner": ("tpr", "rows_per_cta"), "outer": ("nxc", "ry", "tile"), "mixed": ("nxc", "ry", "tile")}
_PLAN_SCHEDULES = ("persistent", "staged", "looped", "split", "coop")


def _check_plan_values(d):
    """:class:`normc.ArgumentError` naming the field of a plan's JSON object ``d`` (types already checked) whose
    value no plan has: an unknown schedule, a vector width other than 1, 2, 4 or 8, a negative int, a count of
    threads or CTAs below 1 (:data:`_PLAN_COUNTS`, the strategy's :data:`_PLAN_TILING`), an arch
    normc does not compile for, no axes, or kept/reduced sizes that are not the products of the axes'."""
    if d["schedule"] not in _PLAN_SCHEDULES:
        raise ArgumentError(f"text: schedule is {d['schedule']!r}; expected one of "
                            f"{', '.join(map(repr, _PLAN_SCHEDULES))}")
    if d["vec"] not in (1, 2, 4, 8):
        raise ArgumentError(f"text: vec is {d['vec']!r}; expected 1, 2, 4 or 8 (elements per vector access)")
    for name in _PLAN_COUNTS + _PLAN_TILING[d["strategy"]]:
        if name in d and d[name] < 1:
            raise ArgumentError(f"text: {name} is {d[name]!r}; expected an int >= 1 in an {d['strategy']} plan")
    for name, v in d.items():
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            raise ArgumentError(f"text: {name} is {v!r}; expected an int >= 0")
    if not d["axes"]:
        raise ArgumentError("text: axes is empty; expected the plan's canonical axes")
    for name, red in (("kept", False), ("reduced", True)):
        want = math.prod(a.size for a in d["axes"] if a.reduced == red)
        if d[name] != want:
            raise ArgumentError(f"text: {name} is {d[name]!r}; the {name} axes' sizes multiply to {want}")
    from .lowering import arch_cc

    try:
        arch_cc(d["arch"])
    except ArgumentError as e:
        raise ArgumentError(f"text: {e}") from None


def _check_json_value(v, f, what, writer):
    """:class:`normc.ArgumentError` naming field ``f`` of ``what`` unless JSON value ``v`` has the field's
    annotated type (bool is no int there), is one of its names (``_JSON_CHOICES``), or, for ``eps``, is an eps
    :func:`normc.spec` accepts (the kernels would add a negative, NaN or float32-overflowing eps as is)."""
    opts = [o.strip() for o in str(f.type).split("|")]
    if v is None and "None" in opts:
        return
    known = [_JSON_TYPES[o] for o in opts if o in _JSON_TYPES]
    if len(known) < len(opts) - ("None" in opts):
        return  # a nested plan or tuple: its reader checks it
    if not any(isinstance(v, t) and (t is bool or not isinstance(v, bool)) for t in known):
        raise ArgumentError(f"{what}: {f.name} is {v!r}; expected {f.type}, as {writer} writes")
    choices = _JSON_CHOICES.get(f.name) if "str" in opts else None  # Axis.stat is a stride, not a statistic
    if choices and v is not None and v not in choices:
        raise ArgumentError(f"{what}: {f.name} is {v!r}; expected one of {', '.join(map(repr, choices))}")
    if f.name == "eps":
        from .errors import SpecError
        from .spec import _check_eps

        try:
            _check_eps(v)
        except SpecError as e:
            raise ArgumentError(f"{what}: {e}") from None


def _json_object(text, cls, writer) -> dict:
    """The JSON object ``text`` holds, read as the fields of dataclass ``cls`` (:func:`_json_fields`);
    :class:`normc.ArgumentError` when it is not JSON (``writer``: what writes such text, for the messages)."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise ArgumentError(f"text is {type(text).__name__}; expected the str of {writer}")
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ArgumentError(f"text is not JSON ({e}); expected the text of {writer}") from None
    return _json_fields(d, cls, "text", writer)


def _axes_from_json(axes, what, writer) -> tuple:
    """The :class:`Axis` tuple of a plan's JSON ``axes`` list (``what``: where it is, for the messages)."""
    if not isinstance(axes, list):
        raise ArgumentError(f"{what}: axes is {axes!r}; expected a list of axis objects")
    return tuple(Axis(**_json_fields(a, Axis, f"{what}: axes[{i}]", writer)) for i, a in enumerate(axes))


def _why_from_json(d) -> tuple:
    """The ``why`` lines of a plan's JSON object ``d`` (absent: none) as a tuple."""
    why = d.get("why", [])
    if not isinstance(why, list):
        raise ArgumentError(f"text: why is {why!r}; expected a list of strings")
    return tuple(why)


def _cc(arch) -> tuple:
    """``"sm_90"`` -> ``(9, 0)``; ``(0, 0)`` for a string that is not one (the planner's arch is normalized by
    its callers, :func:`normc.lowering.arch_cc`)."""
    m = str(arch).replace("sm_", "").replace("compute_", "").rstrip("af")
    return (int(m[:-1]), int(m[-1])) if m.isdigit() and len(m) >= 2 else (0, 0)


def _clusters_ok(arch) -> bool:
    return _cc(arch) >= CLUSTER_MIN_CC


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _align_of(addr_align: int) -> int:
    return min(addr_align, MAX_VECTOR_BYTES)


def pick_vec(axes, run_size, dtype_bytes, aligns, tensors=("x", "out"), inner_index=-1):
    """Largest vector width (elements) usable for ``tensors`` along the innermost contiguous run.

    The run (``run_size`` contiguous elements at stride 1) must be a multiple of the width, every other
    axis' stride must be a multiple of it (so each vector starts aligned), and each base pointer must be
    aligned to ``width * itemsize`` bytes. ``aligns`` maps tensor -> byte alignment of its base pointer;
    ``dtype_bytes`` maps tensor -> itemsize.
    """
    best = 1
    v = 2
    while True:
        ok = run_size % v == 0
        for t in tensors:
            if not ok:
                break
            if v * dtype_bytes[t] > MAX_VECTOR_BYTES or aligns[t] % (v * dtype_bytes[t]) != 0:
                ok = False
            for i, a in enumerate(axes):
                if i == (inner_index % len(axes)):
                    continue
                if a.stride(t) % v != 0:
                    ok = False
        if not ok:
            return best
        best = v
        v *= 2


def _hints(strategy, schedule, x_bytes, why, row_params_16bit=False, arch="sm_90") -> int:
    """Plan.cache_hints (CACHE_HINTS where x is read twice, else 0); explained in ``why``. The inner split
    gets none: on the H200 its rows ran 1-5% slower with them (4 x 10,000,001: 271 -> 285 us), while the
    outer/mixed schedules gained up to 11% (NHWC instance norm (256, 128, 28, 28) float16, looped: 50.9 ->
    45.3 us; (2, 64, 64, 64, 64) float16, split: 77.0 -> 70.8 us; tests/gpu_sweep.py, 2026-12-02). Neither
    does an x over HINTS_MAX_X_BYTES. One single-read case: an inner persistent row without a cluster,
    ``row_params_16bit`` (16-bit x, scale or shift along the row) gets PERSISTENT_CACHE_HINTS."""
    if schedule == "persistent":
        if not (strategy == "inner" and row_params_16bit and PERSISTENT_CACHE_HINTS):
            return 0
        why.append("16-bit rows with scale/shift along them: x's read and y's stores evict-first in L2")
        return PERSISTENT_CACHE_HINTS
    if schedule not in ("looped", "split", "coop") or not CACHE_HINTS:
        return 0
    if schedule == "coop":
        hints = COOP_CACHE_HINTS if _cc(arch) >= (8, 0) else min(COOP_CACHE_HINTS, 1)  # evict-last policies: sm_80+
        if hints:
            why.append("coop: x's re-read and y's stores evict-first in L2"
                       + (", its first read evict-last" if hints >= 2 else "")
                       + ", so L2 keeps the slices the next step re-reads")
        return hints
    if strategy == "inner" and schedule != "looped":
        return 0
    if x_bytes > HINTS_MAX_X_BYTES:
        return 0
    why.append("x read twice: its last read and y's stores evict-first in L2"
               + (", its first read evict-last" if CACHE_HINTS >= 2 else "")
               + ", so L2 keeps what the second pass re-reads")
    return CACHE_HINTS


def _fill_splits(items, slots) -> int:
    """Splits per item so that ``items x splits`` CTAs fill the fewest waves of ``slots`` resident CTAs
    (at least SPLIT_MIN_WAVES) to at least SPLIT_MIN_FILL; ``items`` >= 1, ``slots`` >= 1."""
    for waves in range(SPLIT_MIN_WAVES, SPLIT_MIN_WAVES + 64):
        s = waves * slots // items
        if s >= 1 and items * s >= SPLIT_MIN_FILL * waves * slots:
            return s
    return max(1, SPLIT_MIN_WAVES * slots // items)


def make_plan(problem, *, arch="sm_90", sms=DEFAULT_SMS, schedule=None, max_cluster=None) -> Plan:
    """Choose strategy, schedule and tiling for a canonical problem.

    Args:
        problem: a :class:`normc.canonical.Problem`-like object (see :func:`normc.api.make_problem`).
        arch: target, e.g. ``"sm_90"``.
        sms: number of multiprocessors (132 on the H200) used to size grids.
        schedule: force ``"looped"``, ``"split"``, ``"coop"`` (inner only), ``"staged"`` (inner, where it
            applies), ``"cluster"`` (persistent over a thread-block cluster, sm_90+) or ``"grid"`` (inner rows
            held in registers over CTAs of a co-resident grid, at most one per SM, where they fit) instead of
            the heuristic's choice (for tests and autotuning candidates); ``"persistent"`` is honoured only
            where the values fit in registers.
        max_cluster: largest thread-block cluster to use (default: the largest of ``CLUSTER_SIZES``); the
            runtime lowers it when the device cannot co-schedule a cluster of the planned size.

    Returns:
        :class:`Plan`.
    """
    p = problem
    axes = p.axes
    why = []
    isz = ITEMSIZE[p.x_dtype]
    osz = ITEMSIZE[p.out_dtype]
    inner = axes[-1]
    unit = inner.x == 1 and inner.out == 1

    strategy = "inner" if inner.reduced else "outer"
    if inner.reduced and unit and len(axes) >= 3:
        nxt = axes[-2]
        has_rows_outside = any(a.reduced for a in axes[:-2])
        run_bytes = inner.size * isz
        if (
            not nxt.reduced
            and nxt.x == inner.size
            and nxt.out == inner.size
            and has_rows_outside
            and run_bytes < MIXED_MAX_RUN_BYTES
            and nxt.size * inner.size <= 8 * 1024
        ):
            strategy = "mixed"
            why.append(
                f"innermost reduction run is {run_bytes} B (< {MIXED_MAX_RUN_BYTES} B) inside a contiguous kept axis "
                f"of {nxt.size}: lanes go along tiles of whole groups of the ({nxt.size} x {inner.size}) block, groups merged after"
            )
    if strategy == "inner":
        why.append("innermost axis is reduced: lanes along the reduction (inner)")
    elif strategy == "outer":
        why.append("innermost axis is kept: lanes along the kept axis, rows over y-threads (outer)")
    if inner.reduced and inner.size == 1:
        why.append("reductions of one element: scalar accesses (vec=1)")
    elif not unit:
        why.append("innermost stride is not 1 for x or out: scalar accesses (vec=1)")

    common = dict(
        axes=axes, stat=p.stat, eps=p.eps, x_dtype=p.x_dtype, out_dtype=p.out_dtype,
        scale_dtype=p.scale_dtype, shift_dtype=p.shift_dtype, stats=p.stats,
        kept=p.kept, reduced=p.reduced, arch=arch, sms=sms,
    )
    dbytes = {"x": isz, "out": osz,
              "scale": ITEMSIZE.get(p.scale_dtype or "float32"), "shift": ITEMSIZE.get(p.shift_dtype or "float32")}

    csizes = tuple(c for c in CLUSTER_SIZES if max_cluster is None or c <= max_cluster)
    if strategy == "inner":
        plan = _plan_inner(p, common, dbytes, unit, why, schedule, csizes)
    else:
        plan = _plan_outer(p, common, dbytes, unit, strategy, why, schedule, csizes)
    check_grid(plan.grid * plan.finish_splits, p.kept, p.reduced)
    return plan


def check_grid(grid, kept, reduced):
    """Raise :class:`normc.ArgumentError` when a kernel would need more CTAs than one launch can have
    (MAX_GRID_X along x: the CUDA programming guide's limit on gridDim.x)."""
    if grid > MAX_GRID_X:
        raise ArgumentError(f"x of {kept} x {reduced} elements would need a grid of {grid} CTAs; a launch holds at "
                            f"most {MAX_GRID_X} (2^31 - 1) along x")


def _param_vec(p, axes, vec, dbytes, which, block):
    """Whether the scale/shift vector can be read with ``vec``-wide accesses along the vectorized run."""
    dt = getattr(p, f"{which}_dtype")
    if dt is None or vec == 1:
        return False
    if sum(a.stride(which) for a in block) == 0:
        return False  # broadcast along the run: one scalar per vector
    run_unit = block[-1].stride(which) == 1 and all(
        block[i].stride(which) == block[i + 1].stride(which) * block[i + 1].size for i in range(len(block) - 1)
    )
    if not run_unit:
        return False
    others = [a for a in axes if a not in block]
    return (
        vec * dbytes[which] <= MAX_VECTOR_BYTES
        and p.align[which] % (vec * dbytes[which]) == 0
        and all(a.stride(which) % vec == 0 for a in others)
    )


def _staged_max_row_bytes(itemsize) -> int:
    """Longest row (bytes) the staged schedule takes for x of ``itemsize`` bytes (0 for none when
    STAGED_MAX_ROW_BYTES is 0, 16-bit x included)."""
    return min(STAGED_MAX_ROW_BYTES_16BIT if itemsize == 2 else STAGED_MAX_ROW_BYTES, STAGED_MAX_ROW_BYTES)


def _staged_tiling(p, dbytes, unit):
    """(V, E, R): flat vector width, vectors per thread and rows per CTA of the staged schedule, or None where
    it does not apply: the problem must be one kept axis of contiguous rows (x and out), at most
    STAGED_MAX_ROW_BYTES per row, x and out aligned to 16 bytes, no scale or shift varying along the kept
    axis, and an x dtype whose statistics are not scaled (bfloat16 keeps the persistent schedule)."""
    from .lowering.codegen import SCALED_DTYPES

    axes = p.axes
    if len(axes) != 2 or axes[0].reduced or not axes[1].reduced or not unit or p.x_dtype in SCALED_DTYPES:
        return None
    L = p.reduced
    k = axes[0]
    wide = max(dbytes["x"], dbytes["out"])
    if k.x != L or k.out != L or L * dbytes["x"] > _staged_max_row_bytes(dbytes["x"]) or p.kept < 1:
        return None
    if any(getattr(p, f"{w}_dtype") is not None and k.stride(w) != 0 for w in ("scale", "shift")):
        return None
    V = MAX_VECTOR_BYTES // wide
    if p.align["x"] % (V * dbytes["x"]) or p.align["out"] % (V * dbytes["out"]):
        return None
    m = V // math.gcd(V, L)  # rows per CTA step by m so that a CTA's chunk is whole vectors
    fits = []
    for E in range(STAGED_VECTORS[0], STAGED_VECTORS[1] + 1):
        R = (STAGED_THREADS * E * V // L) // m * m
        words = STAGED_THREADS * E * V
        if R >= 1 and 4 * (words + words // 32 + 2 * L) <= STAGED_MAX_SHARED_BYTES:
            # fewest wasted vector slots plus idle threads of the row step (its last round of R / T rows may
            # be partly filled: 4M x 30 float16 once had 272 rows, a second round for 16 threads); among
            # equals, the E nearest 4 (enough loads in flight, few registers)
            rounds = -(-R // STAGED_THREADS)
            waste = 1 - R * L / (STAGED_THREADS * E * V) + 1 - R / (rounds * STAGED_THREADS)
            fits.append((round(waste, 9), abs(E - 4), E, R))
    return (V, min(fits)[2], min(fits)[3]) if fits else None


def _staged_rejection(plan) -> str:
    """Why an inner plan over one kept axis did not take the staged schedule (for ``explain``)."""
    isz = ITEMSIZE[plan.x_dtype]
    if plan.x_dtype == "bfloat16":
        return "bfloat16 statistics are scaled (accuracy.md); the staged kernel does not scale them"
    if plan.reduced * isz > _staged_max_row_bytes(isz):
        return f"rows of {plan.reduced * isz} B are longer than it takes (<= {_staged_max_row_bytes(isz)} B)"
    return "the rows are not one contiguous, 16-byte aligned run of x and out, or scale/shift vary per row"


def _peel_vec(p, dbytes, unit, vec) -> int:
    """The vector width a peeled plan would use (PEEL), or 0 where peeling does not apply or gains nothing."""
    inner = p.axes[-1]
    if not PEEL or not unit or sum(a.reduced for a in p.axes) != 1:
        return 0
    V = MAX_VECTOR_BYTES // max(dbytes["x"], dbytes["out"])
    if V <= vec or inner.size < 2 * V:  # every row keeps at least one whole vector
        return 0
    if any(p.align[t] % (V * dbytes[t]) for t in ("x", "out")):
        return 0
    if any((a.stride("x") - a.stride("out")) % V for a in p.axes[:-1]):
        return 0  # x and out rows would start at different offsets within a vector
    return V


def _tiling_name(schedule, cluster, grid_ctas):
    """How the ``why`` lines name a tiling that a forced schedule replaces: ``"cluster tiling"``, ``"grid
    tiling"`` or ``"<schedule> tiling"`` (``"streaming tiling"`` before a schedule is picked)."""
    if cluster > 1:
        return "cluster tiling"
    if grid_ctas > 1:
        return "grid tiling"
    return f"{schedule or 'streaming'} tiling"


def _spread_tiling(nc, ctas):
    """(threads, vectors per thread) of a row of ``nc`` vectors spread evenly over ``ctas`` CTAs, as a forced
    cluster or grid spreads it: the power of two of threads (32 to MAX_PERSISTENT_THREADS) nearest above an
    even share, then enough vectors per thread to cover the row."""
    tpr = min(max(_next_pow2(-(-nc // ctas)), 32), MAX_PERSISTENT_THREADS)
    return tpr, -(-nc // (ctas * tpr))


def _grid_tiling(nc, rows, sms, tpr):
    """(S, per): CTAs per row and vectors per thread of rows of ``nc`` vectors held over a co-resident grid of
    ``tpr``-thread CTAs: one CTA per SM shared among ``rows`` rows, no more CTAs than give each thread a vector
    (GRID_PERSISTENT)."""
    S = min(sms // max(rows, 1), nc // tpr)
    return S, -(-nc // (max(S, 1) * tpr))


def _plan_inner(p, common, dbytes, unit, why, force=None, csizes=CLUSTER_SIZES, peel_vec=0):
    axes = p.axes
    inner = axes[-1]
    why_in, force_in = list(why), force  # for the peeled re-plan: the reasons and the request as they came
    staged = _staged_tiling(p, dbytes, unit) if force in (None, "staged") else None
    if force == "staged" and staged is None:
        why.append("the staged schedule needs one kept axis of contiguous rows of at most "
                   f"{STAGED_MAX_ROW_BYTES} B ({STAGED_MAX_ROW_BYTES_16BIT} B for 16-bit x), 16-byte aligned x and "
                   "out, no per-row scale/shift, no bfloat16: not forced")
        force = None  # then planned exactly as without the request
    if staged is not None:
        V, E, R = staged
        why.append(f"short contiguous rows ({p.reduced * dbytes['x']} B <= {_staged_max_row_bytes(dbytes['x'])} B): "
                   f"staged through shared memory, {STAGED_THREADS} threads x {E} flat {V * dbytes['x']} B vectors = "
                   f"{R} rows per CTA, one thread per row reduces and normalizes them there")
        return Plan(
            strategy="inner", schedule="staged", vec=V, scale_vec=False, shift_vec=False,
            threads=STAGED_THREADS, tpr=1, rows_per_cta=R, nxc=0, ry=0, tile=0, group=1, per_thread=E,
            splits=1, grid=-(-p.kept // R), cluster=1, cache_hints=0, why=tuple(why), **common,
        )
    vec = peel_vec or (pick_vec(axes, inner.size, dbytes, p.align) if unit else 1)
    if peel_vec:
        why.append(f"vec={vec} peeled: rows of {inner.size} start at varying alignments; each row's values before "
                   f"its first {vec * dbytes['x']} B boundary and after its last whole vector are handled one at "
                   "a time, the rest as aligned vectors")
    elif vec > 1:
        why.append(f"vec={vec}: {vec * dbytes['x']} B accesses (run {inner.size}, pointers and strides aligned)")
    nc = p.reduced // vec  # vectors per row
    finish = 1  # split: CTAs of the normalize kernel per split (INNER_FINISH_TRIPS)
    K = p.kept
    sms = common["sms"]
    cluster = 1
    grid_ctas = 0  # > 1: a row held over this many CTAs of a co-resident (cooperative) grid
    if nc <= 32:
        # Several vectors per thread (SHORT_ROW_VECTORS), so a row costs few shuffle steps: on 1M x 100 float32
        # one vector per thread spent more instructions per byte than the memory system takes to move it.
        tpr = _next_pow2(-(-nc // SHORT_ROW_VECTORS))
        per = -(-nc // tpr)
        schedule = "persistent"
        why.append(f"short rows ({nc} vectors): {tpr} threads per row, {per} vectors each, rows share warps")
    else:
        schedule = None
        for i, tpr in enumerate((32, 64, 128, 256, 512, INNER_WIDE_THREADS)):
            per = -(-nc // tpr)
            # the last pass (INNER_WIDE_THREADS) admits twice the values: launch bounds cap a 512-thread CTA at
            # 128 registers per thread, enough for 64 float32 values plus addressing
            limit = MAX_VALUES_PER_THREAD * (2 if i == 5 else 1)
            if per * vec <= limit:
                schedule = "persistent"
                why.append(
                    f"row of {p.reduced} fits in registers: {tpr} threads x {per} vectors x {vec} "
                    f"(<= {MAX_VALUES_PER_THREAD} values/thread): x read once"
                )
                break
        if schedule is None and force not in ("looped", "split", "coop") and (_clusters_ok(common["arch"]) and bool(csizes)):
            tpr = INNER_WIDE_THREADS
            row_bytes = p.reduced * dbytes["x"]
            # The smallest cluster whose 512-thread CTAs hold the row (up to 2 x MAX_VALUES_PER_THREAD values
            # per thread): measured on the H200, fewer, fuller CTAs beat larger clusters (1000 x 100,000 float32:
            # 4 CTAs x 52 values 298 us, 8 x 28 values 425 us; 2 x 64^3-element rows: 8 x 64 values 89 us,
            # 16 x 32 values 146 us). Skipped when the looped schedule's re-read stays in L2.
            looped_in_l2 = K >= INNER_LOOPED_MIN_ROWS_PER_SM * sms and sms * row_bytes <= LOOPED_L2_BYTES
            if looped_in_l2:
                why.append(f"a row's {row_bytes} B x {sms} SMs in flight fit in L2 (<= {LOOPED_L2_BYTES} B): "
                           "the looped schedule's re-read hits L2, no cluster needed")
            elif dbytes["x"] == 2 and K * LOOPED_16BIT_MIN_ROWS_PER_SM >= sms:
                schedule = "looped"
                why.append(f"16-bit x, {K} rows for {sms} SMs: one streaming CTA per row (looped) rather than a "
                           "cluster holding the row as float32 registers")
            for C in () if looped_in_l2 or schedule else csizes:
                per = -(-nc // (C * tpr))
                if per * vec <= 2 * MAX_VALUES_PER_THREAD:
                    schedule, cluster = "persistent", C
                    why.append(
                        f"row of {p.reduced} exceeds one CTA's registers: a cluster of {C} CTAs x {tpr} threads x "
                        f"{per} vectors x {vec} holds it; partial statistics merged through distributed shared "
                        f"memory: x read once"
                    )
                    break
        if schedule is None and force is None and GRID_PERSISTENT and 0 < K <= sms:
            # too long for a cluster, yet the rows fit the registers of one CTA per SM: a co-resident grid
            S, per_ = _grid_tiling(nc, K, sms, INNER_WIDE_THREADS)
            if S >= 2 and per_ * vec <= 2 * MAX_VALUES_PER_THREAD:
                schedule, tpr, per, grid_ctas = "persistent", INNER_WIDE_THREADS, per_, S
                why.append(f"{K} row(s) of {p.reduced} exceed a cluster's registers but fit {S} CTAs x {tpr} threads "
                           f"x {per} vectors x {vec} each, one CTA per SM of a co-resident grid; partial sums "
                           "exchanged through a workspace: x read once")
        if schedule in (None, "looped"):
            tpr = STREAM_THREADS
            per = LOOP_UNROLL
        if schedule is None:
            if K >= INNER_LOOPED_MIN_ROWS_PER_SM * sms:
                schedule = "looped"
                why.append(
                    f"row of {p.reduced} exceeds the registers of a {MAX_PERSISTENT_THREADS}-thread CTA; "
                    f"{K} rows >= {sms} SMs: one CTA per row, statistics loop then re-read"
                )
            elif COOP_DEFAULT:
                schedule = "coop"
                why.append(
                    f"only {K} rows (< {sms} SMs) of {p.reduced}: split each row over CTAs of a co-resident "
                    f"grid, partial statistics (n, mean, M2) to a workspace, then merge and normalize in the "
                    f"same kernel"
                )
            else:
                schedule = "split"
                why.append(
                    f"only {K} rows (< {sms} SMs) of {p.reduced}: split each row over CTAs, "
                    f"partial statistics (n, mean, M2) to a workspace, merge and normalize in a second kernel"
                )
    if (schedule == "persistent" and cluster == 1 and not grid_ctas and tpr >= INNER_WIDE_THREADS and K < sms
            and force is None and (_clusters_ok(common["arch"]) and bool(csizes))):
        # fewer rows than SMs: spread each row over a cluster so that every SM gets work
        for C in [c for c in csizes if c <= PORTABLE_CLUSTER] or csizes[:1]:
            if K * C >= sms or C == min(csizes[-1], PORTABLE_CLUSTER):
                per = -(-nc // (C * tpr))
                cluster = C
                why.append(f"only {K} rows for {sms} SMs: each row spread over a cluster of {C} CTAs "
                           f"({per} vectors per thread)")
                break
    if (schedule == "persistent" and cluster >= GRID_PERSISTENT_MIN_CLUSTER and force is None and GRID_PERSISTENT
            and K * cluster <= GRID_PERSISTENT_MAX_FILL * sms):
        S, per_ = _grid_tiling(nc, K, sms, tpr)
        if S > cluster and per_ * vec <= 2 * MAX_VALUES_PER_THREAD:
            why.append(f"{K} rows x a cluster of {cluster} would occupy {K * cluster} of {sms} SMs: each "
                       f"row held over {S} CTAs of a co-resident grid ({K * S} CTAs, one per SM, {per_} vectors "
                       "per thread), partial sums exchanged through a workspace: x read once")
            grid_ctas, cluster, per = S, 1, per_
    if force == "grid":
        S = max(2, min(max(1, sms // max(K, 1)), nc // 32))
        tpr_, per_ = _spread_tiling(nc, S)
        if per_ * vec <= 2 * MAX_VALUES_PER_THREAD and K * S <= sms:
            why.append(f"schedule forced to a co-resident grid of {S} CTAs x {tpr_} threads per row, {per_} "
                       f"vectors per thread, instead of the {_tiling_name(schedule, cluster, grid_ctas)} above")
            schedule, cluster, tpr, per, grid_ctas = "persistent", 1, tpr_, per_, S
        elif K * S > sms:
            why.append(f"{K} rows x at least 2 CTAs exceed the {sms} SMs (one co-resident CTA each): grid schedule "
                       "not forced")
        else:
            why.append(f"a row of {p.reduced} does not fit {S} co-resident CTAs of {MAX_PERSISTENT_THREADS} threads "
                       f"(<= {2 * MAX_VALUES_PER_THREAD} values per thread) one per SM: grid schedule not forced")
    if force == "cluster":
        if not (_clusters_ok(common["arch"]) and bool(csizes)):
            why.append(f"clusters need sm_90 or newer ({common['arch']}): schedule not forced")
        else:
            for C in csizes:
                tpr_, per_ = _spread_tiling(nc, C)
                if per_ * vec <= 2 * MAX_VALUES_PER_THREAD:
                    why.append(f"schedule forced to a cluster of {C} CTAs x {tpr_} threads per row, {per_} vectors "
                               f"per thread, instead of the {_tiling_name(schedule, cluster, grid_ctas)} above")
                    schedule, cluster, tpr, per, grid_ctas = "persistent", C, tpr_, per_, 0
                    break
            else:  # the planner's own tiling above stands
                why.append(f"a row of {p.reduced} does not fit the registers of a cluster of {csizes[-1]} CTAs x "
                           f"{MAX_PERSISTENT_THREADS} threads (<= {2 * MAX_VALUES_PER_THREAD} values per thread): "
                           "cluster schedule not forced")
    if force == "persistent":
        if schedule != "persistent":
            why.append("a row does not fit one CTA's registers: persistent schedule not forced")
        elif cluster > 1:
            why.append(f"a row does not fit one CTA's registers: held over a cluster of {cluster} CTAs as planned")
        else:
            why.append("schedule forced to persistent: each row held by one CTA, not spread over a cluster")
    if force in ("looped", "split", "coop") and force != schedule:
        why.append(f"schedule forced to {force}: {COOP_THREADS if force == 'coop' else STREAM_THREADS} threads per "
                   f"row, {COOP_UNROLL if force == 'coop' else LOOP_UNROLL} vectors per loop trip, instead of the "
                   f"{schedule or 'streaming'} tiling above")
        schedule, tpr, per, cluster = force, STREAM_THREADS, LOOP_UNROLL, 1
    if schedule in ("looped", "split") and vec * dbytes["x"] < MAX_VECTOR_BYTES and NARROW_LOOP_UNROLL > per:
        per = min(NARROW_LOOP_UNROLL, per * MAX_VECTOR_BYTES // (vec * dbytes["x"]))
        why.append(f"{vec * dbytes['x']} B vectors: {per} per loop trip ({per * vec * dbytes['x']} B in flight per thread)")
    if schedule == "coop":
        # Rows in flight: as many as COOP_L2_BYTES holds (at least 1); splits: the co-resident CTAs shared
        # among them, at least COOP_UNROLL vectors per thread each. Forced: at least 2 splits (CTAs that wait for
        # each other), as a forced split.
        row_bytes = p.reduced * dbytes["x"]
        tpr = COOP_THREADS
        ctas = COOP_CTAS_PER_SM * sms
        # A row's CTAs must all be resident at once (each waits for the others): at most one per SM, which
        # any kernel that launches at all has (the runtime launches min(grid, co-resident) CTAs, and a
        # 16-bit kernel of 104 registers fits only 2 of the COOP_CTAS_PER_SM planned per SM).
        max_splits = max(1, min(nc // (tpr * COOP_UNROLL), sms))
        inflight = max(1, min(K, COOP_L2_BYTES // max(row_bytes, 1)))
        splits = max(1, min(ctas // inflight, max_splits))
        inflight = max(1, min(inflight, ctas // splits))
        if force == "coop":
            splits = max(min(2, sms), splits)
            inflight = max(1, min(inflight, ctas // splits))
        per = COOP_UNROLL
        fits = (f"<= {COOP_L2_BYTES} B of L2" if inflight * row_bytes <= COOP_L2_BYTES else
                f"more than the {COOP_L2_BYTES} B of L2 a step should take: most of the re-read misses L2")
        why.append(f"coop: {splits} CTAs per row, {inflight} row(s) of {row_bytes} B in flight "
                   f"({fits}), up to {splits * inflight} co-resident CTAs")
        threads, rpc = tpr, 1
        grid = splits * inflight
    elif schedule == "split":
        max_splits = max(1, nc // (tpr * per))
        slots = STREAM_THREADS_PER_SM // tpr * sms
        splits = max(1, min(_fill_splits(max(K, 1), slots), max_splits))  # K = 0: an empty batch
        if force == "split":
            splits = max(2, splits)
        why.append(f"{splits} splits: {K * splits} CTAs for {slots} resident {tpr}-thread CTAs "
                   f"({STREAM_THREADS_PER_SM} threads per SM)")
        threads, rpc = tpr, 1
        grid = K * splits
        slice_vecs = -(-nc // splits)
        columns = columns_finish(p, nc, grid, tpr)
        if row_shared_params(p) and not columns:
            why.append(f"normalize kernel row-wise: a column-major one would give each of its {grid} CTAs "
                       f"{-(-nc // grid)} vector(s) for {tpr} threads (codegen.columns_finish)")
        if slice_vecs >= tpr * per * INNER_FLAT_MIN_TRIPS and not columns:
            # int(): a fractional INNER_FINISH_TRIPS (tests/gpu_sanitize.py) forces the flat grid on small rows
            finish = max(1, int(slice_vecs // (tpr * per * INNER_FINISH_TRIPS)))
            if finish > 1:
                why.append(f"each row's partials merged once by a middle kernel; normalize kernel over {finish} "
                           f"CTAs per split ({grid * finish} CTAs, about {INNER_FINISH_TRIPS} loop trips each)")
    elif grid_ctas > 1:
        splits, threads, rpc, grid = grid_ctas, tpr, 1, K * grid_ctas
    else:
        splits = 1
        if tpr >= CTA_THREADS or cluster > 1:
            threads, rpc = tpr, 1
        else:
            rpc = CTA_THREADS // tpr
            threads = CTA_THREADS
        grid = -(-K // rpc) * cluster
    blk = [axes[-1]]
    along_row = any(getattr(p, f"{w}_dtype") is not None and inner.stride(w) != 0 for w in ("scale", "shift"))
    streaming = ("looped", "split", "coop")
    pv = 0 if peel_vec else _peel_vec(p, dbytes, unit, vec)
    # held rows are peeled when even a row starting just past a boundary keeps enough whole vectors
    long_rows = pv and (p.reduced - (pv - 1)) // pv >= PEEL_PERSISTENT_MIN_VECTORS
    peelable = streaming + (("persistent",) if long_rows else ())
    if pv and schedule in peelable:
        peeled = _plan_inner(p, common, dbytes, unit, why_in, force_in, csizes, peel_vec=pv)
        if peeled.schedule in peelable:
            return peeled
    hints = _hints("inner", schedule, p.kept * p.reduced * dbytes["x"], why,
                   row_params_16bit=cluster == 1 and dbytes["x"] == 2 and along_row, arch=common["arch"])
    return Plan(
        strategy="inner", schedule=schedule, vec=vec,
        scale_vec=not peel_vec and _param_vec(p, axes, vec, dbytes, "scale", blk),
        shift_vec=not peel_vec and _param_vec(p, axes, vec, dbytes, "shift", blk),
        threads=threads, tpr=tpr, rows_per_cta=rpc, nxc=0, ry=0, tile=0, group=1,
        per_thread=per, splits=splits, grid=grid, cluster=cluster, cache_hints=hints, why=tuple(why),
        peel=bool(peel_vec), finish_splits=finish, **common,
    )


def _plan_outer(p, common, dbytes, unit, strategy, why, force=None, csizes=CLUSTER_SIZES):
    axes = p.axes
    if force == "coop":
        why.append(f"the coop schedule exists for the inner strategy only: not forced ({strategy})")
        force = None
    if force == "staged":
        why.append(f"the staged schedule exists for the inner strategy only: not forced ({strategy})")
        force = None
    if force == "grid":
        why.append(f"rows held over a co-resident grid exist for the inner strategy only: not forced ({strategy})")
        force = None
    sms = common["sms"]
    x_bytes = p.kept * p.reduced * dbytes["x"]
    block = list(axes[-2:]) if strategy == "mixed" else [axes[-1]]
    cb = math.prod(a.size for a in block)
    group = block[-1].size if strategy == "mixed" else 1
    rows = math.prod(a.size for a in axes if a.reduced and a not in block)
    kept_outer = math.prod(a.size for a in axes if not a.reduced and a not in block)
    # The block is one contiguous run of cb elements; only the strides of axes outside it matter for
    # vector alignment (the kept part of a mixed block steps by the run length inside the block).
    outside = [a for a in axes if a not in block] + [block[-1]]
    vec = pick_vec(outside, cb, dbytes, p.align) if unit else 1
    if vec > 1:
        why.append(f"vec={vec}: {vec * dbytes['x']} B accesses along the {cb}-column contiguous block")
    ncv = cb // vec
    if strategy == "mixed":
        # Tile the (g k) block by whole groups: the smallest group count whose tile is >= MIXED_MIN_TILE_BYTES
        # contiguous bytes (and a multiple of vec), then smaller tiles if the larger one does not fit on chip.
        ngroups = block[0].size
        step = vec // math.gcd(group, vec)
        gpt = step
        while gpt * group * dbytes["x"] < MIXED_MIN_TILE_BYTES and gpt < ngroups:
            gpt += step
        tiles = []
        while gpt >= step:
            tiles.append(min(gpt, -(-ngroups // step) * step) * group)
            gpt = (gpt // 2) // step * step
    else:
        # One warp covers up to 32 vectors of a row (512 B at 16 B/vector); narrower blocks let lanes wrap
        # onto the next rows, which are contiguous when the block is the whole row.
        tiles = [min(ncv, OUTER_TILE_VECTORS) * vec]

    def shape(tile_, threads_):
        # A block of no columns (an empty kept axis: x has zero size, nothing is launched) is planned as one
        # column of no tiles, as an inner plan of no rows: a plan that says "launch: none".
        nxc_ = max(tile_ // vec, 1)
        threads_ = max(threads_, -(-nxc_ // 32) * 32)
        return nxc_, threads_, threads_ // nxc_, kept_outer * -(-cb // max(tile_, 1))

    # Persistent candidates in order of preference: one CTA of 256 then 512 threads, then a cluster of
    # CLUSTER_SIZES CTAs of 512 threads (the last size may hold up to twice the values per thread).
    choice = None
    if force not in ("looped", "split", "cluster"):
        for tile_ in tiles:
            for threads_ in (CTA_THREADS, MAX_PERSISTENT_THREADS):
                nxc_, thr, ry_, base_ = shape(tile_, threads_)
                per_ = -(-rows // ry_)
                if per_ * vec <= MAX_VALUES_PER_THREAD:
                    choice = (tile_, nxc_, thr, ry_, base_, per_, 1)
                    break
            if choice is None and (_clusters_ok(common["arch"]) and bool(csizes)):
                nxc_, thr, ry_, base_ = shape(tile_, CTA_THREADS)
                tile_bytes = rows * tile_ * dbytes["x"]
                if base_ >= OUTER_LOOPED_MIN_TILES_PER_SM * sms and sms * tile_bytes <= LOOPED_L2_BYTES:
                    why.append(f"a tile's {tile_bytes} B x {sms} SMs in flight fit in L2 (<= {LOOPED_L2_BYTES} B): "
                               "the looped schedule's re-read hits L2, no cluster needed")
                    break
                # 256-thread CTAs (two per SM even with up to 64 values each), smallest cluster first. Measured
                # on the H200: NHWC instance norm (256, 128, 28, 28) float32, 8 CTAs x 256 threads x 52 values
                # 79 us vs 8 x 512 x 28 values 118 us; NHWC group norm (8, 640, 32, 32) 8 x 256: 28 us vs
                # 8 x 512: 51 us; non-portable 16-CTA clusters were slower than the split schedule (66 vs 51 us
                # on (8, 320, 64, 64)).
                cands = [(C, CTA_THREADS) for C in csizes if C <= PORTABLE_CLUSTER]
                for C, t in cands:
                    nxc_, thr, ry_, base_ = shape(tile_, t)
                    per_ = -(-(-(-rows // C)) // ry_)
                    if per_ * vec <= OUTER_CLUSTER_MAX_VALUES:
                        choice = (tile_, nxc_, thr, ry_, base_, per_, C)
                        break
            if choice is not None:
                break
    if force == "cluster" and (_clusters_ok(common["arch"]) and bool(csizes)):
        nxc_, thr, ry_, base_ = shape(tiles[0], CTA_THREADS)
        for C in csizes:
            per_ = -(-(-(-rows // C)) // ry_)
            if per_ * vec <= 2 * MAX_VALUES_PER_THREAD:
                choice = (tiles[0], nxc_, thr, ry_, base_, per_, C)
                why.append(f"schedule forced to a cluster of {C} CTAs per column tile")
                break
    if force == "cluster" and choice is None:
        if not _clusters_ok(common["arch"]):
            why.append(f"clusters need sm_90 or newer ({common['arch']}): schedule not forced")
        elif not csizes:
            why.append("no thread-block cluster size is allowed (max_cluster): schedule not forced")
        else:
            why.append(f"{rows} rows of a column tile do not fit the registers of a cluster of {csizes[-1]} CTAs "
                       f"(<= {2 * MAX_VALUES_PER_THREAD} values per thread): cluster schedule not forced")
    cluster = 1
    if choice is not None:
        tile, nxc, threads, ry, base, per_persist, cluster = choice
    else:
        tile = tiles[0]
        nxc, threads, ry, base = shape(tile, OUTER_STREAM_THREADS)
        per_persist = -(-rows // ry)
    if force == "looped":
        schedule, splits, per, cluster = "looped", 1, LOOP_UNROLL, 1
        why.append("schedule forced to looped")
    elif force == "split":
        splits = max(2, min(-(-rows // ry), 4))
        schedule, per, cluster = "split", LOOP_UNROLL, 1
        why.append(f"schedule forced to split ({splits} CTAs per column tile)")
    elif choice is not None:
        schedule, splits, per = "persistent", 1, per_persist
        if cluster > 1:
            why.append(
                f"{rows} rows of each column tile over a cluster of {cluster} CTAs x {ry} y-threads: {per} vectors "
                f"x {vec} per thread fit in registers; partial statistics merged through distributed shared "
                f"memory: x read once"
            )
        else:
            why.append(
                f"{rows} rows over {ry} y-threads: {per} vectors x {vec} per thread fit in registers: x read once"
            )
    elif base >= OUTER_LOOPED_MIN_TILES_PER_SM * sms:
        schedule, splits, per = "looped", 1, LOOP_UNROLL
        if strategy == "outer":
            nxc, threads, ry, _ = shape(tile, OUTER_LOOPED_THREADS)
            per = OUTER_LOOPED_UNROLL
        why.append(f"{base} column tiles >= {sms} SMs: one CTA of {threads} threads per column tile, statistics "
                   f"loop, re-read (from L2), {per} vectors a thread in flight")
    else:
        want = OUTER_SPLIT_CTAS_PER_SM * sms * STREAM_THREADS // max(threads * base, 1)  # whole waves: no tail
        max_splits = max(1, rows // (ry * LOOP_UNROLL))
        if strategy == "mixed":
            max_splits = min(max_splits, max(4, MIXED_MAX_SPLIT_PARTIALS // max(tile, 1)))
        splits = max(1, min(want, max_splits))
        schedule, per = ("split" if splits > 1 else "looped"), LOOP_UNROLL
        why.append(
            f"only {base} column tiles for {rows} rows each: split rows over {splits} CTAs, partial statistics "
            f"to a workspace, merged once per column tile by a second kernel, normalized by a third"
            if splits > 1 else f"{base} column tiles, rows too few to split: statistics loop, re-read"
        )
    if force == "persistent" and schedule != "persistent":
        cl = ("" if _clusters_ok(common["arch"])
              else f" (nor a cluster's: clusters need sm_90 or newer, {common['arch']})")
        why.append(f"{rows} rows of a column tile do not fit one CTA's registers{cl}: persistent schedule not forced")
    elif force == "persistent" and cluster > 1:
        why.append(f"{rows} rows of a column tile do not fit one CTA's registers: held over a cluster of {cluster} "
                   "CTAs as planned")
    finish = 1
    if schedule == "split":
        # rows of a split slice over `finish` normalize CTAs, each keeping one loop trip of rows at least
        cap = OUTER_FINISH_SPLITS if strategy == "outer" else MIXED_FINISH_SPLITS
        finish = max(1, min(cap, -(-rows // splits) // (ry * LOOP_UNROLL)))
        if finish > 1:
            why.append(f"normalize kernel over {finish} CTAs per split ({base * splits * finish} CTAs): "
                       "shorter re-reads, a shorter tail")
    hints = _hints(strategy, schedule, x_bytes, why, arch=common["arch"])
    return Plan(
        strategy=strategy, schedule=schedule, vec=vec,
        scale_vec=_param_vec(p, axes, vec, dbytes, "scale", block),
        shift_vec=_param_vec(p, axes, vec, dbytes, "shift", block),
        threads=threads, tpr=0, rows_per_cta=0, nxc=nxc, ry=ry, tile=tile, group=group,
        per_thread=per, splits=splits, grid=base * splits * cluster, cluster=cluster, cache_hints=hints,
        finish_splits=finish, why=tuple(why), **common,
    )


def rejected(plan: Plan) -> list:
    """Why each strategy and schedule the planner did not pick was rejected, one line each.

    Derived from the plan's canonical axes and the same constants :func:`make_plan` uses, so it explains
    the decision without re-running it. Used by ``normc plan --explain``.
    """
    out = []
    axes = plan.axes
    inner = axes[-1]
    isz = ITEMSIZE[plan.x_dtype]
    run = inner.size * isz
    # strategies
    if plan.strategy != "inner":
        if not inner.reduced:
            out.append("inner: the innermost axis is kept, so lanes along the reduction would each "
                       f"step by {axes[-2].x if len(axes) > 1 else 1} elements (no coalescing)")
        else:
            out.append(f"inner: the innermost reduced run is only {run} B (< {MIXED_MAX_RUN_BYTES} B); "
                       "a warp along it would touch many short, separate segments")
    if plan.strategy != "outer":
        out.append("outer: the innermost axis is reduced; outer needs a kept axis innermost")
    if plan.strategy != "mixed":
        if not inner.reduced:
            why = "the innermost axis is kept (outer covers it)"
        elif inner.x != 1 or inner.out != 1:
            why = "the innermost axis is not contiguous"
        elif run >= MIXED_MAX_RUN_BYTES:
            why = f"the innermost reduced run is {run} B, long enough to coalesce along (>= {MIXED_MAX_RUN_BYTES} B)"
        elif len(axes) < 3 or axes[-2].reduced or not any(a.reduced for a in axes[:-2]):
            why = "there is no contiguous kept axis around the run with more reduction axes outside it"
        else:
            why = "the (kept x reduced) block is wider than one CTA can cover"
        out.append(f"mixed: {why}")
    # schedules
    if plan.schedule == "staged":
        out.append(f"persistent, looped, split: rows of {plan.reduced} values ({plan.reduced * isz} B) would give each "
                   "row vectors no wider than its own alignment and leave lanes idle; the rows are one contiguous "
                   "run, so the staged schedule moves them as flat 16-byte vectors instead (x read once)")
        return out
    if plan.schedule == "persistent" and plan.strategy == "inner" and len(axes) == 2:
        out.append(f"staged: {_staged_rejection(plan)}")
    if plan.schedule != "persistent":
        l2 = [w for w in plan.why if "fit in L2" in w]
        cl = "" if _clusters_ok(plan.arch) else f" (clusters need sm_90+, the target is {plan.arch})"
        if l2:
            if plan.strategy == "inner":
                one = (f"a row of {plan.reduced} exceeds one CTA's registers "
                       f"({MAX_PERSISTENT_THREADS} threads x {2 * MAX_VALUES_PER_THREAD} values)")
            else:
                rows = plan.reduced // (plan.group if plan.strategy == "mixed" else 1)
                one = (f"{rows} rows over {plan.ry} y-threads need {-(-rows // plan.ry) * plan.vec} values per "
                       f"thread in one CTA (limit {MAX_VALUES_PER_THREAD})")
            out.append(f"persistent: {one}; a cluster could hold them, but the looped schedule reads HBM about "
                       f"once here ({l2[0].split(': ', 1)[0]})")
        elif plan.strategy == "inner":
            C = CLUSTER_SIZES[-1]
            need = -(-plan.reduced // (C * MAX_PERSISTENT_THREADS * plan.vec)) * plan.vec
            out.append(f"persistent: a row needs {need} values per thread even over a cluster of {C} CTAs x "
                       f"{MAX_PERSISTENT_THREADS} threads (limit {2 * MAX_VALUES_PER_THREAD}){cl}")
        else:
            rows = plan.reduced // (plan.group if plan.strategy == "mixed" else 1)
            need = -(-rows // (PORTABLE_CLUSTER * max(CTA_THREADS // max(plan.nxc, 1), 1))) * plan.vec
            out.append(f"persistent: {rows} rows need {need} values per thread even over a cluster of "
                       f"{PORTABLE_CLUSTER} CTAs x {CTA_THREADS} threads (limit {2 * MAX_VALUES_PER_THREAD}){cl}")
    if plan.schedule != "looped":
        if plan.schedule == "persistent":
            out.append("looped: it reads x twice; the persistent schedule reads it once")
        else:
            n = plan.kept if plan.strategy == "inner" else plan.grid // plan.splits
            out.append(f"looped: only {n} CTAs (one per {'row' if plan.strategy == 'inner' else 'column tile'})"
                       f" for {plan.sms} SMs")
    if plan.schedule != "split":
        if plan.schedule == "persistent":
            out.append("split: the reduction fits one CTA's registers (x read once, one kernel)")
        else:
            out.append(f"split: {plan.grid} CTAs already cover {plan.sms} SMs; splitting would add kernels")
    return out
