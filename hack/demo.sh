#!/usr/bin/env bash
# make demo: a real cutover on an 8-node lab on this machine, measured.
#
# Needs root (network namespaces, Open vSwitch, iptables). Installs what is
# missing with apt-get, builds, brings up the lab "demo" (8 OVS nodes in
# namespaces, real agents and coordinator, mTLS, probes every 10 ms between
# every pair), runs `coordctl cutover --port 4889` against it (through
# cutover-lab, the lab's own binary: coordctl ships without the lab), reads
# every node's port back with ovs-vsctl itself, and tears the lab down, also
# when a step fails. Exit status is non-zero when anything failed.
#
# Knobs: DEMO_NODES (8), DEMO_PORT (4889), DEMO_NAME (demo).
set -euo pipefail

NODES=${DEMO_NODES:-8}
PORT=${DEMO_PORT:-4889}
NAME=${DEMO_NAME:-demo}
cd "$(dirname "$0")/.."
LAB=bin/cutover-lab

step() { printf '\n== %s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, Open vSwitch, iptables): sudo make demo"

step "checking tools"
missing=()
for b in ip bridge iptables iptables-save iptables-restore ovsdb-server ovs-vswitchd ovs-vsctl ovs-ofctl ovs-appctl ovsdb-tool; do
	command -v "$b" >/dev/null || missing+=("$b")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "missing: ${missing[*]}; installing openvswitch-switch iptables iproute2"
	command -v apt-get >/dev/null || die "no apt-get: install Open vSwitch (ovsdb-server, ovs-vswitchd, ovs-vsctl), iptables and iproute2 yourself"
	ovs_was_running=no
	if command -v systemctl >/dev/null && systemctl is-active --quiet openvswitch-switch 2>/dev/null; then ovs_was_running=yes; fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openvswitch-switch iptables iproute2 >/dev/null
	# apt starts the system Open vSwitch; the lab runs one private OVS per
	# node and needs none of it. Stop it only if this script started it.
	if [ "$ovs_was_running" = no ]; then
		if command -v systemctl >/dev/null && systemctl is-active --quiet openvswitch-switch 2>/dev/null; then
			systemctl stop openvswitch-switch || true
		elif [ -x /usr/share/openvswitch/scripts/ovs-ctl ] && /usr/share/openvswitch/scripts/ovs-ctl status >/dev/null 2>&1; then
			/usr/share/openvswitch/scripts/ovs-ctl stop || true
		fi
	fi
fi
ovs-vsctl --version | head -1
iptables --version
# Figures below depend on how busy the machine is: say so up front.
echo "$(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

step "building"
make --no-print-directory lab

cleanup() {
	rc=$?
	step "tearing down"
	"$LAB" down --name "$NAME" || rc=1
	if [ $rc -eq 0 ]; then echo "demo: OK"; else echo "demo: FAILED (exit $rc)" >&2; fi
	exit $rc
}
# A previous run killed hard leaves its lab behind: take it down first.
"$LAB" down --name "$NAME" >/dev/null
trap cleanup EXIT
trap 'exit 130' INT TERM

step "bringing up $NODES nodes (lab $NAME)"
# The coordinator runs the product's --default-strategy (auto): on this OVS
# lab it picks staged and says why (docs/staged.md, Strategy auto).
"$LAB" up --name "$NAME" --nodes "$NODES" --probe-interval 10ms --default-strategy auto | grep -v ' pid '

# Let the probe mesh settle (first packets resolve ARP through the tunnel).
sleep 2

step "coordctl cutover --port $PORT"
echo "(the same command a user types: cutover-lab cutover --name $NAME --port $PORT)"
"$LAB" cutover --name "$NAME" --port "$PORT"

step "reading every node's port back from its own OVS (ovs-vsctl, not the agent)"
bad=0
for i in $(seq 1 "$NODES"); do
	got=$("$LAB" exec --name "$NAME" "n$i" -- ovs-vsctl get interface vxlan0 options:dst_port | tr -d '"')
	rule=$("$LAB" exec --name "$NAME" "n$i" -- iptables-save -t filter | grep -c -- "--dport $PORT -j ACCEPT" || true)
	printf 'n%-3s vxlan0 dst_port=%s  OS_FIREWALL_ALLOW opens %s: %s\n' "$i" "$got" "$PORT" "$([ "$rule" -ge 1 ] && echo yes || echo NO)"
	if [ "$got" != "$PORT" ] || [ "$rule" -lt 1 ]; then bad=1; fi
done
[ $bad -eq 0 ] || die "a node is not on port $PORT"
echo "all $NODES nodes on $PORT"
