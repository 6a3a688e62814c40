package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Links in the user documentation: Markdown link targets (relative to the
// file) and the paths the text names (docs/..., relative to the
// repository; shared/... and ../shared/..., the shared folder beside it).
var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	namedPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:\.\./)?(?:docs|shared)/[A-Za-z0-9_./-]*[A-Za-z0-9_/-])`)
)

// TestDocLinksResolve: every link and named path in README.md and docs/
// points at a file or folder that exists (issue 23: README named a
// docs/loadgen.md that was not there).
func TestDocLinksResolve(t *testing.T) {
	root := ".."
	files := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	shared := filepath.Join(root, "..", "shared")
	_, err = os.Stat(shared)
	haveShared := err == nil
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			checked++
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", f, m[1])
			}
		}
		for _, ix := range namedPath.FindAllStringSubmatchIndex(text, -1) {
			p := strings.TrimSuffix(text[ix[2]:ix[3]], ".")
			if rest := text[ix[3]:]; strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, ".{") {
				continue // a pattern ('DIR/iter.{rank}.jsonl'), not a path
			}
			var full string
			switch {
			case strings.HasPrefix(p, "docs/"):
				full = filepath.Join(root, p)
			case !haveShared:
				continue
			default:
				full = filepath.Join(shared, strings.TrimPrefix(strings.TrimPrefix(p, "../"), "shared/"))
			}
			if strings.Contains(p, "{") {
				continue // a pattern ('DIR/iter.{rank}.jsonl'), not a path
			}
			checked++
			if _, err := os.Stat(full); err != nil {
				t.Errorf("%s names %s, which does not exist", f, p)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d links checked: the patterns find nothing", checked)
	}
}
