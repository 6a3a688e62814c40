//go:build native

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model/modeltest"
)

// promptReport is the part of a prompt run's JSON report these tests read.
type promptReport struct {
	report
	Model   string
	Outputs []struct {
		Prompt           string
		PromptTokens     int `json:"prompt_tokens"`
		Text             string
		CompletionTokens int    `json:"completion_tokens"`
		FinishReason     string `json:"finish_reason"`
		Error            string
		Logprobs         []tokenLogprob
		PromptLogprobs   []tokenLogprob `json:"prompt_logprobs"`
		Perplexity       float64        `json:"prompt_perplexity"`
	}
}

// tokenLogprob is a report's log-probabilities of one token.
type tokenLogprob struct {
	ID      int32
	Token   string
	Logprob float32
	Rank    int32
	Top     []struct {
		ID      int32
		Token   string
		Logprob float32
	} `json:"top_logprobs"`
}

func servePrompts(t *testing.T, bin string, args ...string) promptReport {
	t.Helper()
	out := serveRaw(t, bin, args...)
	var rep promptReport
	require.NoError(t, json.Unmarshal(out, &rep), string(out))
	return rep
}

// TestRealModelCompletes: the command on SmolLM2-135M: the greedy
// continuation of "The capital of France is" starts with " Paris." (as in
// llama.cpp), and --chat renders the model's own ChatML template.
func TestRealModelCompletes(t *testing.T) {
	m := modeltest.SmolLM2(t)
	bin := worker(t)
	rep := servePrompts(t, bin, "--model", m, "--prompt", "The capital of France is", "--max-tokens", "6", "--ranks", "1")
	require.Len(t, rep.Outputs, 1)
	require.Equal(t, 5, rep.Outputs[0].PromptTokens)
	require.True(t, strings.HasPrefix(rep.Outputs[0].Text, " Paris."), "continuation %q", rep.Outputs[0].Text)
	require.Equal(t, "length", rep.Outputs[0].FinishReason)

	rep = servePrompts(t, bin, "--model", m, "--chat", "--prompt", "What is 2+2?", "--max-tokens", "32", "--ranks", "1")
	require.Equal(t, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"+
		"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", rep.Outputs[0].Prompt)
	require.Equal(t, "stop", rep.Outputs[0].FinishReason, "the answer ends at <|im_end|>: %q", rep.Outputs[0].Text)
	require.NotContains(t, rep.Outputs[0].Text, "<|im_end|>")
}

// TestRealModelDigestRule: the same prompts give the same tokens on 1, 2
// and 4 ranks, on 1, 2 and 4 CPU engine threads per rank, chunked or not,
// with and without prefix reuse, under recompute preemption, in both loops,
// with Helix CP 2, and under mpirun.
func TestRealModelDigestRule(t *testing.T) {
	m := modeltest.SmolLM2(t)
	bin := worker(t)
	base := []string{"--model", m, "--prompts", "testdata/smollm2_prompts.jsonl", "--max-tokens", "24"}
	want := servePrompts(t, bin, append(base, "--ranks", "1", "--pages", "256", "--no-prefix-reuse",
		"--chunked-prefill=false", "--overlap", "off", "--cpu-threads", "1")...)
	require.Equal(t, 8, want.Requests.Completed)
	stops := 0
	for _, o := range want.Outputs {
		require.Empty(t, o.Error)
		require.NotEmpty(t, o.Text)
		if o.FinishReason == "stop" {
			stops++
		}
	}
	require.Positive(t, stops, "some chat answers end at the model's stop token")
	for _, c := range []struct {
		name    string
		args    []string
		preempt bool
	}{
		{"4 ranks, chunked, prefix reuse, overlap", []string{"--ranks", "4", "--max-num-tokens", "48"}, false},
		{"2 ranks under recompute pressure", []string{"--ranks", "2", "--pages", "8", "--max-num-tokens", "64"}, true},
		{"1 rank under pressure, overlap off", []string{"--ranks", "1", "--pages", "8", "--overlap", "off", "--chunked-prefill=false"}, true},
		{"Helix CP 2 under pressure", []string{"--cp", "2", "--pages", "5", "--max-num-tokens", "64"}, true},
		{"1 rank on 2 threads, chunked", []string{"--ranks", "1", "--cpu-threads", "2", "--max-num-tokens", "48"}, false},
		{"1 rank on 4 threads, overlap off", []string{"--ranks", "1", "--cpu-threads", "4", "--overlap", "off"}, false},
		{"2 ranks of 2 threads under pressure", []string{"--ranks", "2", "--cpu-threads", "2", "--pages", "8",
			"--max-num-tokens", "64"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := servePrompts(t, bin, append(base, c.args...)...)
			require.Equal(t, want.OutputDigest, got.OutputDigest)
			for i := range want.Outputs {
				require.Equal(t, want.Outputs[i].Text, got.Outputs[i].Text, "prompt %d", i)
			}
			if c.preempt {
				require.Positive(t, got.Preemptions.Recompute+got.Preemptions.Suspended, "the pool must force preemption")
			}
		})
	}
	t.Run("mpirun -np 2", func(t *testing.T) {
		needMPIRun(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		args := append([]string{"--oversubscribe", "-np", "2", bin, "run", "--report", "json", "--progress", "off",
			"--arrival-scale", "0", "--pages", "8"}, base...)
		cmd := exec.CommandContext(ctx, "mpirun", args...)
		cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		require.NoError(t, cmd.Run(), errb.String())
		var got promptReport
		require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
		require.Equal(t, want.OutputDigest, got.OutputDigest)
	})
}

// TestRealModelQuantDigestRule (issue 31 item 2): the quantised kernels give
// the same tokens on 1, 2 and 4 ranks, on 1, 2 and 4 threads, chunked or
// not, under recompute preemption and in both loops (their own digest, not
// the exact kernels').
func TestRealModelQuantDigestRule(t *testing.T) {
	m := modeltest.SmolLM2(t)
	bin := worker(t)
	base := []string{"--model", m, "--prompts", "testdata/smollm2_prompts.jsonl", "--max-tokens", "24", "--cpu-kernels", "quant"}
	want := servePrompts(t, bin, append(base, "--ranks", "1", "--cpu-threads", "1", "--overlap", "off",
		"--chunked-prefill=false")...)
	require.Equal(t, 8, want.Requests.Completed)
	exact := servePrompts(t, bin, "--model", m, "--prompts", "testdata/smollm2_prompts.jsonl", "--max-tokens", "24",
		"--ranks", "1", "--cpu-threads", "1")
	require.NotEqual(t, exact.OutputDigest, want.OutputDigest, "the quantised kernels gave the exact kernels' tokens: not in use?")
	for _, c := range []struct {
		name string
		args []string
	}{
		{"4 ranks, chunked, overlap", []string{"--ranks", "4", "--max-num-tokens", "48"}},
		{"1 rank on 2 threads", []string{"--ranks", "1", "--cpu-threads", "2"}},
		{"1 rank on 4 threads, chunked", []string{"--ranks", "1", "--cpu-threads", "4", "--max-num-tokens", "32"}},
		{"2 ranks of 2 threads under pressure", []string{"--ranks", "2", "--cpu-threads", "2", "--pages", "8", "--max-num-tokens", "64"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := servePrompts(t, bin, append(base, c.args...)...)
			require.Equal(t, want.OutputDigest, got.OutputDigest)
		})
	}
}

// TestRealModelLogprobs (issue 31 item 5): worker run --logprobs K gives
// every completion token its log-probability and the K most probable
// tokens', highest first; under greedy decoding the chosen token is the
// first of them, and asking changes no token.
func TestRealModelLogprobs(t *testing.T) {
	m := modeltest.SmolLM2(t)
	bin := worker(t)
	base := []string{"--model", m, "--prompts", "testdata/smollm2_prompts.jsonl", "--max-tokens", "12", "--ranks", "2"}
	plain := servePrompts(t, bin, base...)
	got := servePrompts(t, bin, append(base, "--logprobs", "4")...)
	require.Equal(t, plain.OutputDigest, got.OutputDigest, "asking for log-probabilities changed the tokens")
	for i, o := range got.Outputs {
		require.Empty(t, o.Error)
		require.Len(t, o.Logprobs, o.CompletionTokens, "prompt %d", i)
		for k, lp := range o.Logprobs {
			require.LessOrEqual(t, lp.Logprob, float32(0), "prompt %d token %d", i, k)
			require.Len(t, lp.Top, 4, "prompt %d token %d", i, k)
			require.Equal(t, lp.ID, lp.Top[0].ID, "prompt %d token %d: greedy picks the most probable", i, k)
			require.Equal(t, lp.Logprob, lp.Top[0].Logprob)
			for j := 1; j < len(lp.Top); j++ {
				require.GreaterOrEqual(t, lp.Top[j-1].Logprob, lp.Top[j].Logprob, "prompt %d token %d: top order", i, k)
			}
		}
		require.Nil(t, plain.Outputs[i].Logprobs, "no log-probabilities unless asked")
	}
	text := serveText(t, bin, "--model", m, "--prompt", "The capital of France is", "--max-tokens", "4", "--ranks", "1",
		"--logprobs", "2")
	require.Contains(t, text, "--- log-probabilities (position, token, logprob, margin over the next candidate; candidates) ---")
	require.Contains(t, text, `" Paris"`)

	// --prompt-logprobs: the prompt's entries and its perplexity; a
	// prompt that ends with the greedy continuation of the rest (" Paris"
	// after "The capital of France is", above) ranks that token first.
	got = servePrompts(t, bin, "--model", m, "--prompt", "The capital of France is Paris", "--max-tokens", "1", "--ranks", "2",
		"--prompt-logprobs", "1")
	o := got.Outputs[0]
	require.Len(t, o.PromptLogprobs, o.PromptTokens-1)
	for k, lp := range o.PromptLogprobs {
		require.LessOrEqual(t, lp.Logprob, float32(0), "prompt token %d", k+1)
		require.Positive(t, lp.Rank)
		require.Len(t, lp.Top, 1)
		if k == o.PromptTokens-2 {
			require.Equal(t, " Paris", lp.Token)
			require.Equal(t, int32(1), lp.Rank, "the greedy continuation's rank")
		}
	}
	require.Greater(t, o.Perplexity, 1.0)
	text = serveText(t, bin, "--model", m, "--prompt", "The capital of France is", "--max-tokens", "1", "--ranks", "1", "--prompt-logprobs", "0")
	require.Contains(t, text, "--- prompt log-probabilities (position, token, logprob, margin over the next candidate; candidates) ---")
	require.Contains(t, text, "prompt perplexity ")
}

// serveText runs `worker run` with the text report and returns its stdout.
func serveText(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, append([]string{"run", "--progress", "off", "--arrival-scale", "0"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), errb.String())
	return out.String()
}

// TestRealModelTrace: a Mooncake trace still runs on a real model (token
// ids synthesised within its vocabulary, output lengths as the trace says).
func TestRealModelTrace(t *testing.T) {
	m := modeltest.SmolLM2(t)
	bin := worker(t)
	trace := sharedTrace(t, "conversation_trace.jsonl")
	args := []string{"--model", m, "--trace", trace, "--limit", "6", "--length-scale", "0.01"}
	one := serve(t, bin, append(args, "--ranks", "1")...)
	two := serve(t, bin, append(args, "--ranks", "2")...)
	require.Equal(t, 6, one.Requests.Completed)
	require.Equal(t, one.OutputDigest, two.OutputDigest)
}
