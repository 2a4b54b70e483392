"""The Python code blocks of README.md and docs/*.md still run.

Each file's ```python blocks run in order in one namespace (later blocks use names from earlier ones).
Blocks that need a GPU (they mention torch, cupy or ``requires: gpu``) run only where a GPU is present
(``test_gpu_blocks_run``, marked gpu; everywhere else they are at least compiled, so a syntax error cannot
hide in them); everything else runs here, on Numba's CUDA simulator where it launches kernels.
"""

import pathlib
import re

import pytest

from normc.runtime import gpu_available

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _needs_gpu(code):
    return bool(re.search(r"\btorch\b|\bcupy\b|requires: gpu", code))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_block_compiles(path):
    """Every block, GPU ones included, is valid Python."""
    for k, code in enumerate(BLOCK.findall(path.read_text())):
        compile(code, f"{path.name}:block{k}", "exec")


@pytest.mark.gpu
@pytest.mark.parametrize("path", [p for p in FILES if any(_needs_gpu(c) for c in BLOCK.findall(p.read_text()))],
                         ids=lambda p: p.name)
def test_gpu_blocks_run(path):
    """On a GPU every block runs, in order, in one namespace (as a reader would run the page)."""
    if not gpu_available():
        pytest.skip("needs a GPU")
    ns = {"__name__": f"docs_{path.stem}"}
    for k, code in enumerate(BLOCK.findall(path.read_text())):
        exec(compile(code, f"{path.name}:block{k}", "exec"), ns)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_python_blocks_run(path):
    blocks = BLOCK.findall(path.read_text())
    ns = {"__name__": f"docs_{path.stem}"}
    ran = 0
    for code in blocks:
        if _needs_gpu(code) and not gpu_available():
            continue
        exec(compile(code, f"{path.name}:block", "exec"), ns)
        ran += 1
    if not blocks:
        pytest.skip("no python blocks")
    if ran == 0:
        pytest.skip("every block needs a GPU")
