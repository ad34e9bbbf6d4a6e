package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The pause binary runs until SIGTERM or SIGINT and then exits 0; a
// SIGCHLD does not end it.
func TestPauseExitsZeroOnTermAndInt(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "pause")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(bin)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		time.Sleep(200 * time.Millisecond) // let it install its handlers
		_ = cmd.Process.Signal(syscall.SIGCHLD)
		select {
		case err := <-done:
			t.Fatalf("exited on SIGCHLD: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		_ = cmd.Process.Signal(sig)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%v: exit %v, want 0", sig, err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("%v: still running after 10s", sig)
		}
	}
	_ = os.Remove(bin)
}
