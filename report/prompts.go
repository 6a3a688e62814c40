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
}

// WritePromptOutputs prints each prompt and its completion.
func WritePromptOutputs(w io.Writer, outs []PromptOutput) error {
	var errs []error
	for _, p := range outs {
		_, err := fmt.Fprintf(w, "--- prompt %d (%d tokens) ---\n%s\n--- completion (%d tokens, %s) ---\n%s\n",
			p.Index, p.PromptTokens, strings.TrimRight(p.Prompt, "\n"), p.Tokens, finishOrError(p), p.Text)
		errs = append(errs, err)
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
