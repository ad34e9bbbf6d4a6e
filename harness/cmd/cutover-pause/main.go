// cutover-pause is the sandbox ("pause") container of the cutover-pause
// image (harness/image.Pause): it holds a pod's namespaces open and exits 0
// on SIGTERM or SIGINT, as registry.k8s.io/pause does. As PID 1 of a pod
// that shares its PID namespace it also reaps orphaned children. It exists
// for nodes that cannot pull registry.k8s.io/pause (air-gapped nodes, the
// test cluster): containerd's sandbox image points at it. Static, no
// dependencies beyond the standard library.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
