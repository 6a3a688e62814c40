package serve

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/model/jinja"
)

// A chat request's own fields: its messages, as sent, and the variables
// it gives the chat template.

// chatRequest is POST /v1/chat/completions.
type chatRequest struct {
	rawParams
	Messages []chatMessageRaw `json:"messages"`
	// ChatTemplateKwargs are extra variables for the chat template
	// (vLLM's chat_template_kwargs: Qwen3's enable_thinking, ...).
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
	// AddGenerationPrompt (default true) ends the prompt with the
	// template's opening of an assistant turn; ContinueFinalMessage
	// instead leaves the final message open for the model to continue
	// (a prefilled answer); ChatTemplate replaces the model's template
	// (with --trust-request-chat-template). vLLM's fields.
	AddGenerationPrompt  *bool   `json:"add_generation_prompt"`
	ContinueFinalMessage bool    `json:"continue_final_message"`
	ChatTemplate         *string `json:"chat_template"`
}

// generationPrompt settles add_generation_prompt against
// continue_final_message: the second, when set, makes the first default to
// false, and both true are refused.
func (r *chatRequest) generationPrompt() (bool, *apiError) {
	if !r.ContinueFinalMessage {
		return r.AddGenerationPrompt == nil || *r.AddGenerationPrompt, nil
	}
	if r.AddGenerationPrompt != nil && *r.AddGenerationPrompt {
		return false, badRequest("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true: "+
			"the first continues the final message, the second opens a new assistant turn")
	}
	return false, nil
}

// chatTemplateOf is the template a chat request renders with: its own
// chat_template when the server trusts request templates, else the
// model's.
func (s *Server) chatTemplateOf(own *string) (string, *apiError) {
	if own != nil {
		if !s.cfg.TrustRequestChatTemplate {
			return "", badRequest("chat_template", "a request's own chat_template needs worker serve --trust-request-chat-template")
		}
		if *own == "" {
			return "", badRequest("chat_template", "chat_template is empty")
		}
		return *own, nil
	}
	if s.cfg.Tokenizer == nil || s.cfg.Tokenizer.ChatTemplate() == "" {
		return "", badRequest("messages", "the model %s has no chat template: use /v1/completions, or send a chat_template (with --trust-request-chat-template)", s.cfg.ModelName)
	}
	return s.cfg.Tokenizer.ChatTemplate(), nil
}

// continueFinal cuts a conversation rendered with its final message (as
// transformers' apply_chat_template(continue_final_message=True) does)
// right after that message's text, so the model continues it: the text
// must appear in the rendering (a template that rewrites it is refused),
// its last appearance is the one cut after, and trailing white space the
// template dropped stays dropped.
func continueFinal(rendered string, final model.ChatMessage) (string, *apiError) {
	if final.Role == "" || final.NullContent {
		return "", badRequest("continue_final_message", "continue_final_message needs a final message with text content")
	}
	want := strings.TrimSpace(final.Content)
	at := strings.LastIndex(rendered, want)
	if at < 0 {
		return "", badRequest("continue_final_message", "continue_final_message: the final message does not appear in the rendered chat (the chat template changes it)")
	}
	if lead := strings.TrimLeft(final.Content, " \t\n\r\f\v"); strings.HasPrefix(rendered[at:], lead) {
		return rendered[:at+len(lead)], nil
	}
	return rendered[:at+len(want)], nil
}

// chatTemplateKwargs reads chat_template_kwargs: an object whose entries
// the template sees as variables, none of them a name the renderer sets.
func chatTemplateKwargs(raw json.RawMessage) (jinja.Ordered, *apiError) {
	if !notNull(raw) {
		return nil, nil
	}
	v, err := model.DecodeOrderedJSON(raw)
	if err != nil {
		return nil, badRequest("chat_template_kwargs", "chat_template_kwargs: %v", err)
	}
	kw, ok := v.(jinja.Ordered)
	if !ok {
		return nil, badRequest("chat_template_kwargs", "chat_template_kwargs must be an object of template variables")
	}
	for _, e := range kw {
		if slices.Contains(model.ChatTemplateReserved, e.Key) {
			return nil, badRequest("chat_template_kwargs", "chat_template_kwargs may not set %q: the server sets it (%s)",
				e.Key, strings.Join(model.ChatTemplateReserved, ", "))
		}
	}
	return kw, nil
}

// chatMessageRaw is one message of a request, as sent.
type chatMessageRaw struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID *string         `json:"tool_call_id"`
}

// messages returns the conversation with text contents.
func (r *chatRequest) messages() ([]model.ChatMessage, *apiError) {
	if len(r.Messages) == 0 {
		return nil, badRequest("messages", "messages must not be empty")
	}
	out := make([]model.ChatMessage, len(r.Messages))
	for i, m := range r.Messages {
		if m.Role == "" {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d] has no role", i)
		}
		if m.Name != "" {
			return nil, badRequest(fmt.Sprintf("messages[%d].name", i), "messages[%d].name is not supported (the chat template has no participant names)", i)
		}
		var calls []any
		if notNull(m.ToolCalls) {
			if m.Role != "assistant" {
				return nil, badRequest(fmt.Sprintf("messages[%d].tool_calls", i), "messages[%d]: only an assistant message has tool_calls", i)
			}
			var e *apiError
			if calls, e = messageToolCalls(i, m.ToolCalls); e != nil {
				return nil, e
			}
		}
		if m.ToolCallID != nil && m.Role != "tool" {
			return nil, badRequest(fmt.Sprintf("messages[%d].tool_call_id", i), "messages[%d]: only a tool message has a tool_call_id", i)
		}
		if !notNull(m.Content) && len(calls) > 0 {
			// An assistant turn that only called tools.
			out[i] = model.ChatMessage{Role: m.Role, NullContent: true, ToolCalls: calls}
			continue
		}
		var text string
		if err := json.Unmarshal(m.Content, &text); err != nil {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content must be a string or a list of text parts", i)
			}
			for _, p := range parts {
				if p.Type != "text" {
					return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content: part type %q is not supported (text only)", i, p.Type)
				}
				text += p.Text
			}
		}
		out[i] = model.ChatMessage{Role: m.Role, Content: text, ToolCalls: calls}
		if m.ToolCallID != nil {
			out[i].ToolCallID = *m.ToolCallID
		}
	}
	return out, nil
}
