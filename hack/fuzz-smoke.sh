#!/usr/bin/env bash
# fuzz-smoke.sh: run every Go fuzz target in the repo for a short time each.
#
#   hack/fuzz-smoke.sh [SECONDS]      (default 5; env FUZZTIME overrides too)
#
# Targets are found by grepping *_test.go for `func FuzzXxx(`; each runs
# alone (`go test -fuzz` takes one target per package at a time) with its
# seed corpus plus testdata/fuzz/<Name>/ when present. A failure leaves the
# crashing input in that package's testdata/fuzz/ (commit it as a
# regression seed) and the script exits non-zero after running the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-${FUZZTIME:-5}}"
case "$secs" in ''|*[!0-9]*) echo "fuzz-smoke: SECONDS must be a whole number, got '$secs'" >&2; exit 2;; esac
failed=()
count=0
while IFS=: read -r file name; do
	pkg="./$(dirname "$file")"
	count=$((count + 1))
	echo "=== fuzz $pkg $name (${secs}s)"
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "${secs}s" "$pkg"; then
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
echo "fuzz-smoke: $count targets, ${secs}s each: ok"
