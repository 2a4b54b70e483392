"""The ``normc`` command line: plan a spec for a shape, or print the PTX of its kernels (no GPU needed).

    normc plan "n c h w : norm over h w ; scale c ; shift c" --shape 256,128,28,28 --layout "n h w c" --dtype float16
    normc ptx  "t d : rms over d ; scale d" --shape 16384,4096 --dtype bfloat16 --eps 1e-6 -o rms.ptx

Every error normc raises on purpose (:class:`normc.NormcError`) and every bad argument value is reported as
one line, ``normc: error: <message>``, on stderr with exit status 2 (argparse's usage errors also exit 2).
See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from . import __version__
from .errors import NormcError, SpecError
from .problem import DTYPE_ALIASES


_EXAMPLES = """\
examples:
  # NHWC instance norm, fp16: how normc plans it, and the PTX of its kernels
  normc plan "n c h w : norm over h w ; scale c ; shift c" --shape 256,128,28,28 --layout "n h w c" --dtype float16
  normc ptx  "n c h w : norm over h w ; scale c ; shift c" --shape 256,128,28,28 --layout "n h w c" --dtype float16 -o in.ptx

  # group norm, channels-last, 32 groups
  normc plan "n (g k) h w : norm over k h w ; scale g k ; shift g k" --size g=32 --shape 8,320,64,64 --layout "n h w (g k)" --dtype float16

  # RMS norm, bf16, plan as JSON
  normc plan "t d : rms over d ; scale d" --eps 1e-6 --shape 16384,4096 --dtype bfloat16 --json

Planning and PTX generation need no GPU. Documentation: docs/cli.md, docs/dsl.md, docs/planner.md.
"""

_COMMON_EPILOG = """\
SPEC is the normc DSL (docs/dsl.md), e.g. "t d : norm over d ; scale d ; shift d".
--shape is the logical shape, one extent per spec dim in the order the spec writes them (a split dim such
as (g k) counts once). --layout lists the same dims outermost-first as they lie in memory (the last is
contiguous), e.g. "n h w c" or "n h w (g k)"; by default the array is row-major as written.
"""


class _UsageError(Exception):
    """A bad argument value found after argparse (reported like a NormcError)."""


def _parse_shape(text: str) -> tuple:
    parts = [p.strip() for p in text.strip().split(",")] if text.strip() else []
    if not parts:
        raise _UsageError(f"--shape {text!r} is empty; expected comma-separated extents, e.g. 256,128,28,28")
    shape = []
    for p in parts:
        if not re.fullmatch(r"[0-9]+", p):  # ASCII digits (\d also takes other scripts' digits)
            raise _UsageError(f"--shape {text!r}: {p!r} is not a non-negative integer; expected e.g. 256,128,28,28")
        shape.append(int(p))
    return tuple(shape)


def _parse_sizes(items) -> dict:
    sizes = {}
    for item in items or ():
        for piece in (s for s in item.split(",") if s.strip()):
            name, eq, value = piece.partition("=")
            name, value = name.strip(), value.strip()
            if not eq or not name or not re.fullmatch(r"[-+]?[0-9]+", value):
                raise _UsageError(f"--size {piece!r}: expected NAME=INT, e.g. g=32")
            if int(value) < 1:
                raise _UsageError(f"--size {piece.strip()!r}: the size of a part of a split dim must be a positive "
                                  f"int; expected e.g. {name}=32")
            if name in sizes:
                raise _UsageError(f"--size {piece.strip()!r}: {name} is already sized by --size {name}={sizes[name]}; "
                                  "expected each part of a split dim sized once")
            if not name.isidentifier() or name == "eps":
                raise _UsageError(f"--size {piece!r}: {name!r} cannot name a part of a split dim (use --eps for "
                                  f"epsilon); expected NAME=INT, e.g. g=32")
            sizes[name] = int(value)
    return sizes


def _parse_eps(text: str) -> float:
    try:
        if not text.isascii():  # float() takes other scripts' digits
            raise ValueError
        eps = float(text)
    except ValueError:
        raise _UsageError(f"--eps {text!r} is not a number; expected e.g. 1e-5") from None
    if not eps >= 0 or eps == float("inf"):
        raise _UsageError(f"--eps {text!r}: expected a finite number >= 0, e.g. 1e-5")
    return eps


def _parse_dtype(text, flag):
    if text is None:
        return None
    dt = DTYPE_ALIASES.get(text.strip().lower())
    if dt is None:
        raise _UsageError(f"{flag} {text!r}: expected float32, float16 or bfloat16")
    return dt


def _plan_from_args(args):
    from .api import plan_for
    from .spec import spec as parse_spec

    shape = _parse_shape(args.shape)
    sizes = _parse_sizes(args.size)
    eps = _parse_eps(args.eps)
    dtype = _parse_dtype(args.dtype, "--dtype")
    out_dtype = _parse_dtype(args.out_dtype, "--out-dtype")
    sp = parse_spec(args.spec, eps=eps, **sizes)
    sp.axis_sizes(shape)  # rank and split-extent checks, with their messages, before the layout is read
    return plan_for(sp, shape, dtype, layout=args.layout, out_dtype=out_dtype, stats=args.stats, arch=args.arch,
                    schedule=getattr(args, "schedule", None))


def _stdout(data):
    """Write ``data`` (text, or bytes to the stream's byte buffer) to standard output and flush it; a stdout
    that cannot take it (a full disk, a closed stream) is a :class:`_UsageError` (exit 2), as a ``-o`` file
    that cannot be written is. A closed pipe is left to :func:`main` (a quiet stop)."""
    try:
        if sys.stdout is None:
            raise OSError("standard output is closed")
        (sys.stdout.buffer if isinstance(data, bytes) else sys.stdout).write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:  # ValueError: I/O on a closed file
        try:  # drop what is still buffered, so that the interpreter's flush at exit does not fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):
            pass
        raise _UsageError(f"cannot write standard output: {getattr(e, 'strerror', None) or e}") from None


def _emit(data, path):
    """Write ``data`` (text or bytes) to the file ``path``, or to standard output where ``path`` is None or
    ``"-"`` (:func:`_stdout`); a file that cannot be written is a :class:`_UsageError`."""
    if path is None or path == "-":
        _stdout(data)
    else:
        try:
            with open(path, "wb" if isinstance(data, bytes) else "w") as f:
                f.write(data)
        except OSError as e:
            raise _UsageError(f"cannot write {path}: {e.strerror or e}") from None


def ptx_text(kernels, workspace_floats=0) -> str:
    """The ``normc ptx`` output for a list of :class:`normc.lowering.LoweredKernel`: each module after a
    ``// normc kernel i/n: entry=E, grid=G, block=B, shared=S bytes, workspace=W floats, cluster=C`` header
    line, in launch order. Every kernel takes seven pointers (x, out, scale, shift, mean, rstd, workspace); the
    workspace is a float32 scratch buffer of W elements shared by the kernels of one call (W = 0: pass null).
    G counts CTAs; C > 1 means the kernel must be launched with thread-block clusters of C CTAs along x
    (``cudaLaunchAttributeClusterDimension``), G / C clusters."""
    out = []
    n = len(kernels)
    for i, k in enumerate(kernels, 1):
        out.append(
            f"// normc kernel {i}/{n}: entry={k.entry}, grid={k.grid}, block={k.block}, "
            f"shared={k.shared_bytes} bytes, workspace={workspace_floats} floats, cluster={k.cluster}\n"
        )
        out.append(k.ptx if k.ptx.endswith("\n") else k.ptx + "\n")
    return "".join(out)


def _cmd_plan(args) -> int:
    from .lowering import arch_cc, check_16bit_target
    from .planner import rejected

    if args.backward:
        if args.explain:
            raise _UsageError("--explain lists the forward planner's rejected alternatives; the backward plan's "
                              "'why:' lines give its reasons (drop --explain or --backward)")
        _no_stats_with_backward(args)
        plan = _backward_plan_from_args(args)
        check_16bit_target(plan, arch_cc(plan.arch))  # refused as normc ptx refuses it
        _emit((plan.to_json() if args.json else plan.describe()) + "\n", args.output)
        return 0
    if args.explain and args.schedule:
        raise _UsageError("--explain says why the planner did not pick the other strategies and schedules; with "
                          "--schedule the schedule is yours (drop one of them)")
    if args.explain and args.json:
        raise _UsageError("--explain adds text lines ('rejected: ...') that --json output cannot hold "
                          "(drop one of them)")
    plan = _plan_from_args(args)  # normc.plan refuses 16-bit plans before sm_80, as normc ptx does
    text = plan.to_json() if args.json else plan.describe()
    if args.explain:
        text += "\n" + "\n".join(f"rejected: {r}" for r in rejected(plan))
    _emit(text + "\n", args.output)
    return 0


def _no_stats_with_backward(args):
    if getattr(args, "stats", False):
        raise _UsageError("--stats asks the forward for mean and rstd; the backward kernels read them "
                          "(drop --stats or --backward)")
    if getattr(args, "schedule", None):
        raise _UsageError("--schedule forces the forward's schedule; the backward plan chooses its own "
                          "(drop --schedule or --backward)")


def _backward_plan_from_args(args):
    from .runtime.backward import plan_backward
    from .spec import spec as parse_spec

    shape = _parse_shape(args.shape)
    sp = parse_spec(args.spec, eps=_parse_eps(args.eps), **_parse_sizes(args.size))
    sp.axis_sizes(shape)
    return plan_backward(sp, shape, _parse_dtype(args.dtype, "--dtype"), layout=args.layout,
                         dy_dtype=_parse_dtype(args.out_dtype, "--out-dtype"), arch=args.arch, fit_bounds=True)


def _cmd_ptx(args) -> int:
    from .lowering import assemble, link, lower, lower_backward

    if getattr(args, "backward", False):
        _no_stats_with_backward(args)
        plan = _backward_plan_from_args(args)
        if plan.kept * plan.reduced == 0:
            raise _UsageError("--shape has a zero extent: there is nothing to compute and no kernel to write")
        kernels = lower_backward(plan)
    else:
        plan = _plan_from_args(args)
        if plan.kept * plan.reduced == 0:
            raise _UsageError("--shape has a zero extent: there is nothing to compute and no kernel to write")
        kernels = lower(plan)
    if args.resource_usage:
        for i, k in enumerate(kernels, 1):
            u = assemble(k.ptx, plan.arch)[1]
            print(f"kernel {i}/{len(kernels)} {k.entry[:48]}: {u.registers} registers/thread, "
                  f"{k.shared_bytes} B shared, {u.stack} B stack, {u.spill_stores} B spill stores, "
                  f"{u.spill_loads} B spill loads, grid {k.grid} x block {k.block}", file=sys.stderr)
    if args.cubin:
        if args.output is None or (args.output == "-" and (sys.stdout.isatty() or not hasattr(sys.stdout, "buffer"))):
            raise _UsageError("--cubin writes binary: give the file with -o FILE (-o - with stdout redirected)")
        _emit(link([k.ptx for k in kernels], plan.arch), args.output)
        return 0
    _emit(ptx_text(kernels, plan.workspace_floats), args.output)
    return 0


def _int_arg(text, flag, minimum=0):
    if text is None:
        return None
    if not re.fullmatch(r"\s*\d+\s*", str(text)) or int(text) < minimum:
        raise _UsageError(f"{flag} {text!r}: expected an integer >= {minimum}")
    return int(text)


def _cmd_bench(args) -> int:
    from . import bench

    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    if not systems:
        raise _UsageError(f"--systems {args.systems!r} names no system; expected some of {', '.join(bench.SYSTEMS)}")
    bad = [s for s in systems if s not in bench.SYSTEMS]
    if bad:
        raise _UsageError(f"--systems: unknown {', '.join(bad)}; expected some of {', '.join(bench.SYSTEMS)}")
    rows = None
    if args.rows:
        try:
            rows = bench.parse_rows(args.rows)
        except ValueError as e:
            raise _UsageError(str(e)) from None
    limit = _int_arg(args.limit, "--limit", 1)
    jobs = _int_arg(args.jobs, "--jobs", 0)
    budget = None
    if args.budget is not None:
        try:
            budget = float(args.budget)
        except ValueError:
            budget = -1.0
        if not budget > 0 or budget == float("inf"):
            raise _UsageError(f"--budget {args.budget!r}: expected a number of seconds > 0, e.g. 200")
    kind = "backward" if args.backward else "forward"
    stem = bench.STEMS[kind]
    if args.render:
        if not args.out:
            raise _UsageError(f"--render needs --out (the directory holding {stem}.json)")
        text, charted = bench.render(args.out, kind)
        if not charted:
            print(f"normc bench: matplotlib is not installed: {stem}.png not written (pip install 'normc[bench]')",
                  file=sys.stderr)
        _stdout(text)
        return 0
    if args.resume and not args.out:
        raise _UsageError(f"--resume needs --out (the directory holding the run's {stem}.json)")
    go = bench.run_backward if args.backward else bench.run
    result = go(table=args.table, rows=rows, systems=systems, out_dir=args.out, resume=args.resume, limit=limit,
                budget_s=budget, jobs=jobs, compile_dynamic=args.compile_dynamic)
    _stdout(bench.markdown(result))
    return 0


def _cmd_cache(args) -> int:
    from .runtime import cache

    d = cache.cache_dir()
    if args.action == "dir":
        _stdout(f"{d}\n")
        return 0
    if os.path.exists(d) and not os.path.isdir(d):
        raise _UsageError(f"the cache directory {d} is not a directory (NORMC_CACHE_DIR names a file?)")
    try:  # only files named as the cache names them: anything else in the directory is not normc's
        names = cache.entry_names(temporary=args.action == "clear")
    except OSError as e:
        raise _UsageError(f"cannot list {d}: {e.strerror or e}") from None
    if args.action == "clear":
        n = 0
        for f in names:
            try:
                os.unlink(os.path.join(d, f))
                n += not f.startswith(".")  # an entry, not the temporary file of an unfinished write
            except FileNotFoundError:  # removed meanwhile (a concurrent clear, or a write renamed into place)
                pass
            except OSError as e:
                raise _UsageError(f"cannot remove {os.path.join(d, f)}: {e.strerror or e}") from None
        _stdout(f"removed {n} cached kernel set(s) from {d}\n")
        return 0
    entries = [(f, cache.load(f[:-len(".json")])) for f in names]
    bad = sum(payload is None for _, payload in entries)
    lines = [f"{d}: {len(entries) - bad} cached kernel set(s)"
             + (f", {bad} unreadable or corrupt (rebuilt when next needed)" if bad else "")]
    for f, payload in entries:
        if payload is not None:
            size = os.path.getsize(os.path.join(d, f))
            lines.append(f"  {f[:16]}  {size / 1024:8.1f} KiB  {len(payload['kernels'])} kernel(s)  "
                         f"{payload.get('summary', '(no summary)')}")
    _stdout("\n".join(lines) + "\n")
    return 0


def _add_common(p):
    p.add_argument("spec", metavar="SPEC", help='the normc spec, e.g. "n c h w : norm over h w ; scale c ; shift c"')
    p.add_argument("--shape", required=True, metavar="N,N,...",
                   help="logical shape of x, one extent per spec dim, e.g. 256,128,28,28")
    p.add_argument("--dtype", default="float32", metavar="DTYPE",
                   help="x's dtype: float32 (default), float16 or bfloat16 (fp32, fp16, bf16 also accepted)")
    p.add_argument("--out-dtype", default=None, metavar="DTYPE", help="output dtype (default: x's dtype)")
    p.add_argument("--layout", default=None, metavar="DIMS",
                   help='memory order of x, outermost first, e.g. "n h w c" or "n h w (g k)" (default: as the spec '
                        "writes its dims, i.e. row-major)")
    p.add_argument("--size", action="append", default=[], metavar="NAME=INT",
                   help="size of a part of a split dim, e.g. g=32 (repeatable)")
    p.add_argument("--eps", default="1e-5", metavar="FLOAT", help="epsilon added to the variance / mean square "
                   "(default 1e-5)")
    p.add_argument("--arch", default="sm_90", help="target compute capability (default sm_90)")
    p.add_argument("--stats", action="store_true", help="also produce float32 mean and rstd per reduction")
    from .runtime.tune import SCHEDULES  # the one list of schedule names (None: the planner's choice)

    p.add_argument("--schedule", default=None, choices=[s for s in SCHEDULES if s is not None],
                   help="force the forward's schedule, as normc.compile(schedule=...) does (where the problem does "
                        "not admit it, the plan keeps the planner's choice and its 'why:' lines say so)")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of stdout ('-': stdout)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``normc`` command (subcommands plan, ptx, bench, cache)."""
    parser = argparse.ArgumentParser(
        prog="normc",
        description="normc: a compiler for GPU normalization kernels. Plan a spec for a shape and layout, or "
                    "print the PTX of its kernels. No GPU is needed for either.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"normc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "plan", help="print the plan (strategy, schedule, tiling, launch, reasons)",
        description="Plan SPEC for an x of --shape/--dtype/--layout and print the plan: strategy "
                    "(inner/outer/mixed), schedule (persistent/staged/looped/split/coop), tiling, launch and the reasons.",
        epilog=_COMMON_EPILOG + """
examples:
  normc plan "n c h w : norm over h w ; scale c ; shift c" --shape 256,128,28,28 --dtype float16
  normc plan "n c h w : norm over h w ; scale c ; shift c" --shape 256,128,28,28 --dtype float16 --layout "n h w c"
  normc plan "t d : norm over d ; scale d ; shift d" --shape 16384,4096 --dtype bfloat16 --json
  normc plan "n c d h w : norm over d h w ; scale c ; shift c" --shape 4,256,32,32,32 --backward
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (Plan.to_json) instead of text")
    p.add_argument("--explain", action="store_true", help="also say why each other strategy and schedule was "
                   "rejected (text output: not with --json or --backward)")
    p.add_argument("--backward", action="store_true", help="the backward plan instead (dx's reduction, the fused "
                   "or column kernel and its cluster, the parameter reductions, the workspace; --out-dtype is "
                   "dy's dtype; not with --stats); see docs/backward.md")
    p.set_defaults(func=_cmd_plan, command_parser=p)

    p = sub.add_parser(
        "ptx", help="print the PTX of the plan's kernels",
        description="Compile SPEC for an x of --shape/--dtype/--layout and print the PTX of its kernels in launch "
                    "order (forward: 2 or 3 for a split schedule; --backward: see docs/backward.md), each after "
                    "a '// normc kernel i/n: entry=..., grid=..., block=..., shared=... bytes, workspace=... floats, "
                    "cluster=C' line. The PTX carries no cluster directive: a kernel with C > 1 must be launched "
                    "with thread-block clusters of C CTAs along x (grid / C clusters).",
        epilog=_COMMON_EPILOG + """
examples:
  normc ptx "n c h w : norm over h w ; scale c ; shift c" --shape 256,128,28,28 --layout "n h w c" --dtype float16
  normc ptx "t d : rms over d ; scale d" --eps 1e-6 --shape 16384,4096 --dtype bfloat16 -o rms.ptx
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(p)
    p.add_argument("--backward", action="store_true", help="the gradient kernels instead (dx, dscale, dshift; "
                   "nine pointers each: dy, x, scale, mean, rstd, dx, workspace, dscale, dshift; --out-dtype is "
                   "dy's dtype); see docs/backward.md")
    p.add_argument("--cubin", action="store_true", help="write one cubin (all kernels linked by nvJitLink for "
                   "--arch) to the -o FILE instead of PTX")
    p.add_argument("--resource-usage", action="store_true", help="report registers, shared memory, stack and "
                   "spills of each kernel (ptxas through nvJitLink) on stderr")
    p.set_defaults(func=_cmd_ptx, command_parser=p)

    p = sub.add_parser(
        "bench", help="time normc against torch eager, torch.compile and Liger on a workload table (GPU)",
        description="On a CUDA GPU: for each workload of the table (default: the bundled anchor table), check "
                    "and time normc, PyTorch eager, torch.compile and Liger (where importable and where they "
                    "have the op), next to the copy-bandwidth floor measured in the same run; write bench.json, "
                    "bench.md and (with matplotlib) bench.png to --out. With --backward: the backward alone and "
                    "forward + backward, every peer's dx/dscale/dshift checked against normc's; backward.json, "
                    "backward.md, backward.png.",
        epilog="examples:\n  normc bench --out docs/perf\n  normc bench --rows 0,1,2,3 --systems normc,eager\n"
               "  normc bench --table my_shapes.json --out /tmp/bench\n"
               "  normc bench --backward --out docs/perf --rows 40-52 --budget 200\n"
               "  normc bench --backward --out docs/perf --resume\n"
               "  normc bench --backward --out docs/perf --render\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--backward", action="store_true",
                   help="benchmark the backward (alone, from saved statistics / a retained autograd graph) and "
                        "forward + backward instead of the forward; reports backward.json/.md/.png")
    p.add_argument("--table", default=None, metavar="FILE", help="JSON table of the anchors.json form")
    p.add_argument("--rows", default=None, metavar="I,J,A-B",
                   help="row indices and inclusive ranges to run, e.g. 0,5,40-44 (default: all)")
    p.add_argument("--limit", default=None, metavar="N", help="run at most N rows (of those not done yet)")
    p.add_argument("--budget", default=None, metavar="SECONDS",
                   help="start no new row after this many seconds (the JSON keeps the rows done; --resume "
                        "continues)")
    p.add_argument("--systems", default="normc,eager,compile,liger", metavar="S,...",
                   help="systems to run (default: normc,eager,compile,liger)")
    p.add_argument("--compile-dynamic", action="store_true",
                   help="torch.compile with dynamic shapes, one compile shared by the rows of a family, dtype, "
                        "rank and memory order (default: static shapes, one compile per row)")
    p.add_argument("--jobs", default=None, metavar="N",
                   help="processes compiling normc's kernels for the coming rows while the GPU runs (default: "
                        "half the CPU cores, at most 8; 0: none)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write bench.json, bench.md, bench.png here (backward.* with --backward)")
    p.add_argument("--render", action="store_true",
                   help="no GPU run: rewrite the Markdown and PNG from --out/bench.json (backward.json with "
                        "--backward), e.g. on a machine with matplotlib")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out/bench.json (backward.json with --backward; written after every "
                        "row) instead of starting over")
    p.set_defaults(func=_cmd_bench, command_parser=p)

    p = sub.add_parser(
        "cache", help="list or clear the on-disk kernel cache",
        description="The on-disk kernel cache ($NORMC_CACHE_DIR, else the user cache directory): list its "
                    "entries, clear it (only files named as its entries are), or print its directory.",
        epilog="examples:\n  normc cache list\n  normc cache clear\n  NORMC_CACHE_DIR=/tmp/k normc cache dir\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=("list", "clear", "dir"), nargs="?", default="list")
    p.set_defaults(func=_cmd_cache, command_parser=p)
    return parser


def _error_line(e: Exception) -> str:
    if isinstance(e, SpecError) and e.text is not None and e.pos is not None:
        return f"{e.message} (at column {max(0, min(e.pos, len(e.text))) + 1} of the spec)"
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _join_negative_values(argv):
    """``--eps -1e-5`` -> ``--eps=-1e-5`` (and ``--shape -2,3`` alike): argparse reads a value
    that starts with '-' and is not a plain negative number (an exponent, a list) as an option and reports
    "expected one argument"; joined, the value reaches normc's own check, which says what is expected."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--eps", "--shape") and i + 1 < len(argv) and re.match(r"-[\d.]", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv=None) -> int:
    """Run the ``normc`` command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            hint = ("; the spec is one argument: quote it, e.g. normc plan \"n c h w : norm over h w\" --shape ..."
                    if args.command in ("plan", "ptx") and ":" in extra else "")
            # the command's own usage line, as argparse gives for its other errors
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    except SystemExit as e:  # --help, --version (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        return args.func(args)
    except (NormcError, _UsageError) as e:
        print(f"normc: error: {_error_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader closed the pipe (e.g. `normc ptx ... | head`): stop quietly, as cat does minus the noise.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0


__all__ = ["main", "build_parser", "ptx_text"]

if __name__ == "__main__":
    sys.exit(main())
