"""Cache and concurrency robustness (issue 5, parts 4 and 5), end to end through
``normc.runtime.compiled_kernels`` (NVVM and nvJitLink run on the CPU: no GPU needed).

Complements tests/test_cache.py, which tests ``normc.runtime.cache`` itself: here two *processes* compile
the same specialization at once, damaged entries are rebuilt by the compile path, an unwritable cache
directory degrades to memory with one warning, a change of normc/NVVM/driver version or target misses,
threads compile concurrently, and the launch path contains no implicit device synchronization.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

import normc
import normc.runtime as rt
from normc.runtime import cache

SPEC = "t d : norm over d ; scale d ; shift d"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "normc-cache"
    monkeypatch.setenv("NORMC_CACHE_DIR", str(d))
    monkeypatch.setattr(rt, "_kernel_memo", {})
    monkeypatch.setattr(cache, "_warned", False)
    return d


@pytest.fixture
def count_lowering(monkeypatch):
    """Counts calls of normc.lowering.lower (each is an NVVM compile)."""
    import normc.lowering as lowering

    calls = []
    real = lowering.lower

    def lower(plan, arch=None):
        calls.append(plan)
        return real(plan, arch=arch)

    monkeypatch.setattr(lowering, "lower", lower)
    return calls


def _plan(d=256, dtype="float32"):
    return normc.plan(SPEC, (64, d), dtype)


def _entries(d):
    return sorted(p.name for p in pathlib.Path(d).iterdir()) if pathlib.Path(d).exists() else []


def _sha(kernels):
    """Fingerprint of compiled kernels; NVVM names each compile's entry uniquely, so names are masked."""
    return hashlib.sha256("".join(k["ptx"].replace(k["entry"][3:], "ENTRY") for k in kernels).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------------
# Two processes


_CHILD = textwrap.dedent("""
    import hashlib, os, pathlib, sys, time
    import normc, normc.runtime as rt
    plan = normc.plan({spec!r}, (64, 256), "float32")
    pathlib.Path(sys.argv[1] + ".ready").touch()
    while not os.path.exists(sys.argv[2]):        # start both compiles at the same moment
        time.sleep(0.005)
    ks = rt.compiled_kernels(plan, (9, 0))
    print(hashlib.sha256("".join(k["ptx"].replace(k["entry"][3:], "ENTRY") for k in ks).encode()).hexdigest())
""").format(spec=SPEC)


def test_two_processes_compile_the_same_specialization_at_once(cache_dir, tmp_path, count_lowering):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    go = tmp_path / "go"
    # the children import the same normc as this process (python -m pytest puts the checkout first)
    root = str(pathlib.Path(normc.__file__).resolve().parent.parent)
    env = dict(os.environ, NORMC_CACHE_DIR=str(cache_dir), PYTHONWARNINGS="error::RuntimeWarning",
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / f"p{i}"), str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    deadline = time.time() + 120
    while not all((tmp_path / f"p{i}.ready").exists() for i in range(2)):
        assert time.time() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    digests = {out.strip() for out, _ in outs}
    assert len(digests) == 1  # the same kernels (up to NVVM's per-compile entry names)
    # exactly one entry, no temporary files, and it loads with the same kernels without recompiling
    (name,) = _entries(cache_dir)
    assert name.endswith(".json") and not name.startswith(".tmp")
    got = rt.compiled_kernels(_plan(), (9, 0))
    assert _sha(got) == digests.pop() and count_lowering == []


# ----------------------------------------------------------------------------------------------------
# Damaged entries are rebuilt


def _truncate(path):
    b = path.read_bytes()
    path.write_bytes(b[: len(b) // 3])


def _flip_ptx(path):
    # still valid JSON, but the PTX differs from what the checksum covers
    doc = json.loads(path.read_text())
    doc["payload"]["kernels"][0]["ptx"] = doc["payload"]["kernels"][0]["ptx"].replace("ld.global", "st.global", 1)
    path.write_text(json.dumps(doc))


def _garbage(path):
    path.write_bytes(os.urandom(512))


def _empty(path):
    path.write_bytes(b"")


def _bad_cubin(path):
    doc = json.loads(path.read_text())
    doc["payload"]["kernels"][0]["cubin"] = "!!not base64!!"
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("damage", [_truncate, _flip_ptx, _garbage, _empty, _bad_cubin],
                         ids=["truncated", "tampered-ptx", "garbage", "empty", "bad-cubin"])
def test_damaged_entry_is_rebuilt_not_loaded(cache_dir, count_lowering, monkeypatch, damage):
    plan = _plan()
    first = rt.compiled_kernels(plan, (9, 0))
    assert len(count_lowering) == 1
    (path,) = pathlib.Path(cache_dir).iterdir()
    damage(path)
    monkeypatch.setattr(rt, "_kernel_memo", {})  # as in a new process
    again = rt.compiled_kernels(plan, (9, 0))
    assert len(count_lowering) == 2, "a damaged entry was loaded"
    assert _sha(again) == _sha(first)
    # the rebuilt entry replaced the damaged one and is valid
    assert _entries(cache_dir) == [path.name]
    monkeypatch.setattr(rt, "_kernel_memo", {})
    assert _sha(rt.compiled_kernels(plan, (9, 0))) == _sha(first) and len(count_lowering) == 2


# ----------------------------------------------------------------------------------------------------
# Unwritable or missing directories


def _make_unwritable(d, monkeypatch):
    """A cache directory normc cannot write: read-only by mode, or (as root, which ignores modes) by making
    every write in it fail with EROFS, as on a read-only mount."""
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o555)
    if os.access(d, os.W_OK):
        import errno
        import tempfile

        real = tempfile.mkstemp

        def mkstemp(*a, dir=None, **k):
            if dir is not None and pathlib.Path(dir) == d:
                raise OSError(errno.EROFS, "Read-only file system", str(d))
            return real(*a, dir=dir, **k)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("how", ["read-only", "uncreatable"])
def test_unwritable_directory_falls_back_to_memory_with_one_warning(cache_dir, count_lowering, monkeypatch,
                                                                    tmp_path, how):
    if how == "read-only":
        _make_unwritable(cache_dir, monkeypatch)
    else:
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        monkeypatch.setenv("NORMC_CACHE_DIR", str(blocker / "normc"))
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            a = rt.compiled_kernels(_plan(256), (9, 0))
            b = rt.compiled_kernels(_plan(512), (9, 0))
            a2 = rt.compiled_kernels(_plan(256), (9, 0))  # memory hit
        msgs = [str(x.message) for x in w if "normc" in str(x.message)]
        assert len(msgs) == 1 and "memory only" in msgs[0], msgs
        assert len(count_lowering) == 2 and _sha(a2) == _sha(a) and _sha(a) != _sha(b)
        assert ".visible .entry" in a[0]["ptx"]
    finally:
        if cache_dir.exists():
            cache_dir.chmod(0o755)
    assert [p for p in _entries(cache_dir) if p.endswith(".json")] == []


def test_missing_directory_is_created(cache_dir, count_lowering, monkeypatch):
    nested = cache_dir / "deeper" / "still"
    monkeypatch.setenv("NORMC_CACHE_DIR", str(nested))
    rt.compiled_kernels(_plan(), (9, 0))
    assert len(_entries(nested)) == 1


def test_existing_entries_load_from_a_read_only_directory(cache_dir, count_lowering, monkeypatch):
    first = rt.compiled_kernels(_plan(), (9, 0))
    _make_unwritable(cache_dir, monkeypatch)
    try:
        monkeypatch.setattr(rt, "_kernel_memo", {})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a hit writes nothing, so nothing to warn about
            again = rt.compiled_kernels(_plan(), (9, 0))
    finally:
        cache_dir.chmod(0o755)
    assert _sha(again) == _sha(first) and len(count_lowering) == 1


# ----------------------------------------------------------------------------------------------------
# Versions and targets key the cache


@pytest.mark.parametrize("what", ["normc", "source", "nvvm", "driver", "arch"])
def test_version_or_target_change_misses(cache_dir, count_lowering, monkeypatch, what, tmp_path):
    """Change the *real* sources that versions() reads (not versions() itself): a miss and a second entry;
    changing back hits the first entry again."""
    plan = _plan()
    cc = (9, 0)
    rt.compiled_kernels(plan, cc)
    assert len(count_lowering) == 1
    with monkeypatch.context() as m:
        m.setattr(rt, "_kernel_memo", {})
        if what == "normc":
            m.setattr(normc, "__version__", "99.0.0")
        elif what == "source":  # the same version, one generator file edited (an editable install)
            import shutil

            src = tmp_path / "lowering"
            shutil.copytree(rt._lowering_dir(), src, ignore=shutil.ignore_patterns("__pycache__"))
            with open(src / "codegen.py", "a") as f:
                f.write("\n# edited\n")
            m.setattr(rt, "_lowering_dir", lambda: str(src))
        elif what == "nvvm":
            from cuda.bindings import nvvm  # what versions() asks (Numba's NVVM() asks the same library)

            m.setattr(nvvm, "version", lambda: (99, 9))
        elif what == "driver":
            from normc.runtime import gpu

            d0 = gpu.driver_version()
            m.setattr(gpu, "driver_version", lambda: d0 + 10)
        else:
            cc = (8, 0)
        rt.compiled_kernels(plan, cc)
        assert len(count_lowering) == 2, f"a {what} change loaded the old entry"
    assert len(_entries(cache_dir)) == 2
    monkeypatch.setattr(rt, "_kernel_memo", {})
    rt.compiled_kernels(plan, (9, 0))
    assert len(count_lowering) == 2


def test_versions_names_every_part():
    v = rt.versions()
    assert set(v) == {"normc", "source", "nvvm", "driver"} and v["normc"] == normc.__version__
    assert re.fullmatch(r"[0-9a-f]{16}", v["source"])
    assert re.fullmatch(r"\d+(\.\d+)*|\?", v["nvvm"]) and isinstance(v["driver"], int)


# ----------------------------------------------------------------------------------------------------
# Threads


def test_threads_compile_the_same_and_different_plans_at_once(cache_dir):
    plans = [_plan(256), _plan(256), _plan(384), _plan(384), _plan(256, "float16"), _plan(256, "float16")]
    results, errors = [None] * len(plans), []
    start = threading.Barrier(len(plans))

    def work(i):
        try:
            start.wait()
            results[i] = _sha(rt.compiled_kernels(plans[i], (9, 0)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results[0] == results[1] and results[2] == results[3] and results[4] == results[5]
    assert len({results[0], results[2], results[4]}) == 3
    names = _entries(cache_dir)
    assert len(names) == 3 and not any(n.startswith(".tmp") for n in names)
    for n in names:
        assert cache.load(n[: -len(".json")]) is not None


def test_tuning_records_from_threads_leave_valid_entries(cache_dir):
    """autotune's records share the disk cache: concurrent writers of one key leave one valid record."""
    from normc.runtime import tune

    prob = next(iter(_compiled_problem().values()))
    errors = []

    def work(s):
        try:
            for _ in range(10):
                assert tune.record(prob, "sm_90", 132, s, {"x": 1.0})
                assert tune.lookup(prob, "sm_90", 132) in ("looped", "split")
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in ("looped", "split", "looped", "split")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(_entries(cache_dir)) == 1


def _compiled_problem():
    from normc.problem import make_problem

    spec = normc.spec(SPEC)
    return {"p": make_problem(spec, (4, 64), (64, 1), (64, 1), x_dtype="float32")}


# ----------------------------------------------------------------------------------------------------
# Streams: the launch path never synchronizes


CALL_PATH = ["runtime/__init__.py", "runtime/arrays.py", "runtime/gpu.py", "runtime/cache.py"]
SYNC = re.compile(r"synchronize\s*\(|cuCtxSynchronize|cuStreamSynchronize|cudaDeviceSynchronize|"
                  r"cudaStreamSynchronize|\.sync\s*\(|block_until_ready|copy_to_host|\.get\s*\(\s*\)")


@pytest.mark.parametrize("path", CALL_PATH)
def test_call_path_has_no_implicit_synchronization(path):
    """Nothing between ``f(x, ...)`` and the launch waits for the device (the GPU test
    test_gpu_reliability.py::test_call_does_not_synchronize checks the same on the device)."""
    src = pathlib.Path(rt.__file__).with_name(pathlib.Path(path).name).read_text()
    code = "\n".join(line.split("#")[0] for line in src.splitlines())
    code = re.sub(r'"""(?:.|\n)*?"""', "", code)
    assert not SYNC.findall(code)


def test_numba_simulator_environment_runs_numpy_input(tmp_path):
    # Under NUMBA_ENABLE_CUDASIM=1 Numba's cuda.is_available() answers True for its simulator; normc must not take
    # that for a GPU (it refused numpy input: "x is a host array; expected a CUDA array on the GPU") but run on
    # the simulator, as it does without a GPU. Numba's simulated device arrays run too, read as numpy views
    # (docs/interop.md): out= one is written in place, a y normc allocates is numpy. Checked against a float64
    # layer norm in the child process.
    code = textwrap.dedent("""
        import warnings
        import numpy as np
        import normc
        from numba import cuda
        warnings.simplefilter("ignore")
        x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
        f = normc.compile("t d : norm over d")
        y = f(x)
        xd = x.astype(np.float64)
        ref = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5)
        assert not normc.runtime.gpu_available()
        dx, dout = cuda.to_device(x), cuda.device_array_like(x)
        assert f(dx, out=dout) is dout and type(f(dx)) is np.ndarray
        print(float(np.abs(np.asarray(y) - ref).max()), float(np.abs(dout.copy_to_host() - ref).max()))
    """)
    root = str(pathlib.Path(normc.__file__).resolve().parent.parent)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NORMC_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert all(float(e) < 1e-5 for e in out.stdout.split()[-2:])


@pytest.mark.parametrize("device, known, want", [
    ((9, 0), ((8, 0), (9, 0), (10, 0)), (9, 0)),     # a target the toolkit compiles for: itself
    ((13, 5), ((8, 0), (9, 0), (12, 1)), (12, 1)),   # newer than the toolkit: its newest target (PTX JIT)
    ((9, 0), (), (9, 0)),                             # no toolkit to ask: the device's own
])
def test_device_newer_than_the_toolkit_compiles_for_its_newest_target(monkeypatch, device, known, want):
    """The runtime compiles for the device's compute capability, except on a GPU newer than every target the
    installed toolkit knows, where it takes the newest of those (arch_cc would refuse the device's own)."""
    import normc.lowering as lowering
    from normc.runtime import gpu

    a = gpu._attr
    answers = {a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: device[0],
               a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: device[1]}
    monkeypatch.setattr(gpu, "_attribute", lambda ordinal, attribute: answers[attribute])
    monkeypatch.setattr(lowering, "supported_ccs", lambda: known)
    gpu.device_cc.cache_clear()
    try:
        assert gpu.device_cc(0) == want
    finally:
        gpu.device_cc.cache_clear()


def _fake_loaded_gpu(monkeypatch, kernel):
    """An sm_90 device of 132 SMs on which every plan loads as two ``kernel()`` objects (no driver calls)."""
    from normc.runtime import gpu

    monkeypatch.setattr(rt, "gpu_available", lambda: True)
    monkeypatch.setattr(gpu, "device_cc", lambda d: (9, 0))
    monkeypatch.setattr(gpu, "device_sms", lambda d: 132)
    monkeypatch.setattr(gpu, "set_device", lambda d: None)
    monkeypatch.setattr(gpu, "load_fitting_clusters", lambda plan_for, kernels_for, cluster_of:
                        (plan_for(None), [kernel(), kernel()]))


def test_coop_plan_whose_row_cannot_be_resident_is_refused_not_hung(monkeypatch):
    """The CTAs of a coop row spin until all of them have arrived: if fewer fit the device at once than a row
    has (the co-resident grid the loaded kernel reports), the call raises CompileError instead of launching a
    grid that would never finish. The planner keeps a row to one CTA per SM, so a real device does not get
    here; the loaded kernel is faked with a co-resident grid of 1."""
    from normc.runtime.arrays import ArrayInfo

    class Kernel:
        grid = 1  # CTAs launched: the co-resident grid of a cooperative launch

    _fake_loaded_gpu(monkeypatch, Kernel)
    f = normc.compile("t d : norm over d", schedule="coop")
    xi = ArrayInfo(None, "torch", 1 << 20, (4, 100000), (100000, 1), "float32", 0)
    with pytest.raises(normc.CompileError, match="coop plan spreads a row over 24 CTAs but only 1 fit"):
        f._build(xi, None, None, None, False)


def test_grid_plan_that_cannot_be_resident_is_refused_not_hung(monkeypatch):
    """Rows held over a co-resident grid need every planned CTA resident at once: a loaded kernel reporting fewer
    (faked: 100 of 132) makes the call raise CompileError instead of launching CTAs that would wait forever."""
    from normc.runtime.arrays import ArrayInfo

    class Kernel:
        grid = 100

    _fake_loaded_gpu(monkeypatch, Kernel)
    f = normc.compile("t d : norm over d")
    xi = ArrayInfo(None, "torch", 1 << 20, (4, 400001), (400001, 1), "float32", 0)
    with pytest.raises(normc.CompileError, match="holds 4 rows over 132 co-resident CTAs but only 100 fit"):
        f._build(xi, None, None, None, False)
