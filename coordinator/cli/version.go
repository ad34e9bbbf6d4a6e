package cli

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/cutover-dev/cutover/pkg/version"
)

func newVersionCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print coordctl's version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if g.JSON() {
				_, err := fmt.Fprintf(g.Stdout, "{\n  \"version\": %q,\n  \"go\": %q,\n  \"platform\": %q\n}\n", version.Version, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
				return err
			}
			_, err := fmt.Fprintf(g.Stdout, "coordctl %s (%s, %s/%s)\n", version.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return err
		},
	}
}
