"""The ``normc`` command line (no GPU needed: planning and NVVM run on the host)."""

import json
import os
import re
import subprocess
import sys

import pytest

import normc
from normc.cli import main

IN_SPEC = "n c h w : norm over h w ; scale c ; shift c"
IN_ARGS = [IN_SPEC, "--shape", "256,128,28,28", "--dtype", "float16"]
NHWC = ["--layout", "n h w c"]

HEADER = re.compile(r"^// normc kernel (\d+)/(\d+): entry=(\S+), grid=(\d+), block=(\d+), shared=(\d+) bytes, workspace=(\d+) floats, cluster=(\d+)$", re.M)


def _modules(text):
    """Split ``normc ptx`` output at its header lines: [(header match, module text)]."""
    heads = list(HEADER.finditer(text))
    assert heads, text[:500]
    assert text.startswith("// normc kernel 1/")
    out = []
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        out.append((h, text[h.end():end]))
    return out


def _check_ptx(text, plan):
    mods = _modules(text)
    n = 1 if plan.schedule != "split" else (2 if plan.strategy == "inner" else 3)
    assert len(mods) == n
    for i, (h, body) in enumerate(mods, 1):
        assert (int(h.group(1)), int(h.group(2))) == (i, n)
        entries = re.findall(r"\.visible\s+\.entry\s+([\w$]+)\s*\(", body)
        assert entries == [h.group(3)]
        assert ".extern" not in body
        assert ".target sm_90" in body
        assert int(h.group(5)) == plan.threads
        assert int(h.group(7)) == plan.workspace_floats
        if n != 3 or i != 2:  # the outer split's middle kernel runs one CTA per column tile
            assert int(h.group(4)) == plan.grid


def _one_error_line(err):
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("normc: error: ")
    return lines[0]


def test_ptx_nhwc_instance_norm(capsys):
    assert main(["ptx", *IN_ARGS, *NHWC]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    plan = normc.plan(IN_SPEC, (256, 128, 28, 28), "float16", layout="n h w c")
    _check_ptx(out, plan)


def test_ptx_output_file(tmp_path, capsys):
    path = tmp_path / "ln.ptx"
    args = ["ptx", "t d : norm over d ; scale d ; shift d", "--shape", "64,1024", "--dtype", "bf16", "--stats",
            "-o", str(path)]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    plan = normc.plan("t d : norm over d ; scale d ; shift d", (64, 1024), "bfloat16", stats=True)
    _check_ptx(path.read_text(), plan)


def test_plan_strategy_follows_layout(capsys):
    assert main(["plan", *IN_ARGS, *NHWC]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("strategy: outer")
    assert main(["plan", *IN_ARGS]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("strategy: inner")
    assert "why:" in out


def test_plan_group_norm_mixed(capsys):
    args = ["plan", "n (g k) h w : norm over k h w ; scale g k ; shift g k", "--size", "g=32",
            "--shape", "8,320,64,64", "--dtype", "float16", "--layout", "n h w (g k)"]
    assert main(args) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("strategy: mixed")


def test_plan_json(capsys):
    assert main(["plan", *IN_ARGS, *NHWC, "--json", "--stats", "--out-dtype", "float32"]) == 0
    out, _ = capsys.readouterr()
    d = json.loads(out)
    assert d["strategy"] == "outer"
    assert d["stats"] is True and d["out_dtype"] == "float32" and d["x_dtype"] == "float16"
    assert normc.Plan.from_json(out).strategy == "outer"


def test_plan_backward(capsys):
    # NCDHW float32 rows of 32768: the fused dx over a cluster of 2 (text and JSON), the same plan as the API's
    from normc.runtime.backward import plan_backward

    args = ["plan", "n c d h w : norm over d h w ; scale c ; shift c", "--shape", "4,256,32,32,32", "--backward"]
    assert main(args) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("backward: 1024 rows x 32768 elements") and "cluster of 2 CTAs per row" in out
    assert main(args + ["--json"]) == 0
    out, _ = capsys.readouterr()
    # the plan that runs (fit_bounds: its first choice prefetches, which would spill, so it is planned again)
    want = plan_backward("n c d h w : norm over d h w ; scale c ; shift c", (4, 256, 32, 32, 32), "float32",
                         fit_bounds=True)
    got = json.loads(out)
    assert got == json.loads(want.to_json()) and got["fused"]["cluster"] == 2 and not got["fused"]["prefetch"]
    # NHWC: dy in float32 for a float16 x (--out-dtype), the general outer path
    assert main(["plan", *IN_ARGS, *NHWC, "--backward", "--out-dtype", "float32"]) == 0
    out, _ = capsys.readouterr()
    assert "x float16, dy float32" in out and "dx: outer" in out
    assert main(args + ["--explain"]) == 2
    assert "--explain" in capsys.readouterr().err
    # flags that would be ignored are usage errors
    assert main(args + ["--stats"]) == 2
    assert "--stats" in capsys.readouterr().err
    assert main(["plan", *IN_ARGS, "--json", "--explain"]) == 2
    assert "--explain" in capsys.readouterr().err
    # the backward plan checks --arch as the forward does
    for arch, msg in (("foo", "arch is 'foo'"), ("sm_50", "arch sm_50 is not supported")):
        assert main(args + ["--arch", arch]) == 2
        assert msg in capsys.readouterr().err


def test_unknown_option_shows_the_commands_usage(capsys):
    assert main(["plan", "t d : norm over d", "--shape", "2,3", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: normc plan") and "normc plan: error: unrecognized arguments: --bogus" in err


def test_bad_size_names_and_empty_backward_ptx(capsys):
    # a split part named eps would collide with the spec's epsilon: a usage error, not a TypeError
    assert main(["plan", "t d : norm over d", "--shape", "2,3", "--size", "eps=3"]) == 2
    assert "'eps' cannot name a part of a split dim" in capsys.readouterr().err
    # no kernel to write for an empty x, backward as forward
    for extra in ([], ["--backward"]):
        assert main(["ptx", "t d : norm over d ; scale d ; shift d", "--shape", "0,16", *extra]) == 2
        assert "zero extent" in capsys.readouterr().err


def test_plan_eps_and_sizes(capsys):
    assert main(["plan", "t d : rms over d ; scale d", "--shape", "16384,4096", "--dtype", "bfloat16",
                 "--eps", "1e-6", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["eps"] == 1e-6 and d["stat"] == "rms"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["plan", "n c h w : norm ovr h w", "--shape", "2,3,4,5"], "missing 'over'"),
        (["ptx", "n c h w : norm over q", "--shape", "2,3,4,5"], "unknown reduction axis"),
        (["plan", IN_SPEC, "--shape", "2,x"], "--shape"),
        (["plan", IN_SPEC, "--shape", "2,-3,4,5"], "--shape"),
        (["plan", IN_SPEC, "--shape", "2,\uff13,4,5"], "is not a non-negative integer"),  # full-width 3: was read as 3
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--eps", "\u0663"], "--eps"),  # Arabic-Indic 3: was read as 3.0
        (["plan", "n (g k) h w : norm over k h w", "--size", "g=\uff14", "--shape", "2,8,4,4"], "expected NAME=INT"),
        (["plan", IN_SPEC, "--shape", "2,3"], "rank 2"),
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--layout", "n h c"], "layout"),
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--layout", "n h h c"], "layout"),
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--dtype", "int8"], "--dtype"),
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--eps", "abc"], "--eps"),
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--eps", "-1"], "eps"),
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--size", "g"], "--size"),
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--size", "g=4"], "not an axis"),
        (["plan", IN_SPEC, "--shape", "2,3,4,5", "--arch", "volta"], "arch"),
        (["ptx", "t d : norm over d", "--shape", "2,5", "--arch", "sm_999"], "'sm_999': compute capability 99.9"),
        (["ptx", "t d : norm over d", "--shape", "2,5", "--arch", "sm_130"], "'sm_130': compute capability 13.0"),
        (["ptx", "t d : norm over d", "--shape", "2,5", "--arch", "sm_90a"], "'sm_90a'; arch-specific targets"),
        (["plan", "n (g k) h w : norm over k h w", "--size", "g=32", "--shape", "2,48,4,4"], "divisible"),
        (["plan", "t d : norm over d", "--shape", "4,8", "--backward", "--stats"], "drop --stats or --backward"),
        (["ptx", "t d : norm over d", "--shape", "4,8", "--backward", "--stats"], "drop --stats or --backward"),
        (["plan", "t d : norm over d", "--shape", "4,8", "--backward", "--schedule", "split"],
         "drop --schedule or --backward"),
        (["plan", "t d : norm over d", "--shape", "4,8", "--explain", "--schedule", "split"], "drop one of them"),
    ],
)
def test_errors_exit_2_with_one_line(args, needle, capsys):
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert needle in _one_error_line(err)


@pytest.mark.parametrize("arch", ["sm_75", "sm_86", "sm_90", "sm_100", "sm_120"])
def test_ptx_targets_the_arch_asked_for(arch, capsys):
    """Architectures the toolkit compiles for are kept as given (sm_999 once printed ``.target sm_121``)."""
    assert main(["ptx", "t d : norm over d", "--shape", "2,5", "--arch", arch]) == 0
    assert re.findall(r"^\.target (\S+)$", capsys.readouterr().out, re.M) == [arch]


def test_plan_and_ptx_schedule_forced(capsys):
    """--schedule forces the forward's schedule as normc.compile(schedule=...) does: a 64 x 4096 layer norm the
    planner keeps persistent is planned and lowered split (2 kernels) and coop (counters, then the cooperative
    kernel with at least 2 CTAs per row); a schedule the problem does not admit leaves the planner's choice."""
    args = ["t d : norm over d ; scale d ; shift d", "--shape", "64,4096"]
    assert main(["plan", *args]) == 0
    assert capsys.readouterr().out.startswith("strategy: inner / persistent")
    assert main(["plan", *args, "--schedule", "split", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["schedule"], plan["splits"] >= 2) == ("split", True)
    assert main(["ptx", *args, "--schedule", "split"]) == 0
    assert len(_modules(capsys.readouterr().out)) == 2
    assert main(["plan", *args, "--schedule", "coop"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("strategy: inner / coop") and "splits=2" in out
    assert main(["plan", "n c h w : norm over h w", "--shape", "2,3,4,5", "--layout", "n h w c",
                 "--schedule", "coop"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("strategy: outer /") and "coop schedule exists for the inner strategy only" in out
    assert main(["plan", *args, "--schedule", "fast"]) == 2
    assert "--schedule" in capsys.readouterr().err


@pytest.mark.parametrize("schedule, note", [
    ("cluster", "cluster schedule not forced"), ("persistent", "persistent schedule not forced")])
def test_forced_schedule_that_does_not_fit_keeps_the_planners_plan(schedule, note, capsys):
    """A 10M-element row fits neither one CTA's nor a cluster's registers: forcing persistent or cluster keeps
    the planner's split unchanged (it once left a split with 306 vectors per thread, whose partial kernel
    spilled 7 KB) and a why line says the request was not applied."""
    args = ["t d : norm over d ; scale d ; shift d", "--shape", "2,10000000", "--json"]
    assert main(["plan", *args]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["plan", *args, "--schedule", schedule]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert any(note in w for w in forced.pop("why"))
    default.pop("why")
    assert forced == default


@pytest.mark.parametrize("arch, shape, schedule, note", [
    ("sm_80", "256,128,28,28", "cluster", "clusters need sm_90 or newer (sm_80): schedule not forced"),
    ("sm_75", "256,128,28,28", "cluster", "clusters need sm_90 or newer (sm_75): schedule not forced"),
    ("sm_80", "256,128,28,28", "persistent",
     "784 rows of a column tile do not fit one CTA's registers (nor a cluster's: clusters need sm_90 or newer, "
     "sm_80): persistent schedule not forced"),
    ("sm_90", "2,64,256,256", "cluster", "65536 rows of a column tile do not fit the registers of a cluster of 16 "
     "CTAs (<= 64 values per thread): cluster schedule not forced"),
    ("sm_90", "256,128,28,28", "persistent", "784 rows of a column tile do not fit one CTA's registers: held over a "
     "cluster of 8 CTAs as planned"),
])
def test_outer_forced_schedule_not_honoured_says_why(arch, shape, schedule, note, capsys):
    """An outer (NHWC) plan that cannot take a forced cluster or persistent schedule (no clusters before sm_90,
    rows too many for registers) keeps the planner's plan and says so in a why line (it said nothing)."""
    args = ["n c h w : norm over h w ; scale c ; shift c", "--shape", shape, "--layout", "n h w c", "--arch", arch,
            "--json"]
    assert main(["plan", *args]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["plan", *args, "--schedule", schedule]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert note in forced.pop("why")
    default.pop("why")
    assert forced == default


def test_16bit_kernels_before_sm_80_are_refused_not_emitted(capsys):
    """16-bit kernels round float32 pairs with cvt.rn.f16x2.f32 (sm_80+): for sm_75 the CLI refuses them with
    the reason, instead of writing PTX that ptxas rejects; float32 kernels (coop included: no evict-last
    policy before sm_80) still assemble there."""
    ln = "t d : norm over d ; scale d ; shift d"
    for extra in ([], ["--backward"]):
        assert main(["ptx", ln, "--shape", "4,1024", "--dtype", "float16", "--arch", "sm_75", *extra]) == 2
        assert "compute capability 8.0 or newer" in _one_error_line(capsys.readouterr().err)
    assert main(["ptx", ln, "--shape", "3,600", "--schedule", "coop", "--arch", "sm_75", "--resource-usage",
                 "-o", os.devnull]) == 0
    assert "registers/thread" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--backward"], ["--out-dtype", "bfloat16"], ["--json"]])
def test_plan_refuses_16bit_before_sm_80_as_ptx_does(extra, capsys):
    """normc plan --arch sm_75 --dtype float16 printed a plan whose kernels normc ptx (and the runtime) refuse;
    it now refuses it with the same one-line reason and exit status. float32 still plans there."""
    args = ["t d : norm over d ; scale d ; shift d", "--shape", "4,1024", "--arch", "sm_75", *extra]
    dt = [] if "--out-dtype" in extra else ["--dtype", "float16"]
    errs = []
    for cmd in ("plan", "ptx"):
        argv = [cmd, *args, *dt] if cmd == "plan" else [cmd, *[a for a in args if a != "--json"], *dt, "-o", os.devnull]
        assert main(argv) == 2
        errs.append(_one_error_line(capsys.readouterr().err))
    assert errs[0] == errs[1] and "kernels need compute capability 8.0 or newer" in errs[0] and "sm_75" in errs[0]
    assert main(["plan", "t d : norm over d", "--shape", "4,1024", "--arch", "sm_75", "--json",
                 *[e for e in extra if e == "--backward"]]) == 0
    assert json.loads(capsys.readouterr().out)["arch"] == "sm_75"


def test_size_given_twice_names_the_argument(capsys):
    for sizes in (["--size", "g=32", "--size", "g=16"], ["--size", "g=32,g=16"]):
        assert main(["plan", "n (g k) h w : norm over k h w", *sizes, "--shape", "8,320,64,64"]) == 2
        assert _one_error_line(capsys.readouterr().err) == (
            "normc: error: --size 'g=16': g is already sized by --size g=32; expected each part of a split dim "
            "sized once")


def test_size_must_be_positive(capsys):
    # -2 was "expected NAME=INT" (it is one) and 0 pointed at a column of the spec, not at --size
    for value in ("-2", "0"):
        assert main(["plan", "n (g k) h w : norm over k h w", "--size", f"g={value}", "--shape", "2,8,4,4"]) == 2
        assert _one_error_line(capsys.readouterr().err) == (
            f"normc: error: --size 'g={value}': the size of a part of a split dim must be a positive int; "
            "expected e.g. g=32")


def test_spec_error_reports_column(capsys):
    assert main(["plan", "n c h w : norm ovr h w", "--shape", "2,3,4,5"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "column 16" in line


def test_usage_errors_exit_2(capsys):
    assert main(["plan", IN_SPEC]) == 2  # --shape missing
    assert main([]) == 2  # no command
    assert main(["frobnicate"]) == 2


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"normc {normc.__version__}"


def test_help_has_examples(capsys):
    assert main(["--help"]) == 0
    assert "examples:" in capsys.readouterr().out
    assert main(["ptx", "--help"]) == 0
    assert "examples:" in capsys.readouterr().out


def test_module_entry_point_bad_spec():
    r = subprocess.run(
        [sys.executable, "-m", "normc.cli", "plan", "n c h w : norm over", "--shape", "2,3,4,5"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 2
    assert r.stdout == ""
    _one_error_line(r.stderr)


def test_plan_explain_names_each_rejected_alternative(capsys):
    code = main(["plan", IN_SPEC, "--shape", "256,128,28,28", "--layout", "n h w c", "--dtype", "float16",
                 "--explain"])
    out = capsys.readouterr().out
    assert code == 0
    rej = [ln for ln in out.splitlines() if ln.startswith("rejected: ")]
    names = {ln.split(":")[1].strip() for ln in rej}
    assert names == {"inner", "mixed", "persistent", "split"}  # chosen: outer / looped
    assert "strategy: outer / looped" in out


def test_ptx_cubin_and_resource_usage(tmp_path, capsys):
    out = tmp_path / "k.cubin"
    code = main(["ptx", IN_SPEC, "--shape", "64,16,8,8", "--layout", "n h w c", "--cubin", "--resource-usage",
                 "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 0
    assert out.read_bytes()[:4] == b"\x7fELF"
    lines = [ln for ln in err.splitlines() if ln.startswith("kernel ")]
    assert lines and all("0 B spill stores" in ln and "registers/thread" in ln for ln in lines)
    assert main(["ptx", IN_SPEC, "--shape", "64,16,8,8", "--cubin"]) == 2  # binary needs -o


def test_output_dash_is_stdout(tmp_path):
    """-o - writes to standard output (it used to create a file named '-'): the PTX text, and with --cubin the
    cubin's bytes where standard output is redirected."""
    args = [sys.executable, "-m", "normc.cli", "ptx", "t d : norm over d", "--shape", "4,8", "-o", "-"]
    r = subprocess.run(args, cwd=tmp_path, capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(b"// normc kernel 1/1") and b".visible .entry" in r.stdout
    r = subprocess.run(args + ["--cubin"], cwd=tmp_path, capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stdout[:4] == b"\x7fELF"
    assert list(tmp_path.iterdir()) == []


def test_cache_list_dir_clear(tmp_path, monkeypatch, capsys):
    from normc.runtime import cache

    monkeypatch.setenv("NORMC_CACHE_DIR", str(tmp_path))
    kernel = {"ptx": "", "cubin": None, "entry": "e", "grid": 1, "block": 32, "shared_bytes": 0}
    cache.store(cache.make_key({"test": 1}), {"kernels": [kernel], "summary": "inner/persistent 4x8 float32"})
    assert main(["cache", "dir"]) == 0 and capsys.readouterr().out.strip() == str(tmp_path)
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "1 cached kernel set(s)" in out and "inner/persistent 4x8 float32" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_cache_clear_and_list_touch_only_cache_entries(tmp_path, monkeypatch, capsys):
    """A break test ran ``normc cache clear`` on a directory holding other files: it removed every *.json
    (package.json too) and stopped at a directory named *.json; ``normc cache list`` crashed on a JSON list."""
    from normc.runtime import cache

    monkeypatch.setenv("NORMC_CACHE_DIR", str(tmp_path))
    key = cache.make_key({"test": 2})
    cache.store(key, {"kernels": [], "summary": "tuned schedule: split"})
    (tmp_path / "package.json").write_text("{}")  # not the cache's: kept
    (tmp_path / "a.json").write_text("[1]")
    (tmp_path / f"{'ab' * 32}.json").write_text("[1]")  # named like an entry, not one: listed as unreadable
    (tmp_path / f"{'cd' * 32}.json").mkdir()  # a directory: skipped
    (tmp_path / ".tmp-x1_y2.json").write_text("{")  # an interrupted write's temporary file: cleared
    assert main(["cache", "list"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines()[0] == (f"{tmp_path}: 1 cached kernel set(s), 1 unreadable or corrupt (rebuilt when "
                                   f"next needed)")
    assert len(out.splitlines()) == 2 and key[:16] in out and "tuned schedule: split" in out
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"removed 2 cached kernel set(s) from {tmp_path}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", f"{'cd' * 32}.json", "package.json"]


def test_unquoted_spec_and_cli_split_size_hints(capsys):
    """An unquoted spec (the shell splits it into words) is a usage error that says to quote it; a split dim
    without its size names the CLI's --size option."""
    assert main(["plan", "n", "c", "h", "w", ":", "norm", "over", "h", "w", "--shape", "2,3,4,4"]) == 2
    assert "quote it" in capsys.readouterr().err
    assert main(["plan", "n (g k) h w : norm over k h w", "--shape", "8,320,64,64"]) == 2
    assert "--size g=32" in capsys.readouterr().err
    assert main(["plan", "n (g k) h w : norm over k h w", "--shape", "8,320,64,64", "--size", "g=32"]) == 0


def test_negative_eps_without_equals_reaches_normcs_check(capsys):
    """``--eps -1e-5`` (no '='): argparse alone would call -1e-5 an option; normc's message names the value."""
    assert main(["plan", "t d : norm over d", "--shape", "2,8", "--eps", "-1e-5"]) == 2
    assert "expected a finite number >= 0" in capsys.readouterr().err
    assert main(["plan", "t d : norm over d", "--shape", "2,8", "--eps", "1e-6"]) == 0
    # --shape alike: a leading negative extent gave argparse's "expected one argument" (a new-user run)
    assert main(["plan", "n c h w : norm over h w", "--shape", "-2,3,4,5"]) == 2
    assert "--shape '-2,3,4,5': '-2' is not a non-negative integer" in capsys.readouterr().err


def test_forced_staged_not_honoured_on_a_peeled_plan_says_why(capsys):
    """A forced staged schedule that does not apply says so, also where the plan is re-planned peeled (odd rows):
    the peeled re-plan started from the request already dropped, and its why line was lost."""
    for n in (10000000, 10000001):  # aligned rows, then peeled ones
        assert main(["plan", "t d : norm over d", "--shape", f"4,{n}", "--schedule", "staged"]) == 0
        out = capsys.readouterr().out
        assert "staged schedule needs" in out and "not forced" in out, (n, out)
        assert ("peeled" in out) == (n % 4 == 1)


class _FullStdout:
    """A standard output on a full disk: every write raises ENOSPC, as /dev/full does."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass

    def fileno(self):
        raise ValueError("no file descriptor")


@pytest.mark.parametrize("argv", [["plan", "t d : norm over d", "--shape", "4,16"],
                                  ["plan", "t d : norm over d", "--shape", "4,16", "--json"],
                                  ["cache", "list"], ["cache", "dir"]])
@pytest.mark.parametrize("stdout", [_FullStdout(), None], ids=["full", "closed"])
def test_unwritable_standard_output_is_a_normc_error(argv, stdout, monkeypatch, capsys):
    """A standard output that cannot be written (a full disk, a closed stream) gave an OSError or AttributeError
    traceback and exit 1; it is now one normc error line and exit 2, as for an -o file that cannot be written."""
    monkeypatch.setattr("sys.stdout", stdout)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("normc: error: cannot write standard output: ") and err.count("\n") == 1, err
    assert ("No space left on device" if stdout else "standard output is closed") in err


def test_cache_dir_that_is_a_file_is_a_normc_error(tmp_path, monkeypatch, capsys):
    """NORMC_CACHE_DIR naming a regular file: `normc cache list` said '0 cached kernel set(s)', exit 0."""
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setenv("NORMC_CACHE_DIR", str(f))
    for action in ("list", "clear"):
        assert main(["cache", action]) == 2
        assert "is not a directory" in capsys.readouterr().err
    assert f.read_text() == "x"
