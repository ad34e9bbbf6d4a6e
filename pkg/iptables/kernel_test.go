package iptables_test

// Privileged tests: each runs in fresh network namespaces against the real
// iptables binaries. Commands run from a thread locked into the namespace
// (netns.Do), as CNI plugins do; every test also checks that the host's
// rules never show what it wrote.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/testenv"
	"github.com/cutover-dev/cutover/pkg/iptables"
	"github.com/cutover-dev/cutover/pkg/netns"
)

func randHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func newNS(t testing.TB) string {
	t.Helper()
	return testenv.Netns(t, "cot-ipt")
}

// in runs fn inside ns and fails the test on error.
func in(t testing.TB, ns string, fn func() error) {
	t.Helper()
	if err := netns.Do(ns, fn); err != nil {
		t.Fatal(err)
	}
}

func save(t *testing.T, ns, backend string) string {
	t.Helper()
	out, err := netns.Command(ns, "iptables-"+backend+"-save").Output()
	if err != nil {
		t.Fatalf("iptables-%s-save in %s: %v", backend, ns, err)
	}
	return string(out)
}

// hostMustNotShow fails if the host's rules (either backend) mention s.
func hostMustNotShow(t *testing.T, s string) {
	t.Helper()
	for _, b := range []string{"nft", "legacy"} {
		out, err := exec.Command("iptables-" + b + "-save").Output()
		if err != nil {
			t.Fatalf("host iptables-%s-save: %v", b, err)
		}
		if strings.Contains(string(out), s) {
			t.Fatalf("host iptables-%s-save shows %q: the command escaped the namespace", b, s)
		}
	}
}

// requireBackend skips only when the kernel cannot run the backend at all
// (iptables-legacy on a kernel built without CONFIG_IP_NF_IPTABLES_LEGACY /
// ip_tables): that holds in CI too, so the skip is honest there. Any other
// failure fails the test.
func requireBackend(t testing.TB, backend string) {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "iptables-"+backend, "iptables-"+backend+"-save")
	ns := newNS(t)
	out, err := netns.Command(ns, "iptables-"+backend, "-t", "filter", "-S").CombinedOutput()
	if err == nil {
		return
	}
	if strings.Contains(string(out), "Table does not exist") || strings.Contains(string(out), "Protocol not supported") {
		uname, _ := exec.Command("uname", "-r").Output()
		t.Skipf("kernel %s has no %s iptables support: %q (needs CONFIG_IP_NF_IPTABLES_LEGACY / ip_tables module)",
			strings.TrimSpace(string(uname)), backend, strings.TrimSpace(string(out)))
	}
	t.Fatalf("iptables-%s -S in a fresh netns: %v: %s", backend, err, out)
}

func TestKernelEnsureDeleteIdempotent(t *testing.T) {
	for _, backend := range []string{iptables.BackendNFT, iptables.BackendLegacy} {
		t.Run(backend, func(t *testing.T) {
			requireBackend(t, backend)
			ns := newNS(t)
			chain := "COT-" + strings.ToUpper(randHex(t, 6))
			allow := iptables.Rule{Table: "filter", Chain: chain, Proto: "udp", DPort: 4889, StateNew: true, Target: "ACCEPT", Comment: "cutover 4889"}
			notrack := iptables.Rule{Table: "raw", Chain: chain, Proto: "udp", DPort: 4889, Target: "NOTRACK"}
			fake := iptables.NewFake(backend)
			var c *iptables.Client
			in(t, ns, func() (err error) {
				c, err = iptables.New(context.Background(), iptables.Config{Backend: backend})
				return err
			})
			if c.Backend() != backend {
				t.Fatalf("Backend() = %s, want %s", c.Backend(), backend)
			}

			// A missing chain is IsNotFound, and the error names the argv.
			in(t, ns, func() error {
				_, err := c.ListRules("filter", chain)
				if !iptables.IsNotFound(err) || !strings.Contains(err.Error(), "iptables-"+backend) {
					return fmt.Errorf("ListRules of a missing chain: %w; want IsNotFound naming the binary", err)
				}
				err = c.EnsureRule(allow)
				if !iptables.IsNotFound(err) || !strings.Contains(err.Error(), "--dport 4889") {
					return fmt.Errorf("EnsureRule into a missing chain: %w; want IsNotFound naming the rule", err)
				}
				return nil
			})

			for _, ipt := range []iptables.Interface{c, fake} {
				in(t, ns, func() error {
					for range 3 {
						for _, step := range []func() error{
							func() error { return ipt.EnsureChain("filter", chain) },
							func() error { return ipt.EnsureChain("raw", chain) },
							func() error { return ipt.EnsureRule(allow) },
							func() error { return ipt.EnsureRule(notrack) },
							func() error { return ipt.EnsureJump("filter", "INPUT", chain) },
						} {
							if err := step(); err != nil {
								return err
							}
						}
					}
					return nil
				})
			}
			real := save(t, ns, backend)
			if n := strings.Count(real, allow.String()+"\n"); n != 1 {
				t.Fatalf("after EnsureRule x3, iptables-%s-save shows %q %d times:\n%s", backend, allow.String(), n, real)
			}
			if got, want := iptables.CanonicalSave(real), fake.Dump(); got != want {
				t.Fatalf("real (canonical):\n%s\nfake:\n%s", got, want)
			}
			hostMustNotShow(t, chain)

			in(t, ns, func() error {
				rules, err := c.ListRules("filter", chain)
				if err != nil {
					return err
				}
				if len(rules) != 1 || rules[0] != allow.String() {
					return fmt.Errorf("ListRules = %q, want [%q]", rules, allow.String())
				}
				if ok, err := c.HasRule(notrack); !ok || err != nil {
					return fmt.Errorf("HasRule(notrack) = %v, %w", ok, err)
				}
				for _, ipt := range []iptables.Interface{c, fake} {
					for range 2 {
						if err := ipt.DeleteRule(allow); err != nil {
							return err
						}
					}
				}
				if ok, err := c.HasRule(allow); ok || err != nil {
					return fmt.Errorf("HasRule after delete = %v, %w", ok, err)
				}
				return nil
			})
			real = save(t, ns, backend)
			if strings.Contains(real, "--dport 4889 -m comment") {
				t.Fatalf("rule still present after DeleteRule x2:\n%s", real)
			}
			if got, want := iptables.CanonicalSave(real), fake.Dump(); got != want {
				t.Fatalf("after delete, real (canonical):\n%s\nfake:\n%s", got, want)
			}
			// The other backend never saw any of it.
			other := map[string]string{"nft": "legacy", "legacy": "nft"}[backend]
			if s := save(t, ns, other); strings.Contains(s, chain) {
				t.Fatalf("iptables-%s-save shows the %s backend's chain:\n%s", other, backend, s)
			}
		})
	}
}

func TestKernelDetect(t *testing.T) {
	requireBackend(t, "legacy")
	requireBackend(t, "nft")
	out, err := exec.Command("iptables", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	systemDefault := iptables.BackendLegacy
	if strings.Contains(string(out), "(nf_tables)") {
		systemDefault = iptables.BackendNFT
	}
	for _, tc := range []struct {
		name   string
		seed   string // backend to write 2 rules with first, "" = none
		want   string
		reason string
	}{
		{"legacy has rules", "legacy", iptables.BackendLegacy, "legacy holds more"},
		{"nft has rules", "nft", iptables.BackendNFT, "nft holds more"},
		{"no rules", "", systemDefault, "system default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNS(t)
			if tc.seed != "" {
				for _, p := range []string{"1", "2"} {
					if out, err := netns.Command(ns, "iptables-"+tc.seed, "-A", "INPUT", "-p", "udp", "--dport", p, "-j", "ACCEPT").CombinedOutput(); err != nil {
						t.Fatalf("seed: %v: %s", err, out)
					}
				}
			}
			var c *iptables.Client
			in(t, ns, func() (err error) {
				c, err = iptables.New(context.Background(), iptables.Config{})
				return err
			})
			d := c.Detection()
			if c.Backend() != tc.want || !strings.Contains(d.Reason, tc.reason) {
				t.Fatalf("detected %+v, want %s (%s)", d, tc.want, tc.reason)
			}
			// What the detected client writes lands in that backend only.
			r := iptables.Rule{Table: "filter", Chain: "INPUT", Proto: "udp", DPort: 4889, Target: "ACCEPT"}
			in(t, ns, func() error { return c.EnsureRule(r) })
			if s := save(t, ns, tc.want); !strings.Contains(s, r.String()) {
				t.Fatalf("rule not in iptables-%s-save:\n%s", tc.want, s)
			}
		})
	}
}

// TestKernelTraffic proves the rule does what it is for: with INPUT policy
// DROP, UDP to the allowed port gets through a veth pair between two
// namespaces, UDP to another port does not, and after DeleteRule neither does.
func TestKernelTraffic(t *testing.T) {
	for _, backend := range []string{iptables.BackendNFT, iptables.BackendLegacy} {
		t.Run(backend, func(t *testing.T) {
			requireBackend(t, backend)
			a, b := newNS(t), newNS(t)
			// Fixed MACs and permanent neighbours: the test is about the
			// firewall, so it must not also depend on ARP on a loaded machine.
			const macA, macB = "02:00:c6:12:07:01", "02:00:c6:12:07:02"
			for _, argv := range [][]string{
				{a, "ip", "link", "add", "veth0", "address", macA, "type", "veth", "peer", "name", "veth1", "address", macB, "netns", b},
				{a, "ip", "addr", "add", "198.18.7.1/24", "dev", "veth0"},
				{a, "ip", "link", "set", "veth0", "up"},
				{a, "ip", "neigh", "replace", "198.18.7.2", "lladdr", macB, "dev", "veth0", "nud", "permanent"},
				{b, "ip", "addr", "add", "198.18.7.2/24", "dev", "veth1"},
				{b, "ip", "link", "set", "veth1", "up"},
				{b, "ip", "neigh", "replace", "198.18.7.1", "lladdr", macA, "dev", "veth1", "nud", "permanent"},
				{b, "iptables-" + backend, "-P", "INPUT", "DROP"},
			} {
				if out, err := netns.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v: %s", argv, err, out)
				}
			}
			// Until linkwatch has activated a device, its packets go to the
			// noop qdisc: wait for operstate UP on both ends.
			waitUp(t, a, "veth0")
			waitUp(t, b, "veth1")
			rule := iptables.Rule{Table: "filter", Chain: iptables.DefaultChain, Proto: "udp", DPort: 4889, StateNew: true, Target: "ACCEPT"}
			var c *iptables.Client
			var open, closed *net.UDPConn
			in(t, b, func() (err error) {
				if c, err = iptables.New(context.Background(), iptables.Config{Backend: backend}); err != nil {
					return err
				}
				if err = c.EnsureChain("filter", iptables.DefaultChain); err != nil {
					return err
				}
				if err = c.EnsureJump("filter", "INPUT", iptables.DefaultChain); err != nil {
					return err
				}
				if err = c.EnsureRule(rule); err != nil {
					return err
				}
				if open, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("198.18.7.2"), Port: 4889}); err != nil {
					return err
				}
				closed, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("198.18.7.2"), Port: 4890})
				return err
			})
			defer open.Close()
			defer closed.Close()
			var s1, s2 *net.UDPConn
			in(t, a, func() (err error) {
				if s1, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP("198.18.7.2"), Port: 4889}); err != nil {
					return err
				}
				s2, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP("198.18.7.2"), Port: 4890})
				return err
			})
			defer s1.Close()
			defer s2.Close()

			if !delivered(t, s1, open, 5*time.Second) {
				t.Fatalf("UDP to 4889 was not delivered with the ACCEPT rule in place\n%s", diag(a, b, backend))
			}
			if delivered(t, s2, closed, 300*time.Millisecond) {
				t.Fatal("UDP to 4890 was delivered although INPUT policy is DROP")
			}
			in(t, b, func() error { return c.DeleteRule(rule) })
			// UDP without a reply stays conntrack NEW, so the next datagram
			// meets the policy again.
			if delivered(t, s1, open, 300*time.Millisecond) {
				t.Fatal("UDP to 4889 still delivered after DeleteRule")
			}
		})
	}
}

func waitUp(t *testing.T, ns, dev string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := netns.Command(ns, "cat", "/sys/class/net/"+dev+"/operstate").Output()
		if err == nil && strings.TrimSpace(string(out)) == "up" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s not up after 5s: %q, %v", dev, ns, out, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// diag describes both namespaces for a failure message.
func diag(a, b, backend string) string {
	var s strings.Builder
	for _, argv := range [][]string{
		{a, "ip", "-s", "link"}, {a, "ip", "neigh"}, {a, "ip", "addr"}, {b, "ip", "-s", "link"}, {b, "ip", "neigh"},
		{b, "iptables-" + backend + "-save", "-c"}, {b, "ss", "-uan"},
	} {
		out, err := netns.Command(argv[0], argv[1:]...).CombinedOutput()
		fmt.Fprintf(&s, "$ %s (in %s): %v\n%s\n", strings.Join(argv[1:], " "), argv[0], err, out)
	}
	return s.String()
}

// delivered sends datagrams on s until r receives one or wait passes.
func delivered(t *testing.T, s, r *net.UDPConn, wait time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(wait)
	buf := make([]byte, 64)
	for time.Now().Before(deadline) {
		if _, err := s.Write([]byte("probe")); err != nil {
			t.Fatal(err)
		}
		_ = r.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, _, err := r.ReadFromUDP(buf); err == nil && string(buf[:n]) == "probe" {
			return true
		}
	}
	return false
}
