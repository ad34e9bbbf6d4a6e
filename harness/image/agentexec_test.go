package image

// TestAgentToolsAreWhatTheCodeExecs derives from the code the programs the
// agent binary can exec and holds AgentTools (what the image check requires
// runnable) to them. It type-checks every package of this module the agent
// links (go list -deps -export, export data for imports) and finds each
// exec: exec.Command, exec.CommandContext, exec.LookPath, execseam.Exec and
// any call of an execseam.Func value. The program is the first argument or
// argv[0], resolved through constants, []string literals, append, local
// variables (every assignment in the function) and struct fields (every
// value the linked code gives that field; none: the default alone). What
// it cannot resolve it names, and a person declares its values in
// resolvedBy, by calling the code that computes them. Third-party packages
// the agent links that import os/exec must be listed in thirdPartyExec with
// why their execs are covered.

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/pkg/iptables"
)

const module = "github.com/cutover-dev/cutover/"

// resolvedBy declares the programs of exec sites whose program is
// computed: "<package>: <expression>" → the values, computed by the code.
var resolvedBy = map[string][]string{
	"pkg/iptables: Binary(c.backend)": {iptables.Binary(iptables.BackendNFT), iptables.Binary(iptables.BackendLegacy)},
}

// thirdPartyExec: packages outside this module that the agent links and
// that import os/exec, and why no program of theirs is missed.
var thirdPartyExec = map[string]string{
	"github.com/coreos/go-iptables/iptables": "runs the path pkg/iptables gives it (goipt.Path), found by pkg/iptables' exec.LookPath site",
}

type listedPkg struct {
	ImportPath, Dir, Export string
	GoFiles                 []string
	Imports                 []string
	Standard                bool
}

func agentPackages(t *testing.T, main string) map[string]*listedPkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-export", "-json", main)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps -export %s: %v", main, err)
	}
	pkgs := map[string]*listedPkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = &p
	}
	return pkgs
}

func derivePrograms(t *testing.T, main string) (programs map[string][]string, unknown []string, thirdParty []string) {
	t.Helper()
	pkgs := agentPackages(t, main)
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		p := pkgs[path]
		if p == nil || p.Export == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(p.Export)
	})
	type checked struct {
		path  string
		files []*ast.File
		info  *types.Info
	}
	var all []checked
	for path, p := range pkgs {
		if p.Standard {
			continue
		}
		if !strings.HasPrefix(path, module) {
			if slices.Contains(p.Imports, "os/exec") {
				thirdParty = append(thirdParty, path)
			}
			continue
		}
		var files []*ast.File
		for _, f := range p.GoFiles {
			af, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, af)
		}
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
		if _, err := (&types.Config{Importer: imp}).Check(path, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", path, err)
		}
		all = append(all, checked{path, files, info})
	}
	// Every value the linked code assigns to each struct field.
	fieldVals := map[types.Object][]ast.Expr{}
	for _, c := range all {
		for _, f := range c.files {
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.KeyValueExpr:
					if id, ok := n.Key.(*ast.Ident); ok {
						if o, ok := c.info.Uses[id].(*types.Var); ok && o.IsField() {
							fieldVals[o] = append(fieldVals[o], n.Value)
						}
					}
				case *ast.AssignStmt:
					for i, l := range n.Lhs {
						if se, ok := l.(*ast.SelectorExpr); ok && i < len(n.Rhs) {
							if s := c.info.Selections[se]; s != nil && s.Kind() == types.FieldVal {
								fieldVals[s.Obj()] = append(fieldVals[s.Obj()], n.Rhs[i])
							}
						}
					}
				}
				return true
			})
		}
	}
	programs = map[string][]string{}
	for _, c := range all {
		if c.path == module+"pkg/execseam" {
			continue // the seam runs what it is given
		}
		rel := strings.TrimPrefix(c.path, module)
		for _, f := range c.files {
			// Assignments to each local variable, per function.
			var fn *ast.FuncDecl
			assigns := map[types.Object][]ast.Expr{}
			var resolve func(e ast.Expr, argv bool, depth int) ([]string, []string)
			resolve = func(e ast.Expr, argv bool, depth int) (vals, unk []string) {
				if depth > 8 {
					return nil, []string{rel + ": " + types.ExprString(e)}
				}
				if tv, ok := c.info.Types[e]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
					return []string{constant.StringVal(tv.Value)}, nil
				}
				switch x := e.(type) {
				case *ast.ParenExpr:
					return resolve(x.X, argv, depth+1)
				case *ast.CompositeLit:
					if argv && len(x.Elts) > 0 {
						return resolve(x.Elts[0], false, depth+1)
					}
				case *ast.CallExpr:
					if id, ok := x.Fun.(*ast.Ident); ok && id.Name == "append" && argv && len(x.Args) > 0 {
						return resolve(x.Args[0], true, depth+1)
					}
				case *ast.Ident:
					o := c.info.Uses[x]
					if rhs, ok := assigns[o]; ok {
						for _, r := range rhs {
							if r == nil {
								continue
							}
							v, u := resolve(r, argv, depth+1)
							vals, unk = append(vals, v...), append(unk, u...)
						}
						return vals, unk
					}
				case *ast.SelectorExpr:
					if s := c.info.Selections[x]; s != nil && s.Kind() == types.FieldVal {
						for _, r := range fieldVals[s.Obj()] {
							if id, ok := r.(*ast.Ident); ok && id.Name == "nil" {
								continue
							}
							// A field's value elsewhere is resolved in its own
							// package only when it is a constant.
							v, u := resolveConst(r, nil)
							vals, unk = append(vals, v...), append(unk, u...)
						}
						return vals, unk // no assignment: the default path alone
					}
				}
				key := rel + ": " + types.ExprString(e)
				if v, ok := resolvedBy[key]; ok {
					return v, nil
				}
				return nil, []string{key}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if d, ok := n.(*ast.FuncDecl); ok {
					fn, assigns = d, map[types.Object][]ast.Expr{}
					ast.Inspect(d, func(m ast.Node) bool {
						if a, ok := m.(*ast.AssignStmt); ok {
							for i, l := range a.Lhs {
								id, ok := l.(*ast.Ident)
								if !ok || i >= len(a.Rhs) {
									continue
								}
								o := c.info.Defs[id]
								if o == nil {
									o = c.info.Uses[id]
								}
								rhs := a.Rhs[i]
								// x = append([]string{...}, x...) adds a program in front;
								// x = append(x, ...) does not change it.
								if call, ok := rhs.(*ast.CallExpr); ok && len(call.Args) > 0 {
									if first, ok := call.Args[0].(*ast.Ident); ok && c.info.Uses[first] == o {
										continue
									}
								}
								assigns[o] = append(assigns[o], rhs)
							}
						}
						return true
					})
				}
				call, ok := n.(*ast.CallExpr)
				if !ok || fn == nil {
					return true
				}
				var prog ast.Expr
				argv := false
				callee := typeutilCallee(c.info, call)
				switch {
				case callee == "os/exec.Command" || callee == "os/exec.LookPath":
					prog = call.Args[0]
				case callee == "os/exec.CommandContext":
					prog = call.Args[1]
				case callee == module+"pkg/execseam.Exec" || isExecseamFunc(c.info, call.Fun):
					prog, argv = call.Args[1], true
				default:
					return true
				}
				vals, unk := resolve(prog, argv, 0)
				pos := fset.Position(call.Pos())
				site := fmt.Sprintf("%s:%d", rel+"/"+filepath.Base(pos.Filename), pos.Line)
				for _, v := range vals {
					programs[v] = append(programs[v], site)
				}
				unknown = append(unknown, unk...)
				return true
			})
		}
	}
	sort.Strings(unknown)
	sort.Strings(thirdParty)
	return programs, slices.Compact(unknown), thirdParty
}

// resolveConst resolves a field's value given elsewhere: a string literal
// only (the fields the agent's programs come from are set, if at all,
// to a literal or left empty).
func resolveConst(e ast.Expr, _ *types.Info) ([]string, []string) {
	if bl, ok := e.(*ast.BasicLit); ok && bl.Kind == token.STRING {
		return []string{strings.Trim(bl.Value, "\"`")}, nil
	}
	return nil, []string{"field value " + types.ExprString(e)}
}

// typeutilCallee names a call's static callee "pkgpath.Func", or "".
func typeutilCallee(info *types.Info, call *ast.CallExpr) string {
	var id *ast.Ident
	switch f := call.Fun.(type) {
	case *ast.Ident:
		id = f
	case *ast.SelectorExpr:
		id = f.Sel
	}
	if id == nil {
		return ""
	}
	if fn, ok := info.Uses[id].(*types.Func); ok && fn.Pkg() != nil {
		if sig, ok := fn.Type().(*types.Signature); ok && sig.Recv() != nil {
			return ""
		}
		return fn.Pkg().Path() + "." + fn.Name()
	}
	return ""
}

// isExecseamFunc: the callee is a value of type execseam.Func.
func isExecseamFunc(info *types.Info, fun ast.Expr) bool {
	tv, ok := info.Types[fun]
	if !ok || !tv.IsValue() {
		return false
	}
	n, ok := tv.Type.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == module+"pkg/execseam" && n.Obj().Name() == "Func"
}

func TestAgentToolsAreWhatTheCodeExecs(t *testing.T) {
	programs, unknown, thirdParty := derivePrograms(t, "./agent/cmd/agent")
	for _, u := range unknown {
		t.Errorf("an exec whose program the test cannot resolve: %s; declare its values in resolvedBy", u)
	}
	for _, p := range thirdParty {
		if thirdPartyExec[p] == "" {
			t.Errorf("the agent links %s, which imports os/exec: read what it runs and list it in thirdPartyExec", p)
		}
	}
	var derived []string
	for p := range programs {
		derived = append(derived, p)
	}
	sort.Strings(derived)
	want := slices.Sorted(slices.Values(AgentTools))
	if !slices.Equal(derived, want) {
		for _, p := range derived {
			if !slices.Contains(AgentTools, p) {
				t.Errorf("the agent execs %s (%s), which AgentTools (what the image must carry) lacks", p, strings.Join(programs[p], ", "))
			}
		}
		for _, p := range AgentTools {
			if programs[p] == nil {
				t.Errorf("AgentTools lists %s, which no code the agent links execs", p)
			}
		}
	}
	t.Logf("derived: %v", derived)
}
