package jinja

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

type goldenCase struct {
	Name     string         `json:"name"`
	Template string         `json:"template"`
	Data     map[string]any `json:"data"`
	Want     *string        `json:"want"`
	Error    string         `json:"error"`
}

// renderData is the data of a golden case as RenderChat passes it: JSON
// numbers become ints where whole, and raise_exception fails the render.
func renderData(d map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range d {
		out[k] = jsonNumbers(v)
	}
	out["raise_exception"] = func(args ...any) (any, error) {
		if len(args) == 0 {
			return nil, errors.New("raise_exception")
		}
		return nil, errors.New(str(args[0]))
	}
	return out
}

func jsonNumbers(v any) any {
	switch x := v.(type) {
	case float64:
		if x == float64(int64(x)) && !strings.ContainsAny(formatFloat(x), ".e") {
			return int64(x)
		}
		return x
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case []any:
		for i := range x {
			x[i] = jsonNumbers(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = jsonNumbers(x[k])
		}
	}
	return v
}

// TestGolden: every case of testdata/cases.jsonl (rendered by jinja2 the
// way transformers does, gen_cases.py) renders to the same text here, or
// fails where jinja2 fails.
func TestGolden(t *testing.T) {
	f, err := os.Open("testdata/cases.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.UseNumber()
		var c goldenCase
		if err := dec.Decode(&c); err != nil {
			t.Fatal(err)
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			tmpl, err := Compile(c.Template, DefaultLimits())
			var got string
			if err == nil {
				got, err = tmpl.Render(renderData(c.Data))
			}
			if c.Want == nil {
				if err == nil {
					t.Fatalf("rendered %q; jinja2 fails: %s", got, c.Error)
				}
				t.Logf("%v (jinja2: %s)", err, c.Error)
				return
			}
			if err != nil {
				t.Fatalf("template %q: %v", c.Template, err)
			}
			if got != *c.Want {
				t.Fatalf("template %q\n got %q\nwant %q", c.Template, got, *c.Want)
			}
		})
	}
	if n < 50 {
		t.Fatalf("only %d golden cases", n)
	}
}

// Hostile templates (issue 23) end in an error naming the limit, quickly,
// and without exhausting the stack or the memory.
func TestLimits(t *testing.T) {
	lim := DefaultLimits()
	for _, c := range []struct {
		name, src, limit string
	}{
		{"recursive macro", `{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}`, "depth"},
		{"mutual recursion", `{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(0) }}`, "depth"},
		{"huge repetition", `{{ 'x' * 10000000000 }}`, "bytes"},
		{"repetition overflow", `{{ 'xx' * 9000000000000000000 }}`, "bytes"},
		{"huge list repetition", `{{ [1, 2] * 100000000 }}`, "bytes"},
		{"huge range", `{% for i in range(1000000000) %}x{% endfor %}`, "bytes"},
		{"nested loops", `{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}`, "steps"},
		{"doubling", `{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}`, "bytes"},
		{"doubling list", `{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}`, "bytes"},
		{"print a big list", `{% set s = 'x' * 40000000 %}{{ [s, s, s] }}`, "bytes"},
		{"replace blow-up", `{{ ('a' * 1000000).replace('a', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa') }}`, "bytes"},
		{"big template", strings.Repeat("x", 10<<20), "size"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			tmpl, err := Compile(c.src, lim)
			if err == nil {
				_, err = tmpl.Render(map[string]any{})
			}
			var le *LimitError
			if !errors.As(err, &le) || le.Limit != c.limit {
				t.Fatalf("error %v, want the %s limit", err, c.limit)
			}
			if !errors.Is(err, ErrLimit) {
				t.Fatal("a limit error matches ErrLimit")
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v", d)
			}
			t.Log(err)
		})
	}
	// Deeply nested source is refused by the parser, not its stack.
	for _, src := range []string{"{{ " + strings.Repeat("(", 10000) + "1" + strings.Repeat(")", 10000) + " }}",
		strings.Repeat("{% if true %}", 10000), "{{ " + strings.Repeat("-", 10000) + "1 }}",
		"{{ " + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + " }}", "{{ " + strings.Repeat("not ", 10000) + "1 }}"} {
		if _, err := Compile(src, lim); err == nil || !strings.Contains(err.Error(), "nested more than") {
			t.Errorf("deep nesting: %v", err)
		}
	}
	// The time limit.
	slow := lim
	slow.MaxSteps, slow.Timeout = 1<<62, 50*time.Millisecond
	tmpl, err := Compile(`{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`, slow)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = tmpl.Render(nil)
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "time" || time.Since(start) > 2*time.Second {
		t.Fatalf("time limit: %v after %v", err, time.Since(start))
	}
}

// A render is independent of the renders before it (a template is safe
// to share).
func TestConcurrentRenders(t *testing.T) {
	tmpl, err := Compile(`{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}`, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 8)
	for i := range 8 {
		go func() {
			msgs := make([]any, i)
			out, err := tmpl.Render(map[string]any{"messages": msgs})
			if err != nil {
				out = err.Error()
			}
			done <- out
		}()
	}
	seen := map[string]bool{}
	for range 8 {
		seen[<-done] = true
	}
	if len(seen) != 8 {
		t.Fatalf("renders interfered: %v", seen)
	}
}
