"""normc bench's table handling and reports (the timing itself needs a GPU: see the gpu-marked test)."""

import json
import math

import pytest

import normc
from normc.runtime import gpu_available
from normc import bench
from normc.cli import main


def _fake_result():
    rows = []
    for i, (fam, us, peers, reads) in enumerate([("layer", 50.0, {"eager": 100.0, "compile": 75.0}, 1),
                                                 ("instance", 200.0, {"eager": 150.0}, 2),
                                                 ("batch", 10.0, {}, 2)]):
        floor = 45.0 if i < 2 else 5.0
        systems = {"normc": {"us": us, "frac_floor": floor / us, "gbps": 1.0, "err_vs_normc": 0.0}}
        systems.update({k: {"us": v, "frac_floor": floor / v, "gbps": 1.0, "err_vs_normc": 1e-7} for k, v in peers.items()})
        systems["liger"] = {"error": "RuntimeError: no op"}
        rows.append({"row": i, "family": fam, "shape": [4, 8], "dtype": "float32", "memory_order": "t d",
                     "plan": "inner/persistent", "reads_x": reads, "floor_us": floor, "systems": systems, "host_us": 9.0})
    return {"meta": {"device": "FakeGPU", "bandwidth": 4.27e12, "normc": normc.__version__, "torch": "x",
                     "date": "2026-11-29"}, "rows": rows, "summary": bench.summarize(rows)}


def test_summary_counts_speedups_and_floor_targets():
    sm = _fake_result()["summary"]
    # row 0: best peer 75 / 50 = 1.5x; row 1: 150 / 200 = 0.75x; row 2 has no peer
    assert sm["rows_compared"] == 2 and sm["rows_faster_than_best_peer"] == 1
    assert sm["geomean_speedup_vs_best_peer"] == pytest.approx((1.5 * 0.75) ** 0.5)
    assert sm["worst_row"] == (1, 0.75)
    # rows with floor >= 20 us: 0 (45/50 = 0.9 >= 0.85, one read) and 1 (45/200 < 0.60, two reads)
    assert sm["rows_floor_ge_20us"] == 2 and sm["rows_meeting_floor_target"] == 1


def test_markdown_report_has_a_row_per_workload():
    md = bench.markdown(_fake_result())
    table = [ln for ln in md.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(table) == 3
    assert "| 50.0 | 100.0 | 75.0 | err |" in table[0]
    assert "1.50x" not in md and "Geometric-mean speedup over the best peer: 1.06x" in md


def test_bundled_table_and_specs():
    rows = bench.load_table()
    assert len(rows) == 67
    specs = {bench.row_spec(r).stat for r in rows}
    assert specs == {"norm", "rms"}
    assert bench.row_spec(next(r for r in rows if r["family"] == "rms")).eps == 1e-6


def test_table_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"rows": [{"family": "layer", "shape": [4, 8], "dtype": "float32", "memory_order": "t d",
                                       "memory_perm": [0, 1], "spec": "t d : norm over d", "sizes": {}}]}))
    assert bench.load_table(str(p))[0]["shape"] == [4, 8]
    p.write_text(json.dumps({"rows": [{**_ROW, "family": "custom", "spec": "t d : rms over d"}]}))
    assert bench.load_table(str(p))[0]["family"] == "custom"  # no peer op: normc is timed alone


def test_cli_bench_argument_errors(capsys):
    assert main(["bench", "--systems", "normc,nvfuser"]) == 2
    assert "unknown nvfuser" in capsys.readouterr().err
    assert main(["bench", "--rows", "1,x"]) == 2
    capsys.readouterr()
    assert main(["bench", "--systems", " , "]) == 2  # was taken as a valid (empty) list
    assert "names no system" in capsys.readouterr().err


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU message")
def test_cli_bench_without_gpu_is_a_clear_error(capsys):
    assert main(["bench", "--rows", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("normc: error:") and ("GPU" in err or "torch" in err)


_ROW = {"family": "layer", "shape": [4, 8], "dtype": "float32", "memory_order": "t d", "memory_perm": [0, 1],
        "spec": "t d : norm over d"}


@pytest.mark.parametrize("text,msg", [
    (None, "cannot read it (No such file or directory)"),
    ("[1, 2", "not JSON (Expecting"),
    ('{"a": 1}', 'expected a JSON object whose "rows" is a non-empty list of workloads'),
    ('{"rows": []}', 'expected a JSON object whose "rows" is a non-empty list'),  # was "0 rows (0--1)"
    # a group row without g failed in the GPU run (KeyError building torch's group_norm); a layer row with an RMS
    # spec compared normc's RMS norm against torch's layer norm
    (json.dumps({"rows": [{**_ROW, "family": "group", "shape": [2, 8, 4], "memory_perm": [0, 1, 2],
                           "memory_order": "n (g k) l", "spec": "n (g k) l : norm over k l", "sizes": {"k": 2}}]}),
     "row 0: family is 'group' but sizes gives no int g"),
    (json.dumps({"rows": [{**_ROW, "spec": "t d : rms over d"}]}),
     "row 0: family is 'layer' but the spec's statistic is 'rms'; expected norm"),
    (json.dumps({"rows": [{**_ROW, "family": "rms"}]}), "row 0: family is 'rms' but the spec's statistic is 'norm'"),
    (json.dumps({"rows": [1]}), "row 0: is a JSON int, not an object"),
    (json.dumps({"rows": [_ROW, {**_ROW, "shape": [4, -8]}]}),
     "row 1: shape is [4, -8]; expected a list of non-negative"),
    (json.dumps({"rows": [{**_ROW, "dtype": "float64"}]}), "row 0: dtype is 'float64'; expected one of float32"),
    (json.dumps({"rows": [{**_ROW, "memory_perm": [0, 0]}]}), "row 0: memory_perm is [0, 0]; expected a permutation"),
    (json.dumps({"rows": [{k: v for k, v in _ROW.items() if k != "spec"}]}), "row 0: spec is None; expected a string"),
    (json.dumps({"rows": [{**_ROW, "spec": "t d : norm ovr d"}]}), "row 0: missing 'over' after 'norm'"),
    (json.dumps({"rows": [{**_ROW, "shape": [4, 8, 2], "memory_perm": [0, 1, 2]}]}),
     "row 0: shape is [4, 8, 2] (3 dims); expected 2 dims"),
    (json.dumps({"rows": [{**_ROW, "shape": [4, 8, 2]}]}), "row 0: shape is [4, 8, 2] (3 dims)"),  # not memory_perm
    # memory_order was not checked: a row's label could name another layout than the one timed
    (json.dumps({"rows": [{**_ROW, "memory_order": "t q"}]}), "row 0: memory_order: layout 't q' must list each dim"),
    (json.dumps({"rows": [{**_ROW, "memory_order": "d t"}]}),
     "row 0: memory_order 'd t' and memory_perm [0, 1] disagree"),
    (json.dumps({"rows": [{**_ROW, "sizes": {"eps": 1}}]}), "row 0: sizes is {'eps': 1}; expected split-axis names"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
])
def test_cli_bench_bad_table_is_a_clear_error(tmp_path, capsys, text, msg):
    """A missing or malformed --table file: one normc error line naming the file (and the row), exit 2, before
    any GPU is looked for (it used to print a FileNotFoundError, JSONDecodeError or KeyError traceback)."""
    p = tmp_path / "t.json"
    if text is not None:
        p.write_text(text)
    assert main(["bench", "--table", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"normc: error: --table {p}: ") and msg in err and err.count("\n") == 1, err
    with pytest.raises(normc.ArgumentError, match="--table"):
        bench.load_table(str(p))


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("damage,msg", [
    (lambda res: "{", "not JSON"),
    (lambda res: json.dumps({**res, "rows": [1]}), "expected rows (a list of objects) and a summary"),
    (lambda res: json.dumps({**res, "meta": {k: v for k, v in res["meta"].items() if k != "device"}}),
     "not a {kind} run as normc bench writes it (no field 'device')"),
    # was "row 0: ... (TypeError: ...)" (a break test, 2026-12-07): the field is named
    (lambda res: json.dumps({**res, "meta": {**res["meta"], "bandwidth": "fast"}}),
     "not a {kind} run as normc bench writes it (meta's bandwidth is 'fast'; expected bytes per second, finite"),
    # a second review: inf passed the check (every floor 0 us), a 400-digit int crashed the float conversion,
    # and a session's bandwidth or a missing date was blamed on row 0
    (lambda res: json.dumps({**res, "meta": {**res["meta"], "bandwidth": float("inf")}}),
     "(meta's bandwidth is inf; expected bytes per second, finite and > 0)"),
    (lambda res: json.dumps({**res, "meta": {**res["meta"], "bandwidth": 10 ** 400}}),
     "expected bytes per second, finite and > 0)"),
    (lambda res: json.dumps({**res, "meta": {**res["meta"], "sessions": [
        {"started": "a", "rows_before": 0, "bandwidth_measured": 4e12},
        {"started": "b", "rows_before": 1, "bandwidth_measured": "fast"}]}}),
     "(meta's sessions[1] bandwidth_measured is 'fast';"),
    (lambda res: json.dumps({**res, "meta": {k: v for k, v in res["meta"].items() if k != "date"}}),
     "json: meta: not a {kind} run as normc bench writes it (no field 'date')"),
])
def test_cli_render_malformed_json_is_a_clear_error(tmp_path, capsys, backward, damage, msg):
    res = _fake_backward_result() if backward else _fake_result()
    kind, stem = ("backward", "backward") if backward else ("forward", "bench")
    (tmp_path / f"{stem}.json").write_text(damage(res))
    assert main(["bench", "--render", "--out", str(tmp_path)] + ["--backward"] * backward) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"normc: error: {tmp_path / stem}.json") and msg.format(kind=kind) in err, err
    assert not (tmp_path / f"{stem}.md").exists()  # nothing written


def test_cli_render_unwritable_report_is_a_clear_error(tmp_path, capsys):
    """--render where the Markdown cannot be written (a directory in its place): a normc error naming --out,
    exit 2 (it was an IsADirectoryError traceback, exit 1)."""
    (tmp_path / "bench.json").write_text(json.dumps(_fake_result()))
    (tmp_path / "bench.md").mkdir()
    assert main(["bench", "--render", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"normc: error: --out {tmp_path}: cannot write the reports") and err.count("\n") == 1, err


def test_drive_resume_of_a_malformed_json_is_a_clear_error(tmp_path):
    (tmp_path / "bench.json").write_text('{"meta": {}, "rows": 3}')
    fake = _FakeBench()
    with pytest.raises(normc.ArgumentError, match="bench.json: expected rows"):
        bench.drive("forward", _table(2), [0, 1], fake.one, fake.measure, {"device": "FakeGPU"},
                    out_dir=str(tmp_path), resume=True, progress=False)
    assert fake.ran == []


@pytest.mark.parametrize("edit, words", [
    (lambda r: r["meta"].pop("bandwidth"), "no field 'bandwidth'"),
    (lambda r: r["meta"].update(bandwidth="fast"), "meta's bandwidth is 'fast'"),
    (lambda r: r["meta"].update(sessions=3), "meta's sessions is 3"),
    (lambda r: r["rows"][0].pop("row"), "no field 'row'"),
    (lambda r: r["rows"][1].update(row="1"), "a row's index is '1'"),
    (lambda r: r["rows"][0].pop("systems"), "no field 'systems'"),
    (lambda r: r["rows"][2].update(floor_us="x"), "TypeError"),
])
def test_drive_resume_of_malformed_rows_or_meta_is_a_clear_error(tmp_path, edit, words):
    """--resume on a bench.json whose meta or rows lack a field or hold one of the wrong kind raised a KeyError or
    TypeError from the run loop (once the GPU setup was done); now a normc error naming the file, before any
    row runs."""
    res = _fake_result()
    edit(res)
    (tmp_path / "bench.json").write_text(json.dumps(res))
    fake = _FakeBench()
    with pytest.raises(normc.ArgumentError) as e:
        bench.drive("forward", _table(4), [0, 1, 2, 3], fake.one, fake.measure, {"device": "FakeGPU"},
                    out_dir=str(tmp_path), resume=True, progress=False)
    assert str(e.value).startswith(f"{tmp_path / 'bench.json'}: not a forward run as normc bench writes it")
    assert words in str(e.value), str(e.value)
    assert fake.ran == []
    res = _fake_result()  # unedited, it resumes: only row 3 runs
    (tmp_path / "bench.json").write_text(json.dumps(res))
    bench.drive("forward", _table(4), [0, 1, 2, 3], fake.one, fake.measure, {"device": "FakeGPU"},
                out_dir=str(tmp_path), resume=True, progress=False)
    assert fake.ran == [3]


# ----------------------------------------------------------------------------------------------------------
# normc bench --backward (and what it shares with the forward bench)


def test_parse_rows_indices_and_ranges():
    assert bench.parse_rows("0,5,9") == [0, 5, 9]
    assert bench.parse_rows("40-44, 3,41") == [40, 41, 42, 43, 44, 3]
    assert bench.parse_rows("7-7") == [7]
    for bad, msg in (("3-1", "backwards"), ("1,,2", "not a row index"), ("a", "not a row index"), ("-2", "not a row")):
        with pytest.raises(ValueError, match=msg):
            bench.parse_rows(bad)
    with pytest.raises(ValueError, match="out of range; the table has 67 rows"):
        bench.parse_rows("60-70", 67)


def test_cli_bench_backward_argument_errors(capsys):
    for argv, msg in ((["--rows", "5-2"], "runs backwards"), (["--limit", "0"], "--limit '0'"),
                      (["--limit", "x"], "--limit 'x'"), (["--budget", "-1"], "--budget '-1'"),
                      (["--budget", "soon"], "--budget 'soon'"), (["--jobs", "-1"], "--jobs '-1'"),
                      (["--resume"], "--resume needs --out (the directory holding the run's backward.json)"),
                      (["--render"], "--render needs --out (the directory holding backward.json)"),
                      (["--rows", "67"], "row 67 is out of range: the table has 67 rows")):
        assert main(["bench", "--backward"] + argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("normc: error:") and msg in err, (argv, err)


def test_graph_shape_bounds_the_timing_of_slow_calls():
    assert bench.graph_shape(10) == (bench.GRAPH_CALLS, bench.GRAPH_REPLAYS)  # fast calls: as the forward bench
    assert bench.graph_shape(1000) == (2, 20)
    assert bench.graph_shape(10_000) == (1, bench.MIN_REPLAYS)  # 10 ms calls: 5 replays of 1 call
    assert bench.graph_shape(5000, rotations=3) == (3, 5)  # every rotated copy is used


def _floor(text, shape, dtype, sms=132, **sizes):
    return bench.backward_floor(normc.spec(text, **sizes), shape, dtype, sms)


def test_backward_floor_layer_and_rms_norm():
    # layer norm 16384 x 4096 bfloat16: rows of 4096 x 2 tensors x 2 B = 16 KiB fit on an SM (route "rows");
    # dscale and dshift sum over rows held by min(16384, 132) CTAs: 132 x 4096 float32 partials each
    t, d, e = 16384, 4096, 2
    fl = _floor("t d : norm over d ; scale d ; shift d", (t, d), "bfloat16")
    b = fl["backward"]
    assert fl["route"] == "rows" and fl["partial_floats"] == 2 * 132 * d
    assert b == {"x": t * d * e, "dy": t * d * e, "dx": t * d * e, "scale": d * e, "stats": 2 * t * 4,
                 "dparams": 2 * d * e, "partials": 2 * 4 * 2 * 132 * d, "total": b["total"]}
    assert b["total"] == 3 * t * d * e + d * e + 2 * t * 4 + 2 * d * e + 16 * 132 * d
    f = fl["forward"]
    assert f == {"x": t * d * e, "y": t * d * e, "params": 2 * d * e, "stats": 2 * t * 4,
                 "total": 2 * t * d * e + 2 * d * e + 8 * t}
    # RMS norm: rstd only, one parameter gradient
    b = _floor("t d : rms over d ; scale d", (t, d), "bfloat16")["backward"]
    assert (b["stats"], b["dparams"], b["partials"]) == (t * 4, d * e, 2 * 4 * 132 * d)
    # fewer rows than SMs: partials for the rows that exist only
    assert _floor("t d : rms over d ; scale d", (100, 256), "float32")["partial_floats"] == 100 * 256
    # no affine step: nothing but x, dy, dx and the statistics
    b = _floor("t d : norm over d", (64, 1024), "float16")["backward"]
    assert b["total"] == 3 * 64 * 1024 * 2 + 2 * 64 * 4 and b["partials"] == b["scale"] == b["dparams"] == 0


def test_backward_floor_long_rows_are_cut_into_column_ranges():
    # layer norm 10 x 10^7 float32: a row (80 MB of x and dy) does not fit on an SM: every CTA holds a column
    # range of every row; the 2 row sums need 132 partials per row, dscale/dshift none (10^7 >= 132 ranges)
    fl = _floor("t d : norm over d ; scale d ; shift d", (10, 10**7), "float32")
    assert fl["route"] == "columns" and fl["partial_floats"] == 2 * 10 * 132
    # NCDHW instance norm 2 x 32 x 128^3 float16: rows of 2M elements; the channel parameters are constant
    # along a row, so each of the 132 ranges holds a partial per channel and per gradient
    fl = _floor("n c d h w : norm over d h w ; scale c ; shift c", (2, 32, 128, 128, 128), "float16")
    assert fl["route"] == "columns" and fl["partial_floats"] == 2 * 64 * 132 + 2 * 32 * 132
    # batch statistics 256 x 256 x 28 x 28 float16: a channel's 200704 elements are one (long) row
    fl = _floor("n c h w : norm over n h w ; scale c ; shift c", (256, 256, 28, 28), "float16")
    assert fl["route"] == "columns" and fl["partial_floats"] == 2 * 256 * 132 + 2 * 256 * 132
    assert fl["backward"]["stats"] == 2 * 256 * 4 and fl["backward"]["scale"] == 256 * 2


def test_backward_floor_instance_and_group_norm():
    # NCHW instance norm 256 x 128 x 28 x 28 float32: rows of 784 fit; channel c's 256 rows are spread over
    # min(256, ceil(132 / 128)) = 2 CTAs: 2 partials per channel per gradient
    fl = _floor("n c h w : norm over h w ; scale c ; shift c", (256, 128, 28, 28), "float32")
    n = 256 * 128 * 28 * 28
    assert fl["route"] == "rows" and fl["partial_floats"] == 2 * 128 * 2
    assert fl["backward"]["total"] == 3 * n * 4 + 128 * 4 + 2 * 256 * 128 * 4 + 2 * 128 * 4 + 8 * 512
    # a smaller machine: more CTAs per channel
    assert _floor("n c h w : norm over h w ; scale c ; shift c", (256, 128, 28, 28), "float32",
                  sms=1000)["partial_floats"] == 2 * 128 * 8
    # group norm 8 x 320 x 64 x 64 float16, 32 groups: rows (n, g) of 10 x 64 x 64; a parameter element's 8
    # rows are spread over min(8, ceil(132 / 32)) = 5 CTAs
    fl = _floor("n (g k) h w : norm over k h w ; scale g k ; shift g k", (8, 320, 64, 64), "float16", g=32)
    assert fl["route"] == "rows" and fl["partial_floats"] == 2 * 320 * 5
    assert fl["backward"]["stats"] == 2 * 8 * 32 * 4 and fl["backward"]["dparams"] == 2 * 320 * 2
    # one row per parameter element (batch statistics of short rows): no partials
    assert _floor("n c h w : norm over n h w ; scale c ; shift c", (2, 64, 8, 8), "float32")["partial_floats"] == 0


def _fake_backward_result():
    def ent(bwd, fb, floor, fb_floor, **kw):
        return {"bwd_us": bwd, "fb_us": fb, "bwd_frac_floor": floor / bwd, "fb_frac_floor": fb_floor / fb,
                "bwd_method": "graph", "fb_method": "graph", **kw}

    ok = {"grads_ok": True, "err": {"dx": 1e-7, "dscale": 2e-7}, "err_vs_normc": 2e-7}
    rows = [
        # row 0: normc 50 (0.90 of a 45 µs floor), best peer 75: 1.5x; fwd+bwd 80 vs 100: 1.25x
        {"row": 0, "family": "layer", "shape": [4, 8], "dtype": "float32", "memory_order": "t d", "plan": "inner/persistent",
         "bwd_plan": "fused", "bwd_kernels": 2, "passes": 1, "floor_us": 45.0, "fb_floor_us": 70.0,
         "systems": {"normc": ent(50.0, 80.0, 45.0, 70.0), "eager": ent(100.0, 150.0, 45.0, 70.0, **ok),
                     "compile": ent(75.0, 100.0, 45.0, 70.0, **ok), "liger": {"error": "RuntimeError: no op"}}},
        # row 1: normc 200 (0.23 of the floor), eager 150 but its dscale is wrong
        {"row": 1, "family": "group", "shape": [2, 64, 8, 8], "dtype": "float16", "memory_order": "n h w (g k)",
         "plan": "mixed/split", "bwd_plan": "outer/split", "bwd_kernels": 4, "passes": 3, "floor_us": 45.0,
         "fb_floor_us": 70.0,
         "systems": {"normc": ent(200.0, 300.0, 45.0, 70.0),
                     "eager": ent(150.0, 200.0, 45.0, 70.0, grads_ok=False, err={"dx": 1e-4, "dscale": 0.5},
                                  err_vs_normc=0.5)}},
        # row 2: tiny (floor < 20 µs), no peer
        {"row": 2, "family": "batch", "shape": [2, 4, 2, 2], "dtype": "float32", "memory_order": "n c h w",
         "plan": "outer/looped", "bwd_plan": "outer", "bwd_kernels": 2, "passes": 3, "floor_us": 1.0, "fb_floor_us": 2.0,
         "systems": {"normc": ent(10.0, 20.0, 1.0, 2.0)}},
    ]
    meta = {"kind": "backward", "device": "FakeGPU", "bandwidth": 4.27e12, "normc": normc.__version__, "torch": "x",
            "date": "2026-12-01", "sms": 132, "compile": "static", "grad_tol": bench.GRAD_TOL,
            "sessions": [{"started": "a", "rows_before": 0, "bandwidth_measured": 4.27e12}], "rows_not_run": [3, 4, 5, 9]}
    return {"meta": meta, "rows": rows, "summary": bench.summarize_backward(rows)}


def test_backward_summary():
    sm = _fake_backward_result()["summary"]
    b, fb = sm["backward"], sm["fwd_bwd"]
    assert b["rows_compared"] == 2 and b["rows_faster_than_best_peer"] == 1
    assert b["geomean_speedup_vs_best_peer"] == pytest.approx((75 / 50 * 150 / 200) ** 0.5)
    assert b["worst_row"] == (1, 0.75)
    assert b["rows_floor_ge_20us"] == 2 and b["rows_meeting_floor_target"] == 1  # 0.90 yes, 0.225 no
    assert fb["geomean_speedup_vs_best_peer"] == pytest.approx((100 / 80 * 200 / 300) ** 0.5)
    assert fb["rows_floor_ge_20us"] == 2 and fb["rows_meeting_floor_target"] == 1  # 70/80 yes, 70/300 no
    assert sm["grad_mismatches"] == [[1, "eager", {"dx": 1e-4, "dscale": 0.5}]]
    assert sm["errors"] == [[0, "liger", "RuntimeError: no op"]]


def test_markdown_backward_tables():
    md = bench.markdown(_fake_backward_result())
    assert md.startswith("# normc bench --backward on FakeGPU")
    assert "dx written (N x itemsize each)" in md and "min(T, SMs) x D" in md  # the byte arithmetic
    assert "float32 0.0001, float16 0.004, bfloat16 0.03" in md
    assert "Incomplete: 4 selected row(s) not run yet (3-5,9)" in md
    assert ("**Backward alone**: 1 of 2 rows with a floor >= 20 µs reach >= 0.70 of it; faster than the best peer "
            "on 1 of 2 rows; geometric-mean speedup over the best peer 1.06x (worst: row 1, 0.75x).") in md
    table = [ln for ln in md.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(table) == 6  # 3 rows x (backward alone, forward + backward)
    assert table[0] == ("| 0 | layer | 4x8 | float32 | t d | fused (2 k) | 1 | 45.0 | 50.0 | 100.0 | 75.0 | err | "
                        "0.90 | 1.50x |")
    assert table[1].endswith("| 3 | 45.0 | 200.0 | 150.0! | - | - | 0.23 | 0.75x |")
    assert table[2].endswith("| 1.0 | 10.0 | - | - | - | 0.10 | - |")
    assert table[3] == "| 0 | layer | 4x8 | float32 | t d | inner/persistent | 70.0 | 80.0 | 150.0 | 100.0 | err | 0.88 | 1.25x |"
    assert "Gradient mismatches: row 1 eager (dx 1.0e-04, dscale 5.0e-01)." in md
    assert "Errors: row 0 liger: `RuntimeError: no op`." in md


def test_cli_render_backward(tmp_path, capsys):
    res = _fake_backward_result()
    (tmp_path / "backward.json").write_text(json.dumps(res))
    assert main(["bench", "--backward", "--render", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# normc bench --backward on FakeGPU")
    assert (tmp_path / "backward.md").read_text() == out
    pytest.importorskip("matplotlib")
    assert (tmp_path / "backward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a forward run's JSON is not rendered as a backward one, nor the other way round
    (tmp_path / "bench.json").write_text(json.dumps(res))
    assert main(["bench", "--render", "--out", str(tmp_path)]) == 2
    assert "holds a backward run, not a forward one (render it with --backward)" in capsys.readouterr().err
    # a row with a field of the wrong kind is named (the message named neither row nor field)
    bad = _fake_result()
    bad["rows"][2]["floor_us"] = "x"
    (tmp_path / "bench.json").write_text(json.dumps(bad))
    assert main(["bench", "--render", "--out", str(tmp_path)]) == 2
    assert "bench.json: row 2: not a forward run as normc bench writes it (ValueError" in capsys.readouterr().err
    # a JSON object that no bench run wrote says what it lacks (it said "holds a non-bench run")
    (tmp_path / "bench.json").write_text(json.dumps({"rows": [{"a": 1}]}))
    assert main(["bench", "--render", "--out", str(tmp_path)]) == 2
    assert "expected an object with meta, rows and summary" in capsys.readouterr().err


def test_cli_render_forward_unchanged(tmp_path, capsys):
    res = _fake_result()
    (tmp_path / "bench.json").write_text(json.dumps(res))
    assert main(["bench", "--render", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == bench.markdown(res) == (tmp_path / "bench.md").read_text()
    assert not (tmp_path / "backward.md").exists()


class _FakeBench:
    """bench_one / measure_bw / precompiler stand-ins for bench.drive (no GPU)."""

    def __init__(self):
        self.ran, self.bw, self.waited, self.closed = [], iter([4.0e12, 3.0e12, 2.0e12, 1.0e12]), [], 0

    def one(self, i, row, bw):
        self.ran.append(i)
        return {"row": i, "family": row["family"], "shape": row["shape"], "dtype": "float32", "memory_order": "t d",
                "plan": "inner/persistent", "reads_x": 1, "host_us": 5.0, "floor_us": 30.0,
                "fb_floor_us": 50.0, "bw_seen": bw,
                "systems": {"normc": {"bwd_us": 40.0, "fb_us": 60.0, "bwd_frac_floor": 0.75, "fb_frac_floor": 0.83}}}

    def measure(self):
        return next(self.bw)

    def precompiler(self, todo):
        fake = self

        class P:
            def wait(self, i):
                fake.waited.append(i)

            def close(self):
                fake.closed += 1

        self.todo = list(todo)
        return P()


def _table(n):
    return [{"family": "layer", "shape": [4, 8 * (i + 1)]} for i in range(n)]


def test_drive_resume_limit_and_budget(tmp_path):
    tab = _table(6)
    fake = _FakeBench()
    kw = dict(out_dir=str(tmp_path), progress=False, precompiler=fake.precompiler)
    # first session: rows 1, 3, 4, 5 selected, at most 2 of them
    res = bench.drive("backward", tab, [1, 3, 4, 5], fake.one, fake.measure, {"device": "FakeGPU"}, limit=2, **kw)
    assert fake.ran == [1, 3] and fake.waited == [1, 3] and fake.todo == [1, 3] and fake.closed == 1
    assert res["meta"]["rows_not_run"] == [4, 5] and res["meta"]["bandwidth"] == 4.0e12
    saved = json.loads((tmp_path / "backward.json").read_text())
    assert [r["row"] for r in saved["rows"]] == [1, 3] and saved["meta"]["kind"] == "backward"
    assert (tmp_path / "backward.md").exists() and not (tmp_path / "bench.json").exists()
    # resumed: only the rows not done run; the first session's bandwidth stays the floor's, the new one is recorded
    res = bench.drive("backward", tab, [1, 3, 4, 5], fake.one, fake.measure, {"device": "FakeGPU"}, resume=True, **kw)
    assert fake.ran == [1, 3, 4, 5] and res["meta"]["rows_not_run"] == []
    assert res["meta"]["bandwidth"] == 4.0e12 and {r["bw_seen"] for r in res["rows"]} == {4.0e12}
    assert [(s["rows_before"], s["bandwidth_measured"]) for s in res["meta"]["sessions"]] == [(0, 4.0e12), (2, 3.0e12)]
    assert res["summary"]["backward"]["rows_meeting_floor_target"] == 4
    md = (tmp_path / "backward.md").read_text()
    assert "The run was resumed: 2 sessions" in md and "Incomplete" not in md
    # without --resume the run starts over
    res = bench.drive("backward", tab, [0], fake.one, fake.measure, {"device": "FakeGPU"}, **kw)
    assert [r["row"] for r in res["rows"]] == [0] and len(res["meta"]["sessions"]) == 1


def test_drive_budget_stops_between_rows(tmp_path, capsys):
    tab = _table(5)
    fake = _FakeBench()
    ticks = iter(range(0, 1000, 10))  # every clock reading is 10 s later
    res = bench.drive("forward", tab, list(range(5)), lambda i, row, bw: {**fake.one(i, row, bw), "reads_x": 1},
                      fake.measure, {"device": "FakeGPU"}, out_dir=str(tmp_path), progress=False, budget_s=25,
                      clock=lambda: next(ticks))
    assert fake.ran == [0, 1] and res["meta"]["rows_not_run"] == [2, 3, 4]
    assert "--budget of 25 s is spent after 2 row(s); 3 left" in capsys.readouterr().err
    assert json.loads((tmp_path / "bench.json").read_text())["meta"]["kind"] == "forward"


def _fake_info(shape, strides, dtype, ptr=1 << 20):
    from normc.runtime.arrays import ArrayInfo

    return ArrayInfo(None, "torch", ptr, tuple(shape), tuple(strides), dtype, 0)


@pytest.mark.parametrize("i", [1, 45, 48, 54, 66])
def test_precompile_plans_are_the_runtimes(i, monkeypatch):
    """The plans precompiled ahead are those Compiled makes for the bench's tensors (same disk-cache keys)."""
    from normc import runtime
    from normc.api import layout_strides
    from normc.canonical import dense_like
    from normc.runtime import backward as rb
    from normc.runtime import gpu

    seen = {}

    class Loaded:
        def __init__(self, *a, **k):
            pass

        def clusters_fit(self):
            return True

    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(gpu, "device_cc", lambda d: (9, 0))
    monkeypatch.setattr(gpu, "device_sms", lambda d: 132)
    monkeypatch.setattr(gpu, "set_device", lambda d: None)
    monkeypatch.setattr(gpu, "Loaded", Loaded)
    monkeypatch.setattr(runtime, "compiled_kernels", lambda plan, cc: seen.__setitem__("fwd", plan) or [])
    monkeypatch.setattr(rb, "compiled_backward_kernels", lambda plan, cc: seen.__setitem__("bwd", plan) or [])
    monkeypatch.setattr(rb, "bound_kept", lambda plan, cc: True)  # (row 48's fused kernel keeps it: ptxas)
    row = bench.load_table()[i]
    spec = bench.row_spec(row)
    shape, dt = row["shape"], row["dtype"]
    strides = layout_strides(spec, tuple(shape), row["memory_perm"])
    sizes = spec.axis_sizes(tuple(shape))
    xi = _fake_info(shape, strides, dt)
    pi = [None if axes is None else _fake_info((math.prod(sizes[a] for a in axes),), (1,), dt, 1 << 24)
          for axes in (spec.scale, spec.shift)]
    f = normc.compile(spec)
    for kind in ("forward", "backward"):
        f._build(xi, pi[0], pi[1], None, kind == "backward")
        plan, bplan = bench.precompile_plans(row, kind, (9, 0), 132)
        assert plan.to_dict() == seen["fwd"].to_dict()
    gi = _fake_info(shape, dense_like(tuple(shape), strides), dt, 1 << 28)
    rb._build(f, gi, xi, pi[0], spec.scale is not None, spec.shift is not None)
    assert bplan.to_dict() == seen["bwd"].to_dict()


def test_precompile_fills_the_disk_cache(tmp_path, monkeypatch):
    """Worker processes compile a row's kernels into the disk cache (NVVM and nvJitLink need no GPU)."""
    from normc.runtime import cache, compiled_kernels, versions
    from normc.runtime.backward import compiled_backward_kernels

    monkeypatch.setenv("NORMC_CACHE_DIR", str(tmp_path))
    row = {"family": "rms", "shape": [8, 64], "dtype": "float16", "memory_order": "t d", "memory_perm": [0, 1],
           "spec": "t d : rms over d ; scale d", "sizes": {}}
    pre = bench._Precompiler([(0, row)], "backward", (9, 0), 132, jobs=1)
    pre.wait(0)
    pre.close()
    plan, bplan = bench.precompile_plans(row, "backward", (9, 0), 132)
    assert cache.load(cache.make_key({"plan": plan.to_dict(), "cc": [9, 0], **versions()})) is not None
    assert cache.load(cache.make_key({"backward": bplan.to_dict(), "cc": [9, 0], **versions()})) is not None
    assert len(compiled_kernels(plan, (9, 0))) == 1 and compiled_backward_kernels(bplan, (9, 0))


def test_peer_gradients_match_the_reference_formulas():
    """The torch ops the peers run, their gradients (x, scale, shift leaves) and grad_errors, on the CPU."""
    torch = pytest.importorskip("torch")
    import normc.torch as nt

    for i in (1, 45, 46, 54, 66):
        row = dict(bench.load_table()[i])
        row["shape"] = {4: [3, 8, 5, 4], 2: [6, 32]}[len(row["shape"])] if row["family"] != "group" else [2, 64, 3, 4]
        spec = bench.row_spec(row)
        g = torch.Generator().manual_seed(i)
        perm = row["memory_perm"]
        x = torch.randn([row["shape"][d] for d in perm], generator=g, dtype=torch.float64)
        x = x.permute(*[perm.index(d) for d in range(len(perm))]).detach().requires_grad_()
        sizes = spec.axis_sizes(tuple(row["shape"]))
        w = torch.randn(math.prod(sizes[a] for a in spec.scale), generator=g, dtype=torch.float64).requires_grad_()
        b = None if spec.shift is None else torch.randn(w.numel(), generator=g, dtype=torch.float64).requires_grad_()
        dy = torch.randn(x.shape, generator=g, dtype=torch.float64)
        fn = bench.peer_fns(row, spec, w, b)["eager"]
        got = torch.autograd.grad(fn(x), [x] + [p for p in (w, b) if p is not None], dy)
        _, mean, rstd = nt.reference_forward(spec, x.detach(), w.detach(), None if b is None else b.detach())
        ref = dict(zip(("dx", "dscale", "dshift"), nt.reference_backward(spec, dy, x.detach(), mean, rstd, w.detach())))
        e = bench.grad_errors(dict(zip(("dx", "dscale", "dshift"), got)), ref, "float32")
        assert e["grads_ok"] and set(e["err"]) == {k for k, v in ref.items() if v is not None}, (i, e)
        assert e["err_vs_normc"] < 1e-10, (i, e)
        bad = dict(zip(("dx", "dscale", "dshift"), got))
        bad["dscale"] = bad["dscale"] * 1.01
        e = bench.grad_errors(bad, ref, "float32")
        assert not e["grads_ok"] and e["err"]["dscale"] == pytest.approx(0.01, rel=0.01)
        bad["dx"] = bad["dx"] * float("nan")
        assert not bench.grad_errors(bad, ref, "bfloat16")["grads_ok"]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
def test_bench_backward_smoke(tmp_path):
    """normc bench --backward on two small anchor rows: both run, normc is timed, peers agree or say why not."""
    torch = pytest.importorskip("torch")
    assert torch.cuda.is_available()
    assert main(["bench", "--backward", "--rows", "16,46", "--out", str(tmp_path), "--jobs", "1"]) == 0
    res = json.loads((tmp_path / "backward.json").read_text())
    assert [r["row"] for r in res["rows"]] == [16, 46] and res["meta"]["rows_not_run"] == []
    for r in res["rows"]:
        n = r["systems"]["normc"]
        assert "error" not in n, n
        assert n["bwd_us"] > 0 and n["fb_us"] > n["bwd_us"] * 0.5 and r["floor_us"] > 0
        assert r["passes"] >= 1 and r["bwd_kernels"] >= 1
        eager = r["systems"]["eager"]
        assert eager.get("grads_ok") is True and eager["bwd_us"] > 0 and eager["fb_us"] > 0, eager
        for name, ent in r["systems"].items():
            assert "error" in ent or ("bwd_us" in ent and "fb_us" in ent), (name, ent)
    md = (tmp_path / "backward.md").read_text()
    assert md.count("| 16 | instance |") == 2 and md.count("| 46 | rms |") == 2


def test_drive_goes_on_after_a_failed_row(tmp_path, capsys):
    fake = _FakeBench()

    def one(i, row, bw):
        if i == 2:
            raise RuntimeError("CUDA out of memory")
        return fake.one(i, row, bw)

    res = bench.drive("backward", _table(4), [0, 1, 2, 3], one, fake.measure, {"device": "FakeGPU"},
                      out_dir=str(tmp_path), progress=False)
    assert fake.ran == [0, 1, 3] and res["meta"]["rows_not_run"] == [2]
    assert res["meta"]["rows_failed"] == [[2, "RuntimeError: CUDA out of memory"]]
    assert "row 2 failed: RuntimeError: CUDA out of memory" in capsys.readouterr().err
    md = (tmp_path / "backward.md").read_text()
    assert "Incomplete: 1 selected row(s) not run yet (2)" in md
    assert "Failed (retried by `--resume`): row 2: `RuntimeError: CUDA out of memory`." in md
    # --resume retries it
    res = bench.drive("backward", _table(4), [0, 1, 2, 3], fake.one, fake.measure, {"device": "FakeGPU"},
                      out_dir=str(tmp_path), progress=False, resume=True)
    assert fake.ran[-1] == 2 and res["meta"]["rows_not_run"] == [] and res["meta"]["rows_failed"] == []
