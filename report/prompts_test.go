package report

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// A completion's log-probabilities print one line per token with the margin
// over the best other candidate (a sampled token below the top shows a
// negative margin; without another candidate there is none).
func TestWritePromptLogprobs(t *testing.T) {
	out := PromptOutput{Index: 0, Prompt: "The capital of France is", PromptTokens: 5, Text: " Paris.", Tokens: 2,
		FinishReason: "length", Logprobs: []TokenLogprob{
			{ID: 7, Token: " Paris", Logprob: -0.25, Top: []TopLogprob{{7, " Paris", -0.25}, {9, " the", -2.75}}},
			{ID: 3, Token: ".", Logprob: -1.5, Top: []TopLogprob{{4, ",", -1.0}, {3, ".", -1.5}}},
			{ID: 5, Token: "!", Logprob: -0.5},
		}}
	var b bytes.Buffer
	require.NoError(t, WritePromptOutputs(&b, []PromptOutput{out}))
	text := b.String()
	require.Contains(t, text, "--- log-probabilities (position, token, logprob, margin over the next candidate; candidates) ---")
	require.Contains(t, text, `   0 " Paris"           -0.2500  2.5000  " Paris" -0.2500, " the" -2.7500`)
	require.Contains(t, text, `   1 "."                -1.5000 -0.5000  "," -1.0000, "." -1.5000`)
	require.Contains(t, text, `   2 "!"                -0.5000       -  `)
	// The prompt's: positions from 1 (the first token has none), with the
	// perplexity.
	out.PromptLogprobs = []TokenLogprob{{ID: 2, Token: " capital", Logprob: -2, Rank: 3}, {ID: 4, Token: " of", Logprob: 0}}
	out.Perplexity = Perplexity(out.PromptLogprobs)
	require.InDelta(t, 2.7183, out.Perplexity, 1e-4) // exp(2/2)
	b.Reset()
	require.NoError(t, WritePromptOutputs(&b, []PromptOutput{out}))
	require.Contains(t, b.String(), "--- prompt log-probabilities (position, token, logprob, margin over the next candidate; candidates) ---")
	require.Contains(t, b.String(), `   1 " capital"         -2.0000       -`)
	require.Contains(t, b.String(), "prompt perplexity 2.7183 over 2 tokens")
	require.Zero(t, Perplexity(nil))
	out.PromptLogprobs = nil
	var plain bytes.Buffer
	out.Logprobs = nil
	require.NoError(t, WritePromptOutputs(&plain, []PromptOutput{out}))
	require.NotContains(t, plain.String(), "log-probabilities")
}
