"""The on-disk kernel cache: round trip, corruption detection, unwritable directories, concurrent writers,
and version keys. No GPU needed (nvJitLink and NVVM run on the CPU)."""

import json
import multiprocessing as mp
import os
import warnings

import pytest

import normc
from normc.runtime import cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "normc-cache"
    monkeypatch.setenv("NORMC_CACHE_DIR", str(d))
    return d


PAYLOAD = {"kernels": [{"ptx": ".version 9.0\n", "cubin": b"\x7fELF\x00\x01", "entry": "k", "grid": 3,
                        "block": 128, "shared_bytes": 0}]}


def test_round_trip(cache_dir):
    assert cache.load("abc") is None
    assert cache.store("abc", PAYLOAD)
    got = cache.load("abc")
    assert got["kernels"][0]["cubin"] == b"\x7fELF\x00\x01"
    assert got["kernels"][0]["grid"] == 3
    assert [p.name for p in cache_dir.iterdir()] == ["abc.json"]  # no temporary files left behind


def test_truncated_or_tampered_file_is_not_loaded(cache_dir):
    cache.store("k1", PAYLOAD)
    path = cache_dir / "k1.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    assert cache.load("k1") is None
    doc = json.loads(text)
    doc["payload"]["kernels"][0]["grid"] = 4  # valid JSON, wrong checksum
    path.write_text(json.dumps(doc))
    assert cache.load("k1") is None
    cache.store("k1", PAYLOAD)  # rebuilt entry replaces the bad one
    assert cache.load("k1")["kernels"][0]["grid"] == 3


def test_unwritable_directory_falls_back_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NORMC_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(cache, "_warned", False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert cache.store("x", PAYLOAD) is False
        assert cache.store("y", PAYLOAD) is False
    msgs = [str(x.message) for x in w if "kernel cache" in str(x.message)]
    assert len(msgs) == 1 and "memory only" in msgs[0]
    assert cache.load("x") is None


def test_cache_directory_that_is_a_file_is_named_as_such(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NORMC_CACHE_DIR", str(blocker))
    monkeypatch.setattr(cache, "_warned", False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert cache.store("x", PAYLOAD) is False
    msgs = [str(x.message) for x in w if "kernel cache" in str(x.message)]
    assert len(msgs) == 1 and "it is a file, not a directory" in msgs[0], msgs
    assert blocker.read_text() == "not a directory"


def _writer(args):
    d, n = args
    os.environ["NORMC_CACHE_DIR"] = d
    ok = 0
    for _ in range(n):
        ok += cache.store("same-key", PAYLOAD)
        got = cache.load("same-key")
        assert got is None or got["kernels"][0]["grid"] == 3
    return ok


def test_concurrent_writers_leave_one_valid_entry(cache_dir):
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        oks = pool.map(_writer, [(str(cache_dir), 25)] * 2)
    assert oks == [25, 25]
    assert sorted(p.name for p in cache_dir.iterdir()) == ["same-key.json"]
    assert cache.load("same-key")["kernels"][0]["entry"] == "k"


def test_compiled_kernels_hit_disk_and_key_on_versions(cache_dir, monkeypatch):
    import normc.runtime as rt

    plan = normc.plan(normc.layer_norm(), (64, 256), "float32")
    monkeypatch.setattr(rt, "_kernel_memo", {})
    first = rt.compiled_kernels(plan, (9, 0))
    assert len(list(cache_dir.iterdir())) == 1
    assert ".visible .entry" in first[0]["ptx"] and first[0]["cubin"]
    # a new process: empty memo, and NVVM must not run again
    monkeypatch.setattr(rt, "_kernel_memo", {})
    import normc.lowering as lowering

    def boom(*a, **k):
        raise AssertionError("recompiled despite a disk-cache hit")

    monkeypatch.setattr(lowering, "lower", boom)
    again = rt.compiled_kernels(plan, (9, 0))
    assert again[0]["ptx"] == first[0]["ptx"] and again[0]["cubin"] == first[0]["cubin"]
    # another NVVM (or driver, or normc) version is another key: a miss, not a stale kernel
    v = rt.versions()
    monkeypatch.setattr(rt, "versions", lambda: {**v, "nvvm": "0.0"})
    monkeypatch.setattr(rt, "_kernel_memo", {})
    with pytest.raises(AssertionError, match="recompiled"):
        rt.compiled_kernels(plan, (9, 0))


def test_compiling_from_several_threads_is_safe(cache_dir):
    """Threads racing on one new specialization (and on different ones) all get correct results."""
    import threading

    import numpy as np

    from conftest import reference

    spec = normc.layer_norm()
    f = normc.compile(spec)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((3, 8 + (i % 2) * 4)).astype(np.float32) for i in range(4)]
    results, errors = [None] * 4, []

    def work(i):
        try:
            x = xs[i]
            w = np.ones(x.shape[1], np.float32)
            b = np.zeros(x.shape[1], np.float32)
            results[i] = (f(x, w, b), reference(spec, x, w, b)[0])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for y, ref in results:
        assert np.abs(y - ref).max() < 1e-5
    assert len(f._table) == 2  # two specializations (8 and 12 columns), each built once


def test_tuned_schedule_is_used_by_later_compiles(cache_dir):
    """A schedule recorded by autotune (here written directly: timing needs a GPU) is what the planner uses
    for that problem afterwards, in any Compiled; forcing a schedule still wins."""
    import numpy as np

    from normc.runtime import tune

    spec = normc.layer_norm()
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    w, b = np.ones(64, np.float32), np.zeros(64, np.float32)
    f = normc.compile(spec)
    y0 = f(x, w, b)
    (entry,) = f._table.values()
    assert entry.plan.schedule == "persistent"
    assert tune.record(entry.problem, "sm_90", 4, "split", {"None": 2.0, "split": 1.0})
    g = normc.compile(spec)
    y1 = g(x, w, b)
    (e1,) = g._table.values()
    assert e1.plan.schedule == "split" and "schedule forced to split" in " ".join(e1.plan.why)
    assert np.abs(y1 - y0).max() < 1e-5
    h = normc.compile(spec, schedule="looped")
    h(x, w, b)
    assert next(iter(h._table.values())).plan.schedule == "looped"
    with pytest.raises(normc.ArgumentError, match="CUDA torch"):
        normc.autotune(spec, x, w, b)


def test_import_turns_off_numba_message_colours_unless_set():
    """`import normc` sets NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING=1 (Numba's colorama highlighting of the
    thousands of messages its overload resolution discards costs a third of a kernel's compile), and keeps a
    value the user set, the empty string included."""
    import os
    import subprocess
    import sys

    code = "import os, normc; print(repr(os.environ['NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING']))"
    for given, want in ((None, "'1'"), ("", "''"), ("0", "'0'")):
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"}
        if given is not None:
            env["NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"] = given
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == want, (given, out.stdout, out.stderr[-500:])


def _run_code(code, env=None, timeout=300):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_gpu_probe_versions_and_targets_do_not_import_numba():
    """What a disk-cache hit asks before its first launch (is there a GPU, the cache key's NVVM version, the
    targets the toolkit compiles for) is asked through cuda.bindings: importing numba.cuda costs a new process
    about 0.3 s, a third of a 100 ms budget three times over, and only compiling needs it."""
    code = ("import sys, normc\nfrom normc import runtime\nfrom normc.lowering import supported_ccs\n"
            "runtime.gpu_available(); v = runtime.versions(); ccs = supported_ccs()\n"
            "print(sorted(m for m in sys.modules if m == 'numba' or m.startswith('numba.')))\n"
            "print(v['nvvm'], ccs)")
    mods, answers = _run_code(code).splitlines()
    assert mods == "[]"
    from normc.lowering import supported_ccs
    from numba.cuda.cudadrv.nvvm import NVVM

    # the same answers Numba gives (the cache key must not change with the path that asked)
    assert answers == f"{'.'.join(map(str, NVVM().get_version()))} {supported_ccs()}"


def test_simulator_setting_read_without_numba():
    """NUMBA_ENABLE_CUDASIM=1 makes gpu_available() False before numba is imported (normc then runs on the
    simulator); 0 and a value Numba would ignore do not."""
    import os

    code = "import sys, normc.runtime as r\nprint(r._cudasim(), 'numba' in sys.modules)"
    for value, want in (("1", "True False"), ("0", "False False"), ("yes", "False False")):
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM=value)
        assert _run_code(code, env).strip() == want, value
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    assert _run_code("import normc.runtime as r\nprint(r.gpu_available())", env).strip() == "False"


@pytest.mark.gpu
def test_disk_cache_hit_launches_without_numba(tmp_path):
    """A new process whose kernels are in the disk cache plans, loads and launches them without importing
    Numba or cuda.core (issue 3, part 4: the first launch of such a process within 100 ms;
    tests/gpu_compile_time.py times it). The output is checked against float64."""
    import os

    code = ("import sys, torch, numpy as np, normc\n"
            "x = torch.randn(64, 1000, device='cuda'); w = torch.randn(1000, device='cuda')\n"
            "y = normc.compile('t d : norm over d ; scale d')(x, w); torch.cuda.synchronize()\n"
            "xd = x.double().cpu().numpy(); m = xd.mean(1, keepdims=True); v = xd.var(1, keepdims=True)\n"
            "ref = (xd - m) / np.sqrt(v + 1e-5) * w.double().cpu().numpy()\n"
            "print(float(np.abs(y.double().cpu().numpy() - ref).max()), 'numba' in sys.modules,\n"
            "      'cuda.core' in sys.modules)")
    env = dict(os.environ, NORMC_CACHE_DIR=str(tmp_path))
    first = _run_code(code, env).split()  # compiles (imports Numba) and fills the cache
    again = _run_code(code, env).split()
    assert float(first[0]) < 1e-4 and first[1] == "True"
    assert float(again[0]) < 1e-4 and again[1:] == ["False", "False"]
