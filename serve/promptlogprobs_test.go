package serve

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
)

// deliverScored answers a's call as the fleet does: its tokens as deltas
// (the first with the prompt's log-probabilities), then its response.
func deliverScored(s *Server, a executor.Arrival, toks []int32, lps, prompt []executor.TokenLogprobs) {
	ds := make([]executor.TokenDelta, len(toks))
	for i, t := range toks {
		ds[i] = executor.TokenDelta{ID: a.ID, Token: t}
		if lps != nil {
			ds[i].Logprobs = &lps[i]
		}
	}
	ds[0].PromptLogprobs = prompt
	s.onTokens(ds)
	s.onResponse(executor.Response{ID: a.ID, Output: toks, Logprobs: lps, ArrivalUnixNS: a.ArrivalUnixNS})
}

// The prompt "Hi!" ('H' 'i' '!'): 'i' is the top token at its position,
// '!' is third (outside the top 2, so its own entry stands beside them).
var scoredPrompt = []executor.TokenLogprobs{
	{Logprob: -0.25, Rank: 1, TopIDs: []int32{'i', 'o'}, TopLogprobs: []float32{-0.25, -2}},
	{Logprob: -3, Rank: 3, TopIDs: []int32{'.', '?'}, TopLogprobs: []float32{-0.5, -1}},
}

func TestPromptLogprobsCompletions(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi!","max_tokens":2,"prompt_logprobs":2,"n":2}`)
	as := takeArrivals(t, s, 2)
	for _, a := range as {
		require.True(t, a.PromptLogprobs, "every choice scores its prompt")
		require.Equal(t, 2, a.PromptTopLogprobs)
		require.False(t, a.Logprobs)
		deliverScored(s, a, lpToks, nil, scoredPrompt)
	}
	m := <-done
	require.Equal(t, 200.0, m["status"], m)
	want := []any{nil,
		map[string]any{"105": map[string]any{"logprob": -0.25, "rank": 1.0, "decoded_token": "i"},
			"111": map[string]any{"logprob": -2.0, "rank": 2.0, "decoded_token": "o"}},
		map[string]any{"33": map[string]any{"logprob": -3.0, "rank": 3.0, "decoded_token": "!"},
			"46": map[string]any{"logprob": -0.5, "rank": 1.0, "decoded_token": "."},
			"63": map[string]any{"logprob": -1.0, "rank": 2.0, "decoded_token": "?"}},
	}
	for _, ch := range choicesOf(t, m) {
		require.Equal(t, want, ch["prompt_logprobs"])
		require.Nil(t, ch["logprobs"])
	}

	// prompt_logprobs 0: the prompt tokens' own entries; streamed, on the
	// choice's first chunk alone.
	body := streamBody(t, ts.URL+"/v1/completions", `{"prompt":"Hi!","max_tokens":2,"prompt_logprobs":0,"stream":true}`)
	a := takeArrival(t, s)
	require.Zero(t, a.PromptTopLogprobs)
	deliverScored(s, a, lpToks, nil, scoredPrompt)
	var got []any
	for _, c := range sseChunks(t, <-body) {
		for _, ch := range choicesOf(t, c) {
			if v, ok := ch["prompt_logprobs"]; ok {
				got = append(got, v)
			}
		}
	}
	require.Equal(t, []any{[]any{nil,
		map[string]any{"105": map[string]any{"logprob": -0.25, "rank": 1.0, "decoded_token": "i"}},
		map[string]any{"33": map[string]any{"logprob": -3.0, "rank": 3.0, "decoded_token": "!"}}}}, got)
}

// echo with logprobs (lm-evaluation-harness's loglikelihood request): the
// logprobs lists start with the prompt's tokens, the first with nulls,
// each with the logprobs count of top tokens and its own; offsets run on
// through the output's. Streamed, the echo's chunk carries the prompt's.
func TestEchoLogprobs(t *testing.T) {
	s, _, ts := fleetServer(t)
	want := map[string]any{
		"tokens":         []any{"H", "i", "!", "a", "b"},
		"token_logprobs": []any{nil, -0.25, -3.0, -0.5, -9999.0},
		"top_logprobs": []any{nil,
			map[string]any{"i": -0.25},
			map[string]any{".": -0.5, "!": -3.0},
			map[string]any{"a": -0.5},
			map[string]any{"x": -0.125, "b": -9999.0}},
		"text_offset": []any{0.0, 1.0, 2.0, 3.0, 4.0},
	}
	top1 := []executor.TokenLogprobs{ // lpVals as the fleet gives them with logprobs 1
		{Logprob: -0.5, TopIDs: []int32{'a'}, TopLogprobs: []float32{-0.5}},
		{Logprob: lpVals[1].Logprob, TopIDs: []int32{'x'}, TopLogprobs: []float32{-0.125}},
	}
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi!","max_tokens":2,"logprobs":1,"echo":true}`)
	a := takeArrival(t, s)
	require.True(t, a.PromptLogprobs)
	require.Equal(t, 1, a.PromptTopLogprobs)
	deliverScored(s, a, lpToks, top1, scoredPrompt)
	m := <-done
	require.Equal(t, 200.0, m["status"], m)
	ch := choicesOf(t, m)[0]
	require.Equal(t, "Hi!ab", ch["text"])
	require.Equal(t, want, ch["logprobs"])
	require.NotContains(t, ch, "prompt_logprobs")

	body := streamBody(t, ts.URL+"/v1/completions", `{"prompt":"Hi!","max_tokens":2,"logprobs":1,"echo":true,"stream":true}`)
	a = takeArrival(t, s)
	deliverScored(s, a, lpToks, top1, scoredPrompt)
	merged := map[string][]any{}
	texts := ""
	for _, c := range sseChunks(t, <-body) {
		for _, ch := range choicesOf(t, c) {
			texts += ch["text"].(string)
			if l, ok := ch["logprobs"].(map[string]any); ok {
				for k, v := range l {
					merged[k] = append(merged[k], v.([]any)...)
				}
			}
		}
	}
	require.Equal(t, "Hi!ab", texts)
	for k, v := range want {
		require.Equal(t, v, merged[k], k)
	}
}

// Chat: one prompt_logprobs per answer, at the top level (vLLM's), on the
// body or the first chunk that has them.
func TestPromptLogprobsChat(t *testing.T) {
	s, _, url := chatServer(t)
	msgs := `"messages":[{"role":"user","content":"Hi!"}]`
	done := postAsync(t, url+"/v1/chat/completions", `{`+msgs+`,"max_tokens":2,"prompt_logprobs":1}`)
	a := takeArrival(t, s)
	require.Equal(t, []int32{'H', 'i', '!'}, a.Prompt)
	deliverScored(s, a, lpToks, nil, scoredPrompt)
	m := <-done
	require.Equal(t, 200.0, m["status"], m)
	want := []any{nil,
		map[string]any{"105": map[string]any{"logprob": -0.25, "rank": 1.0, "decoded_token": "i"}},
		map[string]any{"33": map[string]any{"logprob": -3.0, "rank": 3.0, "decoded_token": "!"},
			"46": map[string]any{"logprob": -0.5, "rank": 1.0, "decoded_token": "."}}}
	require.Equal(t, want, m["prompt_logprobs"])
	require.NotContains(t, choicesOf(t, m)[0], "prompt_logprobs")

	body := streamBody(t, url+"/v1/chat/completions", `{`+msgs+`,"max_tokens":2,"prompt_logprobs":1,"stream":true}`)
	a = takeArrival(t, s)
	deliverScored(s, a, lpToks, nil, scoredPrompt)
	var got []any
	for _, c := range sseChunks(t, <-body) {
		if v, ok := c["prompt_logprobs"]; ok {
			got = append(got, v)
		}
	}
	require.Equal(t, []any{want}, got)
}

// A stop string that ends the answer early leaves the prompt's
// log-probabilities (they came with the first token); a fleet that never
// sends them is a server error, not a silent omission; an engine that
// cannot score refuses the fields up front.
func TestPromptLogprobsEdges(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi!","max_tokens":5,"prompt_logprobs":0,"stop":["a"]}`)
	a := takeArrival(t, s)
	s.onTokens([]executor.TokenDelta{{ID: a.ID, Token: 'a', PromptLogprobs: scoredPrompt}})
	m := <-done
	require.Equal(t, 200.0, m["status"], m)
	ch := choicesOf(t, m)[0]
	require.Equal(t, "stop", ch["finish_reason"])
	require.Len(t, ch["prompt_logprobs"], 3)
	s.onResponse(executor.Response{ID: a.ID, Output: []int32{'a'}, Error: executor.CancelledError})

	done = postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi!","max_tokens":2,"prompt_logprobs":0}`)
	a = takeArrival(t, s)
	deliverScored(s, a, lpToks, nil, nil)
	m = <-done
	require.Equal(t, 500.0, m["status"], m)

	_, _, ts2 := fleetServer(t, func(c *Config) { c.NoPromptLogprobs = true })
	for body, param := range map[string]string{
		`{"prompt":"Hi!","prompt_logprobs":0}`:      "prompt_logprobs",
		`{"prompt":"Hi!","logprobs":0,"echo":true}`: "echo",
	} {
		resp, err := http.Post(ts2.URL+"/v1/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		var e map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, body)
		require.Equal(t, param, e["error"].(map[string]any)["param"], body)
		require.Contains(t, e["error"].(map[string]any)["message"], "CUDA")
	}
}
