#!/usr/bin/env bash
# compute-sanitizer memcheck + racecheck over one small case of every strategy x schedule; exits non-zero
# on any sanitizer error, failed case or missing sanitizer. Logs and sanitize-summary.txt go to $OUT (or
# ./sanitize-out). Extra arguments go to tests/gpu_sanitize.py (e.g. --tools memcheck,racecheck,synccheck).
set -uo pipefail
exec python3 "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/gpu_sanitize.py" "$@"
