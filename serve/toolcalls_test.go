package serve

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/serve/openai"
)

func TestParseHermes(t *testing.T) {
	call := `{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}`
	runParseCases(t, parseHermes, []parseCase{
		{"no call", "It is sunny.", "It is sunny.", nil},
		{"one call", "<tool_call>\n" + call + "\n</tool_call>", "", []string{`get_weather({"city":"Rome","days":2})`}},
		{"content first", "Let me look.\n<tool_call>" + call + "</tool_call>", "Let me look.\n", []string{`get_weather({"city":"Rome","days":2})`}},
		{"two calls", "<tool_call>" + call + "</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call>\n", "",
			[]string{`get_weather({"city":"Rome","days":2})`, `now({})`}},
		{"unclosed last call", "<tool_call>\n" + call + "\n", "", []string{`get_weather({"city":"Rome","days":2})`}},
		{"arguments in a string", `<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>`, "", []string{`f({"x":1})`}},
		{"not JSON", "<tool_call>get_weather(Rome)</tool_call>", "<tool_call>get_weather(Rome)</tool_call>", nil},
		{"no name", `<tool_call>{"arguments": {}}</tool_call>`, `<tool_call>{"arguments": {}}</tool_call>`, nil},
		{"arguments not an object", `<tool_call>{"name": "f", "arguments": [1]}</tool_call>`, `<tool_call>{"name": "f", "arguments": [1]}</tool_call>`, nil},
		{"text after the calls", "<tool_call>" + call + "</tool_call> and more", "<tool_call>" + call + "</tool_call> and more", nil},
	})
}

// parseCase is a parser's answer text, the content it must find and its
// calls as name(arguments) (nil: it reads none).
type parseCase struct {
	name, text, content string
	calls               []string
}

func runParseCases(t *testing.T, parse func(string) (string, []openai.ToolCall, bool), cases []parseCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			content, calls, ok := parse(c.text)
			require.Equal(t, c.calls != nil, ok)
			require.Equal(t, c.content, content)
			var got []string
			for _, tc := range calls {
				require.True(t, strings.HasPrefix(tc.ID, "chatcmpl-tool-") && len(tc.ID) == len("chatcmpl-tool-")+32, tc.ID)
				require.Equal(t, "function", tc.Type)
				got = append(got, tc.Function.Name+"("+tc.Function.Arguments+")")
			}
			require.Equal(t, c.calls, got)
		})
	}
}

func TestParseLlama3JSON(t *testing.T) {
	runParseCases(t, parseLlama3JSON, []parseCase{
		{"no call", "It is sunny.", "It is sunny.", nil},
		{"one call", `{"name": "get_weather", "parameters": {"city": "Rome"}}`, "", []string{`get_weather({"city":"Rome"})`}},
		{"python tag", `<|python_tag|>{"name": "f", "arguments": {"a": 1}}`, "", []string{`f({"a":1})`}},
		{"two calls", ` {"name": "f", "parameters": {}}; {"name": "g", "parameters": {"b": [1, 2]}};`, "", []string{`f({})`, `g({"b":[1,2]})`}},
		{"text first", `Sure. {"name": "f", "parameters": {}}`, `Sure. {"name": "f", "parameters": {}}`, nil},
		{"text after", `{"name": "f", "parameters": {}} done`, `{"name": "f", "parameters": {}} done`, nil},
		{"no name", `{"parameters": {}}`, `{"parameters": {}}`, nil},
		{"cut short", `{"name": "f", "parameters": {"a"`, `{"name": "f", "parameters": {"a"`, nil},
	})
	// Streaming: white space and a prefix of the tag wait for the next
	// piece; an answer that starts as text streams at once and is never
	// read for calls.
	p, err := newToolParser("llama3_json")
	require.NoError(t, err)
	ts := &toolStream{p: p}
	require.Equal(t, "", ts.feed(" <|py"))
	require.Equal(t, "", ts.feed(`thon_tag|>{"name": "f"}`))
	rest, calls := ts.end()
	require.Equal(t, "", rest)
	require.Len(t, calls, 1)
	ts = &toolStream{p: p}
	require.Equal(t, "", ts.feed("\n"))
	require.Equal(t, "\nSure", ts.feed("Sure"))
	require.Equal(t, ` {"name": "f"}`, ts.feed(` {"name": "f"}`))
	rest, calls = ts.end()
	require.Equal(t, "", rest)
	require.Nil(t, calls)
}

func TestParseMistral(t *testing.T) {
	runParseCases(t, parseMistral, []parseCase{
		{"no call", "It is sunny.", "It is sunny.", nil},
		{"list", `[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "now", "arguments": {}}]`, "",
			[]string{`get_weather({"city":"Rome"})`, `now({})`}},
		{"content first", `Checking.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]`, "Checking.", []string{`f({"a":1})`}},
		{"v11", `[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]now[ARGS]{}`, "",
			[]string{`get_weather({"city":"Rome"})`, `now({})`}},
		{"empty list", `[TOOL_CALLS][]`, `[TOOL_CALLS][]`, nil},
		{"not JSON", `[TOOL_CALLS][{"name": "f", "arguments": {]`, `[TOOL_CALLS][{"name": "f", "arguments": {]`, nil},
		{"v11 without args", `[TOOL_CALLS]get_weather`, `[TOOL_CALLS]get_weather`, nil},
		{"v11 args not an object", `[TOOL_CALLS]f[ARGS][1]`, `[TOOL_CALLS]f[ARGS][1]`, nil},
	})
}

// A streamed answer's text streams until a call may begin; a marker split
// across pieces is held back whole, a would-be marker that is not one is
// released by the next piece, and the calls come out at the end.
func TestToolStreamHoldsBackCalls(t *testing.T) {
	p, err := newToolParser("hermes")
	require.NoError(t, err)
	ts := &toolStream{p: p}
	var streamed []string
	for _, piece := range []string{"Hi <to", "day", " then <tool", `_call>{"name": "f", `, `"arguments": {"a": 1}}`, "</tool_call>"} {
		streamed = append(streamed, ts.feed(piece))
	}
	rest, calls := ts.end()
	require.Equal(t, []string{"Hi ", "<today", " then ", "", "", ""}, streamed)
	require.Equal(t, "", rest)
	require.Len(t, calls, 1)
	require.Equal(t, `{"a":1}`, calls[0].Function.Arguments)

	// An unreadable call ends as content; a held partial marker too.
	ts = &toolStream{p: p}
	require.Equal(t, "", ts.feed("<tool_call>oops"))
	rest, calls = ts.end()
	require.Equal(t, "<tool_call>oops", rest)
	require.Nil(t, calls)
	ts = &toolStream{p: p}
	require.Equal(t, "x", ts.feed("x<tool_"))
	rest, _ = ts.end()
	require.Equal(t, "<tool_", rest)
}

// toolsServer is a fleet server whose chat template renders tools, with
// --enable-auto-tool-choice --tool-call-parser parser.
func toolsServer(t *testing.T, parser string) (*Server, string) {
	spec := byteTokenizer(t).Spec()
	spec.ChatTemplate = `{% if tools %}[{{ tools | tojson }}]{% endif %}` +
		`{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}{% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}`
	tok, err := model.NewTokenizer(spec)
	require.NoError(t, err)
	s, _, ts := fleetServer(t, func(c *Config) { c.Tokenizer, c.ToolCallParser = tok, parser })
	return s, ts.URL
}

const weatherTool = `"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]`

// The tools reach the template as the client wrote them, and the model's
// calls come back as tool_calls with finish_reason "tool_calls", whole or
// streamed (the content before the call streams as it comes, the call in
// one delta).
func TestChatToolCalls(t *testing.T) {
	s, url := toolsServer(t, "hermes")
	answer := `Let me look.<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>`
	msgs := `"messages": [{"role": "user", "content": "Rome?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "18 C"}, {"role": "user", "content": "And Rome?"}]`

	done := postAsync(t, url+"/v1/chat/completions", `{"max_tokens": 100, `+weatherTool+`, `+msgs+`}`)
	a := takeArrival(t, s)
	prompt := s.cfg.Tokenizer.Decode(a.Prompt)
	require.Equal(t, `[[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]]`+
		`<user>Rome?<assistant>get_weather{"city": "Paris"}<tool>18 C<user>And Rome?`, prompt)
	deliver(s, a, answer)
	m := <-done
	ch := choicesOf(t, m)[0]
	require.Equal(t, "tool_calls", ch["finish_reason"])
	msg := ch["message"].(map[string]any)
	require.Equal(t, "Let me look.", msg["content"])
	calls := msg["tool_calls"].([]any)
	require.Len(t, calls, 1)
	fn := calls[0].(map[string]any)["function"].(map[string]any)
	require.Equal(t, "get_weather", fn["name"])
	require.JSONEq(t, `{"city": "Rome"}`, fn["arguments"].(string))

	body := streamBody(t, url+"/v1/chat/completions", `{"max_tokens": 100, "stream": true, `+weatherTool+`, `+msgs+`}`)
	a = takeArrival(t, s)
	toks := s.cfg.Tokenizer.Encode(answer, model.EncodeOptions{})
	streamPieces(s, a, toks[:14], toks[14:30]) // "Let me look.<t", then into the call
	deliverTokens(s, a, toks[30:], true, 0)
	content, streamedCalls, finish := streamedAnswer(t, <-body)
	require.Equal(t, "Let me look.", content)
	require.Len(t, streamedCalls, 1)
	c0 := streamedCalls[0].(map[string]any)
	require.Equal(t, 0.0, c0["index"])
	require.JSONEq(t, `{"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}`, mustJSON(t, c0["function"]))
	require.Equal(t, "tool_calls", finish[len(finish)-1])

	// tool_choice "none": the tools are shown, the answer is text.
	done = postAsync(t, url+"/v1/chat/completions", `{"max_tokens": 100, "tool_choice": "none", `+weatherTool+`, `+msgs+`}`)
	deliverTokens(s, takeArrival(t, s), toks, true, 0)
	ch = choicesOf(t, <-done)[0]
	require.Equal(t, "stop", ch["finish_reason"])
	require.Equal(t, answer, ch["message"].(map[string]any)["content"])
	require.Nil(t, ch["message"].(map[string]any)["tool_calls"])
}

// Llama 3's JSON calls, whole and streamed (the answer's first pieces
// are white space and part of the python tag).
func TestChatToolCallsLlama3JSON(t *testing.T) {
	s, url := toolsServer(t, "llama3_json")
	answer := ` <|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}`
	ask := `{"max_tokens": 100, ` + weatherTool + `, "messages": [{"role": "user", "content": "Rome?"}]`
	done := postAsync(t, url+"/v1/chat/completions", ask+`}`)
	deliver(s, takeArrival(t, s), answer)
	ch := choicesOf(t, <-done)[0]
	require.Equal(t, "tool_calls", ch["finish_reason"])
	msg := ch["message"].(map[string]any)
	require.Equal(t, "", msg["content"])
	fn := msg["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)
	require.Equal(t, "get_weather", fn["name"])
	require.Equal(t, `{"city":"Rome"}`, fn["arguments"])

	body := streamBody(t, url+"/v1/chat/completions", ask+`, "stream": true}`)
	a := takeArrival(t, s)
	toks := s.cfg.Tokenizer.Encode(answer, model.EncodeOptions{})
	streamPieces(s, a, toks[:6]) // " <|pyt"
	deliverTokens(s, a, toks[6:], true, 0)
	content, calls, _ := streamedAnswer(t, <-body)
	require.Equal(t, "", content)
	require.Len(t, calls, 1)
}

// streamPieces hands a's call each piece of tokens as one iteration's
// deltas.
func streamPieces(s *Server, a executor.Arrival, pieces ...[]int32) {
	for _, piece := range pieces {
		deltas := make([]executor.TokenDelta, len(piece))
		for i, tk := range piece {
			deltas[i] = executor.TokenDelta{ID: a.ID, Token: tk}
		}
		s.onTokens(deltas)
	}
}

// streamedAnswer puts a streamed chat answer together: its content, its
// tool calls and every chunk's finish_reason.
func streamedAnswer(t *testing.T, body string) (string, []any, []any) {
	var content strings.Builder
	var calls, finish []any
	for _, c := range sseChunks(t, body) {
		for _, ch := range choicesOf(t, c) {
			d := ch["delta"].(map[string]any)
			content.WriteString(d["content"].(string))
			if tc, ok := d["tool_calls"].([]any); ok {
				calls = append(calls, tc...)
			}
			finish = append(finish, ch["finish_reason"])
		}
	}
	return content.String(), calls, finish
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// Tools the server cannot honour are refused with 400 naming the field.
func TestToolRequestsRefused(t *testing.T) {
	_, url := toolsServer(t, "hermes")
	user := `"messages": [{"role": "user", "content": "hi"}]`
	for _, c := range []struct{ path, body, param, msg string }{
		{"/v1/chat/completions", `{"tools": {"a": 1}, ` + user + `}`, "tools", "tools must be a list"},
		{"/v1/chat/completions", `{"tools": [{"type": "code"}], ` + user + `}`, "tools[0].type", `must be "function"`},
		{"/v1/chat/completions", `{"tools": [{"type": "function"}], ` + user + `}`, "tools[0].function", "is required"},
		{"/v1/chat/completions", `{"tools": [{"type": "function", "function": {"name": "a b"}}], ` + user + `}`, "tools[0].function.name", "letters, digits"},
		{"/v1/chat/completions", `{"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}], ` + user + `}`, "tools[0].function.parameters", "JSON Schema object"},
		{"/v1/chat/completions", `{"tool_choice": {"type": "function", "function": {"name": "get_time"}}, ` + weatherTool + `, ` + user + `}`, "tool_choice", "not one of the request's tools"},
		{"/v1/chat/completions", `{"tool_choice": {"type": "function", "function": {"name": "f"}}, ` + user + `}`, "tool_choice", "has no tools"},
		{"/v1/chat/completions", `{"tool_choice": {"type": "function"}, ` + weatherTool + `, ` + user + `}`, "tool_choice", `{"type": "function", "function": {"name": ...}}`},
		{"/v1/chat/completions", `{"tool_choice": "required", "response_format": {"type": "json_object"}, ` + weatherTool + `, ` + user + `}`, "tool_choice", "constrains the output too"},
		{"/v1/chat/completions", `{"tool_choice": "required", ` + user + `}`, "tool_choice", "needs tools"},
		{"/v1/chat/completions", `{"tool_choice": "auto", ` + user + `}`, "tool_choice", "needs tools"},
		{"/v1/chat/completions", `{"tool_choice": "sometimes", ` + weatherTool + `, ` + user + `}`, "tool_choice", `"none", "auto", "required"`},
		{"/v1/chat/completions", `{"parallel_tool_calls": "yes", ` + weatherTool + `, ` + user + `}`, "parallel_tool_calls", "boolean"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}`, "messages[0].tool_calls", "only an assistant message"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi", "tool_call_id": "c"}]}`, "messages[0].tool_call_id", "only a tool message"},
		{"/v1/chat/completions", `{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]}`,
			"messages[0].tool_calls[0].function.arguments", "JSON object"},
		{"/v1/chat/completions", `{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": "{}"}}]}]}`,
			"messages[0].tool_calls[0].function.name", "is required"},
		{"/v1/completions", `{"prompt": "hi", ` + weatherTool + `}`, "tools", "chat/completions only"},
	} {
		m := <-postAsync(t, url+c.path, c.body)
		require.Equal(t, 400.0, m["status"], c.body)
		e := m["error"].(map[string]any)
		require.Equal(t, c.param, e["param"], c.body)
		require.Contains(t, e["message"], c.msg, c.body)
	}

	// Without --enable-auto-tool-choice, tools need tool_choice "none";
	// a template that never renders tools refuses them.
	_, _, plain := fleetServer(t, func(c *Config) { c.Tokenizer = chatTokenizer(t) })
	m := <-postAsync(t, plain.URL+"/v1/chat/completions", `{`+weatherTool+`, `+user+`}`)
	require.Equal(t, 400.0, m["status"])
	require.Equal(t, "tool_choice", m["error"].(map[string]any)["param"])
	require.Contains(t, m["error"].(map[string]any)["message"], "--enable-auto-tool-choice")
	m = <-postAsync(t, plain.URL+"/v1/chat/completions", `{"tool_choice": "none", `+weatherTool+`, `+user+`}`)
	require.Equal(t, 400.0, m["status"])
	require.Equal(t, "tools", m["error"].(map[string]any)["param"])
	require.Contains(t, m["error"].(map[string]any)["message"], "does not render tools")
}

// /tokenize renders a conversation's tools as the chat endpoint does.
func TestTokenizeWithTools(t *testing.T) {
	s, url := toolsServer(t, "hermes")
	msgs := `"messages": [{"role": "user", "content": "Rome?"}]`
	done := postAsync(t, url+"/v1/chat/completions", `{"max_tokens": 5, `+weatherTool+`, `+msgs+`}`)
	a := takeArrival(t, s)
	deliver(s, a, "ok")
	<-done
	m := <-postAsync(t, url+"/tokenize", `{`+weatherTool+`, `+msgs+`}`)
	require.Equal(t, 200.0, m["status"], "%v", m)
	var got []int32
	for _, v := range m["tokens"].([]any) {
		got = append(got, int32(v.(float64)))
	}
	require.Equal(t, a.Prompt, got)
	m = <-postAsync(t, url+"/tokenize", `{"prompt": "hi", `+weatherTool+`}`)
	require.Equal(t, 400.0, m["status"])
	require.Equal(t, "tools", m["error"].(map[string]any)["param"])
}

func TestParseDeepSeek(t *testing.T) {
	v3 := func(name, args string) string {
		return deepseekCallBegin + "function" + deepseekSep + name + "\n```json\n" + args + "\n```" + deepseekCallEnd
	}
	v31 := func(name, args string) string { return deepseekCallBegin + name + deepseekSep + args + deepseekCallEnd }
	runParseCases(t, parseDeepSeek, []parseCase{
		{"no call", "It is sunny.", "It is sunny.", nil},
		{"v3 one call", deepseekCallsBegin + v3("get_weather", `{"city": "Rome"}`) + deepseekCallsEnd, "", []string{`get_weather({"city":"Rome"})`}},
		{"v3 content and two calls", "Checking.\n" + deepseekCallsBegin + v3("f", `{"a": 1}`) + "\n" + v3("g", "{}") + deepseekCallsEnd,
			"Checking.\n", []string{`f({"a":1})`, `g({})`}},
		{"v31 calls", deepseekCallsBegin + v31("get_weather", `{"city": "Rome"}`) + v31("now", `{}`) + deepseekCallsEnd, "",
			[]string{`get_weather({"city":"Rome"})`, `now({})`}},
		{"no calls end marker", deepseekCallsBegin + v31("f", `{"a": [1, 2]}`), "", []string{`f({"a":[1,2]})`}},
		{"unclosed last call", deepseekCallsBegin + deepseekCallBegin + "f" + deepseekSep + `{"a": 1}`, "", []string{`f({"a":1})`}},
		{"a call without the calls marker", "x" + v31("f", "{}"), "x", []string{`f({})`}},
		{"no separator", deepseekCallsBegin + deepseekCallBegin + "f{}" + deepseekCallEnd, deepseekCallsBegin + deepseekCallBegin + "f{}" + deepseekCallEnd, nil},
		{"args not JSON", deepseekCallsBegin + v31("f", "{oops"), deepseekCallsBegin + v31("f", "{oops"), nil},
		{"v3 unclosed fence", deepseekCallsBegin + deepseekCallBegin + "function" + deepseekSep + "f\n```json\n{}", deepseekCallsBegin + deepseekCallBegin + "function" + deepseekSep + "f\n```json\n{}", nil},
		{"text after the calls", deepseekCallsBegin + v31("f", "{}") + deepseekCallsEnd + " more", deepseekCallsBegin + v31("f", "{}") + deepseekCallsEnd + " more", nil},
		{"empty calls", deepseekCallsBegin + deepseekCallsEnd, deepseekCallsBegin + deepseekCallsEnd, nil},
	})
	// Streaming: a marker split across pieces is held back.
	p, err := newToolParser("deepseek_v3")
	require.NoError(t, err)
	ts := &toolStream{p: p}
	require.Equal(t, "Sure", ts.feed("Sure<｜tool"))
	require.Equal(t, "", ts.feed("▁calls▁begin｜>"+v31("f", `{"a": 1}`)))
	rest, calls := ts.end()
	require.Equal(t, "", rest)
	require.Len(t, calls, 1)
}

func TestParsePythonic(t *testing.T) {
	runParseCases(t, parsePythonic, []parseCase{
		{"no call", "It is sunny.", "It is sunny.", nil},
		{"one call", `[get_weather(city="San Francisco", metric='celsius')]`, "", []string{`get_weather({"city":"San Francisco","metric":"celsius"})`}},
		{"two calls, no arguments", ` [now(), get_weather(city="Rome",)] `, "", []string{`now({})`, `get_weather({"city":"Rome"})`}},
		{"literals", `[f(a=1, b=-2.5, c=True, d=False, e=None, g=[1, 'x', (2, 3)], h={'k': {"n": 1e3}}, i=.5)]`, "",
			[]string{`f({"a":1,"b":-2.5,"c":true,"d":false,"e":null,"g":[1,"x",[2,3]],"h":{"k":{"n":1e3}},"i":0.5})`}},
		{"escapes", `[f(s='it\'s a "test"\n\u00e9\x41')]`, "", []string{`f({"s":"it's a \"test\"\né` + "A" + `"})`}},
		{"llama 4 tags", "<|python_start|>[f(x=1)]<|python_end|>", "", []string{`f({"x":1})`}},
		{"dotted name", `[tools.search(q="go")]`, "", []string{`search({"q":"go"})`}},
		{"positional argument", `[f(1)]`, `[f(1)]`, nil},
		{"a variable", `[f(x=y)]`, `[f(x=y)]`, nil},
		{"a call as a value", `[f(x=g())]`, `[f(x=g())]`, nil},
		{"not a list", `f(x=1)`, `f(x=1)`, nil},
		{"text after", `[f(x=1)] done`, `[f(x=1)] done`, nil},
		{"cut short", `[f(x="abc`, `[f(x="abc`, nil},
		{"empty list", `[]`, `[]`, nil},
		{"non-string key", `[f(d={1: 2})]`, `[f(d={1: 2})]`, nil},
		{"deep nesting", "[f(x=" + strings.Repeat("[", 100) + strings.Repeat("]", 100) + ")]", "[f(x=" + strings.Repeat("[", 100) + strings.Repeat("]", 100) + ")]", nil},
	})
	p, err := newToolParser("pythonic")
	require.NoError(t, err)
	ts := &toolStream{p: p}
	require.Equal(t, "", ts.feed(" <|python_"))
	require.Equal(t, "", ts.feed(`start|>[f(x=1)]`))
	rest, calls := ts.end()
	require.Equal(t, "", rest)
	require.Len(t, calls, 1)
	ts = &toolStream{p: p}
	require.Equal(t, "Hello [", ts.feed("Hello ["))
}
