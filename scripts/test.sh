#!/usr/bin/env bash
# Runs the whole suite (`make test`). The output is kept in .build/test-output.log and, when a
# test fails, the failing tests' lines are printed again at the end: a CI log often shows only
# its last lines, and the ✘ of one test among 600 is far above them.
#
# Without arguments the suite runs as two processes at once: the modules' own tests (in-process
# engines, stores and servers) and EndToEndTests (the real binaries). Many end-to-end tests wait
# synchronously for a process they started, and each such wait holds one of the test process's
# concurrency threads (as many as cores, 2 here): in one process, an in-process engine's
# transfer then got no thread for minutes, stalled and was retried (MetricsTests took 720 s in
# a full run and failed). With arguments (`make crash` passes a filter) it is one process.
set -uo pipefail
SWIFT=${SWIFT:-swift}
log=.build/test-output.log
units_log=.build/test-units.log
mkdir -p .build

# Linux's libdispatch sometimes crashes the test process itself in its manager thread
# (`_dispatch_event_loop_drain`, a known libdispatch/Foundation bug while processes are being
# spawned; seen in 2 of 6 full runs here, in no test's code). Only that crash, and only once,
# runs that part again, saying so; any other failure stands.
# run LOG COMMAND...: runs the command with its output in LOG (and on stdout with TEE=1).
run() {
    local out=$1
    shift
    local code
    for attempt in 1 2; do
        if [ "${TEE:-0}" = 1 ]; then
            "$@" 2>&1 | tee "$out"
            code=${PIPESTATUS[0]}
        else
            "$@" >"$out" 2>&1
            code=$?
        fi
        if [ "$code" -ne 0 ] && [ "$attempt" = 1 ] && grep -q "_dispatch_event_loop_drain" "$out"; then
            echo
            echo "==== the test process crashed in libdispatch (_dispatch_event_loop_drain), not in a test: running $out's part once more ===="
            cp "$out" "$out.crashed"
            continue
        fi
        return "$code"
    done
}

failures() {
    grep -E '✘|recorded an issue|Expectation failed|error:|[Ff]atal|signal|Crash' "$1" | cut -c1-700 | head -80
}

if [ "$#" -gt 0 ]; then
    TEE=1 run "$log" "$SWIFT" test --skip-build --disable-xctest "$@"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo
        echo "==== the run failed (exit $rc); its failures, from $log ===="
        failures "$log"
    fi
    exit "$rc"
fi

# The test bundle itself for the modules' tests: a second `swift test` would wait for the
# first's lock on .build.
bundle=$("$SWIFT" build --show-bin-path)/dldPackageTests.xctest
run "$units_log" "$bundle" --testing-library swift-testing --skip '^EndToEndTests\.' &
units=$!
TEE=1 run "$log" "$SWIFT" test --skip-build --disable-xctest --filter '^EndToEndTests\.'
rc=$?
wait "$units"
units_rc=$?
echo
echo "==== the modules' tests (run beside the end-to-end tests), from $units_log ===="
cat "$units_log"
echo
echo "==== end-to-end tests: exit $rc; the modules' tests: exit $units_rc ===="
if [ "$rc" -ne 0 ]; then
    echo "==== end-to-end failures, from $log ===="
    failures "$log"
fi
if [ "$units_rc" -ne 0 ]; then
    echo "==== the modules' failures, from $units_log ===="
    failures "$units_log"
fi
[ "$rc" -eq 0 ] && [ "$units_rc" -eq 0 ]
