#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer targets of Fuzz/ (a package of their own, so that `make test`
# never builds them) and runs each for FUZZ_SECONDS (60 by default) from its seed corpus in
# Fuzz/corpus/<target>/. New inputs go to Fuzz/.build/corpus/<target>/ (kept between runs, never
# committed); an input that crashes goes to Fuzz/.build/artifacts/<target>/. Fails if any target
# crashed. `scripts/fuzz.sh json netrc` runs some of them.
set -uo pipefail
SWIFT=${SWIFT:-swift}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
cd "$(dirname "$0")/../Fuzz" || exit 1
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(json toml content-disposition input-list netrc http-response hls metalink)

# Release: libFuzzer runs ten times more inputs a second than in debug; bounds and overflow
# checks stay on (-O keeps them), so a trap is still a crash.
"$SWIFT" build -c release -Xswiftc -sanitize=fuzzer 2>&1 | grep -v "Cannot export local symbol" || true
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fuzz: the build failed"; exit 1; }

# Swift's own backtracer would take the signal of a trap (fatalError, a failed precondition)
# before libFuzzer, which then never writes the crashing input.
export SWIFT_BACKTRACE=enable=no
failed=()
for target in "${targets[@]}"; do
    work=.build/corpus/$target artifacts=.build/artifacts/$target
    mkdir -p "$work" "$artifacts"
    log=.build/fuzz-$target.log
    echo "== fuzz-$target for ${FUZZ_SECONDS} s"
    # -timeout: one input that takes 10 s is a hang, and reported as a crash.
    .build/release/fuzz-"$target" -max_total_time="$FUZZ_SECONDS" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" "$work" "corpus/$target" > "$log" 2>&1
    rc=$?
    grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)" "$log" | sed 's/^/   /'
    if [ $rc -ne 0 ]; then
        failed+=("$target")
        echo "   CRASH (exit $rc): input in $artifacts/, log in Fuzz/$log"
        grep -E "ERROR|Fatal error|fuzz invariant|SUMMARY|Test unit written" "$log" | head -10 | sed 's/^/   /'
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: crashes in ${failed[*]}"
    exit 1
fi
echo "fuzz: no crash in ${targets[*]}"
