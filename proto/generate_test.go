// Package proto_test fails when the generated gRPC code beside the .proto
// files is stale: it regenerates into a temporary directory with the pinned
// plugins (make tools) and compares byte for byte.
package proto_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cutover-dev/cutover/harness/testenv"
)

func TestGeneratedCodeIsFresh(t *testing.T) {
	tools, err := filepath.Abs("../bin/tools")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"protoc-gen-go", "protoc-gen-go-grpc"} {
		if _, err := os.Stat(filepath.Join(tools, p)); err != nil {
			if testenv.InCI() {
				t.Fatalf("%s missing in bin/tools: `make tools` must run before the tests", p)
			}
			t.Skipf("%s not built; run `make tools`", p)
		}
	}
	testenv.RequireBinaries(t, "protoc")
	protos, err := filepath.Glob("*/v1/*.proto")
	if err != nil || len(protos) == 0 {
		t.Fatalf("no .proto files found: %v", err)
	}
	out := t.TempDir()
	args := append([]string{"-I", ".", "--go_out=" + out, "--go_opt=paths=source_relative",
		"--go-grpc_out=" + out, "--go-grpc_opt=paths=source_relative"}, protos...)
	cmd := exec.Command("protoc", args...)
	cmd.Env = append(os.Environ(), "PATH="+tools+string(os.PathListSeparator)+os.Getenv("PATH"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc %v: %v\n%s", args, err, b)
	}
	gen, _ := filepath.Glob(filepath.Join(out, "*/v1/*.pb.go"))
	if len(gen) == 0 {
		t.Fatal("protoc generated nothing")
	}
	for _, g := range gen {
		rel, _ := filepath.Rel(out, g)
		want, _ := os.ReadFile(g)
		got, err := os.ReadFile(rel)
		if err != nil {
			t.Errorf("%s: not committed (run `make proto`): %v", rel, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make proto` and commit the result", rel)
		}
	}
}
