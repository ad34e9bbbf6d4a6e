package labcli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/coordinator/cli"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestSplitLabArgs(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		name, dir  string
		rest, fail string
	}{
		{args: []string{"--port", "4889"}, name: "lab", rest: "--port 4889"},
		{args: []string{"--name", "demo", "--port", "4889"}, name: "demo", rest: "--port 4889"},
		{args: []string{"--port", "4889", "--name=demo", "-o", "json"}, name: "demo", rest: "--port 4889 -o json"},
		{args: []string{"--dir", "/tmp/x", "status"}, name: "lab", dir: "/tmp/x", rest: "status"},
		{args: []string{"--", "--name", "x"}, name: "lab", rest: "-- --name x"},
		{args: []string{"--name"}, fail: "--name: needs a value"},
		{args: []string{"--coordinator", "1.2.3.4:1"}, fail: "--coordinator: cutover-lab sets"},
		{args: []string{"--tls-dir=/x"}, fail: "--tls-dir: cutover-lab sets"},
		{args: []string{"--insecure"}, fail: "--insecure: cutover-lab sets"},
	} {
		sel, rest, err := splitLabArgs(tc.args)
		if tc.fail != "" {
			if err == nil || !strings.Contains(err.Error(), tc.fail) {
				t.Errorf("%q: error %v, want %q", tc.args, err, tc.fail)
			}
			continue
		}
		if err != nil || sel.name != tc.name || sel.dir != tc.dir || strings.Join(rest, " ") != tc.rest {
			t.Errorf("%q: %+v %q %v, want name %q dir %q rest %q", tc.args, sel, rest, err, tc.name, tc.dir, tc.rest)
		}
	}
}

// A lab that does not exist is a usage error naming the dir and the way
// out; bad names are refused before anything is touched.
func TestLabErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"status", "--dir", dir}, cli.ExitUsage, "cutover-lab up creates one"},
		{[]string{"cutover", "--dir", dir, "--port", "4889"}, cli.ExitUsage, "cutover-lab up creates one"},
		{[]string{"status", "--name", "Bad-Name"}, cli.ExitUsage, `Name "Bad-Name"`},
		{[]string{"ctl", "--dir", dir}, cli.ExitUsage, "no coordctl command given"},
		{[]string{"exec", "--dir", dir, "n1", "ip", "link"}, cli.ExitUsage, "want NODE -- COMMAND"},
		{[]string{"status", "-o", "yaml"}, cli.ExitUsage, `-o/--output "yaml"`},
		{[]string{"nosuch"}, cli.ExitUsage, `cutover-lab: unknown command "nosuch"`},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d %q, want %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}

// The coordctl command is coordctl itself, in process: what the forwarded
// commands run in the hub namespace. Its exit codes and messages are
// coordctl's, printed once.
func TestCoordctlCommand(t *testing.T) {
	code, stdout, stderr := run(t, "coordctl", "version")
	if code != cli.ExitOK || stdout == "" {
		t.Errorf("coordctl version: exit %d %q %q", code, stdout, stderr)
	}
	code, _, stderr = run(t, "coordctl", "agents", "--timeout", "0s")
	if code != cli.ExitUsage || strings.Count(stderr, "--timeout 0s") != 1 || !strings.HasPrefix(stderr, "coordctl: ") {
		t.Errorf("coordctl agents --timeout 0s: exit %d %q, want %d and coordctl's one message", code, stderr, cli.ExitUsage)
	}
}
