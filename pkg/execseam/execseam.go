// Package execseam is the one exec seam of the project (STYLE.md habit 3):
// the function type a driver calls to run a program, the real
// implementation, and the one error a failed run returns. Drivers take a
// Func so that a unit test swaps in a fake while production runs through
// the very code the fake covers; the harness runs its prebuilt commands
// (in a namespace, with a batch on stdin) through Run and gets the same
// error.
//
// It only runs what it is given: no retries, no parsing of output. Whether
// an output means "no such bridge" is the driver's business.
package execseam

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Func runs argv with env added to the process environment and returns
// its standard output. On failure it returns what the program printed
// (standard output, then standard error) and an error, an *Error for the
// real implementation.
type Func func(ctx context.Context, argv []string, env []string) ([]byte, error)

// Error is a failed run: the argv, the batch fed on stdin (if any), what
// the program printed, and the cause (an *exec.ExitError, a missing
// binary, a context's end).
type Error struct {
	Argv   []string
	Stdin  string
	Output string
	Err    error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %v", strings.Join(e.Argv, " "), e.Err)
	if out := strings.TrimSpace(e.Output); out != "" {
		s += ": " + out
	}
	if e.Stdin != "" {
		s += "\n--- batch ---\n" + strings.TrimSpace(e.Stdin)
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

var _ Func = Exec

// Exec is the real Func.
func Exec(ctx context.Context, argv []string, env []string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, &Error{Err: fmt.Errorf("empty argv")}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		out := append(stdout.Bytes(), stderr.Bytes()...)
		return out, &Error{Argv: argv, Output: string(out), Err: err}
	}
	return stdout.Bytes(), nil
}

// Run runs a prepared command with stdin fed (when not empty) and returns
// its combined output; on failure an *Error.
func Run(cmd *exec.Cmd, stdin string) ([]byte, error) {
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), &Error{Argv: cmd.Args, Stdin: stdin, Output: out.String(), Err: err}
	}
	return out.Bytes(), nil
}
