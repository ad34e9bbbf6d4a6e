package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildAgent builds the real binary once per test run.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agent")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildAgent(t)

	t.Run("bad flags", func(t *testing.T) {
		cases := []struct {
			args []string
			want []string
		}{
			{[]string{"--backend", "geneve", "--insecure"}, []string{`--backend "geneve"`, "want ovs or kernel-vxlan"}},
			{[]string{"--listen", "nowhere", "--insecure"}, []string{`--listen "nowhere"`, "not host:port"}},
			{[]string{"--state-dir", "rel"}, []string{`--state-dir "rel"`, `--tls-ca ""`, "required"}},
			{[]string{"--no-such-flag"}, []string{"unknown flag: --no-such-flag"}},
			{[]string{"--deadman", "soon"}, []string{"--deadman", "soon"}},
			{[]string{"--insecure", "extra-arg"}, []string{`unexpected argument "extra-arg"`}},
		}
		for _, c := range cases {
			cmd := exec.Command(bin, c.args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Errorf("%q: exit %v, want 2; stderr:\n%s", c.args, err, stderr.String())
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("%q: stderr does not name %q:\n%s", c.args, w, stderr.String())
				}
			}
		}
	})

	t.Run("serves healthz without OVS", func(t *testing.T) {
		httpAddr := freeAddr(t)
		cmd := exec.Command(bin, "--insecure", "--backend", "ovs", "--node-name", "node-1",
			"--listen", freeAddr(t), "--metrics-listen", httpAddr, "--state-dir", t.TempDir(),
			"--ovsdb", "unix:"+filepath.Join(t.TempDir(), "absent.sock"), "--backend-retry", "100ms")
		var stderr syncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill() // by PID; a no-op once it has exited
		})
		get := func(path string) (int, string) {
			resp, err := http.Get("http://" + httpAddr + path)
			if err != nil {
				return 0, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		var code int
		var body string
		// As root the OVS backend is built and reports the absent ovsdb
		// socket; without root it cannot even open iptables and says so.
		want := "backend"
		if os.Geteuid() == 0 {
			want = "absent.sock"
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if code, _ = get("/healthz"); code == http.StatusOK {
				if code, body = get("/readyz"); strings.Contains(body, want) {
					break
				}
			}
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
			t.Fatalf("/readyz = %d %q, want 503 naming %q; stderr:\n%s", code, body, want, stderr.String())
		}
		if !strings.Contains(stderr.String(), "INSECURE") {
			t.Errorf("no loud --insecure warning in the log:\n%s", stderr.String())
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("agent did not stop on SIGTERM; stderr:\n%s", stderr.String())
		}
	})
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
