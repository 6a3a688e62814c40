// Package prompts reads prompts files: JSON Lines of text prompts or chat
// messages, the text workload of `worker run --prompts` and
// `worker loadgen --prompts`.
package prompts

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/model"
)

// Input is one prompt: a text, or chat messages.
type Input struct {
	Text      string              `json:"prompt,omitempty"`
	Messages  []model.ChatMessage `json:"messages,omitempty"`
	MaxTokens int                 `json:"max_tokens,omitempty"`
	// Place names where the prompt came from for messages: "--prompt" or
	// "FILE:LINE".
	Place string `json:"-"`
}

// ReadFile reads a prompts file: one JSON object per line, blank lines
// skipped. Every line is checked before anything runs; errors are usage
// errors naming FILE:LINE.
func ReadFile(path string) ([]Input, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usage.Errorf("--prompts: %v", err)
	}
	defer f.Close()
	var out []Input
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		place := fmt.Sprintf("%s:%d", path, line)
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(b, &raw); err != nil {
			return nil, usage.Errorf("%s: not a JSON object: %v", place, err)
		}
		for k := range raw {
			switch k {
			case "prompt", "text", "messages", "max_tokens":
			default:
				return nil, usage.Errorf("%s: unknown field %q (allowed: prompt, text, messages, max_tokens)", place, k)
			}
		}
		var p struct {
			Prompt    *string             `json:"prompt"`
			Text      *string             `json:"text"`
			Messages  []model.ChatMessage `json:"messages"`
			MaxTokens *int                `json:"max_tokens"`
		}
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, usage.Errorf("%s: %v", place, err)
		}
		in := Input{Messages: p.Messages, Place: place}
		n := 0
		for _, s := range []*string{p.Prompt, p.Text} {
			if s != nil {
				in.Text = *s
				n++
			}
		}
		if p.Messages != nil {
			n++
		}
		if n != 1 {
			return nil, usage.Errorf("%s: give exactly one of \"prompt\" (or \"text\") and \"messages\"", place)
		}
		if p.Messages != nil && len(p.Messages) == 0 {
			return nil, usage.Errorf("%s: \"messages\" is empty", place)
		}
		for i, m := range p.Messages {
			if m.Role == "" {
				return nil, usage.Errorf("%s: messages[%d] has no \"role\"", place, i)
			}
		}
		if p.MaxTokens != nil {
			if *p.MaxTokens < 1 {
				return nil, usage.Errorf("%s: max_tokens must be at least 1, got %d", place, *p.MaxTokens)
			}
			in.MaxTokens = *p.MaxTokens
		}
		out = append(out, in)
	}
	if err := sc.Err(); err != nil {
		return nil, usage.Errorf("--prompts %s: %v", path, err)
	}
	if len(out) == 0 {
		return nil, usage.Errorf("--prompts %s: no prompts", path)
	}
	return out, nil
}
