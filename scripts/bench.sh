#!/usr/bin/env bash
# `make bench`: builds are done by make; this runs the benchmark scripts.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/bench.py "$@"
