// Command coordctl is the Cutover CLI; everything lives in coordinator/cli.
package main

import (
	"os"

	"github.com/cutover-dev/cutover/coordinator/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
