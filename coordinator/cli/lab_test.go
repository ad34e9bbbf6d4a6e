package cli

import (
	"strings"
	"testing"
)

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
		{args: []string{"--coordinator", "1.2.3.4:1"}, fail: "--coordinator: coordctl lab sets"},
		{args: []string{"--tls-dir=/x"}, fail: "--tls-dir: coordctl lab sets"},
		{args: []string{"--insecure"}, fail: "--insecure: coordctl lab sets"},
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
		{[]string{"lab", "status", "--dir", dir}, ExitUsage, "coordctl lab up creates one"},
		{[]string{"lab", "cutover", "--dir", dir, "--port", "4889"}, ExitUsage, "coordctl lab up creates one"},
		{[]string{"lab", "status", "--name", "Bad-Name"}, ExitUsage, `Name "Bad-Name"`},
		{[]string{"lab", "ctl", "--dir", dir}, ExitUsage, "no coordctl command given"},
		{[]string{"lab", "exec", "--dir", dir, "n1", "ip", "link"}, ExitUsage, "want NODE -- COMMAND"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d %q, want %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}
