package model

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockstep-ai/lockstep/model/jinja"
)

// ChatMessage is one turn of a conversation.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// NullContent renders content as None (an assistant turn that only
	// calls tools sends content null).
	NullContent bool `json:"-"`
	// ToolCalls are an assistant turn's tool calls, decoded for the
	// template (DecodeOrderedJSON; each function's arguments an object, as
	// HF templates expect), and ToolCallID the call a "tool" turn answers.
	ToolCalls  []any  `json:"-"`
	ToolCallID string `json:"-"`
}

var (
	templateCache  sync.Map     // template source -> *jinja.Template
	templateCached atomic.Int32 // entries stored
)

// maxCachedTemplates bounds the cache: the models' templates, and a few of
// the templates requests bring (--trust-request-chat-template); others are
// compiled on every use.
const maxCachedTemplates = 32

// chatTemplate is the compiled template of src (compiled once while the
// cache has room).
func chatTemplate(src string) (*jinja.Template, error) {
	if src == "" {
		return nil, errors.New("model: no chat template")
	}
	if v, ok := templateCache.Load(src); ok {
		return v.(*jinja.Template), nil
	}
	tmpl, err := jinja.Compile(src, jinja.DefaultLimits())
	if err != nil {
		return nil, fmt.Errorf("model: chat template: %w", err)
	}
	if templateCached.Add(1) <= maxCachedTemplates {
		templateCache.Store(src, tmpl)
	}
	return tmpl, nil
}

// raisedError is the error of a template's own raise_exception: the
// template works, and refuses this conversation.
type raisedError struct{ msg string }

func (e *raisedError) Error() string { return e.msg }

// RenderChat renders a conversation with a Jinja chat template the way HF
// transformers' apply_chat_template(tokenize=False) does: the template sees
// messages, add_generation_prompt, bos_token and eos_token, and the
// raise_exception and strftime_now functions. Rendering is bounded
// (model/jinja's limits): a template that recurses, loops or grows without
// end fails with an error naming the limit. Encode the result with
// ParseSpecial so the template's special-token texts become tokens.
func RenderChat(template string, messages []ChatMessage, addGenerationPrompt bool, bosToken, eosToken string) (string, error) {
	return RenderChatTools(template, messages, nil, addGenerationPrompt, bosToken, eosToken)
}

// RenderChatTools is RenderChat with the request's tools (a list decoded
// by DecodeOrderedJSON; nil: none), which the template sees as tools, as
// apply_chat_template(tools=...) passes them.
func RenderChatTools(template string, messages []ChatMessage, tools []any, addGenerationPrompt bool, bosToken, eosToken string) (string, error) {
	return RenderChatKwargs(template, messages, tools, nil, addGenerationPrompt, bosToken, eosToken)
}

// ChatTemplateReserved are the names the renderer gives the template
// itself; a request's chat_template_kwargs may not set them.
var ChatTemplateReserved = []string{"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
	"raise_exception", "strftime_now"}

// RenderChatKwargs is RenderChatTools with extra variables for the template
// (a request's chat_template_kwargs, as apply_chat_template(**kwargs)
// passes them: Qwen3's enable_thinking, DeepSeek-V3.1's thinking). A
// reserved name among them is an error.
func RenderChatKwargs(template string, messages []ChatMessage, tools []any, kwargs jinja.Ordered, addGenerationPrompt bool, bosToken, eosToken string) (string, error) {
	tmpl, err := chatTemplate(template)
	if err != nil {
		return "", err
	}
	msgs := make([]any, len(messages))
	for i, m := range messages {
		var content any = m.Content
		if m.NullContent {
			content = nil
		}
		msg := jinja.Ordered{{Key: "role", Value: m.Role}, {Key: "content", Value: content}}
		if len(m.ToolCalls) > 0 {
			msg = append(msg, jinja.KV{Key: "tool_calls", Value: m.ToolCalls})
		}
		if m.ToolCallID != "" {
			msg = append(msg, jinja.KV{Key: "tool_call_id", Value: m.ToolCallID})
		}
		msgs[i] = msg
	}
	data := map[string]any{
		"messages":              msgs,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             bosToken,
		"eos_token":             eosToken,
		"raise_exception": func(args ...any) (any, error) {
			msg := "raise_exception"
			if len(args) > 0 {
				msg = fmt.Sprint(args[0])
			}
			return nil, &raisedError{msg}
		},
		"strftime_now": func(args ...any) (any, error) {
			if len(args) != 1 {
				return nil, errors.New("strftime_now takes one format")
			}
			f, ok := args[0].(string)
			if !ok {
				return nil, errors.New("strftime_now takes a format string")
			}
			return strftime(time.Now(), f), nil
		},
	}
	if tools != nil {
		data["tools"] = tools
	}
	for _, kv := range kwargs {
		if slices.Contains(ChatTemplateReserved, kv.Key) {
			return "", fmt.Errorf("model: chat template variable %q is set by the renderer, not by chat_template_kwargs", kv.Key)
		}
		data[kv.Key] = kv.Value
	}
	out, err := tmpl.Render(data)
	if err != nil {
		return "", fmt.Errorf("model: chat template: %w", err)
	}
	return out, nil
}

// CheckChatTemplate compiles a chat template and renders it once on a
// fixed two-message conversation, so that a template that is broken (or
// hits a limit) is refused when the model is loaded rather than on the
// first chat request. A template that refuses the conversation with its
// own raise_exception passes: it works, and has rules.
func CheckChatTemplate(template, bosToken, eosToken string) error {
	if template == "" {
		return nil
	}
	_, err := RenderChat(template, []ChatMessage{{Role: "user", Content: "Hello."}, {Role: "assistant", Content: "Hi! How can I help?"}},
		true, bosToken, eosToken)
	var raised *raisedError
	if err != nil && !errors.As(err, &raised) {
		return fmt.Errorf("the chat template fails on a two-message conversation: %w", err)
	}
	return nil
}
