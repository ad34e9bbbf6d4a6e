// Command cutover-lab runs the local lab (harness/lab) and coordctl against
// it; everything lives in harness/lab/labcli. It is a test harness, built
// by `make lab` beside the shipped binaries and never into an image.
package main

import (
	"os"

	"github.com/cutover-dev/cutover/harness/lab/labcli"
)

func main() { os.Exit(labcli.Main(os.Args[1:])) }
