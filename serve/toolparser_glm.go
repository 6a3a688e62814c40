package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/lockstep-ai/lockstep/model/jinja"
	"github.com/lockstep-ai/lockstep/serve/openai"
)

// GLM-4.5, 4.6 and 4.7's tool calls (vLLM's glm45 and glm47 parsers): each
// call is <tool_call>NAME then, per argument, <arg_key>K</arg_key>
// <arg_value>V</arg_value>, then </tool_call> (GLM-4.5 puts newlines
// between the parts, 4.7 none; either reads). A value is text: an argument
// the request's tool declares a string keeps it as written (trimmed);
// any other is read as JSON, or as Python's True, False and None, and
// failing that stays a string — as vLLM reads them against the schema.
const (
	glmKeyStart = "<arg_key>"
	glmKeyEnd   = "</arg_key>"
	glmValStart = "<arg_value>"
	glmValEnd   = "</arg_value>"
)

// newGLMParser is the glm45 parser for a request's tools (nil: none
// declared, every value read as JSON when it is).
func newGLMParser(name string, tools []any) *toolParser {
	strs := stringArguments(tools)
	return &toolParser{name: name, find: markerFinder(hermesStart), tools: func(t []any) *toolParser { return newGLMParser(name, t) },
		parse: func(text string) (string, []openai.ToolCall, bool) { return parseGLM(text, strs) }}
}

func parseGLM(text string, strs map[[2]string]bool) (string, []openai.ToolCall, bool) {
	at := strings.Index(text, hermesStart)
	if at < 0 {
		return text, nil, false
	}
	content := text[:at]
	var calls []openai.ToolCall
	for rest := text[at:]; ; {
		rest = strings.TrimLeft(rest, " \t\r\n")
		if rest == "" {
			break
		}
		body, ok := strings.CutPrefix(rest, hermesStart)
		if !ok {
			return text, nil, false
		}
		end := strings.Index(body, hermesEnd)
		if end < 0 {
			end = len(body) // an unclosed last call
		}
		call, err := glmCall(body[:end], strs)
		if err != nil {
			return text, nil, false
		}
		calls = append(calls, call)
		rest = body[min(len(body), end+len(hermesEnd)):]
	}
	return content, calls, true
}

// glmCall reads one call's body: its name, then its key/value pairs.
func glmCall(body string, strs map[[2]string]bool) (openai.ToolCall, error) {
	cut := strings.Index(body, glmKeyStart)
	if cut < 0 {
		cut = len(body)
	}
	name := strings.TrimSpace(body[:cut])
	if name == "" || strings.ContainsAny(name, "<>\n") {
		return openai.ToolCall{}, fmt.Errorf("a GLM tool call without a name")
	}
	var args bytes.Buffer
	args.WriteByte('{')
	seen := map[string]bool{}
	for rest := body[cut:]; ; {
		rest = strings.TrimLeft(rest, " \t\r\n")
		if rest == "" {
			break
		}
		key, after, ok := between(rest, glmKeyStart, glmKeyEnd)
		if !ok {
			return openai.ToolCall{}, fmt.Errorf("tool call %q: expected %s", name, glmKeyStart)
		}
		val, after2, ok := between(strings.TrimLeft(after, " \t\r\n"), glmValStart, glmValEnd)
		if !ok {
			return openai.ToolCall{}, fmt.Errorf("tool call %q: argument %q without a value", name, key)
		}
		key = strings.TrimSpace(key)
		if key == "" || seen[key] {
			return openai.ToolCall{}, fmt.Errorf("tool call %q: an empty or repeated argument %q", name, key)
		}
		seen[key] = true
		if len(seen) > 1 {
			args.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		args.Write(k)
		args.WriteByte(':')
		args.Write(glmValue(strings.TrimSpace(val), strs[[2]string{name, key}]))
		rest = after2
	}
	args.WriteByte('}')
	return functionCall(name, args.Bytes())
}

// glmValue is an argument's JSON: the text as a string when the tool says
// it is one, else its JSON (or Python literal) when it has one.
func glmValue(v string, isString bool) []byte {
	if !isString {
		switch v {
		case "True":
			return []byte("true")
		case "False":
			return []byte("false")
		case "None":
			return []byte("null")
		}
		if json.Valid([]byte(v)) {
			var b bytes.Buffer
			if json.Compact(&b, []byte(v)) == nil {
				return b.Bytes()
			}
		}
	}
	s, _ := json.Marshal(v)
	return s
}

// between cuts s = open + inner + close + rest (s must start with open).
func between(s, open, close string) (inner, rest string, ok bool) {
	body, ok := strings.CutPrefix(s, open)
	if !ok {
		return "", "", false
	}
	end := strings.Index(body, close)
	if end < 0 {
		return "", "", false
	}
	return body[:end], body[end+len(close):], true
}

// stringArguments are the (function, argument) pairs a request's tools
// declare as strings (parameters.properties.ARG.type "string").
func stringArguments(tools []any) map[[2]string]bool {
	out := map[[2]string]bool{}
	at := func(v any, key string) any { x, _ := orderedGet(v, key); return x }
	for _, t := range tools {
		fn := at(t, "function")
		name, _ := at(fn, "name").(string)
		props, _ := at(at(fn, "parameters"), "properties").(jinja.Ordered)
		for _, p := range props {
			if typ, _ := at(p.Value, "type").(string); typ == "string" {
				out[[2]string{name, p.Key}] = true
			}
		}
	}
	return out
}
