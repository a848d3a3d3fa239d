#!/usr/bin/env bash
# `make crash-mutants`: shows that the power-cut suite catches real breaks of dld. Each mutant
# of Tests/PowerCutMutants/mutants.txt is a patch of dld's sources, applied to a scratch copy of
# this tree (.build-mutants/src); dld is built there (.build-mutants/build: one scratch path
# shared by the mutants, so that after the first full build each mutant costs an incremental
# build of the modules its patch touches), and the power-cut points the list names run (in one `swift test`), with
# this tree's test binary, against that dld (DLD_BIN_DIR). Every named point must fail; a
# mutant with a point that passes survives, and the run fails.
#
# Usage: scripts/crash-mutants.sh [NAME...]   (default: every mutant of the list)
# The test binary must be built (`swift build --build-tests`, as `make crash-mutants` does).
set -uo pipefail
SWIFT=${SWIFT:-swift}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
list=Tests/PowerCutMutants/mutants.txt
work=$root/.build-mutants
src=$work/src
scratch=$work/build
products=$("$SWIFT" build --show-bin-path)
mkdir -p "$work" "$src"
log=$work/run.log
: >"$log"

wanted=("$@")
mapfile -t lines < <(grep -v '^[[:space:]]*#' "$list" | grep '|')
if [ "${#wanted[@]}" -gt 0 ]; then
    kept=()
    for line in "${lines[@]}"; do
        name=$(echo "${line%%|*}" | xargs)
        for w in "${wanted[@]}"; do [ "$w" = "$name" ] && kept+=("$line"); done
    done
    lines=("${kept[@]}")
    [ "${#lines[@]}" -eq "${#wanted[@]}" ] || { echo "unknown mutant among: ${wanted[*]} (see $list)" >&2; exit 2; }
fi

survivors=()
previous_files=()
started=$(date +%s)
for line in "${lines[@]}"; do
    name=$(echo "${line%%|*}" | xargs)
    points=${line#*|}
    patch=Tests/PowerCutMutants/$name.patch
    echo "==== mutant $name"
    # The scratch copy as this tree is (committed or not), then the patch. Files the previous
    # mutant patched are touched, so that the build sees them changed back.
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$src"
    [ -f Package.resolved ] && cp -p Package.resolved "$src/"
    for f in "${previous_files[@]}"; do touch "$src/$f"; done
    mapfile -t previous_files < <(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$patch")
    if ! patch -d "$src" -p1 --forward --quiet <"$patch"; then
        echo "mutant $name: its patch no longer applies (update $patch)"
        survivors+=("$name (patch does not apply)")
        continue
    fi
    if ! "$SWIFT" build --package-path "$src" --scratch-path "$scratch" --product dld >>"$log" 2>&1; then
        echo "mutant $name: does not build (see $log)"
        survivors+=("$name (does not build)")
        continue
    fi
    # This build's other programs, with the mutant's dld.
    bin=$work/bin-$name
    rm -rf "$bin"
    mkdir -p "$bin"
    for program in "$products"/*; do
        [ -f "$program" ] && [ -x "$program" ] && ln -s "$program" "$bin/"
    done
    rm -f "$bin/dld"
    cp "$scratch/debug/dld" "$bin/dld"
    IFS=';' read -ra named <<<"$points"
    trimmed=()
    for point in "${named[@]}"; do trimmed+=("$(echo "$point" | sed 's/^[[:space:]]*//;s/[[:space:]]*$//')"); done
    # All its points in one run (DLD_POWERCUT takes A|B); each must have recorded an issue.
    selection=$(IFS='|'; echo "${trimmed[*]}")
    out=$work/$name.log
    DLD_BIN_DIR=$bin DLD_POWERCUT=$selection "$SWIFT" test --skip-build --disable-xctest --filter 'PowerCutTests' >"$out" 2>&1
    rc=$?
    cat "$out" >>"$log"
    alive=0
    for point in "${trimmed[@]}"; do
        # The first issue of the point, with its message (the ↳ line after it, if any).
        why=$(awk -v p="$point" 'found { if (index($0, "↳") == 1) { print substr($0, 5); shown = 1 } exit }
            index($0, "recorded an issue") && index($0, p) { found = 1; sub(/.*PowerCutTests.swift:[0-9]+:[0-9]+: */, ""); first = $0 }
            END { if (found && !shown) print first }' "$out" | head -2 | tr '\n' ' ' | cut -c1-240)
        if [ "$rc" -ne 0 ] && [ -n "$why" ]; then
            echo "  killed by \"$point\": $why"
        else
            echo "  SURVIVED \"$point\" (exit $rc; see $out)"
            alive=1
        fi
    done
    [ "$alive" -eq 0 ] || survivors+=("$name")
done
echo "==== $(( $(date +%s) - started )) s; log in $log"
if [ "${#survivors[@]}" -gt 0 ]; then
    echo "mutants that survived: ${survivors[*]}"
    exit 1
fi
echo "every mutant was killed"
