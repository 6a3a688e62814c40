package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/lockstep-ai/lockstep/bridge"
	"net/http"
	"strings"

	"github.com/lockstep-ai/lockstep/serve/openai"
)

// The Responses API (POST /v1/responses), stateless: a request is turned
// into the chat request it stands for (instructions as the system
// message, input as the conversation, function tools, text.format as
// response_format) and answered by the chat machinery, in the Responses
// shapes (responsesWriter). Nothing is stored: store, previous_response_id
// and background are refused.

// responsesRequest is POST /v1/responses as sent.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Stream             bool            `json:"stream"`
	Text               json.RawMessage `json:"text"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  json.RawMessage `json:"parallel_tool_calls"`
	Store              *bool           `json:"store"`
	Metadata           json.RawMessage `json:"metadata"`
	User               string          `json:"user"`
	PromptCacheKey     json.RawMessage `json:"prompt_cache_key"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Background         bool            `json:"background"`
	Reasoning          json.RawMessage `json:"reasoning"`
	Include            json.RawMessage `json:"include"`
	Truncation         json.RawMessage `json:"truncation"`
	MaxToolCalls       json.RawMessage `json:"max_tool_calls"`
	ServiceTier        json.RawMessage `json:"service_tier"`
	TopLogprobs        json.RawMessage `json:"top_logprobs"`
	Prompt             json.RawMessage `json:"prompt"`

	chat chatRequest // what it stands for (translate)
}

// translated is implemented by a request body that becomes another
// endpoint's request once decoded (parse calls translate before any
// check); param names a refused field of that request as the client
// sent it.
type translated interface {
	translate() *apiError
	param(name string) string
}

// param names chat's fields as the Responses request has them (a
// message's index is not an input item's: instructions and merged calls
// shift them, so such a field is named input).
func (r *responsesRequest) param(name string) string {
	switch {
	case name == "max_tokens":
		return "max_output_tokens"
	case name == "response_format":
		return "text.format"
	case name == "messages" || strings.HasPrefix(name, "messages["):
		return "input"
	}
	return name
}

// logprobsInclude is the include value that returns the output text's
// log-probabilities (the only one lockstep honours).
const logprobsInclude = "message.output_text.logprobs"

// translateLogprobs maps include ["message.output_text.logprobs"] and
// top_logprobs (0 to 20) onto chat's logprobs and top_logprobs: either
// asks for the output text's log-probabilities (its tokens', with the
// top_logprobs most probable tokens' at each position).
func (r *responsesRequest) translateLogprobs() *apiError {
	want := false
	if notNull(r.Include) {
		var inc []string
		if err := json.Unmarshal(r.Include, &inc); err != nil {
			return badRequest("include", "include must be a list of strings")
		}
		for _, v := range inc {
			if v != logprobsInclude {
				return badRequest("include", "include %q is not supported (only %q)", v, logprobsInclude)
			}
			want = true
		}
	}
	if notNull(r.TopLogprobs) {
		var k int
		if err := json.Unmarshal(r.TopLogprobs, &k); err != nil || k < 0 || k > bridge.MaxLogprobs {
			return badRequest("top_logprobs", "top_logprobs must be an integer in [0, %d], got %s", bridge.MaxLogprobs, r.TopLogprobs)
		}
		r.chat.TopLogprobs, want = &k, true
	}
	if want {
		r.chat.Logprobs = json.RawMessage("true")
	}
	return nil
}

// translate fills r.chat from the Responses fields, naming the first one
// it cannot honour.
func (r *responsesRequest) translate() *apiError {
	c := &r.chat
	c.Model, c.MaxTokens, c.Temperature, c.TopP, c.Stream, c.User = r.Model, r.MaxOutputTokens, r.Temperature, r.TopP, r.Stream, r.User
	c.PromptCacheKey = r.PromptCacheKey
	switch {
	case r.Store != nil && *r.Store:
		return badRequest("store", "store: true is not supported: lockstep keeps no responses (send store: false, or leave it out)")
	case notNull(r.PreviousResponseID):
		return badRequest("previous_response_id", "previous_response_id needs stored responses, which lockstep does not keep: send the conversation as input")
	case r.Background:
		return badRequest("background", "background responses are not supported")
	case notNull(r.Reasoning):
		return badRequest("reasoning", "reasoning options are not supported")
	case notNull(r.Truncation) && string(r.Truncation) != `"disabled"`:
		return badRequest("truncation", `truncation must be "disabled" (a prompt that does not fit is refused)`)
	case notNull(r.MaxToolCalls):
		return badRequest("max_tool_calls", "max_tool_calls is not supported")
	case notNull(r.ServiceTier) && string(r.ServiceTier) != `"auto"` && string(r.ServiceTier) != `"default"`:
		return badRequest("service_tier", "service_tier must be \"auto\" or \"default\"")
	case notNull(r.Prompt):
		return badRequest("prompt", "prompt templates are not supported: send the input")
	}
	if notNull(r.Metadata) && !isJSONObject(r.Metadata) {
		return badRequest("metadata", "metadata must be an object")
	}
	if e := r.translateLogprobs(); e != nil {
		return e
	}
	if e := r.translateTools(); e != nil {
		return e
	}
	if notNull(r.Text) {
		var t struct {
			Format    json.RawMessage `json:"format"`
			Verbosity json.RawMessage `json:"verbosity"`
		}
		if err := strictJSON(r.Text, &t); err != nil {
			return badRequest("text", "text must be {\"format\": {...}}: %v", err)
		}
		if notNull(t.Verbosity) && string(t.Verbosity) != `"medium"` {
			return badRequest("text.verbosity", "text.verbosity other than \"medium\" is not supported (the model's answers are as long as it writes them)")
		}
		if notNull(t.Format) {
			f, e := responseFormatOf(t.Format)
			if e != nil {
				return e
			}
			c.ResponseFormat = f
		}
	}
	var msgs []chatMessageRaw
	if r.Instructions != nil && *r.Instructions != "" {
		content, _ := json.Marshal(*r.Instructions)
		msgs = append(msgs, chatMessageRaw{Role: "system", Content: content})
	}
	in, e := inputMessages(r.Input)
	if e != nil {
		return e
	}
	c.Messages = append(msgs, in...)
	return nil
}

// strictJSON decodes raw into v, refusing fields v lacks.
func strictJSON(raw json.RawMessage, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// responseFormatOf turns text.format ({"type": "text" | "json_object" |
// "json_schema", "name", "schema", "strict", "description"}) into chat's
// response_format.
func responseFormatOf(raw json.RawMessage) (json.RawMessage, *apiError) {
	var f struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Schema      json.RawMessage `json:"schema"`
		Strict      json.RawMessage `json:"strict"`
		Description json.RawMessage `json:"description"`
	}
	if err := strictJSON(raw, &f); err != nil {
		return nil, badRequest("text.format", "text.format must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}: %v", err)
	}
	switch f.Type {
	case "text", "json_object":
		return json.RawMessage(fmt.Sprintf(`{"type": %q}`, f.Type)), nil
	case "json_schema":
		schema := f.Schema
		if !notNull(schema) {
			return nil, badRequest("text.format.schema", `text.format of type "json_schema" needs a schema`)
		}
		b, _ := json.Marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": f.Name, "schema": schema}})
		return b, nil
	}
	return nil, badRequest("text.format.type", `text.format.type must be "text", "json_object" or "json_schema", got %q`, f.Type)
}

// translateTools turns the Responses tools ({"type": "function", "name",
// "description", "parameters", "strict"}) and tool_choice ("none", "auto",
// "required", {"type": "function", "name"}) into chat's.
func (r *responsesRequest) translateTools() *apiError {
	c := &r.chat
	c.ParallelToolCalls = r.ParallelToolCalls
	if notNull(r.Tools) {
		var tools []struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description json.RawMessage `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      json.RawMessage `json:"strict"`
		}
		if err := json.Unmarshal(r.Tools, &tools); err != nil {
			return badRequest("tools", `tools must be a list of {"type": "function", "name": ..., "parameters": {...}}: %v`, err)
		}
		// Chat's shape, in the order OpenAI documents it (the template
		// prints the tools as they come).
		type function struct {
			Name        string          `json:"name"`
			Description json.RawMessage `json:"description,omitempty"`
			Parameters  json.RawMessage `json:"parameters,omitempty"`
		}
		type tool struct {
			Type     string   `json:"type"`
			Function function `json:"function"`
		}
		out := make([]tool, len(tools))
		for i, t := range tools {
			if t.Type != "function" {
				return badRequest(fmt.Sprintf("tools[%d].type", i), "tools[%d].type must be \"function\" (lockstep runs no built-in tools), got %q", i, t.Type)
			}
			out[i] = tool{Type: "function", Function: function{Name: t.Name}}
			if notNull(t.Description) {
				out[i].Function.Description = t.Description
			}
			if notNull(t.Parameters) {
				out[i].Function.Parameters = t.Parameters
			}
		}
		c.Tools, _ = json.Marshal(out)
	}
	if notNull(r.ToolChoice) {
		var named struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if json.Unmarshal(r.ToolChoice, &named) == nil && named.Type == "function" {
			c.ToolChoice, _ = json.Marshal(map[string]any{"type": "function", "function": map[string]any{"name": named.Name}})
		} else {
			c.ToolChoice = r.ToolChoice
		}
	}
	return nil
}

// inputMessages turns input (a string: one user message; or a list of
// items: messages {role, content: a string or input_text/output_text
// parts}, function_call and function_call_output) into chat messages.
func inputMessages(raw json.RawMessage) ([]chatMessageRaw, *apiError) {
	if !notNull(raw) {
		return nil, badRequest("input", "input is required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		content, _ := json.Marshal(text)
		return []chatMessageRaw{{Role: "user", Content: content}}, nil
	}
	var items []struct {
		Type      string          `json:"type"`
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Arguments string          `json:"arguments"`
		Output    json.RawMessage `json:"output"`
		ID        json.RawMessage `json:"id"`
		Status    json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequest("input", "input must be a string or a list of items: %v", err)
	}
	if len(items) == 0 {
		return nil, badRequest("input", "input must not be empty")
	}
	var out []chatMessageRaw
	for i, it := range items {
		field := fmt.Sprintf("input[%d]", i)
		switch it.Type {
		case "", "message":
			role := it.Role
			if role == "developer" {
				role = "system"
			}
			switch role {
			case "user", "system", "assistant":
			default:
				return nil, badRequest(field+".role", "%s.role must be user, system, developer or assistant, got %q", field, it.Role)
			}
			content, e := inputContent(field, it.Content)
			if e != nil {
				return nil, e
			}
			out = append(out, chatMessageRaw{Role: role, Content: content})
		case "function_call":
			if it.CallID == "" || it.Name == "" {
				return nil, badRequest(field, "%s: a function_call needs call_id and name", field)
			}
			calls, _ := json.Marshal([]map[string]any{{"id": it.CallID, "type": "function",
				"function": map[string]any{"name": it.Name, "arguments": it.Arguments}}})
			// Consecutive calls are one assistant turn.
			if n := len(out); n > 0 && out[n-1].Role == "assistant" && notNull(out[n-1].ToolCalls) && !notNull(out[n-1].Content) {
				var prev []json.RawMessage
				json.Unmarshal(out[n-1].ToolCalls, &prev) //nolint:errcheck // written above
				var more []json.RawMessage
				json.Unmarshal(calls, &more) //nolint:errcheck
				out[n-1].ToolCalls, _ = json.Marshal(append(prev, more...))
				continue
			}
			out = append(out, chatMessageRaw{Role: "assistant", ToolCalls: calls})
		case "function_call_output":
			if it.CallID == "" {
				return nil, badRequest(field+".call_id", "%s: a function_call_output needs call_id", field)
			}
			var s string
			if json.Unmarshal(it.Output, &s) != nil {
				return nil, badRequest(field+".output", "%s.output must be a string", field)
			}
			id := it.CallID
			content, _ := json.Marshal(s)
			out = append(out, chatMessageRaw{Role: "tool", Content: content, ToolCallID: &id})
		default:
			return nil, badRequest(field+".type", "%s.type %q is not supported (message, function_call, function_call_output)", field, it.Type)
		}
	}
	return out, nil
}

// inputContent is a message's content as chat takes it: a string, or its
// text parts (input_text, output_text) joined.
func inputContent(field string, raw json.RawMessage) (json.RawMessage, *apiError) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return raw, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, badRequest(field+".content", "%s.content must be a string or a list of text parts", field)
	}
	var sb []byte
	for k, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			sb = append(sb, p.Text...)
		default:
			return nil, badRequest(fmt.Sprintf("%s.content[%d].type", field, k), "%s.content[%d]: only text parts are supported, got %q", field, k, p.Type)
		}
	}
	b, _ := json.Marshal(string(sb))
	return b, nil
}

// responses is POST /v1/responses.
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	s.handle(w, r, "responses", &req, &req.chat.rawParams, restOfContext, s.chatPrompt(&req.chat))
}

// responseUsage is the Responses form of a usage.
func responseUsage(u openai.Usage, cached int) *openai.ResponseUsage {
	return &openai.ResponseUsage{InputTokens: u.Prompt, OutputTokens: u.Completion, TotalTokens: u.Total,
		InputTokensDetails: openai.InputTokensDetails{CachedTokens: cached}}
}
