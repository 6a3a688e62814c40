package report

import (
	"errors"
	"fmt"
	"io"
	"math"
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
	// PromptLogprobs, with worker run --prompt-logprobs K: every prompt
	// token's log-probability but the first's (given the text before it),
	// its rank and the K most probable tokens' at its position; Perplexity
	// is exp of their mean negative log-probability.
	PromptLogprobs []TokenLogprob `json:"prompt_logprobs,omitempty"`
	Perplexity     float64        `json:"prompt_perplexity,omitempty"`
}

// Perplexity is exp(−mean log-probability) of lps (0 for none).
func Perplexity(lps []TokenLogprob) float64 {
	if len(lps) == 0 {
		return 0
	}
	sum := 0.0
	for _, t := range lps {
		sum += float64(t.Logprob)
	}
	return math.Exp(-sum / float64(len(lps)))
}

// TokenLogprob is one completion token: its id, text and natural-log
// probability, and the most probable tokens at its position (highest first).
type TokenLogprob struct {
	ID      int32        `json:"id"`
	Token   string       `json:"token"`
	Logprob float32      `json:"logprob"`
	Rank    int32        `json:"rank,omitempty"` // a prompt token's rank at its position (1: the most probable)
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
			errs = append(errs, writeLogprobs(w, "log-probabilities", p.Logprobs, 0))
		}
		if len(p.PromptLogprobs) > 0 {
			errs = append(errs, writeLogprobs(w, "prompt log-probabilities", p.PromptLogprobs, 1))
			_, err := fmt.Fprintf(w, "prompt perplexity %.4f over %d tokens\n", p.Perplexity, len(p.PromptLogprobs))
			errs = append(errs, err)
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

// writeLogprobs prints one line per token (positions from first: a
// completion's from 0, a prompt's from 1): its position, text,
// log-probability, the margin over the next candidate and the candidates.
func writeLogprobs(w io.Writer, what string, lps []TokenLogprob, first int) error {
	var errs []error
	_, err := fmt.Fprintf(w, "--- %s (position, token, logprob, margin over the next candidate; candidates) ---\n", what)
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
		_, err := fmt.Fprintf(w, "%4d %-16q %9.4f %s  %s\n", first+k, t.Token, t.Logprob, margin, strings.Join(top, ", "))
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
