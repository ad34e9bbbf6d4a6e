#!/usr/bin/env bash
# bench-coordinator-ab.sh BASE: BenchmarkCoordinatorScaleSim (agents in
# process, bounded clock sampling) for the tree at BASE and the working
# tree, interleaved (base, this, base, this, ...) so that both see the same
# machine: these 2-core machines are shared and one run's figures move by
# more than a change's effect between runs. Sizes 1,000 (AB_REPS_1000 runs
# each, default 5) and 10,000 (AB_REPS_10000, default 2). Writes
# results/coordinator_ab.json (results/coordinator_ab_$AB_NAME.json when
# AB_NAME is set: a comparison the docs keep beside the others): every
# run's phases, and the medians' ratios.
set -euo pipefail
base=${1:?usage: bench-coordinator-ab.sh BASE (a commit)}
out=results/coordinator_ab${AB_NAME:+_$AB_NAME}.json
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
wt="$tmp/base"
cleanup() {
	git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
git -C "$root" worktree add --detach "$wt" "$base" >/dev/null
(cd "$wt" && go test -c -o "$tmp/base.test" ./coordinator/)
(cd "$root" && go test -c -o "$tmp/this.test" ./coordinator/)
ulimit -n 20000
run() { # tree size out
	local dir=$root/coordinator
	[ "$1" = base ] && dir=$wt/coordinator
	mkdir -p "$3"
	(cd "$dir" && COT_SCALE_SIM_SIZES=$2 COT_SCALE_SIM_WARM_ONLY=1 CUTOVER_RESULTS=$3 "$tmp/$1.test" -test.run '^$' \
		-test.bench "BenchmarkCoordinatorScaleSim/agents=$2/host=in-process/sampling=bounded" -test.benchtime 1x >/dev/null)
}
k=0
for size in 1000 10000; do
	reps=${AB_REPS_1000:-5}
	[ "$size" = 10000 ] && reps=${AB_REPS_10000:-2}
	for _ in $(seq "$reps"); do
		for tree in base this; do
			k=$((k + 1))
			run "$tree" "$size" "$tmp/runs/$k-$tree"
		done
	done
done
python3 - "$tmp/runs" "$base" "$(git -C "$root" rev-parse --short HEAD)" "$root/$out" <<'PY'
import json, os, statistics, sys
runs, base, head, out = sys.argv[1:]
rows = []
for d in sorted(os.listdir(runs), key=lambda s: int(s.split("-")[0])):
    tree = d.split("-", 1)[1]
    for r in json.load(open(os.path.join(runs, d, "coordinator_scale_sim.json")))["results"]:
        if r.get("connections", "warm") != "warm" or r.get("tls"):
            continue  # a base older than COT_SCALE_SIM_WARM_ONLY runs the cold rows too
        r["tree"] = tree
        rows.append(r)
keys = ["preflight_ms", "prepare_ms", "commit_ms", "verify_ms", "preflight_prepare_commit_verify_ms"]
summary = []
for n in sorted({r["agents"] for r in rows}):
    med = {t: {k: statistics.median(r[k] for r in rows if r["agents"] == n and r["tree"] == t) for k in keys} for t in ("base", "this")}
    summary.append({"agents": n, "runs_each": sum(1 for r in rows if r["agents"] == n and r["tree"] == "base"),
                    "median_base": med["base"], "median_this": med["this"],
                    "ratio_this_to_base": {k: round(med["this"][k] / med["base"][k], 3) for k in keys}})
    print(f"N={n}: " + ", ".join(f"{k[:-3]} {med['base'][k]:.0f} -> {med['this'][k]:.0f} ms" for k in keys))
load = " ".join(open("/proc/loadavg").read().split()[:3])
json.dump({"benchmark": "BenchmarkCoordinatorScaleSim, base against this tree, interleaved",
           "base": base, "this": head + " (working tree)", "setup": "agents in process, bounded clock sampling; load average at the end " + load,
           "summary": summary, "runs": rows}, open(out, "w"), indent=2)
print("written to", out)
PY
# The provenance every results file starts with (harness/benchresult): this
# script assembles its file itself, so it stamps it afterwards.
(cd "$root" && CUTOVER_BENCH_TOOL="${CUTOVER_BENCH_TOOL:-hack/bench-coordinator-ab.sh}" go run ./hack/provenance stamp "$out")
