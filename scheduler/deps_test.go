package scheduler

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPurity enforces DESIGN.md §1 for scheduler, scheduler/sim and
// scheduler/costfit: standard library only (plus this module's scheduler
// packages), and nothing that does I/O, reads a clock, draws random numbers,
// starts goroutines or logs.
func TestPurity(t *testing.T) {
	allowed := map[string]bool{
		"errors": true, "fmt": true, "math": true, "math/bits": true, "slices": true,
		"strconv": true, "strings": true, "github.com/lockstep-ai/lockstep/scheduler": true,
	}
	// costfit's report writer takes an io.Writer (the interface, not a file)
	// and sorts records with cmp.
	extra := map[string]map[string]bool{"costfit": {"io": true, "cmp": true}}
	for _, dir := range []string{".", "sim", "costfit"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fs := token.NewFileSet()
			af, err := parser.ParseFile(fs, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if !allowed[p] && !extra[dir][p] {
					t.Errorf("%s imports %q: the scheduler must stay pure (no I/O, clock, randomness, goroutines, logging)", f, p)
				}
			}
			ast.Inspect(af, func(n ast.Node) bool {
				if g, ok := n.(*ast.GoStmt); ok {
					t.Errorf("%s:%d starts a goroutine: the scheduler packages are single-threaded state machines", f, fs.Position(g.Pos()).Line)
				}
				return true
			})
		}
	}
}
