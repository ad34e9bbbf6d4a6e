#!/usr/bin/env bash
# fuzz-smoke.sh: run every Go fuzz target in the repo for a fixed number of
# executions each.
#
#   hack/fuzz-smoke.sh [EXECS]      (default 50000; env FUZZ_EXECS overrides too)
#
# The budget is a count (-fuzztime Nx), not a duration: with a duration, Go
# 1.26's fuzz coordinator can report its own deadline as a target failure
# ("context deadline exceeded", no failing input) when a starved worker is
# mid-call at the boundary (golang/go#75804, fixed in 1.27). A count has no
# deadline to race; on a loaded machine it only runs slower. -timeout still
# bounds a target that hangs.
#
# Targets are found by grepping *_test.go for `func FuzzXxx(`; each runs
# alone (`go test -fuzz` takes one target per package at a time) with its
# seed corpus plus testdata/fuzz/<Name>/ when present. A failure leaves the
# crashing input in that package's testdata/fuzz/ (commit it as a
# regression seed) and the script exits non-zero after running the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
execs="${1:-${FUZZ_EXECS:-50000}}"
case "$execs" in ''|*[!0-9]*|0) echo "fuzz-smoke: EXECS must be a positive whole number, got '$execs'" >&2; exit 2;; esac
failed=()
count=0
while IFS=: read -r file name; do
	pkg="./$(dirname "$file")"
	count=$((count + 1))
	echo "=== fuzz $pkg $name (${execs} execs)"
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "${execs}x" -timeout 5m "$pkg"; then
		failed+=("$pkg $name")
	fi
done < <(grep -rHoE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' --exclude-dir=vendor --exclude-dir=.git --exclude-dir=tools . \
	| sed -E 's#^\./##; s#:func (Fuzz[A-Za-z0-9_]*)\($#:\1#' | sort -u)
if [ "$count" -eq 0 ]; then
	echo "fuzz-smoke: no Fuzz targets found" >&2
	exit 1
fi
if [ "${#failed[@]}" -gt 0 ]; then
	printf 'fuzz-smoke: FAILED %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz-smoke: $count targets, ${execs} execs each: ok"
