package kvpool_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportRule enforces DESIGN.md §1 for kvpool: a deterministic state
// machine imports only pure standard-library packages and scheduler (no I/O,
// clock, randomness, goroutine or locking packages, no cgo).
func TestImportRule(t *testing.T) {
	allowed := map[string]bool{
		"errors": true, "fmt": true, "slices": true, "strings": true, "math/bits": true,
		"cmp": true, "math": true, "strconv": true,
		// Pure and deterministic: the canonical block keys of kvcache.md §6.1.
		"crypto/sha256": true, "encoding/binary": true, "encoding/hex": true,
		"github.com/lockstep-ai/lockstep/scheduler": true,
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range ast.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !allowed[path] {
				t.Errorf("%s imports %q: kvpool may import only %v", f, path, allowed)
			}
		}
	}
}
