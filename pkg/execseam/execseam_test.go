package execseam_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/pkg/execseam"
)

func TestExecReturnsStdoutAndEnv(t *testing.T) {
	out, err := execseam.Exec(context.Background(), []string{"sh", "-c", `printf '%s' "$CUTOVER_X"; echo err >&2`}, []string{"CUTOVER_X=hello"})
	if err != nil || string(out) != "hello" {
		t.Fatalf("Exec = %q, %v; want stdout only, \"hello\"", out, err)
	}
}

func TestExecFailureIsAnErrorWithArgvAndOutput(t *testing.T) {
	argv := []string{"sh", "-c", "echo partial; echo broken >&2; exit 3"}
	out, err := execseam.Exec(context.Background(), argv, nil)
	var e *execseam.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want *execseam.Error", err, err)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Errorf("err does not unwrap to the exit status 3: %v", err)
	}
	if !strings.Contains(string(out), "partial") || !strings.Contains(string(out), "broken") {
		t.Errorf("output %q: want stdout and stderr", out)
	}
	for _, want := range []string{"sh -c", "exit status 3", "broken"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

func TestRunFeedsStdinAndNamesTheBatch(t *testing.T) {
	out, err := execseam.Run(exec.Command("cat"), "line one\n")
	if err != nil || string(out) != "line one\n" {
		t.Fatalf("Run(cat) = %q, %v", out, err)
	}
	_, err = execseam.Run(exec.Command("sh", "-c", "cat >/dev/null; exit 1"), "bad line\n")
	if err == nil || !strings.Contains(err.Error(), "--- batch ---\nbad line") {
		t.Fatalf("err = %v, want the batch named", err)
	}
}

func TestExecMissingBinary(t *testing.T) {
	_, err := execseam.Exec(context.Background(), []string{"cutover-no-such-binary"}, nil)
	if !errors.Is(err, exec.ErrNotFound) {
		t.Fatalf("err = %v, want exec.ErrNotFound wrapped", err)
	}
}
