package cli

import (
	"bytes"
	_ "embed"
	"html/template"
	"io"
	"time"

	"github.com/spf13/cobra"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
)

// recordHTML is the change record page: one file with its CSS, script and
// drawings inline, so that it opens anywhere (a change ticket, a mail) and
// fetches nothing (its Content-Security-Policy forbids it, too).
//
//go:embed changerecord/record.html.tmpl
var recordHTML string

var recordTmpl = template.Must(template.New("record").Parse(recordHTML))

// writeRecordHTML renders the change record of r as of now.
func writeRecordHTML(w io.Writer, r *coordinatorv1.Report, now time.Time) error {
	var b bytes.Buffer
	if err := recordTmpl.Execute(&b, newRecordView(r, now)); err != nil {
		return Exitf(ExitFailed, "rendering the change record: %v", err)
	}
	_, err := w.Write(b.Bytes())
	return err
}

func newReportCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "report [OP] [-o html|json|text]",
		Short: "The change record of an operation (the current or last one when OP is omitted)",
		Long: `Write the change record of an operation: who ran it and when, the request,
the plan and preflight it passed, a timeline of every node on one time axis
(prepared, applied, confirmed, finalized, reverted) with the commit instant,
the probe disruption per pair, warnings and every node's final state read
back.

  coordctl report -o html > change.html   one self-contained page (no network
                                          fetches), to attach to a change ticket
  coordctl report OP -o json              the same data as JSON
  coordctl report                         as text (what coordctl status shows)

Works for running (a partial record, as of now), aborted and rolled-back
operations. Exit codes: 0 the record was written, 2 bad or unknown OP, 3
coordinator unreachable. See docs/change-record.md.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := fetchReport(cmd, g, args, "report")
			if err != nil {
				return err
			}
			switch g.Output {
			case "html":
				return writeRecordHTML(g.Stdout, rep, time.Now())
			case "json":
				return writeJSON(g.Stdout, rep)
			}
			renderReport(g.Stdout, rep)
			return nil
		},
	}
}
