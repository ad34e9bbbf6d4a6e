// Command coordinator runs the Cutover coordinator: flags → Config → Run.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/cutover-dev/cutover/coordinator"
)

func main() {
	cfg := coordinator.Default()
	fs := flag.NewFlagSet("coordinator", flag.ExitOnError)
	cfg.AddFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "coordinator: unexpected argument %q: every setting is a flag (see -h)\n", fs.Arg(0))
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := coordinator.Run(ctx, cfg, log); err != nil {
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		os.Exit(1)
	}
}
