package prompts

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/model"
)

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "p.jsonl")
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	for _, c := range []struct {
		body, want string
	}{
		{`{"prompt": "a"}` + "\n" + `{"prompt": "b", "messages": [{"role": "user", "content": "c"}]}`, "p.jsonl:2: give exactly one of"},
		{`{"prompt": "a", "temperature": 1}`, `p.jsonl:1: unknown field "temperature"`},
		{`{"messages": []}`, `"messages" is empty`},
		{`{"messages": [{"content": "x"}]}`, `messages[0] has no "role"`},
		{`{"prompt": "a", "max_tokens": 0}`, "max_tokens must be at least 1"},
		{`[1, 2]`, "not a JSON object"},
		{"\n\n", "no prompts"},
	} {
		_, err := ReadFile(write(c.body))
		require.ErrorContains(t, err, c.want, c.body)
		require.True(t, usage.Is(err), "bad input is a usage error: %v", err)
	}
	_, err := ReadFile(filepath.Join(dir, "missing.jsonl"))
	require.ErrorContains(t, err, "--prompts: ")

	p := write(`{"prompt": "Hello"}` + "\n\n" + `{"text": "Bye", "max_tokens": 2}` + "\n" +
		`{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}`)
	in, err := ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, []Input{
		{Text: "Hello", Place: p + ":1"},
		{Text: "Bye", MaxTokens: 2, Place: p + ":3"},
		{Messages: []model.ChatMessage{{Role: "user", Content: "Hi"}}, MaxTokens: 3, Place: p + ":4"},
	}, in)
}
