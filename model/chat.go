package model

import (
	"fmt"
	"sync"

	"github.com/ardanlabs/jinja"
)

// ChatMessage is one turn of a conversation.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

var templateCache sync.Map // template source -> *jinja.Template

// RenderChat renders a conversation with a Jinja chat template the way HF
// transformers' apply_chat_template(tokenize=False) does: the template sees
// messages, add_generation_prompt, bos_token and eos_token, and the
// raise_exception and strftime_now functions. Encode the result with
// ParseSpecial so the template's special-token texts become tokens.
func RenderChat(template string, messages []ChatMessage, addGenerationPrompt bool, bosToken, eosToken string) (string, error) {
	if template == "" {
		return "", fmt.Errorf("model: no chat template")
	}
	var tmpl *jinja.Template
	if v, ok := templateCache.Load(template); ok {
		tmpl = v.(*jinja.Template)
	} else {
		var err error
		tmpl, err = jinja.Compile(template)
		if err != nil {
			return "", fmt.Errorf("model: chat template: %w", err)
		}
		templateCache.Store(template, tmpl)
	}
	msgs := make([]any, len(messages))
	for i, m := range messages {
		msgs[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	out, err := tmpl.Render(map[string]any{
		"messages":              msgs,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             bosToken,
		"eos_token":             eosToken,
	})
	if err != nil {
		return "", fmt.Errorf("model: chat template: %w", err)
	}
	return out, nil
}
