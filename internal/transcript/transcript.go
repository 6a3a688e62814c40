// Package transcript runs data-driven test transcripts: scenario files
// (testdata/*.txt) that read like a story, in the style of etcd-io/raft's
// tests. A file is a sequence of blocks
//
//	# commentary (any number of '#' lines and blank lines)
//	command arg key=value ...
//	----
//	expected output lines
//
// each ended by a blank line (or the end of the file). The test hands every
// command to its handler, in file order, and compares what the handler
// returns with the expected lines. With rewrite set it writes the file back
// with the outputs it got instead: commentary, commands and spacing are kept
// byte for byte, so rewriting an unchanged story reproduces it exactly.
//
// An output never contains a blank line (a blank line ends the block); the
// handler's trailing newlines are trimmed. The package is for tests only: it
// imports testing.
package transcript

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Command is one directive of a transcript: its name, its positional
// arguments and its key=value arguments. The typed getters record which keys
// the handler read; Run reports any key it never read, so a misspelt
// argument fails the story instead of being ignored.
type Command struct {
	// Line is the directive as written; Pos is "file:line" of it.
	Line, Pos string
	// Name is the first word; Args the later words without '='.
	Name string
	Args []string

	t    testing.TB
	keys []string
	vals map[string]string
	used map[string]bool
}

// Parse splits a directive line into a Command; pos names it in errors.
func Parse(t testing.TB, line, pos string) *Command {
	f := strings.Fields(line)
	c := &Command{Line: line, Pos: pos, t: t, vals: map[string]string{}, used: map[string]bool{}}
	if len(f) == 0 {
		return c
	}
	c.Name = f[0]
	for _, w := range f[1:] {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			c.Args = append(c.Args, w)
			continue
		}
		if _, dup := c.vals[k]; dup {
			t.Fatalf("%s: %q: argument %s given twice", pos, line, k)
		}
		c.keys = append(c.keys, k)
		c.vals[k] = v
	}
	return c
}

// Has reports whether key was given (and marks it read).
func (c *Command) Has(key string) bool {
	c.used[key] = true
	_, ok := c.vals[key]
	return ok
}

// Str returns key's value, or def when it is absent.
func (c *Command) Str(key, def string) string {
	if !c.Has(key) {
		return def
	}
	return c.vals[key]
}

// Int returns key's value as an integer, or def when it is absent. A value
// that is not an integer fails the test.
func (c *Command) Int(key string, def int) int {
	if !c.Has(key) {
		return def
	}
	n, err := strconv.Atoi(c.vals[key])
	if err != nil {
		c.t.Fatalf("%s: %s=%q is not an integer", c.Pos, key, c.vals[key])
	}
	return n
}

// Bool returns key's value as on/off (also true/false), or def when absent.
func (c *Command) Bool(key string, def bool) bool {
	if !c.Has(key) {
		return def
	}
	switch c.vals[key] {
	case "on", "true":
		return true
	case "off", "false":
		return false
	}
	c.t.Fatalf("%s: %s=%q: want on or off", c.Pos, key, c.vals[key])
	return false
}

// Ints parses key's value as a comma-separated list of integers and
// inclusive ranges ("1..4,9,9" is 1 2 3 4 9 9); nil when absent.
func (c *Command) Ints(key string) []int {
	if !c.Has(key) {
		return nil
	}
	var out []int
	for _, part := range strings.Split(c.vals[key], ",") {
		lo, hi, isRange := strings.Cut(part, "..")
		a, err1 := strconv.Atoi(lo)
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || b < a {
			c.t.Fatalf("%s: %s=%q: want integers and ranges a..b separated by commas", c.Pos, key, c.vals[key])
		}
		for x := a; x <= b; x++ {
			out = append(out, x)
		}
	}
	return out
}

// RawLine returns the directive as written, for a handler that parses it
// itself; Run then does not check its keys.
func (c *Command) RawLine() string {
	for _, k := range c.keys {
		c.used[k] = true
	}
	return c.Line
}

// Fatalf fails the story at this command.
func (c *Command) Fatalf(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf("%s: %s: %s", c.Pos, c.Line, fmt.Sprintf(format, args...))
}

// unused lists the keys the handler never read, in the order given.
func (c *Command) unused() []string {
	var out []string
	for _, k := range c.keys {
		if !c.used[k] {
			out = append(out, k)
		}
	}
	return out
}

// block is one directive with the commentary before it.
type block struct {
	pre      []string // '#' and blank lines before the directive
	cmd      string
	line     int // 1-based line of cmd
	expected string
}

// parse reads a transcript file into blocks and the commentary after the
// last one.
func parse(t testing.TB, file string) ([]block, []string) {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	var blocks []block
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if l == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: directive %q must be followed by ----", file, i+1, l)
		}
		j := i + 2
		var out []string
		for j < len(lines) && lines[j] != "" {
			out = append(out, lines[j])
			j++
		}
		blocks = append(blocks, block{pre: pre, cmd: l, line: i + 1, expected: strings.Join(out, "\n")})
		pre = nil
		i = j // skip the blank line that ends the block
	}
	return blocks, pre
}

// Run plays the transcript in file: do gets every command in order and
// returns its output. Without rewrite a mismatch is reported (with the file
// position, the got and the wanted output) and the story goes on; with
// rewrite the file is written back with the outputs got.
func Run(t *testing.T, file string, rewrite bool, do func(c *Command) string) {
	t.Helper()
	blocks, tail := parse(t, file)
	var b strings.Builder
	for i, bl := range blocks {
		pos := fmt.Sprintf("%s:%d", file, bl.line)
		c := Parse(t, bl.cmd, pos)
		got := strings.TrimRight(do(c), "\n")
		if u := c.unused(); len(u) > 0 {
			t.Errorf("%s: %s: unknown argument(s) %v", pos, bl.cmd, u)
		}
		if strings.Contains(got, "\n\n") || strings.HasPrefix(got, "\n") {
			t.Errorf("%s: %s: the output has a blank line, which would end the block:\n%s", pos, bl.cmd, got)
		}
		for _, p := range bl.pre {
			b.WriteString(p + "\n")
		}
		b.WriteString(bl.cmd + "\n----\n")
		if got != "" {
			b.WriteString(got + "\n")
		}
		if i < len(blocks)-1 || len(tail) > 0 {
			b.WriteString("\n")
		}
		if !rewrite && got != bl.expected {
			t.Errorf("%s: %s\n--- got\n%s\n--- want\n%s", pos, bl.cmd, got, bl.expected)
		}
	}
	for _, p := range tail {
		b.WriteString(p + "\n")
	}
	if rewrite {
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// RunDir plays every file matching glob (e.g. "testdata/*.txt") as a
// subtest named after the file; newHandler builds a fresh handler (fresh
// story state) for each file. A glob that matches nothing fails the test.
func RunDir(t *testing.T, glob string, rewrite bool, newHandler func(t *testing.T) func(c *Command) string) {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts match %s: %v", glob, err)
	}
	slices.Sort(files)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { Run(t, file, rewrite, newHandler(t)) })
	}
}
