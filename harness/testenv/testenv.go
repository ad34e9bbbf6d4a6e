// Package testenv gates the privileged test tier, and runs the bite tests
// whose switches only a build with FaultInjectTag compiles
// (RunFaultInjected).
//
// A privileged test calls RequireRoot (and RequireBinaries for what it
// execs). Outside CI a missing prerequisite skips the test with a reason; in CI
// (CI=true) it fails the test instead, because CI installs everything the
// privileged tier needs and a skip there would hide a test that never ran.
package testenv

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"

	"github.com/cutover-dev/cutover/pkg/netns"
)

// InCI reports whether the tests run under CI, where nothing may be skipped.
func InCI() bool { return os.Getenv("CI") == "true" }

// RequireRoot skips (or, in CI, fails) a test that needs root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	missing(t, "needs root (network namespaces, iptables, OVS); run `sudo make test` or in CI")
}

// RequireBinaries skips (or, in CI, fails) a test when a program it execs is
// not installed.
func RequireBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing(t, n+" is not installed; .ci/run installs it (apt-get install openvswitch-switch iptables iproute2 conntrack)")
		}
	}
}

// RequirePrivileged is RequireRoot plus RequireBinaries.
func RequirePrivileged(t testing.TB, names ...string) {
	t.Helper()
	RequireRoot(t)
	RequireBinaries(t, names...)
}

// Netns creates a fresh named network namespace, prefix plus a random
// suffix, and deletes it when the test ends. It skips (or, in CI, fails) the
// test without root or ip.
func Netns(t testing.TB, prefix string) string {
	t.Helper()
	RequirePrivileged(t, "ip")
	name := fmt.Sprintf("%s-%08x", prefix, rand.Uint32())
	if err := netns.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Delete(name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return name
}

func missing(t testing.TB, why string) {
	t.Helper()
	if InCI() {
		t.Fatalf("privileged prerequisite missing in CI: %s", why)
	}
	t.Skip("skipped: " + why)
}
