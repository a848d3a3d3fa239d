#!/usr/bin/env bash
# `make sanitize`: the unit and store tests (DLCoreTests, DLRPCTests, DLEngineTests,
# DLDaemonTests, DLStoreTests, DLTransferTests; not EndToEndTests, whose daemons are separate processes) under
# AddressSanitizer and ThreadSanitizer, each a full debug build of its own in .build-asan and
# .build-tsan. `scripts/sanitize.sh thread` runs one of them. Fails if a test fails or a
# sanitizer reports (ASan stops the run; TSan reports every race and fails at the end).
set -uo pipefail
SWIFT=${SWIFT:-swift}
cd "$(dirname "$0")/.." || exit 1
sanitizers=("$@")
[ ${#sanitizers[@]} -gt 0 ] || sanitizers=(address thread)
# LeakSanitizer (part of ASan) would fail the run on objects that live as long as the process.
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-suppressions.txt:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# ThreadSanitizer: reports it cannot judge (see the file), nothing of dld's own.
export TSAN_OPTIONS="suppressions=$PWD/scripts/tsan-suppressions.txt${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
filter='^(DLCoreTests|DLRPCTests|DLEngineTests|DLDaemonTests|DLStoreTests|DLTransferTests)\.'
failed=()
for sanitizer in "${sanitizers[@]}"; do
    case $sanitizer in
        address) scratch=.build-asan ;;
        thread) scratch=.build-tsan ;;
        *) echo "sanitize: unknown sanitizer $sanitizer (address or thread)"; exit 2 ;;
    esac
    echo "== $sanitizer sanitizer, in $scratch"
    args=(-c debug --sanitize="$sanitizer" --scratch-path "$scratch")
    if ! "$SWIFT" build --build-tests "${args[@]}"; then
        failed+=("$sanitizer (build)")
        continue
    fi
    mkdir -p "$scratch"
    log=$scratch/sanitize-test.log
    start=$(date +%s)
    "$SWIFT" test --skip-build --disable-xctest "${args[@]}" --filter "$filter" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    echo "== $sanitizer: exit $rc after $(( $(date +%s) - start )) s; log in $log"
    if [ "$rc" -ne 0 ] || grep -qE "^(==[0-9]+==ERROR: AddressSanitizer|WARNING: ThreadSanitizer)" "$log"; then
        failed+=("$sanitizer")
        grep -E "ERROR: AddressSanitizer|WARNING: ThreadSanitizer|SUMMARY: |✘" "$log" | sort | uniq -c | head -40
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "sanitize: failed: ${failed[*]}"
    exit 1
fi
echo "sanitize: clean under ${sanitizers[*]}"
