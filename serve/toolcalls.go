package serve

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/lockstep-ai/lockstep/serve/openai"
)

// Tool calling (docs/serving.md, "Tools"): with --enable-auto-tool-choice a
// chat request's tools reach the chat template, and a tool-call parser
// turns what the model wrote into the message's tool_calls, as vLLM's
// --tool-call-parser does. The parsers work on the answer's text, on rank
// 0 only: the ranks generate tokens as for any request.

// ToolCallParsers are the names --tool-call-parser takes.
var ToolCallParsers = []string{"deepseek_v3", "deepseek_v31", "glm45", "glm47", "hermes", "llama3_json", "mistral", "pythonic"}

// toolParser splits an answer into its content and its tool calls; ok
// false when the text holds no call it can read (then the whole text is
// content). For streaming, find says where in the text so far the calls
// begin (at ≥ 0), or else how many trailing bytes may still begin them
// (hold); an anchored parser reads calls only at the start of an answer,
// so once text has streamed as content it looks no more.
type toolParser struct {
	name     string
	parse    func(text string) (content string, calls []openai.ToolCall, ok bool)
	find     func(text string) (at, hold int)
	anchored bool
	// tools, when set, is the parser for a request's tools (a parser
	// that reads arguments against their schema: glm45).
	tools func(tools []any) *toolParser
}

// forRequest is the parser for a request with these tools.
func (p *toolParser) forRequest(tools []any) *toolParser {
	if p.tools == nil {
		return p
	}
	return p.tools(tools)
}

// newToolParser is the parser named by --tool-call-parser.
func newToolParser(name string) (*toolParser, error) {
	switch name {
	case "hermes":
		return &toolParser{name: name, parse: parseHermes, find: markerFinder(hermesStart)}, nil
	case "llama3_json":
		return &toolParser{name: name, parse: parseLlama3JSON, find: findLlama3JSON, anchored: true}, nil
	case "mistral":
		return &toolParser{name: name, parse: parseMistral, find: markerFinder(mistralCalls)}, nil
	case "deepseek_v3", "deepseek_v31":
		return &toolParser{name: name, parse: parseDeepSeek, find: findDeepSeek}, nil
	case "pythonic":
		return &toolParser{name: name, parse: parsePythonic, find: findPythonic, anchored: true}, nil
	case "glm45", "glm47":
		return newGLMParser(name, nil), nil
	}
	return nil, fmt.Errorf("unknown tool-call parser %q (supported: %s)", name, strings.Join(ToolCallParsers, ", "))
}

// markerFinder finds calls that open with marker anywhere in the text.
func markerFinder(marker string) func(string) (int, int) {
	return func(text string) (int, int) {
		if at := strings.Index(text, marker); at >= 0 {
			return at, 0
		}
		return -1, partialSuffix(text, marker)
	}
}

// Hermes' format (NousResearch Hermes 2 Pro and later, Qwen2.5, and the
// templates written for it): each call is a JSON object {"name": ...,
// "arguments": {...}} between <tool_call> and </tool_call>; text before the
// first call is the message's content. The last call may lack its closing
// tag (the answer stopped at the end-of-turn token right after the JSON).
const (
	hermesStart = "<tool_call>"
	hermesEnd   = "</tool_call>"
)

func parseHermes(text string) (string, []openai.ToolCall, bool) {
	at := strings.Index(text, hermesStart)
	if at < 0 {
		return text, nil, false
	}
	content := text[:at]
	var calls []openai.ToolCall
	for rest := text[at:]; ; {
		body, ok := strings.CutPrefix(rest, hermesStart)
		if !ok {
			// Only whitespace may follow or separate the calls.
			if strings.TrimSpace(rest) != "" {
				return text, nil, false
			}
			break
		}
		end := strings.Index(body, hermesEnd)
		if end < 0 {
			end = len(body) // an unclosed last call
		}
		call, err := hermesCall(body[:end])
		if err != nil {
			return text, nil, false
		}
		calls = append(calls, call)
		rest = strings.TrimLeft(body[min(len(body), end+len(hermesEnd)):], " \t\r\n")
	}
	return content, calls, true
}

// hermesCall reads one call's JSON {"name": ..., "arguments": ...}
// (functionCall).
func hermesCall(body string) (openai.ToolCall, error) {
	var raw struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &raw); err != nil {
		return openai.ToolCall{}, err
	}
	return functionCall(raw.Name, raw.Arguments)
}

// functionCall is a call of name with arguments that are an object
// (written compactly, keys in the model's order), a string holding one,
// or absent ({}); a call needs a name.
func functionCall(name string, arguments json.RawMessage) (openai.ToolCall, error) {
	if name == "" {
		return openai.ToolCall{}, fmt.Errorf("a tool call without a name")
	}
	args := "{}"
	if notNull(arguments) {
		var s string
		if json.Unmarshal(arguments, &s) == nil {
			arguments = []byte(s)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(arguments, &obj); err != nil {
			return openai.ToolCall{}, fmt.Errorf("tool call %q: arguments are not a JSON object", name)
		}
		var b bytes.Buffer
		if err := json.Compact(&b, arguments); err != nil {
			return openai.ToolCall{}, err
		}
		args = b.String()
	}
	return openai.ToolCall{ID: toolCallID(), Type: "function", Function: openai.ToolCallFunction{Name: name, Arguments: args}}, nil
}

// toolCallID is a fresh call id ("chatcmpl-tool-" and 32 hex digits, as
// vLLM names them).
func toolCallID() string {
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand does not fail on Linux
	return "chatcmpl-tool-" + hex.EncodeToString(b[:])
}

// toolStream is a streamed choice's view of its text under a tool parser:
// text streams as content until a call may begin (what may still open one
// is held back until the next piece decides), and from a call's start
// everything is held until the answer ends, when the calls are parsed (or,
// unreadable, sent as content after all).
type toolStream struct {
	p       *toolParser
	held    string
	started bool
	sent    bool // some text streamed as content
}

// feed takes the next piece of text and returns what may stream now.
func (t *toolStream) feed(piece string) string {
	switch {
	case t.started:
		t.held += piece
		return ""
	case t.p.anchored && t.sent:
		return piece
	}
	text := t.held + piece
	out := text
	if at, hold := t.p.find(text); at >= 0 {
		t.started, t.held, out = true, text[at:], text[:at]
	} else {
		t.held, out = text[len(text)-hold:], text[:len(text)-hold]
	}
	t.sent = t.sent || out != ""
	return out
}

// end returns, once the answer is over, the content still to stream and
// the tool calls (nil when none were read).
func (t *toolStream) end() (string, []openai.ToolCall) {
	rest := t.held
	t.held = ""
	if !t.started {
		return rest, nil
	}
	content, calls, ok := t.p.parse(rest)
	if !ok {
		return rest, nil
	}
	return content, calls
}

// partialSuffix is the length of the longest suffix of text that is a
// proper prefix of marker.
func partialSuffix(text, marker string) int {
	for n := min(len(text), len(marker)-1); n > 0; n-- {
		if strings.HasSuffix(text, marker[:n]) {
			return n
		}
	}
	return 0
}

// Llama 3.1 and 3.2's JSON tool calls (vLLM's llama3_json): an answer that
// is, after an optional <|python_tag|>, one or more JSON objects
// {"name": ..., "parameters": {...}} ("arguments" also read), separated by
// semicolons. An answer that starts otherwise is content.
const llamaPythonTag = "<|python_tag|>"

func parseLlama3JSON(text string) (string, []openai.ToolCall, bool) {
	rest := strings.TrimSpace(text)
	rest = strings.TrimSpace(strings.TrimPrefix(rest, llamaPythonTag))
	if !strings.HasPrefix(rest, "{") {
		return text, nil, false
	}
	var calls []openai.ToolCall
	for rest != "" {
		d := json.NewDecoder(strings.NewReader(rest))
		var raw struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
			Arguments  json.RawMessage `json:"arguments"`
		}
		if err := d.Decode(&raw); err != nil {
			return text, nil, false
		}
		args := raw.Parameters
		if !notNull(args) {
			args = raw.Arguments
		}
		call, err := functionCall(raw.Name, args)
		if err != nil {
			return text, nil, false
		}
		calls = append(calls, call)
		rest = strings.TrimSpace(rest[d.InputOffset():])
		if next, ok := strings.CutPrefix(rest, ";"); ok {
			rest = strings.TrimSpace(next)
			if rest == "" {
				break
			}
		} else if rest != "" {
			return text, nil, false
		}
	}
	return "", calls, true
}

// findLlama3JSON: calls begin at the start of the answer when its first
// text (past white space) opens a JSON object or is the python tag; white
// space and a prefix of the tag are held until that is known.
func findLlama3JSON(text string) (int, int) { return anchoredFind(text, "{", llamaPythonTag) }

// anchoredFind: calls begin at the start of the answer when its first text
// (past white space) is opener or tag; white space and a prefix of the tag
// are held until that is known.
func anchoredFind(text, opener, tag string) (int, int) {
	s := strings.TrimLeft(text, " \t\r\n")
	switch {
	case strings.HasPrefix(s, opener) || strings.HasPrefix(s, tag):
		return 0, 0
	case strings.HasPrefix(tag, s): // "" included
		return -1, len(text)
	}
	return -1, 0
}

// Mistral's tool calls (vLLM's mistral): content, then the control token
// [TOOL_CALLS] and either a JSON list of {"name": ..., "arguments": {...}}
// (Mistral 7B v0.3, Mixtral 8x22B, Mistral-Nemo) or, from the v11
// tokenizer on, one name[ARGS]{...} per [TOOL_CALLS].
const (
	mistralCalls = "[TOOL_CALLS]"
	mistralArgs  = "[ARGS]"
)

func parseMistral(text string) (string, []openai.ToolCall, bool) {
	at := strings.Index(text, mistralCalls)
	if at < 0 {
		return text, nil, false
	}
	content, rest := text[:at], strings.TrimSpace(text[at+len(mistralCalls):])
	var calls []openai.ToolCall
	if strings.HasPrefix(rest, "[") {
		var list []struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal([]byte(rest), &list); err != nil || len(list) == 0 {
			return text, nil, false
		}
		for _, c := range list {
			call, err := functionCall(c.Name, c.Arguments)
			if err != nil {
				return text, nil, false
			}
			calls = append(calls, call)
		}
		return content, calls, true
	}
	for _, one := range strings.Split(rest, mistralCalls) {
		name, args, ok := strings.Cut(strings.TrimSpace(one), mistralArgs)
		if !ok {
			return text, nil, false
		}
		call, err := functionCall(strings.TrimSpace(name), json.RawMessage(strings.TrimSpace(args)))
		if err != nil || !isJSONObject(json.RawMessage(strings.TrimSpace(args))) {
			return text, nil, false
		}
		calls = append(calls, call)
	}
	return content, calls, true
}
