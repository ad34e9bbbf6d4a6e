#!/usr/bin/env bash
# manycore-run.sh: the lab benchmarks this 2-core machine cannot run, on the
# many-core machine, from the bundle hack/manycore-bundle.sh made:
#
#   make manycore-bundle      (here: writes .manycore/, git-ignored)
#   device run, command "bash hack/manycore-run.sh", carry [".manycore"]
#
# For each size in COT_MANYCORE_SIZES (32) it runs BenchmarkLabCutoverRounds
# (make bench-lab-n8's benchmark: limit, parallel, atomic and staged in
# alternating rounds, both backends, probes every 1 ms to 2 peers) with
# COT_MANYCORE_ROUNDS rounds (3), and writes results/lab_cutover_n<N>_manycore.json
# and its log to $OUT (results/ without one). The files' provenance names the
# machine (its cores) and the bundle's commit. Copy them into results/ here.
#
# With "footprint" in COT_MANYCORE_BENCH ("lab footprint" by default) it then
# runs BenchmarkAgentFootprint (make bench-agent's: the agent's CPU probing at
# the default rate and at 1 ms in an 8-node lab, beside the wake floor and a
# null syscall's cost) with this tree's agent alone (that machine has no Go
# to build the base), COT_MANYCORE_FOOTPRINT_ROUNDS rounds (2), and writes
# results/agent_footprint_manycore.json: what the probe mesh costs where a
# wake and a syscall cost what that machine charges, not this one.
#
# COT_MANYCORE_STRICT=1 runs the benchmark with PATH holding the bundle's
# tools alone: on a machine that has the tools it shows that the bundle
# lacks none (harness/lab TestManycoreBundle, which also names another
# bundle with COT_MANYCORE_BUNDLE).
set -euo pipefail
cd "$(dirname "$0")/.."
bench="${COT_MANYCORE_BENCH:-lab footprint}"
for w in $bench; do
	case "$w" in
	lab | footprint) ;;
	*)
		echo "manycore-run: COT_MANYCORE_BENCH=\"$bench\": $w: want lab, footprint or both" >&2
		exit 2
		;;
	esac
done
b="${COT_MANYCORE_BUNDLE:-$PWD/.manycore}"
if [[ ! -e "$b/bin/lab.test.xz" && ! -x "$b/bin/lab.test" ]]; then
	echo "manycore-run: no bundle in $b: run make manycore-bundle here and carry .manycore" >&2
	exit 2
fi
# The bundle travels xz-compressed but for xz itself (manycore-bundle.sh).
for f in "$b"/bin/*.xz "$b"/real/*.xz "$b"/lib/*.xz; do
	[[ -e "$f" && ! -e "${f%.xz}" ]] || continue
	"$b/tools/xz" -dc "$f" > "${f%.xz}"
	chmod +x "${f%.xz}"
done
commit=$(<"$b/COMMIT")
out="${OUT:-$PWD/results}"
res="${CUTOVER_RESULTS:-$PWD/results}" # where the benchmark writes (harness/benchresult)
mkdir -p "$out" "$res"
# ovsdb-tool create reads the schema from where Debian puts it
# (harness/ovsproc.Schema); the machine is lent bare and given back.
if [[ ! -e /usr/share/openvswitch/vswitch.ovsschema ]]; then
	mkdir -p /usr/share/openvswitch
	cp "$b/share/vswitch.ovsschema" /usr/share/openvswitch/
fi
ulimit -n 65536 2>/dev/null || true
# The lab's nodes share this kernel's neighbour table: N nodes hold
# N×(N−1) dynamic entries, past the default gc_thresh3 (1024) from 33 nodes
# on, and the lab refuses to come up (harness/lab/neigh.go). The machine is
# lent bare and given back, so raise the limits for the largest size here.
big=0
for n in ${COT_MANYCORE_SIZES:-32}; do ((n > big)) && big=$n; done
need=$((big * (big - 1)))
if (($(</proc/sys/net/ipv4/neigh/default/gc_thresh3) < 4 * need)); then
	echo "$need" > /proc/sys/net/ipv4/neigh/default/gc_thresh1
	echo "$((2 * need))" > /proc/sys/net/ipv4/neigh/default/gc_thresh2
	echo "$((4 * need))" > /proc/sys/net/ipv4/neigh/default/gc_thresh3
fi
echo "neighbour table: gc_thresh1/2/3 $(</proc/sys/net/ipv4/neigh/default/gc_thresh1) $(</proc/sys/net/ipv4/neigh/default/gc_thresh2) $(</proc/sys/net/ipv4/neigh/default/gc_thresh3)"
path="$b/tools:$PATH"
if [[ "${COT_MANYCORE_STRICT:-0}" == 1 ]]; then
	path="$b/tools"
fi
rc=0
# run_bench NAME BENCHMARK LINES VAR=VALUE...: BENCHMARK from the bundle's test
# binary with the bundle's tools and the variables given, its log in
# $out/NAME.txt (the last LINES shown here) and its results file beside it.
run_bench() {
	local name=$1 benchmark=$2 lines=$3
	shift 3
	echo "== $name: $(nproc) cores, commit $commit, $(date -u +%FT%TZ)"
	(
		cd harness/lab
		env PATH="$path" CI=true COT_LAB_BIN="$b/bin" COT_BENCH_COMMIT="$commit" "$@" \
			"$b/bin/lab.test" -test.run '^$' -test.bench "$benchmark" -test.benchtime 1x \
			-test.timeout "${COT_MANYCORE_TIMEOUT:-9m}" -test.v
	) > "$out/$name.txt" 2>&1 || rc=$?
	tail -n "$lines" "$out/$name.txt"
	if [[ -e "$res/$name.json" && "$out" != "$res" ]]; then
		cp "$res/$name.json" "$out/"
	fi
}
if [[ " $bench " == *" lab "* ]]; then
	for n in ${COT_MANYCORE_SIZES:-32}; do
		name="lab_cutover_n${n}_manycore"
		run_bench "$name" BenchmarkLabCutoverRounds 40 \
			CUTOVER_BENCH_TOOL="hack/manycore-run.sh (COT_MANYCORE_SIZES=$n)" \
			COT_LAB_BENCH_NAME="$name" COT_LAB_BENCH_NODES="$n" COT_LAB_BENCH_ROUNDS="${COT_MANYCORE_ROUNDS:-3}"
	done
fi
if [[ " $bench " == *" footprint "* ]]; then
	name=agent_footprint_manycore
	run_bench "$name" BenchmarkAgentFootprint 20 \
		CUTOVER_BENCH_TOOL="hack/manycore-run.sh (COT_MANYCORE_BENCH=footprint)" \
		COT_FOOTPRINT_NAME="$name" COT_FOOTPRINT_BASE=none \
		COT_FOOTPRINT_PROBES="${COT_MANYCORE_FOOTPRINT_PROBES:-probing,probing-1ms}" \
		COT_FOOTPRINT_ROUNDS="${COT_MANYCORE_FOOTPRINT_ROUNDS:-2}"
fi
exit "$rc"
