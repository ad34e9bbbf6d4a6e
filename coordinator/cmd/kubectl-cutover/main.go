// Command kubectl-cutover is coordctl as a kubectl plugin: `kubectl
// cutover plan --port 4889` finds the coordinator through the kubeconfig,
// port-forwards to it through the API server and uses the admin Secret's
// client certificate (coordinator/kubectl).
package main

import (
	"os"

	"github.com/cutover-dev/cutover/coordinator/cli"
	"github.com/cutover-dev/cutover/coordinator/kubectl"
)

func main() {
	cli.AddCommand(kubectl.Install)
	os.Exit(cli.Main(os.Args[1:]))
}
