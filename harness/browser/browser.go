// Package browser runs a real headless Chromium for tests of the pages
// coordctl writes (the change record): a screenshot of a page and the DOM
// after its scripts ran. It is test harness: nothing shipped imports it.
//
// Each run gets a fresh --user-data-dir, runs with --no-sandbox (tests run
// as root, where Chromium's sandbox refuses to start), in its own process
// group, and is killed (the group, by its id) when it overruns its
// timeout, so no renderer outlives the test.
package browser

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cutover-dev/cutover/harness/testenv"
)

// Binary is the Chromium Debian installs (package chromium).
const Binary = "chromium"

// Timeout bounds one Chromium run.
const Timeout = 90 * time.Second

// Require skips the test (fails it under CI=true) when Chromium is not
// installed, and returns its path.
func Require(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath(Binary)
	if err == nil {
		return p
	}
	why := Binary + " is not installed; .ci/run installs it (apt-get install chromium)"
	if testenv.InCI() {
		t.Fatalf("browser test prerequisite missing in CI: %s", why)
	}
	t.Skip("skipped: " + why)
	return ""
}

// run runs chromium headless on url with extra flags and returns stdout.
func run(t testing.TB, bin, url string, extra ...string) []byte {
	t.Helper()
	profile := t.TempDir()
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + profile,
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--metrics-recording-only", "--hide-scrollbars",
	}, extra...)
	args = append(args, url)
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	select {
	case err := <-done:
		// The browser is gone; anything of its group that lingers goes too.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%s %v: %v", bin, args, err)
		}
		if err != nil {
			t.Fatalf("%s %v: %v\nstderr:\n%s", bin, args, err, tail(errb.Bytes(), 4000))
		}
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		if werr := <-done; werr != nil {
			t.Logf("%s killed: %v", bin, werr)
		}
		t.Fatalf("%s did not finish within %s; killed (process group %d)\nstderr:\n%s", bin, Timeout, pgid, tail(errb.Bytes(), 4000))
	}
	return out.Bytes()
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// FileURL is the file:// URL of path.
func FileURL(t testing.TB, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return "file://" + abs
}

// DumpDOM loads url and returns the DOM serialized after the page's
// scripts ran (what the browser shows, not the file's text).
func DumpDOM(t testing.TB, bin, url string) string {
	t.Helper()
	return string(run(t, bin, url, "--dump-dom", "--virtual-time-budget=5000"))
}

// Screenshot renders url in a width x height window to a PNG file in a
// temp dir and returns its path. It fails the test unless the file is a
// PNG of exactly that size.
func Screenshot(t testing.TB, bin, url string, width, height int) string {
	t.Helper()
	png := filepath.Join(t.TempDir(), "page.png")
	run(t, bin, url, "--screenshot="+png, fmt.Sprintf("--window-size=%d,%d", width, height), "--virtual-time-budget=5000")
	w, h, err := PNGSize(png)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if w != width || h != height {
		t.Fatalf("screenshot %s is %dx%d, want %dx%d", png, w, h, width, height)
	}
	return png
}

// PNGSize reads the width and height from a PNG file's IHDR chunk.
func PNGSize(path string) (width, height int, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	sig := []byte("\x89PNG\r\n\x1a\n")
	if len(b) < 24 || !bytes.Equal(b[:8], sig) || string(b[12:16]) != "IHDR" {
		return 0, 0, fmt.Errorf("%s: not a PNG (%d bytes)", path, len(b))
	}
	return int(binary.BigEndian.Uint32(b[16:20])), int(binary.BigEndian.Uint32(b[20:24])), nil
}
