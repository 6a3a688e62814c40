package serve

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model"
)

// A Responses request is the chat request it stands for: instructions as
// the system turn, input items as the conversation (developer as system,
// earlier calls and their outputs as assistant and tool turns), function
// tools, text.format as the guide; the answer is a response object.
func TestResponsesTranslation(t *testing.T) {
	s, url := guidedServer(t, "")
	tok := s.cfg.Tokenizer
	stop := func(a string) []int32 { return tok.Encode(a, model.EncodeOptions{}) }
	body := `{"model": "m", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0, "store": false, "metadata": {"k": "v"},
		"tools": [{"type": "function", "name": "get_weather", "description": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
		"tool_choice": "none",
		"input": [{"role": "developer", "content": "Dev."}, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Rome"}, {"type": "input_text", "text": "?"}]},
			{"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"},
			{"type": "function_call_output", "call_id": "c1", "output": "18 C"}]}`
	done := postResponse(t, url, body)
	a := takeArrival(t, s)
	require.Equal(t, `[[{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]]`+
		`<system>Be brief.<system>Dev.<user>Rome?<assistant>get_weather{"city": "Rome"}<tool>18 C`, tok.Decode(a.Prompt))
	require.Equal(t, 50, a.MaxNewTokens)
	deliverTokens(s, a, stop("It is mild."), true, 0)
	m := <-done
	require.Equal(t, "response", m["object"])
	require.Equal(t, "completed", m["status"])
	require.True(t, strings.HasPrefix(m["id"].(string), "resp_"), m["id"])
	require.Equal(t, "Be brief.", m["instructions"])
	require.Equal(t, map[string]any{"k": "v"}, m["metadata"])
	out := m["output"].([]any)
	require.Len(t, out, 1)
	msg := out[0].(map[string]any)
	require.Equal(t, "message", msg["type"])
	require.Equal(t, "assistant", msg["role"])
	require.Equal(t, "It is mild.", msg["content"].([]any)[0].(map[string]any)["text"])
	u := m["usage"].(map[string]any)
	require.EqualValues(t, len(a.Prompt), u["input_tokens"])
	require.EqualValues(t, len(stop("It is mild.")), u["output_tokens"])

	// text.format json_schema guides the answer; max_output_tokens ends it
	// incomplete.
	done = postResponse(t, url, `{"model": "m", "input": "hi", "max_output_tokens": 3,
		"text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "integer"}, "strict": true}}}`)
	a = takeArrival(t, s)
	require.Equal(t, jsonInteger, a.Guide)
	deliver(s, a, "123")
	m = <-done
	require.Equal(t, "incomplete", m["status"])
	require.Equal(t, "max_output_tokens", m["incomplete_details"].(map[string]any)["reason"])
}

// Streamed: the events of a message's text, then the final response,
// numbered in order; a forced call is a function_call item.
func TestResponsesStream(t *testing.T) {
	s, url := guidedServer(t, "")
	tok := s.cfg.Tokenizer
	body := streamBody(t, url+"/v1/responses", `{"model": "m", "input": "hi", "stream": true}`)
	a := takeArrival(t, s)
	toks := tok.Encode("Hello there", model.EncodeOptions{})
	streamPieces(s, a, toks[:3])
	deliverTokens(s, a, toks[3:], true, 0)
	evs := responseEvents(t, <-body)
	var types []string
	text := ""
	for i, ev := range evs {
		require.EqualValues(t, i, ev["sequence_number"])
		types = append(types, ev["type"].(string))
		if ev["type"] == "response.output_text.delta" {
			text += ev["delta"].(string)
		}
	}
	require.Equal(t, "Hello there", text)
	require.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}, types[:4])
	require.Equal(t, []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}, types[len(types)-4:])
	final := evs[len(evs)-1]["response"].(map[string]any)
	require.Equal(t, "completed", final["status"])
	require.Equal(t, "Hello there", final["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"])

	// An empty answer is an empty message, streamed or not.
	for _, stream := range []bool{false, true} {
		b := streamBody(t, url+"/v1/responses", fmt.Sprintf(`{"model": "m", "input": "hi", "stream": %v}`, stream))
		deliverTokens(s, takeArrival(t, s), nil, true, 0)
		var final map[string]any
		if stream {
			evs := responseEvents(t, <-b)
			final = evs[len(evs)-1]["response"].(map[string]any)
		} else {
			require.NoError(t, json.Unmarshal([]byte(<-b), &final))
		}
		out := final["output"].([]any)
		require.Len(t, out, 1, "stream %v", stream)
		require.Equal(t, "", out[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"])
	}

	tools := `"tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]`
	for _, stream := range []bool{false, true} {
		req := `{"model": "m", "input": "Rome?", "tool_choice": {"type": "function", "name": "get_weather"}, ` + tools
		var output []any
		if stream {
			b := streamBody(t, url+"/v1/responses", req+`, "stream": true}`)
			a := takeArrival(t, s)
			require.NotEmpty(t, a.Guide)
			deliverTokens(s, a, tok.Encode(`{"city": "Rome"}`, model.EncodeOptions{}), true, 0)
			evs := responseEvents(t, <-b)
			var types []string
			for _, ev := range evs {
				types = append(types, ev["type"].(string))
			}
			require.Contains(t, types, "response.function_call_arguments.done")
			require.NotContains(t, types, "response.output_text.delta")
			output = evs[len(evs)-1]["response"].(map[string]any)["output"].([]any)
		} else {
			done := postResponse(t, url, req+`}`)
			a := takeArrival(t, s)
			deliverTokens(s, a, tok.Encode(`{"city": "Rome"}`, model.EncodeOptions{}), true, 0)
			output = (<-done)["output"].([]any)
		}
		require.Len(t, output, 1, "stream %v", stream)
		call := output[0].(map[string]any)
		require.Equal(t, "function_call", call["type"])
		require.Equal(t, "get_weather", call["name"])
		require.JSONEq(t, `{"city": "Rome"}`, call["arguments"].(string))
		require.True(t, strings.HasPrefix(call["call_id"].(string), "chatcmpl-tool-"))
	}
}

// postResponse posts a Responses request and returns its body (whose
// own "status" postAsync would overwrite).
func postResponse(t *testing.T, url, body string) chan map[string]any {
	done := make(chan map[string]any, 1)
	raw := streamBody(t, url+"/v1/responses", body)
	go func() {
		var m map[string]any
		json.Unmarshal([]byte(<-raw), &m) //nolint:errcheck // checked by the caller
		done <- m
	}()
	return done
}

// responseEvents reads a Responses stream: each event's data, checking
// that its SSE name is its type.
func responseEvents(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, block := range strings.Split(strings.TrimSpace(body), "\n\n") {
		name, data, ok := strings.Cut(block, "\n")
		require.True(t, ok, "event %q", block)
		var ev map[string]any
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &ev), block)
		require.Equal(t, "event: "+ev["type"].(string), name)
		out = append(out, ev)
	}
	return out
}

func TestResponsesRefusals(t *testing.T) {
	_, url := guidedServer(t, "")
	for _, c := range []struct{ body, param, msg string }{
		{`"input": "x", "store": true`, "store", "keeps no responses"},
		{`"input": "x", "previous_response_id": "resp_1"`, "previous_response_id", "send the conversation as input"},
		{`"input": "x", "background": true`, "background", "not supported"},
		{`"input": "x", "reasoning": {"effort": "low"}`, "reasoning", "not supported"},
		{`"input": "x", "include": ["reasoning.encrypted_content"]`, "include", "not supported"},
		{`"input": "x", "include": "x"`, "include", "a list of strings"},
		{`"input": "x", "top_logprobs": 21`, "top_logprobs", "[0, 20]"},
		{`"input": "x", "truncation": "auto"`, "truncation", `"disabled"`},
		{`"input": "x", "text": {"verbosity": "low"}`, "text.verbosity", "not supported"},
		{`"input": "x", "no_such": 1`, "no_such", "not supported"},
		{`"input": []`, "input", "must not be empty"},
		{`"input": 3`, "input", "a string or a list of items"},
		{`"input": [{"type": "image", "role": "user"}]`, "input[0].type", `"image" is not supported`},
		{`"input": [{"role": "critic", "content": "x"}]`, "input[0].role", "must be user, system, developer or assistant"},
		{`"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]`, "input[0].content[0].type", "only text parts"},
		{`"input": [{"type": "function_call_output", "output": "x"}]`, "input[0].call_id", "needs call_id"},
		{`"input": "x", "tools": [{"type": "web_search"}]`, "tools[0].type", "no built-in tools"},
		{`"input": "x", "text": {"format": {"type": "xml"}}`, "text.format.type", `"text", "json_object" or "json_schema"`},
		{`"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}`, "text.format.schema", "needs a schema"},
		{`"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"not": {}}}}`, "text.format", `"not" is not supported`},
		{`"input": "x", "max_output_tokens": 0`, "max_output_tokens", "at least 1"},
	} {
		m := <-postAsync(t, url+"/v1/responses", `{"model": "m", `+c.body+`}`)
		require.Equal(t, 400.0, m["status"], c.body)
		e := m["error"].(map[string]any)
		require.Equal(t, c.param, e["param"], c.body)
		require.Contains(t, e["message"], c.msg, c.body)
	}
}

// include ["message.output_text.logprobs"] (or top_logprobs) returns the
// output text's tokens' log-probabilities in chat's shape: on the message's
// output_text part, and, streamed, on each delta and the done events.
func TestResponsesLogprobs(t *testing.T) {
	s, url := guidedServer(t, "")
	want := lpValsChat()
	done := postResponse(t, url, `{"model": "m", "input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 2}`)
	a := takeArrival(t, s)
	require.True(t, a.Logprobs)
	require.Equal(t, 2, a.TopLogprobs)
	deliverLogprobs(s, a, lpToks, lpVals)
	m := <-done
	part := m["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)
	require.Equal(t, "ab", part["text"])
	require.Equal(t, want, part["logprobs"])

	body := streamBody(t, url+"/v1/responses", `{"model": "m", "input": "hi", "stream": true, "top_logprobs": 2}`)
	a = takeArrival(t, s)
	require.True(t, a.Logprobs)
	deliverLogprobs(s, a, lpToks, lpVals)
	var deltas []any
	var done2 map[string]any
	for _, ev := range responseEvents(t, <-body) {
		switch ev["type"] {
		case "response.output_text.delta":
			deltas = append(deltas, ev["logprobs"].([]any)...)
		case "response.output_text.done":
			done2 = ev
		}
	}
	require.Equal(t, want, deltas)
	require.Equal(t, want, done2["logprobs"])

	// Without either, no logprobs anywhere.
	done = postResponse(t, url, `{"model": "m", "input": "hi"}`)
	a = takeArrival(t, s)
	require.False(t, a.Logprobs)
	deliverTokens(s, a, lpToks, false, 0)
	m = <-done
	require.NotContains(t, m["output"].([]any)[0].(map[string]any)["content"].([]any)[0], "logprobs")
}
