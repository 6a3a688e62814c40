package serve

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/model/jinja"
	"github.com/lockstep-ai/lockstep/serve/openai"
)

// toolName is OpenAI's rule for a function's name.
var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// checkTools reads tools, tool_choice and parallel_tool_calls (chat: the
// endpoint's default max_tokens is the rest of the context). Completions
// take none of them. tool_choice defaults to "auto" with tools and "none"
// without, as OpenAI's and vLLM's do; "required" and a named function
// force a call by guiding the answer (forceCall).
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
			return p.forceNamedTool(r.ToolChoice, hasTools)
		}
		switch choice {
		case "none", "auto", "required":
			p.ToolChoice = choice
		default:
			return badRequest("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}, got %q", choice)
		}
		if choice != "none" && !hasTools {
			return badRequest("tool_choice", "tool_choice %q needs tools", choice)
		}
		if choice == "required" {
			return p.forceCall("")
		}
	}
	return nil
}

// forceNamedTool is tool_choice {"type": "function", "function": {"name":
// N}}: the answer is a call of N (its arguments guided by N's parameters).
func (p *genParams) forceNamedTool(raw json.RawMessage, hasTools bool) *apiError {
	var named struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function == nil {
		return badRequest("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}, got %s`, raw)
	}
	if !hasTools {
		return badRequest("tool_choice", "tool_choice names the function %q, and the request has no tools", named.Function.Name)
	}
	if _, ok := toolByName(p.Tools, named.Function.Name); !ok {
		return badRequest("tool_choice", "tool_choice names the function %q, which is not one of the request's tools", named.Function.Name)
	}
	p.ToolChoice = "function"
	return p.forceCall(named.Function.Name)
}

// toolByName finds a decoded tool's function by name: its parameters
// schema (nil when it has none).
func toolByName(tools []any, name string) (any, bool) {
	for _, t := range tools {
		fn, _ := orderedGet(t, "function")
		if n, _ := orderedGet(fn, "name"); n == name {
			params, _ := orderedGet(fn, "parameters")
			return params, true
		}
	}
	return nil, false
}

// orderedGet is key's value in a decoded JSON object (nil, false when v
// is not an object or lacks it).
func orderedGet(v any, key string) (any, bool) {
	o, ok := v.(jinja.Ordered)
	if !ok {
		return nil, false
	}
	return get(o, key)
}

// forceCall makes a forced tool call's guide and parser: with name, the
// answer is that function's arguments (an object matching its parameters;
// vLLM's named tool_choice); without, it is a list of one or more calls
// [{"name": N, "parameters": {...}}, ...] of the request's tools (one with
// parallel_tool_calls false; vLLM's "required").
func (p *genParams) forceCall(name string) *apiError {
	if p.Guide != "" {
		return badRequest("tool_choice", "tool_choice %q forces a call, and %s constrains the output too: give one", p.ToolChoice, p.GuideParam)
	}
	argPattern := func(params any, fn string) (string, *apiError) {
		if params == nil {
			return objectPattern(), nil
		}
		pat, err := schemaPattern(params)
		if err != nil {
			return "", badRequest("tools", "the parameters of tool %q: %v", fn, err)
		}
		return pat, nil
	}
	if name != "" {
		params, _ := toolByName(p.Tools, name)
		pat, e := argPattern(params, name)
		if e != nil {
			return e
		}
		p.Guide, p.GuideParam, p.forced = pat, "tool_choice", &forcedCall{name: name}
		return nil
	}
	var alts []string
	for _, t := range p.Tools {
		fn, _ := orderedGet(t, "function")
		n, _ := orderedGet(fn, "name")
		fname, _ := n.(string)
		params, _ := orderedGet(fn, "parameters")
		pat, e := argPattern(params, fname)
		if e != nil {
			return e
		}
		key, _ := json.Marshal(fname)
		alts = append(alts, `\{"name"`+jsonColon+regexp.QuoteMeta(string(key))+jsonComma+`"parameters"`+jsonColon+pat+`\}`)
	}
	hi := -1
	if !p.ParallelToolCalls {
		hi = 1
	}
	p.Guide, p.GuideParam, p.forced = arrayOf("(?:"+strings.Join(alts, "|")+")", 1, hi), "tool_choice", &forcedCall{}
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

// forcedCall reads a forced call's guided answer: the named function's
// arguments, or (name "") the list of calls of tool_choice "required".
type forcedCall struct{ name string }

func (f *forcedCall) parse(text string) (string, []openai.ToolCall, bool) {
	if f.name != "" {
		call, err := functionCall(f.name, json.RawMessage(text))
		if err != nil {
			return text, nil, false
		}
		return "", []openai.ToolCall{call}, true
	}
	var list []struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if err := json.Unmarshal([]byte(text), &list); err != nil || len(list) == 0 {
		return text, nil, false
	}
	calls := make([]openai.ToolCall, len(list))
	for i, c := range list {
		var err error
		if calls[i], err = functionCall(c.Name, c.Parameters); err != nil {
			return text, nil, false
		}
	}
	return "", calls, true
}

// parser is the tool parser of a forced call: the whole answer is the
// call(s), held back when streamed.
func (f *forcedCall) parser() *toolParser {
	return &toolParser{name: "forced", parse: f.parse, find: func(string) (int, int) { return 0, 0 }, anchored: true}
}
