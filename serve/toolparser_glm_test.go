package serve

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/serve/openai"
)

// GLM-4.5's and 4.7's tool calls: with newlines (4.5) or without (4.7),
// content before them, several calls, values as strings where the tool
// declares a string and JSON (or Python literals) elsewhere, and malformed
// calls left as content.
func TestParseGLM(t *testing.T) {
	strs := map[[2]string]bool{{"get_weather", "city"}: true, {"get_weather", "code"}: true}
	parse := func(text string) (string, []openai.ToolCall, bool) { return parseGLM(text, strs) }
	runParseCases(t, parse, []parseCase{
		{"no call", "It is sunny.", "It is sunny.", nil},
		{"glm45", "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
			"Let me check.\n", []string{`get_weather({"city":"Beijing","days":3})`}},
		{"glm47", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>", "", []string{`get_weather({"city":"Rome"})`}},
		{"a string that looks like a number", "<tool_call>get_weather<arg_key>code</arg_key><arg_value>007</arg_value></tool_call>", "",
			[]string{`get_weather({"code":"007"})`}},
		{"JSON and Python values", "<tool_call>f\n<arg_key>o</arg_key>\n<arg_value>{\"a\": [1, 2]}</arg_value>\n<arg_key>b</arg_key><arg_value>True</arg_value>\n" +
			"<arg_key>n</arg_key><arg_value>None</arg_value><arg_key>s</arg_key><arg_value>plain text</arg_value></tool_call>", "",
			[]string{`f({"o":{"a":[1,2]},"b":true,"n":null,"s":"plain text"})`}},
		{"two calls, no arguments", "<tool_call>now</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>", "",
			[]string{`now({})`, `get_weather({"city":"Oslo"})`}},
		{"unclosed last call", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>", "", []string{`get_weather({"city":"Rome"})`}},
		{"value without its end", "<tool_call>f<arg_key>a</arg_key><arg_value>1</tool_call>", "<tool_call>f<arg_key>a</arg_key><arg_value>1</tool_call>", nil},
		{"repeated argument", "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value></tool_call>",
			"<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value></tool_call>", nil},
		{"no name", "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", nil},
		{"text after", "<tool_call>now</tool_call> done", "<tool_call>now</tool_call> done", nil},
	})
}

// Served with --tool-call-parser glm45: the request's tools decide which
// values stay strings; whole and streamed.
func TestChatToolCallsGLM(t *testing.T) {
	s, url := toolsServer(t, "glm45")
	tools := `"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]`
	answer := "<think>ok</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
	ask := `{"max_tokens": 100, ` + tools + `, "messages": [{"role": "user", "content": "weather?"}]`
	done := postAsync(t, url+"/v1/chat/completions", ask+`}`)
	deliver(s, takeArrival(t, s), answer)
	ch := choicesOf(t, <-done)[0]
	require.Equal(t, "tool_calls", ch["finish_reason"])
	msg := ch["message"].(map[string]any)
	require.Equal(t, "<think>ok</think>\n", msg["content"])
	fn := msg["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)
	require.Equal(t, "get_weather", fn["name"])
	require.JSONEq(t, `{"city": "123", "days": 3}`, fn["arguments"].(string))

	body := streamBody(t, url+"/v1/chat/completions", ask+`, "stream": true}`)
	a := takeArrival(t, s)
	toks := s.cfg.Tokenizer.Encode(answer, model.EncodeOptions{})
	streamPieces(s, a, toks[:20], toks[20:40])
	deliverTokens(s, a, toks[40:], true, 0)
	content, calls, finish := streamedAnswer(t, <-body)
	require.Equal(t, "<think>ok</think>\n", content)
	require.Len(t, calls, 1)
	require.JSONEq(t, `{"name": "get_weather", "arguments": "{\"city\":\"123\",\"days\":3}"}`, mustJSON(t, calls[0].(map[string]any)["function"]))
	require.Equal(t, "tool_calls", finish[len(finish)-1])
}
