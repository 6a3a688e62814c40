package transcript

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const story = `# A story: commentary survives a rewrite.
echo a=1 b
----
a=1 args [b]

# Two lines of output, then an empty one.
lines n=2
----
line 0
line 1

lines n=0
----

# Trailing commentary.
`

// handler answers echo and lines; a broken handler (off by one) lets the
// test see a rewrite change the file.
func handler(off int) func(c *Command) string {
	return func(c *Command) string {
		switch c.Name {
		case "echo":
			return "a=" + c.Str("a", "") + " args [" + strings.Join(c.Args, " ") + "]"
		case "lines":
			var out []string
			for i := range c.Int("n", 0) + off {
				out = append(out, "line "+string(rune('0'+i)))
			}
			return strings.Join(out, "\n")
		}
		c.Fatalf("unknown command")
		return ""
	}
}

func write(t *testing.T, text string) string {
	file := filepath.Join(t.TempDir(), "story.txt")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func read(t *testing.T, file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRewriteUnchangedIsIdentity: a story whose outputs match is written
// back byte for byte, and it passes as it is.
func TestRewriteUnchangedIsIdentity(t *testing.T) {
	file := write(t, story)
	Run(t, file, false, handler(0))
	Run(t, file, true, handler(0))
	if got := read(t, file); got != story {
		t.Fatalf("rewrite changed an unchanged story:\n%s", got)
	}
}

// TestRewriteRecordsNewOutput: a changed behaviour is written into the
// story, commentary and spacing kept.
func TestRewriteRecordsNewOutput(t *testing.T) {
	file := write(t, story)
	Run(t, file, true, handler(1))
	want := strings.Replace(story, "line 1\n", "line 1\nline 2\n", 1)
	want = strings.Replace(want, "lines n=0\n----\n", "lines n=0\n----\nline 0\n", 1)
	if got := read(t, file); got != want {
		t.Fatalf("rewritten story:\n%s\nwant:\n%s", got, want)
	}
}

func TestParseArguments(t *testing.T) {
	c := Parse(t, "alloc id=3 tokens=1..4,9,9 fast on=off", "x:1")
	if c.Name != "alloc" || !slices.Equal(c.Args, []string{"fast"}) {
		t.Fatalf("name %q args %v", c.Name, c.Args)
	}
	if got := c.Ints("tokens"); !slices.Equal(got, []int{1, 2, 3, 4, 9, 9}) {
		t.Fatalf("tokens %v", got)
	}
	if c.Int("id", 0) != 3 || c.Bool("on", true) || c.Int("missing", 7) != 7 {
		t.Fatal("typed getters")
	}
	if u := c.unused(); len(u) != 0 {
		t.Fatalf("unused %v", u)
	}
	d := Parse(t, "alloc id=3 tpyo=1", "x:2")
	d.Int("id", 0)
	if u := d.unused(); !slices.Equal(u, []string{"tpyo"}) {
		t.Fatalf("unused %v, want [tpyo]", u)
	}
}
