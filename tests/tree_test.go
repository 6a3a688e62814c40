package tests

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoMergeConflictMarkers: no source, script or document in the tree
// holds a merge's conflict markers. A merge once committed them into a CUDA
// benchmark and docs/twin.md; the Go tests passed and only the CUDA compile,
// minutes later, failed.
func TestNoMergeConflictMarkers(t *testing.T) {
	root := ".."
	skipDirs := map[string]bool{".git": true, "bin": true, "node_modules": true, "__pycache__": true}
	checked := 0
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (skipDirs[name] || strings.HasPrefix(name, "build") || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > 4<<20 {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // binary
		}
		checked++
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		for line := 1; sc.Scan(); line++ {
			l := sc.Text()
			if strings.HasPrefix(l, "<<<<<<< ") || strings.HasPrefix(l, ">>>>>>> ") {
				t.Errorf("%s:%d: a merge conflict marker: %q", p, line, l)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked only %d files: the walk missed the tree", checked)
	}
}
