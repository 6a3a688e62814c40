package report

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// PromptOutput is one prompt's result in the report of a prompt run
// (`worker run --prompt/--prompts`, `worker loadgen --prompts`).
type PromptOutput struct {
	Index        int    `json:"index"`
	Prompt       string `json:"prompt"`
	PromptTokens int    `json:"prompt_tokens"`
	Text         string `json:"text"`
	Tokens       int    `json:"completion_tokens"`
	FinishReason string `json:"finish_reason"` // "stop" or "length"
	Error        string `json:"error,omitempty"`
	// Logprobs, with worker run --logprobs K: every completion token's
	// log-probability and the K most probable tokens' at its position.
	Logprobs []TokenLogprob `json:"logprobs,omitempty"`
}

// TokenLogprob is one completion token: its id, text and natural-log
// probability, and the most probable tokens at its position (highest first).
type TokenLogprob struct {
	ID      int32        `json:"id"`
	Token   string       `json:"token"`
	Logprob float32      `json:"logprob"`
	Top     []TopLogprob `json:"top_logprobs,omitempty"`
}

// TopLogprob is one of the most probable tokens at a position.
type TopLogprob struct {
	ID      int32   `json:"id"`
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
}

// margin is how far the chosen token's log-probability lies above the best
// other candidate's (the near-tie another engine might break the other
// way); ok false when no other candidate was returned.
func (t TokenLogprob) margin() (float32, bool) {
	for _, c := range t.Top {
		if c.ID != t.ID {
			return t.Logprob - c.Logprob, true
		}
	}
	return 0, false
}

// WritePromptOutputs prints each prompt and its completion.
func WritePromptOutputs(w io.Writer, outs []PromptOutput) error {
	var errs []error
	for _, p := range outs {
		_, err := fmt.Fprintf(w, "--- prompt %d (%d tokens) ---\n%s\n--- completion (%d tokens, %s) ---\n%s\n",
			p.Index, p.PromptTokens, strings.TrimRight(p.Prompt, "\n"), p.Tokens, finishOrError(p), p.Text)
		errs = append(errs, err)
		if len(p.Logprobs) > 0 {
			errs = append(errs, writeLogprobs(w, p.Logprobs))
		}
	}
	_, err := fmt.Fprintln(w)
	return errors.Join(append(errs, err)...)
}

func finishOrError(p PromptOutput) string {
	if p.Error != "" {
		return "error: " + p.Error
	}
	return p.FinishReason
}

// writeLogprobs prints one line per completion token: its position, text,
// log-probability, the margin over the next candidate and the candidates.
func writeLogprobs(w io.Writer, lps []TokenLogprob) error {
	var errs []error
	_, err := fmt.Fprintf(w, "--- log-probabilities (position, token, logprob, margin over the next candidate; candidates) ---\n")
	errs = append(errs, err)
	for k, t := range lps {
		margin := "      -"
		if m, ok := t.margin(); ok {
			margin = fmt.Sprintf("%7.4f", m)
		}
		var top []string
		for _, c := range t.Top {
			top = append(top, fmt.Sprintf("%q %.4f", c.Token, c.Logprob))
		}
		_, err := fmt.Fprintf(w, "%4d %-16q %9.4f %s  %s\n", k, t.Token, t.Logprob, margin, strings.Join(top, ", "))
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
