package jinja

import (
	"bufio"
	"encoding/json"
	"os"
	"testing"
	"time"
)

// FuzzRender: any template compiles or is refused, and any render ends
// (output, an error, or a limit) within its time limit; nothing panics,
// overflows the stack or outgrows the bytes limit (issue 23).
func FuzzRender(f *testing.F) {
	if cases, err := os.Open("testdata/cases.jsonl"); err == nil {
		sc := bufio.NewScanner(cases)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var c goldenCase
			if json.Unmarshal(sc.Bytes(), &c) == nil {
				f.Add(c.Template)
			}
		}
		cases.Close()
	}
	f.Add(`{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}`)
	f.Add(`{{ 'x' * 10000000000 }}{% for i in range(1000000000) %}x{% endfor %}`)
	lim := Limits{MaxTemplateBytes: 1 << 16, MaxDepth: 16, MaxSteps: 200_000, MaxBytes: 1 << 20, Timeout: 500 * time.Millisecond}
	data := map[string]any{
		"messages":              []any{map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "assistant", "content": "yo"}},
		"add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src, lim)
		if err != nil {
			return
		}
		start := time.Now()
		out, err := tmpl.Render(data)
		if d := time.Since(start); d > 2*lim.Timeout+time.Second {
			t.Fatalf("a render took %v", d)
		}
		if err == nil && int64(len(out)) > lim.MaxBytes {
			t.Fatalf("output of %d bytes past the limit", len(out))
		}
	})
}
