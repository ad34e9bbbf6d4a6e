// Command agent is the Cutover node agent: flags → agent.Config →
// agent.Run, stopped gracefully by SIGTERM or SIGINT. All logic lives in
// package agent.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/cutover-dev/cutover/agent"
	"github.com/cutover-dev/cutover/pkg/version"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// run returns the exit code: 0 after a clean stop, 2 for bad flags, 1 for
// any other failure. "cleanup" (with the agent's own flags) removes what
// Cutover made on the node and exits (agent.Cleanup).
func run(args []string) int {
	cfg := agent.Default()
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	fs.SortFlags = false
	cfg.AddFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "agent: %v\n", err)
		return 2
	}
	if *showVersion {
		fmt.Println(version.Version)
		return 0
	}
	cleanup := false
	switch {
	case fs.NArg() == 1 && fs.Arg(0) == "cleanup":
		cleanup = true
	case fs.NArg() > 0:
		fmt.Fprintf(os.Stderr, "agent: unexpected argument %q: the agent takes flags only, or the subcommand cleanup (see --help)\n", fs.Arg(0))
		return 2
	}
	if cleanup && cfg.TLS.CA == "" && cfg.TLS.Cert == "" && cfg.TLS.Key == "" {
		// cleanup serves nothing: an admin on the node runs it with the
		// dataplane flags alone, without the agent's certificates.
		cfg.Insecure = true
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "agent: invalid flags:\n%v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if cleanup {
		rep, err := agent.Cleanup(ctx, cfg, nil)
		for _, r := range rep.Removed {
			fmt.Println("removed " + r)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "agent: %v\n", err)
			return 1
		}
		fmt.Println("cleanup done: nothing Cutover made is left on this node")
		return 0
	}
	if err := agent.Run(ctx, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "agent: %v\n", err)
		return 1
	}
	return 0
}
