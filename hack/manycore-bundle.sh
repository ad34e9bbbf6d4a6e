#!/usr/bin/env bash
# manycore-bundle.sh: prepare what travels to the many-core machine for the
# lab benchmarks this 2-core machine cannot run (N = 32 and 64 at 1 ms):
#
#   hack/manycore-bundle.sh [DIR]      (default .manycore, git-ignored)
#
# That machine has no Go, no git and none of the lab's tools (no ip, bridge,
# iptables, nft, OVS: ../shared/notes/many-core-machine.md), and everything
# that travels must fit in 64 MiB. So the bundle holds:
#   bin/     the agent, coordinator and coordctl, static, and the lab's
#            test binary (lab.test), static: labtest.Binaries takes them
#            from COT_LAB_BIN instead of building;
#   real/    this machine's Debian tools, as they are;
#   lib/     every library they link and the loader that runs them;
# every file of bin/, real/ and lib/ xz-compressed (.xz: 99 MiB would not
# travel, 45 do) but xz itself and what it links, with which the run
# unpacks the rest;
#   tools/   one wrapper per command name the lab and the agents run,
#            which starts the real tool through the carried loader
#            (iptables and its siblings are one multi-call binary that
#            dispatches on its name: the wrapper passes the name);
#   xtables/ iptables' extensions (XTABLES_LIBDIR);
#   share/   OVS's database schema;
#   COMMIT   the tree's commit (COT_BENCH_COMMIT, which the results record:
#            the binaries were built from it, whatever git says there).
# hack/manycore-run.sh runs the benchmarks from it on that machine; its
# results name the machine (16 cores) and the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.manycore}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
rm -rf "$out"
mkdir -p "$out"/{bin,real,lib,tools,xtables,share}

export CGO_ENABLED=0
flags=(-trimpath -ldflags '-s -w')
go build "${flags[@]}" -o "$out/bin/" ./agent/cmd/agent ./coordinator/cmd/coordinator ./coordinator/cmd/coordctl
go test -c "${flags[@]}" -o "$out/bin/lab.test" ./harness/lab

# Every command name the lab, its agents and OVS run (harness/lab,
# harness/ovsproc, agent/, pkg/): a name missing here fails the run there
# with "executable file not found", which TestManycoreBundle here shows first.
tools=(xz ip bridge ping tc ss ethtool conntrack nft flock nsenter
	iptables iptables-save iptables-restore iptables-nft iptables-nft-save iptables-nft-restore
	iptables-legacy iptables-legacy-save iptables-legacy-restore
	ip6tables ip6tables-save ip6tables-restore
	ovsdb-tool ovsdb-server ovs-vswitchd ovs-vsctl ovs-ofctl ovs-appctl ovsdb-client)
# The loader every tool is started through (ld-linux), as ldd names it.
loader=$(basename "$(ldd "$(readlink -f "$(command -v ip)")" | awk '$1 ~ /^\/.*ld-linux/ {print $1}')")
[[ "$loader" == ld-linux* ]] || { echo "manycore-bundle: no dynamic loader in ldd's output for ip" >&2; exit 1; }
for t in "${tools[@]}"; do
	path=$(command -v "$t") || { echo "manycore-bundle: $t: not installed here (.ci/run installs the lab's tools)" >&2; exit 1; }
	real=$(readlink -f "$path")
	name=$(basename "$real")
	[[ -e "$out/real/$name" ]] || cp "$real" "$out/real/$name"
	while read -r lib; do
		[[ -n "$lib" ]] || continue
		[[ -e "$out/lib/$(basename "$lib")" ]] || cp -L "$lib" "$out/lib/"
	done < <(ldd "$real" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}')
	# $0 is the wrapper's absolute path when PATH holds tools/ absolutely
	# (hack/manycore-run.sh): the bundle is two levels up, with no
	# command run to find it.
	cat > "$out/tools/$t" <<EOF
#!/bin/sh
b=\${0%/tools/*}
XTABLES_LIBDIR=\$b/xtables exec "\$b/lib/$loader" --library-path "\$b/lib" --argv0 "$t" "\$b/real/$name" "\$@"
EOF
	chmod +x "$out/tools/$t"
done
cp -r /usr/lib/x86_64-linux-gnu/xtables/. "$out/xtables/"
# Compressed to travel; the run unpacks them with the bundle's xz, which
# must run before: it and its libraries stay as they are.
keep=("real/xz" "lib/$loader")
while read -r lib; do keep+=("lib/$(basename "$lib")"); done < <(ldd "$(readlink -f "$(command -v xz)")" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
for f in "$out"/bin/* "$out"/real/* "$out"/lib/*; do
	rel=${f#"$out"/}
	[[ " ${keep[*]} " == *" $rel "* ]] && continue
	xz -9 -T0 "$f"
done
cp /usr/share/openvswitch/vswitch.ovsschema "$out/share/"
git rev-parse HEAD > "$out/COMMIT"
if [[ -n "$(git status --porcelain --untracked-files=no -- . ':(exclude)results' ':(exclude)*.md')" ]]; then
	sed -i 's/$/-dirty/' "$out/COMMIT"
fi
size=$(du -sm "$out" | cut -f1)
echo "manycore-bundle: $out, ${size} MiB, commit $(cat "$out/COMMIT")"
if ((size > 56)); then
	echo "manycore-bundle: ${size} MiB leaves too little of the 64 MiB that travels for the tree itself" >&2
	exit 1
fi
