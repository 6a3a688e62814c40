package serve

import (
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/model/jinja"
)

// toolName is OpenAI's rule for a function's name.
var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// checkTools reads tools, tool_choice and parallel_tool_calls (chat: the
// endpoint's default max_tokens is the rest of the context). Completions
// take none of them. tool_choice defaults to "auto" with tools and "none"
// without, as OpenAI's and vLLM's do; "required" and a named function
// would force the model's output, which takes guided decoding.
func (r *rawParams) checkTools(p *genParams, chat bool) *apiError {
	hasTools := notNull(r.Tools) && string(r.Tools) != "[]"
	if !chat {
		switch {
		case hasTools:
			return badRequest("tools", "tools apply to /v1/chat/completions only")
		case notNull(r.ToolChoice) && string(r.ToolChoice) != `"none"`:
			return badRequest("tool_choice", "tool_choice applies to /v1/chat/completions only")
		case notNull(r.ParallelToolCalls):
			return badRequest("parallel_tool_calls", "parallel_tool_calls applies to /v1/chat/completions only")
		}
		return nil
	}
	p.ParallelToolCalls = true
	if notNull(r.ParallelToolCalls) {
		if err := json.Unmarshal(r.ParallelToolCalls, &p.ParallelToolCalls); err != nil {
			return badRequest("parallel_tool_calls", "parallel_tool_calls must be a boolean")
		}
	}
	if hasTools {
		if e := checkToolList(r.Tools); e != nil {
			return e
		}
		v, err := model.DecodeOrderedJSON(r.Tools)
		if err != nil {
			return badRequest("tools", "tools: %v", err)
		}
		p.Tools = v.([]any) // checkToolList saw a list
	}
	p.ToolChoice = "none"
	if hasTools {
		p.ToolChoice = "auto"
	}
	if notNull(r.ToolChoice) {
		var choice string
		if err := json.Unmarshal(r.ToolChoice, &choice); err != nil {
			return badRequest("tool_choice", "tool_choice %s names a function to call: forcing a call takes guided decoding, "+
				"which lockstep does not do (use \"auto\" or \"none\")", r.ToolChoice)
		}
		switch choice {
		case "none", "auto":
			p.ToolChoice = choice
		case "required":
			return badRequest("tool_choice", "tool_choice \"required\" forces a call: that takes guided decoding, "+
				"which lockstep does not do (use \"auto\" or \"none\")")
		default:
			return badRequest("tool_choice", "tool_choice must be \"none\" or \"auto\", got %q", choice)
		}
		if choice == "auto" && !hasTools {
			return badRequest("tool_choice", "tool_choice \"auto\" needs tools")
		}
	}
	return nil
}

// checkToolList checks the shape OpenAI gives tools: a list of
// {"type": "function", "function": {"name", "description"?, "parameters"?}},
// names as OpenAI allows them, parameters a JSON Schema object.
func checkToolList(raw json.RawMessage) *apiError {
	var tools []struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string          `json:"name"`
			Description json.RawMessage `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return badRequest("tools", `tools must be a list of {"type": "function", "function": {"name": ..., "parameters": {...}}}: %v`, err)
	}
	for i, t := range tools {
		field := fmt.Sprintf("tools[%d]", i)
		switch {
		case t.Type != "function":
			return badRequest(field+".type", "%s.type must be \"function\", got %q", field, t.Type)
		case t.Function == nil:
			return badRequest(field+".function", "%s.function is required", field)
		case !toolName.MatchString(t.Function.Name):
			return badRequest(field+".function.name", "%s.function.name must be 1 to 64 letters, digits, _ or -, got %q", field, t.Function.Name)
		case notNull(t.Function.Description) && !isJSONString(t.Function.Description):
			return badRequest(field+".function.description", "%s.function.description must be a string", field)
		case notNull(t.Function.Parameters) && !isJSONObject(t.Function.Parameters):
			return badRequest(field+".function.parameters", "%s.function.parameters must be a JSON Schema object", field)
		}
	}
	return nil
}

// messageToolCalls reads an assistant message's tool_calls for the
// template: each {"id", "type": "function", "function": {"name",
// "arguments"}}, whose arguments (a JSON object in a string, as OpenAI
// sends them) become an object, as HF templates read them.
func messageToolCalls(i int, raw json.RawMessage) ([]any, *apiError) {
	field := fmt.Sprintf("messages[%d].tool_calls", i)
	var calls []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function *struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &calls); err != nil {
		return nil, badRequest(field, "%s must be a list of tool calls: %v", field, err)
	}
	out := make([]any, len(calls))
	for j, c := range calls {
		f := fmt.Sprintf("%s[%d]", field, j)
		if c.Type != "" && c.Type != "function" {
			return nil, badRequest(f+".type", "%s.type must be \"function\", got %q", f, c.Type)
		}
		if c.Function == nil || c.Function.Name == "" {
			return nil, badRequest(f+".function.name", "%s.function.name is required", f)
		}
		var args any = jinja.Ordered{}
		if notNull(c.Function.Arguments) {
			text := string(c.Function.Arguments)
			var s string
			if json.Unmarshal(c.Function.Arguments, &s) == nil {
				text = s
			}
			v, err := model.DecodeOrderedJSON([]byte(text))
			if _, obj := v.(jinja.Ordered); err != nil || !obj {
				return nil, badRequest(f+".function.arguments", "%s.function.arguments must be a JSON object (in a string), got %s", f, c.Function.Arguments)
			}
			args = v
		}
		out[j] = jinja.Ordered{
			{Key: "id", Value: c.ID},
			{Key: "type", Value: "function"},
			{Key: "function", Value: jinja.Ordered{{Key: "name", Value: c.Function.Name}, {Key: "arguments", Value: args}}},
		}
	}
	return out, nil
}

func isJSONString(raw json.RawMessage) bool {
	var s string
	return json.Unmarshal(raw, &s) == nil
}

func isJSONObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil
}
