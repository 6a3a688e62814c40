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
var ToolCallParsers = []string{"hermes"}

// toolParser splits an answer into its content and its tool calls; ok
// false when the text holds no call it can read (then the whole text is
// content). start is the text that opens a call, for streaming.
type toolParser struct {
	name  string
	start string
	parse func(text string) (content string, calls []openai.ToolCall, ok bool)
}

// newToolParser is the parser named by --tool-call-parser.
func newToolParser(name string) (*toolParser, error) {
	switch name {
	case "hermes":
		return &toolParser{name: name, start: hermesStart, parse: parseHermes}, nil
	}
	return nil, fmt.Errorf("unknown tool-call parser %q (supported: %s)", name, strings.Join(ToolCallParsers, ", "))
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

// hermesCall reads one call's JSON: a non-empty name, and arguments that
// are an object (written compactly, keys in the model's order), a string
// holding one, or absent ({}).
func hermesCall(body string) (openai.ToolCall, error) {
	var raw struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &raw); err != nil {
		return openai.ToolCall{}, err
	}
	if raw.Name == "" {
		return openai.ToolCall{}, fmt.Errorf("a tool call without a name")
	}
	args := "{}"
	if len(raw.Arguments) > 0 && string(raw.Arguments) != "null" {
		var s string
		if json.Unmarshal(raw.Arguments, &s) == nil {
			raw.Arguments = []byte(s)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw.Arguments, &obj); err != nil {
			return openai.ToolCall{}, fmt.Errorf("tool call %q: arguments are not a JSON object", raw.Name)
		}
		var b bytes.Buffer
		if err := json.Compact(&b, raw.Arguments); err != nil {
			return openai.ToolCall{}, err
		}
		args = b.String()
	}
	return openai.ToolCall{ID: toolCallID(), Type: "function", Function: openai.ToolCallFunction{Name: raw.Name, Arguments: args}}, nil
}

// toolCallID is a fresh call id ("chatcmpl-tool-" and 32 hex digits, as
// vLLM names them).
func toolCallID() string {
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand does not fail on Linux
	return "chatcmpl-tool-" + hex.EncodeToString(b[:])
}

// toolStream is a streamed choice's view of its text under a tool parser:
// text streams as content until a call may begin (a prefix of the
// parser's start text is held back until the next piece decides), and
// from a call's start everything is held until the answer ends, when the
// calls are parsed (or, unreadable, sent as content after all).
type toolStream struct {
	p       *toolParser
	held    string
	started bool
}

// feed takes the next piece of text and returns what may stream now.
func (t *toolStream) feed(piece string) string {
	if t.started {
		t.held += piece
		return ""
	}
	text := t.held + piece
	if at := strings.Index(text, t.p.start); at >= 0 {
		t.started, t.held = true, text[at:]
		return text[:at]
	}
	keep := partialSuffix(text, t.p.start)
	t.held = text[len(text)-keep:]
	return text[:len(text)-keep]
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
