package model

import (
	"math"
	"strings"
	"testing"
	"time"
)

// Hostile checkpoints (issue 23): every one is refused with one clear
// error naming what is wrong, and none panics.
func TestHostileGGUF(t *testing.T) {
	m := newTinyModel(7, false)
	firstDims := func(dims ...uint64) ggufOptions {
		return ggufOptions{header: func(i int, _ string, d []uint64, off uint64) ([]uint64, uint64) {
			if i == 0 {
				return dims, off
			}
			return d, off
		}}
	}
	metaF32 := func(key string, v float32) ggufOptions {
		return ggufOptions{kvs: func(kvs []ggufKV) []ggufKV {
			for i := range kvs {
				if kvs[i].key == key {
					kvs[i].val = v
				}
			}
			return kvs
		}}
	}
	for _, c := range []struct {
		name string
		o    ggufOptions
		want []string
	}{
		{"dim 2^63+5", firstDims(1<<63 + 5), []string{"truncated or corrupt"}},
		{"dims 2^32 x 2^32", firstDims(1<<32, 1<<32), []string{"truncated or corrupt"}},
		{"dims whose product overflows", firstDims(1<<40, 1<<30), []string{"truncated or corrupt"}},
		{"dim 2^40", firstDims(1 << 40), []string{"truncated or corrupt"}},
		{"zero dim", firstDims(0, 64), []string{"truncated or corrupt"}},
		{"unaligned offset", ggufOptions{header: func(i int, _ string, d []uint64, off uint64) ([]uint64, uint64) {
			if i == 0 {
				return d, 3
			}
			return d, off
		}}, []string{"offset 3", "general.alignment 32"}},
		{"rope.freq_base +Inf", metaF32("llama.rope.freq_base", float32(math.Inf(1))), []string{"rope_theta", "+Inf"}},
		{"rope.freq_base NaN", metaF32("llama.rope.freq_base", float32(math.NaN())), []string{"rope_theta"}},
		{"rms epsilon +Inf", metaF32("llama.attention.layer_norm_rms_epsilon", float32(math.Inf(1))), []string{"rms_eps"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeGGUF(t, m, c.o)
			got, err := loadNoPanic(t, path)
			if err == nil {
				got.Close()
				t.Fatalf("Load accepted %s", c.name)
			}
			t.Log(err)
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// loadNoPanic is Load, failing the test (instead of the process) on a panic.
func loadNoPanic(t *testing.T, path string) (m *Model, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Load panicked: %v", r)
		}
	}()
	return Load(path)
}

func TestHostileHFTokenizer(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(tj, cfg map[string]any)
		want   []string
	}{
		{"huge id", func(tj, _ map[string]any) {
			tj["model"].(map[string]any)["vocab"].(map[string]int)["zz"] = 1000000000
		}, []string{`"zz"`, "1000000000", "outside the vocabulary"}},
		{"huge added id", func(tj, _ map[string]any) {
			tj["added_tokens"] = append(tj["added_tokens"].([]map[string]any), map[string]any{"id": 1 << 30, "content": "<x>"})
		}, []string{`"<x>"`, "outside the vocabulary"}},
		{"bogus merge", func(tj, _ map[string]any) {
			m := tj["model"].(map[string]any)
			m["merges"] = append(m["merges"].([]any), []string{"nope", "missing"})
		}, []string{"merge 4", `"nope"`, "not in the vocabulary"}},
		{"merge result missing", func(tj, _ map[string]any) {
			m := tj["model"].(map[string]any)
			m["merges"] = append(m["merges"].([]any), "h o")
		}, []string{"merge 4", `"ho"`, "not in the vocabulary"}},
	} {
		_, err := LoadHFTokenizer(hfDir(t, c.mutate))
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %s", c.name, err, w)
			}
		}
	}
}

// A hostile chat template fails its render with an error naming the
// limit (never the process: issue 23, defects 2 and 3), and the startup
// check refuses it; a template that only refuses a conversation with
// raise_exception passes the check.
func TestHostileChatTemplates(t *testing.T) {
	msgs := []ChatMessage{{Role: "user", Content: "hi"}}
	for _, c := range []struct{ name, src, want string }{
		{"recursion", `{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}`, "depth limit"},
		{"huge string", `{{ 'x' * 10000000000 }}`, "bytes limit"},
		{"huge range", `{% for i in range(1000000000) %}x{% endfor %}`, "bytes limit"},
		{"nested loops", `{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}`, "steps limit"},
		{"10 MB template", strings.Repeat("x", 10<<20), "size limit"},
	} {
		_, err := RenderChat(c.src, msgs, true, "", "")
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "chat template") {
			t.Errorf("%s: %v, want an error naming the chat template's %s", c.name, err, c.want)
		}
		if err := CheckChatTemplate(c.src, "", ""); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: the startup check passed it: %v", c.name, err)
		}
	}
	if err := CheckChatTemplate(`{{ raise_exception('system message required') }}`, "", ""); err != nil {
		t.Errorf("a template with its own rules is not broken: %v", err)
	}
	if err := CheckChatTemplate(`{{ messages[0].content | nofilter }}`, "", ""); err == nil {
		t.Error("an unknown filter passed the check")
	}
}

func TestStrftime(t *testing.T) {
	at := time.Date(2024, time.July, 6, 15, 4, 5, 0, time.UTC)
	if got := strftime(at, "%d %b %Y|%B %e, %y|%A %a %H:%M:%S %I%p %j %% %Q"); got != "06 Jul 2024|July  6, 24|Saturday Sat 15:04:05 03PM 188 % %Q" {
		t.Fatalf("strftime: %q", got)
	}
}
