package opstate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"
)

// TestReportHasOneWriter: the report and the node results are touched
// only in report.go (the fields are unexported, so nothing outside this
// package can): every other file tells the operation what happened
// through its methods.
func TestReportHasOneWriter(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if f == "report.go" || filepath.Ext(f) != ".go" || len(f) > 8 && f[len(f)-8:] == "_test.go" {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(file, func(n ast.Node) bool {
			if s, ok := n.(*ast.SelectorExpr); ok && (s.Sel.Name == "report" || s.Sel.Name == "results") {
				t.Errorf("%s: %s touches op.%s: only report.go writes the report", f, fset.Position(s.Pos()), s.Sel.Name)
			}
			return true
		})
	}
	if checked < 3 {
		t.Fatalf("checked %d files: the package's files were not found", checked)
	}
}
