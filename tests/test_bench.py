"""normc bench's table handling and reports (the timing itself needs a GPU: see the gpu-marked test)."""

import json

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


def test_cli_bench_argument_errors(capsys):
    assert main(["bench", "--systems", "normc,nvfuser"]) == 2
    assert "unknown nvfuser" in capsys.readouterr().err
    assert main(["bench", "--rows", "1,x"]) == 2


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU message")
def test_cli_bench_without_gpu_is_a_clear_error(capsys):
    assert main(["bench", "--rows", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("normc: error:") and ("GPU" in err or "torch" in err)
