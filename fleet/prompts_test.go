package fleet

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/model/modeltest"
)

func TestPromptFlagsRefusedUpFront(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", "hi"}, "need a real model: --model PATH"},
		{[]string{"--chat"}, "--chat and --system need --prompt"},
		{[]string{"--logprobs", "3"}, "--logprobs needs --prompt or --prompts"},
		{[]string{"--logprobs", "21"}, "--logprobs must be in -1..20 (-1 = none), got 21"},
		{[]string{"--logprobs", "-2"}, "--logprobs must be in -1..20"},
		{[]string{"--prompt-logprobs", "0"}, "--prompt-logprobs needs --prompt or --prompts"},
		{[]string{"--prompt-logprobs", "21"}, "--prompt-logprobs must be in -1..20 (-1 = none), got 21"},
		{[]string{"--model", "/nonexistent/model.gguf"}, "no such file"},
		{[]string{"--model", write("x.gguf", "not gguf")}, "not a GGUF file"},
		{[]string{"--engine", "twin", "--model", "/some/path.gguf"}, "a checkpoint needs --engine cpu, cuda or fake"},
		{[]string{"--model", "llama-9b"}, "unknown model preset"},
	} {
		_, err := ParseArgs(c.args, io.Discard)
		require.Error(t, err, "%v", c.args)
		require.Contains(t, err.Error(), c.want, "%v", c.args)
	}
}

// TestPromptsFileChecked: a bad prompts file is refused while the options
// are parsed, naming FILE:LINE (every rule of the file is tested in
// workload/prompts); the prompt flags are checked against each other; a
// valid file becomes the workload.
func TestPromptsFileChecked(t *testing.T) {
	m := modeltest.SmolLM2(t)
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "p.jsonl")
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	_, err := ParseArgs([]string{"--model", m, "--prompts", write(`{"prompt": "a"}` + "\n" + `{"prompt": "a", "temperature": 1}`)}, io.Discard)
	require.ErrorContains(t, err, `p.jsonl:2: unknown field "temperature"`)
	require.True(t, usage.Is(err))
	_, err = ParseArgs([]string{"--model", m, "--prompt", "a", "--prompts", write(`{"prompt": "b"}`)}, io.Discard)
	require.ErrorContains(t, err, "mutually exclusive")
	_, err = ParseArgs([]string{"--model", m, "--prompt", "a", "--max-tokens", "0"}, io.Discard)
	require.ErrorContains(t, err, "--max-tokens must be at least 1")

	// A valid file: text and chat prompts, a per-prompt limit; the pool is
	// sized for the checkpoint.
	o, err := ParseArgs([]string{"--model", m, "--prompts", write(`{"prompt": "Hello"}` + "\n" +
		`{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}`)}, io.Discard)
	require.NoError(t, err)
	defer o.loaded.Close()
	require.Less(t, o.Pages, 4096, "a checkpoint's default pool is sized from its KV bytes")
	reqs, err := o.promptWorkload()
	require.NoError(t, err)
	require.Len(t, reqs, 2)
	require.Equal(t, 128, reqs[0].MaxNewTokens)
	require.Equal(t, 3, reqs[1].MaxNewTokens)
	require.True(t, reqs[0].StopAtEOS && reqs[1].StopAtEOS)
	require.True(t, strings.HasPrefix(o.rendered[1].text, "<|im_start|>system\n"), o.rendered[1].text)
	require.Equal(t, []int32{19556}, reqs[0].Prompt) // "Hello"
}
