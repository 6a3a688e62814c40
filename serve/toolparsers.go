package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/lockstep-ai/lockstep/serve/openai"
)

// DeepSeek's tool calls (vLLM's deepseek_v3 and deepseek_v31): content,
// then the calls between <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>, each
// between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>. DeepSeek-V3 and R1
// write function<｜tool▁sep｜>NAME, a newline and the arguments in a ```json
// fence; V3.1 and later write NAME<｜tool▁sep｜>ARGUMENTS. Both forms are read
// under either name. The last call may lack its end marker (the answer
// stopped at the end of the turn).
const (
	deepseekCallsBegin = "<｜tool▁calls▁begin｜>"
	deepseekCallsEnd   = "<｜tool▁calls▁end｜>"
	deepseekCallBegin  = "<｜tool▁call▁begin｜>"
	deepseekCallEnd    = "<｜tool▁call▁end｜>"
	deepseekSep        = "<｜tool▁sep｜>"
)

func parseDeepSeek(text string) (string, []openai.ToolCall, bool) {
	at, _ := findDeepSeek(text)
	if at < 0 {
		return text, nil, false
	}
	content := text[:at]
	rest := strings.TrimPrefix(text[at:], deepseekCallsBegin)
	var calls []openai.ToolCall
	for {
		rest = strings.TrimLeft(rest, " \t\r\n")
		if after, ok := strings.CutPrefix(rest, deepseekCallsEnd); ok {
			if strings.TrimSpace(after) != "" {
				return text, nil, false
			}
			break
		}
		if rest == "" {
			break // the calls' end marker is optional at the end of the answer
		}
		body, ok := strings.CutPrefix(rest, deepseekCallBegin)
		if !ok {
			return text, nil, false
		}
		end := strings.Index(body, deepseekCallEnd)
		if end < 0 {
			end = len(body)
		}
		call, err := deepseekCall(body[:end])
		if err != nil {
			return text, nil, false
		}
		calls = append(calls, call)
		rest = body[min(len(body), end+len(deepseekCallEnd)):]
	}
	if len(calls) == 0 {
		return text, nil, false
	}
	return content, calls, true
}

// deepseekCall reads one call's body (between its begin and end markers).
func deepseekCall(body string) (openai.ToolCall, error) {
	left, right, ok := strings.Cut(body, deepseekSep)
	if !ok {
		return openai.ToolCall{}, fmt.Errorf("a DeepSeek tool call without %s", deepseekSep)
	}
	if fence := strings.Index(right, "```json"); strings.TrimSpace(left) == "function" && fence >= 0 {
		// V3 / R1: function<｜tool▁sep｜>NAME\n```json\nARGS\n```
		name := strings.TrimSpace(right[:fence])
		args := right[fence+len("```json"):]
		close := strings.LastIndex(args, "```")
		if close < 0 {
			return openai.ToolCall{}, fmt.Errorf("tool call %q: unclosed ```json fence", name)
		}
		return functionCall(name, json.RawMessage(strings.TrimSpace(args[:close])))
	}
	// V3.1: NAME<｜tool▁sep｜>ARGS
	args := strings.TrimSpace(right)
	if !isJSONObject(json.RawMessage(args)) {
		return openai.ToolCall{}, fmt.Errorf("tool call %q: arguments are not a JSON object", left)
	}
	return functionCall(strings.TrimSpace(left), json.RawMessage(args))
}

// findDeepSeek: calls begin at the first begin marker (of the calls, or
// of a call written without it).
func findDeepSeek(text string) (int, int) {
	at := -1
	for _, m := range []string{deepseekCallsBegin, deepseekCallBegin} {
		if i := strings.Index(text, m); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	if at >= 0 {
		return at, 0
	}
	return -1, max(partialSuffix(text, deepseekCallsBegin), partialSuffix(text, deepseekCallBegin))
}

// Python-style tool calls (vLLM's pythonic; Llama 3.2 and 4 with their
// pythonic templates): an answer that is, optionally between
// <|python_start|> and <|python_end|>, a Python list of calls with keyword
// arguments whose values are literals: [get_weather(city="Rome"), now()].
// Strings, numbers, True, False, None, lists, tuples and dicts with string
// keys become JSON. An answer that starts otherwise is content.
const (
	pythonStart = "<|python_start|>"
	pythonEnd   = "<|python_end|>"
)

func parsePythonic(text string) (string, []openai.ToolCall, bool) {
	s := strings.TrimSpace(text)
	if inner, ok := strings.CutPrefix(s, pythonStart); ok {
		s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(inner), pythonEnd))
	}
	p := &pyParser{s: s}
	calls, err := p.callList()
	if err != nil || len(calls) == 0 {
		return text, nil, false
	}
	return "", calls, true
}

// findPythonic: calls begin at the start of the answer when its first
// text (past white space) opens a list or is the python start tag.
func findPythonic(text string) (int, int) { return anchoredFind(text, "[", pythonStart) }

// pyParser reads Python literals into JSON.
type pyParser struct {
	s     string
	i     int
	depth int
}

// maxPyDepth bounds the nesting of a call's argument values.
const maxPyDepth = 64

func (p *pyParser) space() {
	for p.i < len(p.s) && strings.IndexByte(" \t\r\n", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *pyParser) eat(c byte) bool {
	p.space()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *pyParser) ident() string {
	p.space()
	j := p.i
	for j < len(p.s) {
		c := p.s[j]
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || j > p.i && c >= '0' && c <= '9' {
			j++
			continue
		}
		break
	}
	id := p.s[p.i:j]
	p.i = j
	return id
}

func (p *pyParser) errorf(format string, a ...any) error {
	return fmt.Errorf("pythonic tool call at byte %d: %s", p.i, fmt.Sprintf(format, a...))
}

// callList reads [call, call, ...] to the end of the text.
func (p *pyParser) callList() ([]openai.ToolCall, error) {
	if !p.eat('[') {
		return nil, p.errorf("want [")
	}
	var calls []openai.ToolCall
	for !p.eat(']') {
		if len(calls) > 0 && !p.eat(',') {
			return nil, p.errorf("want , or ]")
		}
		if p.eat(']') {
			break // a trailing comma
		}
		call, err := p.call()
		if err != nil {
			return nil, err
		}
		calls = append(calls, call)
	}
	p.space()
	if p.i != len(p.s) {
		return nil, p.errorf("text after the list")
	}
	return calls, nil
}

// call reads name(key=value, ...); a dotted name keeps its last part.
func (p *pyParser) call() (openai.ToolCall, error) {
	name := p.ident()
	for name != "" && p.eat('.') {
		name = p.ident()
	}
	if name == "" || !p.eat('(') {
		return openai.ToolCall{}, p.errorf("want a call name(...)")
	}
	var args bytes.Buffer
	args.WriteByte('{')
	n := 0
	for !p.eat(')') {
		if n > 0 && !p.eat(',') {
			return openai.ToolCall{}, p.errorf("want , or )")
		}
		if p.eat(')') {
			break
		}
		key := p.ident()
		if key == "" || !p.eat('=') {
			return openai.ToolCall{}, p.errorf("%s: arguments must be keyword arguments (name=value)", name)
		}
		if n > 0 {
			args.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		args.Write(k)
		args.WriteByte(':')
		if err := p.value(&args); err != nil {
			return openai.ToolCall{}, err
		}
		n++
	}
	args.WriteByte('}')
	return functionCall(name, json.RawMessage(args.Bytes()))
}

// value reads one literal and writes it as JSON.
func (p *pyParser) value(out *bytes.Buffer) error {
	if p.depth++; p.depth > maxPyDepth {
		return p.errorf("values nested deeper than %d", maxPyDepth)
	}
	defer func() { p.depth-- }()
	p.space()
	if p.i >= len(p.s) {
		return p.errorf("want a value")
	}
	switch c := p.s[p.i]; {
	case c == '"' || c == '\'':
		s, err := p.str()
		if err != nil {
			return err
		}
		b, _ := json.Marshal(s)
		out.Write(b)
		return nil
	case c == '[' || c == '(':
		p.i++
		return p.seq(out, map[byte]byte{'[': ']', '(': ')'}[c])
	case c == '{':
		p.i++
		out.WriteByte('{')
		for n := 0; !p.eat('}'); n++ {
			if n > 0 && !p.eat(',') {
				return p.errorf("want , or }")
			}
			if p.eat('}') {
				break
			}
			p.space()
			if p.i >= len(p.s) || p.s[p.i] != '"' && p.s[p.i] != '\'' {
				return p.errorf("dict keys must be strings")
			}
			if n > 0 {
				out.WriteByte(',')
			}
			if err := p.value(out); err != nil {
				return err
			}
			if !p.eat(':') {
				return p.errorf("want :")
			}
			out.WriteByte(':')
			if err := p.value(out); err != nil {
				return err
			}
		}
		out.WriteByte('}')
		return nil
	case c == '-' || c == '+' || c == '.' || c >= '0' && c <= '9':
		j := p.i
		if c == '-' || c == '+' {
			j++
		}
		for j < len(p.s) && strings.IndexByte("0123456789.eE+-", p.s[j]) >= 0 {
			if (p.s[j] == '+' || p.s[j] == '-') && p.s[j-1] != 'e' && p.s[j-1] != 'E' {
				break
			}
			j++
		}
		f, err := strconv.ParseFloat(p.s[p.i:j], 64)
		if err != nil {
			return p.errorf("bad number %q", p.s[p.i:j])
		}
		lit := strings.TrimPrefix(p.s[p.i:j], "+")
		if !json.Valid([]byte(lit)) {
			lit = strconv.FormatFloat(f, 'g', -1, 64) // 1. or .5 in Python
		}
		out.WriteString(lit)
		p.i = j
		return nil
	}
	switch id := p.ident(); id {
	case "True":
		out.WriteString("true")
	case "False":
		out.WriteString("false")
	case "None":
		out.WriteString("null")
	default:
		return p.errorf("value %q is not a literal", id)
	}
	return nil
}

// seq reads the items of a list or tuple up to close as a JSON array.
func (p *pyParser) seq(out *bytes.Buffer, close byte) error {
	out.WriteByte('[')
	for n := 0; !p.eat(close); n++ {
		if n > 0 && !p.eat(',') {
			return p.errorf("want , or %c", close)
		}
		if p.eat(close) {
			break
		}
		if n > 0 {
			out.WriteByte(',')
		}
		if err := p.value(out); err != nil {
			return err
		}
	}
	out.WriteByte(']')
	return nil
}

// str reads a quoted Python string ('...' or "...", escapes as Python
// reads them; no triple quotes, no prefixes).
func (p *pyParser) str() (string, error) {
	q := p.s[p.i]
	p.i++
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == q:
			p.i++
			return b.String(), nil
		case c == '\n':
			return "", p.errorf("newline in a string")
		case c != '\\':
			b.WriteByte(c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.s) {
			break
		}
		e := p.s[p.i+1]
		p.i += 2
		switch e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '0':
			b.WriteByte(0)
		case '\\', '\'', '"':
			b.WriteByte(e)
		case '\n':
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if p.i+n > len(p.s) {
				return "", p.errorf("short \\%c escape", e)
			}
			v, err := strconv.ParseUint(p.s[p.i:p.i+n], 16, 32)
			if err != nil || !utf8.ValidRune(rune(v)) {
				return "", p.errorf("bad \\%c escape", e)
			}
			b.WriteRune(rune(v))
			p.i += n
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", p.errorf("unterminated string")
}
