"""The Python code blocks of README.md and docs/*.md still run.

Each block is one test item (``README.md:1``: the second ```python block of README.md); a file's blocks run
in order in one namespace, as a reader would run the page (later blocks use names from earlier ones).
What a block needs is read from the block itself:

- **a GPU framework**: it imports torch, cupy or jax (``import torch``, ``from jax import ...``), or says
  ``# requires: torch`` (``cupy``, ``jax``). Every such block in these docs works on CUDA arrays, so it also
  needs a GPU.
- **a GPU**: ``# requires: gpu`` (e.g. Numba device arrays, which need a CUDA driver even though Numba is
  installed with normc).
- **the simulator**: any other block that uses numpy (``np.``) passes host arrays to normc, which run on
  Numba's CUDA simulator, and only where no GPU is present (with a GPU, normc wants CUDA arrays).
- nothing: planning and specs, which run anywhere.

``test_block_runs`` (what CI runs, ``-m "not gpu"``) runs the simulator and plain blocks and skips each GPU
block with a reason naming what it needs; ``test_gpu_block_runs`` (``-m gpu``) runs the GPU blocks where
their framework is importable and a GPU is present, and skips them with the missing piece otherwise; every
block, GPU ones included, is compiled everywhere (``test_every_block_compiles``). A block that raises fails
its test, and the file's later blocks fail too (they would run on a half-built namespace).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import types
import re

import pytest

from normc.runtime import gpu_available

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

FRAMEWORKS = ("torch", "cupy", "jax")
NEEDS = FRAMEWORKS + ("gpu",)
_IMPORT = re.compile(r"^\s*(?:import|from)\s+(torch|cupy|jax)\b", re.M)
_MARKER = re.compile(r"#\s*requires:\s*([A-Za-z0-9_, ]+)")
# A framework used by name (torch.x, cupy.x, jax.x, jnp.x): the block must declare it, by import or marker, so
# that a block using names imported by an earlier block is not taken for one that runs anywhere.
_USE = re.compile(r"\b(torch|cupy|jax|jnp)\.")
_NUMPY = re.compile(r"\bnp\.|^\s*import numpy\b", re.M)


def needs(code: str) -> tuple:
    """What ``code`` needs, from :data:`NEEDS` in that order: the GPU frameworks it imports or names in a
    ``# requires:`` marker, and ``gpu`` for any of them or for ``# requires: gpu``."""
    got = set(_IMPORT.findall(code))
    for m in _MARKER.findall(code):
        for word in filter(None, (w.strip() for w in m.split(","))):
            if word not in NEEDS:
                raise ValueError(f"unknown requirement {word!r} in '# requires: {m}' (known: {', '.join(NEEDS)})")
            got.add(word)
    if got:
        got.add("gpu")
    return tuple(n for n in NEEDS if n in got)


def kind(code: str) -> str:
    """``"gpu"`` (needs a GPU, and maybe a framework), ``"simulator"`` (numpy arrays, no GPU) or ``"any"``."""
    if needs(code):
        return "gpu"
    return "simulator" if _NUMPY.search(code) else "any"


def _missing(need: str):
    """Why ``need`` is not available here, or None when it is."""
    if need == "gpu":
        return None if gpu_available() else "no CUDA GPU (normc.runtime.gpu_available() is False)"
    if importlib.util.find_spec(need) is None:
        return f"{need} is not installed"
    if need == "torch":
        import torch

        return None if torch.cuda.is_available() else "torch has no CUDA device (torch.cuda.is_available() is False)"
    if need == "jax":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as the JAX block does, before jax starts
        try:
            import jax

            platforms = sorted({d.platform for d in jax.devices()})
        except Exception as e:  # pragma: no cover - depends on the installed jax
            return f"jax failed to start ({type(e).__name__}: {e})"
        return None if "gpu" in platforms else f"jax has no GPU backend (jax.devices(): {', '.join(platforms)})"
    return None


def _words(need: tuple) -> str:
    """("torch", "gpu") -> "torch and a GPU"."""
    return " and ".join([n for n in need if n != "gpu"] + ["a GPU"])


def skip_reason(code: str, gpu_run: bool):
    """Why the block is not run by the test of this mode (``gpu_run``: the gpu-marked one), or None to run it."""
    k = kind(code)
    if not gpu_run:
        if k == "gpu":
            return f"needs {_words(needs(code))}: compiled only here; runs in test_gpu_block_runs (-m gpu)"
        if k == "simulator" and gpu_available():
            return "numpy arrays run on the simulator only, and this machine has a GPU (normc wants CUDA arrays)"
        return None
    if k == "simulator":
        return "a simulator block (numpy arrays): runs in test_block_runs, where there is no GPU"
    if k == "any":
        return None
    why = [m for m in map(_missing, needs(code)) if m]
    return f"needs {_words(needs(code))}: {'; '.join(why)}" if why else None


def blocks(path) -> list:
    return BLOCK.findall(pathlib.Path(path).read_text())


class Page:
    """One file's blocks run in order in one namespace, each at most once; the blocks this mode does not run
    are passed over (a later block using their names fails, as it would for a reader without them)."""

    def __init__(self, name: str, codes: list, gpu_run: bool):
        self.name, self.codes, self.gpu_run = name, codes, gpu_run
        # a real module in sys.modules: torch.compile (Dynamo) imports the module a traced function lives in
        mod = types.ModuleType(f"docs_{pathlib.Path(name).stem}")
        sys.modules[mod.__name__] = mod
        self.ns = mod.__dict__
        self.done = 0  # blocks before this index have been run or passed over
        self.failed = None  # index of the block that raised

    def run_through(self, k: int):
        """Run the blocks up to and including ``k`` that this mode runs (raises what a block raises)."""
        while self.done <= k:
            if self.failed is not None:
                pytest.fail(f"{self.name}: block {self.failed} raised, so block {k} did not run (see its test)")
            i, code = self.done, self.codes[self.done]
            self.done += 1
            if skip_reason(code, self.gpu_run) is None:
                try:
                    exec(compile(code, f"{self.name}:block{i}", "exec"), self.ns)
                except BaseException:
                    self.failed = i
                    raise


_pages = {}


def _page(path, gpu_run: bool) -> Page:
    key = (path, gpu_run)
    if key not in _pages:
        _pages[key] = Page(path.name, blocks(path), gpu_run)
    return _pages[key]


ALL = [(p, k) for p in FILES for k in range(len(blocks(p)))]
GPU_BLOCKS = [(p, k) for p, k in ALL if kind(blocks(p)[k]) == "gpu"]


def _ids(items):
    return [f"{p.name}:{k}" for p, k in items]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_block_compiles(path):
    """Every block, GPU ones included, is valid Python and says what it needs."""
    for k, code in enumerate(blocks(path)):
        compile(code, f"{path.name}:block{k}", "exec")
        used = {"jax" if u == "jnp" else u for u in _USE.findall(code)}
        undeclared = used - set(needs(code))
        assert not undeclared, (f"{path.name} block {k} uses {', '.join(sorted(undeclared))} without importing it or "
                                f"a '# requires:' marker, so it would be taken for a block that runs without it")


@pytest.mark.parametrize("path,k", ALL, ids=_ids(ALL))
def test_block_runs(path, k):
    """Simulator and plain blocks run (on Numba's CUDA simulator where they launch kernels); GPU blocks are
    skipped with what they need."""
    why = skip_reason(blocks(path)[k], gpu_run=False)
    if why:
        pytest.skip(f"{path.name} block {k} {why}")
    _page(path, gpu_run=False).run_through(k)


@pytest.mark.gpu
@pytest.mark.parametrize("path,k", GPU_BLOCKS, ids=_ids(GPU_BLOCKS))
def test_gpu_block_runs(path, k):
    """On a GPU, each GPU block runs where its framework is importable, after the file's earlier GPU and plain
    blocks (the simulator blocks cannot run there)."""
    why = skip_reason(blocks(path)[k], gpu_run=True)
    if why:
        pytest.skip(f"{path.name} block {k} {why}")
    _page(path, gpu_run=True).run_through(k)


def test_a_raising_block_fails_its_test_and_the_later_ones():
    page = Page("t.md", ["a = 1", "raise RuntimeError('boom')", "b = a"], gpu_run=False)
    page.run_through(0)
    assert page.ns["a"] == 1
    with pytest.raises(RuntimeError, match="boom"):
        page.run_through(1)
    with pytest.raises(pytest.fail.Exception, match="block 1 raised"):
        page.run_through(2)


def test_classification():
    assert needs("import torch\nx = torch.ones(1)") == ("torch", "gpu")
    assert needs("import torch, normc.torch as nt") == ("torch", "gpu")
    assert needs("from jax import numpy as jnp") == ("jax", "gpu")
    assert needs("from numba import cuda   # requires: gpu") == ("gpu",)
    assert needs("y = f(x)   # requires: cupy") == ("cupy", "gpu")
    assert needs("import normc.torch") == ()  # normc's module, not torch itself: declare torch to need it
    assert kind("import numpy as np\ny = f(np.ones(3))") == "simulator"
    assert kind("import normc\nprint(normc.plan('t d : norm over d', (4, 8)))") == "any"
    with pytest.raises(ValueError, match="unknown requirement"):
        needs("# requires: tpu")
    assert "needs torch and a GPU" in skip_reason("import torch", gpu_run=False)
    assert "needs a GPU" in skip_reason("# requires: gpu", gpu_run=False)


# ``$ normc plan ...`` examples in the docs, with the output printed under them (up to the next ``$`` line or
# the block's end): the CLI must still print it (an example whose output starts "normc: error:" exits with
# status 2 and prints it on stderr). A shown line ending in "..." is shortened (a prefix of the real
# line); a block may show the first lines only.
PLAN_EXAMPLE = re.compile(r"^\$ (normc plan [^\n|]*)\n((?:(?!\$ |```)[^\n]*\n)*)", re.M)


def _plan_examples():
    out = []
    for path in FILES:
        for m in PLAN_EXAMPLE.finditer(path.read_text()):
            if m.group(2).strip():
                out.append(pytest.param(m.group(1), m.group(2), id=f"{path.name}:{m.group(1)[11:60]}"))
    return out


@pytest.mark.parametrize("cmd,shown", _plan_examples())
def test_plan_example_output_is_current(cmd, shown, capsys, monkeypatch, tmp_path):
    import shlex

    from normc.cli import main

    monkeypatch.setenv("NORMC_CACHE_DIR", str(tmp_path))  # no autotuned plan of the user's cache
    want = shown.rstrip("\n").splitlines()
    status = main(shlex.split(cmd)[1:])
    out, err = capsys.readouterr()
    failing = want[0].startswith("normc: error:")  # an example of an error: its message, on stderr
    assert status == (2 if failing else 0), (cmd, err)
    got = (err if failing else out).splitlines()
    assert len(got) >= len(want), (cmd, got)
    for w, g in zip(want, got):
        assert g == w or (w.endswith("...") and g.startswith(w[:-3].rstrip())), (cmd, w, g)
