#!/usr/bin/env bash
# Runs the whole suite (`make test`). The output is kept in .build/test-output.log and, when a
# test fails, the failing tests' lines are printed again at the end: a CI log often shows only
# its last lines, and the ✘ of one test among 330 is far above them.
set -uo pipefail
SWIFT=${SWIFT:-swift}
log=.build/test-output.log
mkdir -p .build
"$SWIFT" test --skip-build --disable-xctest "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
# Linux's libdispatch sometimes crashes the test process itself in its manager thread
# (`_dispatch_event_loop_drain`, a known libdispatch/Foundation bug while processes are being
# spawned; seen in 2 of 6 full runs here, in no test's code). Only that crash, and only once,
# runs the suite again, saying so; any other failure stands.
if [ "$rc" -ne 0 ] && grep -q "_dispatch_event_loop_drain" "$log"; then
    echo
    echo "==== the test process crashed in libdispatch (_dispatch_event_loop_drain), not in a test: running the suite once more ===="
    cp "$log" "$log.crashed"
    "$SWIFT" test --skip-build --disable-xctest "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
fi
if [ "$rc" -ne 0 ]; then
    echo
    echo "==== the run failed (exit $rc); its failures, from $log ===="
    grep -E '✘|recorded an issue|Expectation failed|error:|[Ff]atal|signal|Crash' "$log" | cut -c1-700 | head -80
fi
exit "$rc"
