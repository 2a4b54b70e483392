#!/usr/bin/env bash
# One device call's worth of GPU work, in order of importance; each step's log goes to $OUT (or ./gpu-out).
# Start it after the install line of ../shared/gpu/README.md, e.g. through the device tool:
#   <install line> bash tests/gpu_session.sh [bench|bench-backward|tests|examples|host|all]
# Steps (tests+sanitize runs the first and third at once): tests = pytest -m gpu (every anchor row, interchange, streams, graphs, reliability, torch modules, the real-model examples at reduced sizes);
# bench = normc bench over the anchor table into docs/perf-style reports (resumable: copy docs/perf/bench.json
# into $out/perf first to continue a run; bench-backward the same for normc bench --backward, from
# docs/perf/backward.json); sanitize = compute-sanitizer over every strategy x schedule;
# host = tests/gpu_host_state.py (why the bench's host column can exceed a normc-only run's);
# examples = every example that needs a GPU (carry the platformdirs wheel in .whl: the image lacks it). T_TESTS and T_SAN (seconds) bound the tests and the sanitizer.
# The device tool returns at most 8 files from $OUT (../.library/device/README.md): "all" writes more (test
# and sanitizer logs, bench.json/.md/.png), so run the bench in its own call or copy what matters first.
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
what="${1:-all}"
export PYTHONUNBUFFERED=1

# pytest-xdist (one process per test file) when installed: compiling is CPU-bound and the GPU is shared
xdist=()
python3 -c "import xdist" 2>/dev/null && xdist=(-n 8 --dist loadfile)
if [[ "$what" == tests+sanitize ]]; then  # both at once: the sanitizer's cases are small
  timeout "${T_SAN:-540}" bash tests/gpu_sanitize.sh --out "$out" > "$out/sanitize-stdout.log" 2>&1 &
  san=$!
  timeout "${T_TESTS:-420}" python3 -m pytest -q -m gpu tests -p no:cacheprovider "${xdist[@]}" 2>&1 | tee "$out/gpu-tests.log" | tail -8
  wait $san
  tail -25 "$out/sanitize-stdout.log"
fi
if [[ "$what" == tests || "$what" == all ]]; then
  timeout "${T_TESTS:-420}" python3 -m pytest -q -m gpu tests -p no:cacheprovider "${xdist[@]}" 2>&1 | tee "$out/gpu-tests.log" | tail -8
fi
if [[ "$what" == bench || "$what" == all ]]; then
  mkdir -p "$out/perf"
  timeout 540 normc bench --out "$out/perf" --resume 2>&1 | tail -80 > "$out/bench-stdout.log"
  tail -15 "$out/bench-stdout.log"
fi
if [[ "$what" == bench-backward ]]; then  # not in "all": a call of its own (resumable as bench)
  mkdir -p "$out/perf"
  timeout 540 normc bench --backward --out "$out/perf" --resume 2>&1 | tail -80 > "$out/bench-stdout.log"
  tail -15 "$out/bench-stdout.log"
fi
if [[ "$what" == host ]]; then  # not in "all": the bench's host-overhead column in four process states
  timeout 300 python3 tests/gpu_host_state.py 2>&1 | grep -v "Warning" | tee "$out/host-state.log"
fi
if [[ "$what" == sanitize || "$what" == all ]]; then
  timeout 540 bash tests/gpu_sanitize.sh --out "$out" 2>&1 | tail -20
fi
if [[ "$what" == examples || "$what" == all ]]; then
  {
    normc --version
    timeout 120 python3 examples/astronaut_instance_norm.py
    timeout 120 python3 examples/instance_as_group_norm.py
    timeout 120 python3 examples/keras_layer_norm.py
    timeout 120 python3 examples/cupy_rawmodule.py
    timeout 120 python3 examples/nvfuser_nhwc_instance_norm.py
    timeout 120 python3 examples/jax_dlpack.py
    timeout 300 python3 examples/style_transfer.py
    timeout 300 python3 examples/unet3d_block.py
    timeout 300 python3 examples/transformer_block.py
    normc ptx "t d : norm over d ; scale d ; shift d" --shape 4096,1024 --dtype float32 --stats -o /tmp/ln.ptx &&
      cmake -S examples/ptx_driver_api -B /tmp/ptxbuild >/dev/null && cmake --build /tmp/ptxbuild >/dev/null &&
      /tmp/ptxbuild/normc_ptx_run /tmp/ln.ptx 4096 1024
  } 2>&1 | grep -v "Warning" | tee "$out/examples.log"
fi
