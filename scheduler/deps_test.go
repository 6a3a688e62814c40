package scheduler

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPurity enforces DESIGN.md §1 for scheduler and scheduler/sim: standard
// library only (plus this module's scheduler packages), and nothing that
// does I/O, reads a clock, draws random numbers, starts goroutines or logs.
func TestPurity(t *testing.T) {
	allowed := map[string]bool{
		"errors": true, "fmt": true, "math": true, "math/bits": true, "slices": true,
		"strconv": true, "strings": true, "github.com/lockstep-ai/lockstep/scheduler": true,
	}
	for _, dir := range []string{".", "sim"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if !allowed[p] {
					t.Errorf("%s imports %q: the scheduler must stay pure (no I/O, clock, randomness, goroutines, logging)", f, p)
				}
			}
		}
	}
}
