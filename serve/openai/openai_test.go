package openai

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWireShapes pins the bytes of each shape lockstep writes: clients and
// earlier versions saw exactly these keys, in this order.
func TestWireShapes(t *testing.T) {
	text, stop, key := " Paris", "stop", "invalid_api_key"
	ids := []int32{7}
	for _, c := range []struct {
		v    any
		want string
	}{
		{Completion{ID: "cmpl-0", Object: "text_completion", Created: 5, Model: "m",
			Choices: []Choice{{Text: &text, Logprobs: NullLogprobs, FinishReason: &stop, TokenIDs: &ids}},
			Usage:   &Usage{Prompt: 1, Completion: 2, Total: 3}},
			`{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"text":" Paris","token_ids":[7]}],"created":5,"id":"cmpl-0","model":"m","object":"text_completion","usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`},
		{Completion{ID: "chatcmpl-1", Object: "chat.completion.chunk", Model: "m",
			Choices: []Choice{{Delta: &Message{Content: "", Role: "assistant"}}}},
			`{"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0}],"created":0,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk"}`},
		{Completion{ID: "c", Object: "chat.completion.chunk", Model: "m", Choices: []Choice{}, Usage: &Usage{}},
			`{"choices":[],"created":0,"id":"c","model":"m","object":"chat.completion.chunk","usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`},
		{ErrorBody{Error: Error{Message: "bad", Type: "invalid_request_error"}},
			`{"error":{"code":null,"message":"bad","param":null,"type":"invalid_request_error"}}`},
		{ErrorBody{Error: Error{Code: &key, Message: "no", Type: "authentication_error"}},
			`{"error":{"code":"invalid_api_key","message":"no","param":null,"type":"authentication_error"}}`},
		{StreamErrorEvent{Error: StreamError{Message: "x", Type: "server_error"}},
			`{"error":{"code":null,"message":"x","type":"server_error"}}`},
		{ModelList{Object: "list", Data: []Model{{ID: "m", Object: "model", OwnedBy: "lockstep"}}},
			`{"data":[{"created":0,"id":"m","object":"model","owned_by":"lockstep"}],"object":"list"}`},
	} {
		b, err := json.Marshal(c.v)
		require.NoError(t, err)
		require.Equal(t, c.want, string(b))
	}
}

// TestReadsOtherServers: a chunk of another server (reasoning content, an
// error inside the stream) decodes into the same types.
func TestReadsOtherServers(t *testing.T) {
	var c Completion
	require.NoError(t, json.Unmarshal([]byte(`{"object":"chat.completion.chunk","choices":[{"index":0,
		"delta":{"reasoning_content":"hmm","content":null},"finish_reason":null}]}`), &c))
	require.Equal(t, "hmm", *c.Choices[0].Delta.ReasoningContent)
	require.Nil(t, c.Choices[0].FinishReason)
	require.NoError(t, json.Unmarshal([]byte(`{"object":"error","message":"overloaded"}`), &c))
	require.Equal(t, "overloaded", c.Message)
}
