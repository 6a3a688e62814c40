package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// Every field is honoured or refused with 400 naming it: vLLM's fields the
// server cannot honour, unknown fields (top level and nested), and bad
// values of the honoured ones.
func TestUnsupportedAndBadFieldsAreRefused(t *testing.T) {
	_, ts := testServer(t, true)
	for _, c := range []struct{ body, param string }{
		{`{"prompt": [1], "priority": 3}`, "priority"},
		{`{"prompt": [1], "guided_json": {"type": "object"}}`, "guided_json"},
		{`{"prompt": [1], "guided_choice": ["a"]}`, "guided_choice"},
		{`{"prompt": [1], "allowed_token_ids": []}`, "allowed_token_ids"},
		{`{"prompt": [1], "allowed_token_ids": [-1]}`, "allowed_token_ids"},
		{`{"prompt": [1], "allowed_token_ids": ["a"]}`, "allowed_token_ids"},
		{`{"prompt": [1], "allowed_token_ids": [100000]}`, "allowed_token_ids"},
		{`{"prompt": [1], "bad_words": ["x"]}`, "bad_words"},
		{`{"prompt": [1], "use_beam_search": true}`, "use_beam_search"},
		{`{"prompt": [1], "length_penalty": 2}`, "length_penalty"},
		{`{"prompt": [1], "truncate_prompt_tokens": 0}`, "truncate_prompt_tokens"},
		{`{"prompt": [1], "tool_choice": "auto"}`, "tool_choice"},
		{`{"prompt": [1], "no_such_field": 1}`, "no_such_field"},
		{`{"prompt": [1], "stream": true, "stream_options": {"include_usage": true, "bogus": 1}}`, "bogus"},
		{`{"prompt": [1], "presence_penalty": 2.5}`, "presence_penalty"},
		{`{"prompt": [1], "frequency_penalty": -3}`, "frequency_penalty"},
		{`{"prompt": [1], "repetition_penalty": 0}`, "repetition_penalty"},
		{`{"prompt": [1], "min_p": 1.5}`, "min_p"},
		{`{"prompt": [1], "logit_bias": {"x": 1}}`, "logit_bias"},
		{`{"prompt": [1], "logit_bias": {"5": 101}}`, "logit_bias"},
		{`{"prompt": [1], "logit_bias": {"100": 1}}`, "logit_bias"}, // vocabulary of 100
		{`{"prompt": [1], "stop_token_ids": [100]}`, "stop_token_ids"},
		{`{"prompt": [1], "stop_token_ids": [-1]}`, "stop_token_ids"},
		{`{"prompt": [1], "min_tokens": -1}`, "min_tokens"},
		{`{"prompt": [1], "max_tokens": 3, "min_tokens": 4}`, "min_tokens"},
		{`{"prompt": [1], "attention_dp_rank": 1}`, "attention_dp_rank"}, // one attention-DP rank
		{`{"prompt": [1], "attention_dp_rank": -1}`, "attention_dp_rank"},
		{`{"prompt": [1], "attention_dp_rank": 0.5}`, "attention_dp_rank"},
		{`{"prompt": [1], "attention_dp_rank": "0"}`, "attention_dp_rank"},
		{`{"prompt": [1], "attention_dp_relax": "yes"}`, "attention_dp_relax"},
		{`{"prompt": [1], "conversation_id": {"a": 1}}`, "conversation_id"},
		{`{"prompt": [1], "conversation_id": 1.5}`, "conversation_id"},
		{`{"prompt": [1], "affinity_id": "` + strings.Repeat("a", 257) + `"}`, "affinity_id"},
		{`{"prompt": [1], "prompt_cache_key": ["k"]}`, "prompt_cache_key"},
		{`{"prompt": [1], "prompt_cache_key": "k1", "affinity_id": "k2"}`, "prompt_cache_key"},
	} {
		status, m := post(t, ts, "/v1/completions", "k", c.body)
		require.Equal(t, 400, status, c.body)
		require.Equal(t, c.param, m["error"].(map[string]any)["param"], c.body)
	}
	// attention_dp_rank is bounded by the fleet's attention-DP ranks.
	_, _, ts4 := fleetServer(t, func(c *Config) { c.AttentionDPRanks = 4 })
	status, m := post(t, ts4, "/v1/completions", "", `{"prompt": [1], "attention_dp_rank": 4}`)
	require.Equal(t, 400, status)
	require.Equal(t, "attention_dp_rank", m["error"].(map[string]any)["param"])
	require.Contains(t, m["error"].(map[string]any)["message"], "the fleet has 4 attention-DP ranks (allowed: 0 to 3)")
	status, m = post(t, ts, "/v1/chat/completions", "k", `{"messages": [{"role": "user", "content": "hi", "name": "bob"}]}`)
	require.Equal(t, 400, status)
	require.Equal(t, "messages[0].name", m["error"].(map[string]any)["param"])
	status, m = post(t, ts, "/v1/chat/completions", "k", `{"messages": [{"role": "user", "content": "hi", "toolz": 1}]}`)
	require.Equal(t, 400, status)
	require.Equal(t, "toolz", m["error"].(map[string]any)["param"])
}

// The honoured processors reach the arrival (in id order for the bias);
// penalties apply to greedy requests, min_p only to sampled ones.
func TestProcessorFieldsReachTheArrival(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := make(chan map[string]any, 1)
	go func() {
		_, m := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":4,"presence_penalty":0.5,
			"frequency_penalty":-0.25,"repetition_penalty":1.1,"min_p":0.2,"logit_bias":{"9":-100,"3":2.5},
			"stop_token_ids":[7,8],"user":"u1"}`)
		done <- m
	}()
	a := takeArrival(t, s)
	require.Equal(t, bridge.SamplingParams{PresencePenalty: 0.5, FrequencyPenalty: -0.25, RepetitionPenalty: 1.1}, a.Sampling)
	require.Equal(t, []bridge.TokenBias{{ID: 3, Bias: 2.5}, {ID: 9, Bias: -100}}, a.LogitBias)
	require.Equal(t, []int32{7, 8}, a.StopTokenIDs)
	deliver(s, a, "yo")
	<-done

	go func() {
		_, m := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":4,"temperature":1,"seed":3,"min_p":0.2,"repetition_penalty":1}`)
		done <- m
	}()
	a = takeArrival(t, s)
	require.Equal(t, bridge.SamplingParams{Temperature: 1, TopP: 1, Seed: 3, MinP: 0.2}, a.Sampling, "repetition_penalty 1 is off")
	deliver(s, a, "yo")
	<-done
}

// The routing fields reach the arrival: conversation_id (a number as
// written), affinity_id or OpenAI's prompt_cache_key as the routing key,
// TensorRT-LLM's attention_dp_rank and attention_dp_relax, on both
// endpoints and for every choice.
func TestRoutingFieldsReachTheArrival(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) { c.Tokenizer = chatTokenizer(t) })
	done := make(chan map[string]any, 1)
	for _, c := range []struct {
		path, body string
		conv       string
		routing    workload.Routing
	}{
		{"/v1/completions", `{"prompt":"Hi","max_tokens":2,"n":2,"conversation_id":"c1","prompt_cache_key":"agent-7"}`,
			"c1", workload.Routing{AffinityID: "agent-7"}},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"conversation_id":7,
			"affinity_id":"p","prompt_cache_key":"p","attention_dp_rank":0,"attention_dp_relax":false}`,
			"7", workload.Routing{AffinityID: "p", HasRank: true, Rank: 0, Strict: true}},
		{"/v1/completions", `{"prompt":"Hi","max_tokens":2,"attention_dp_rank":0,"conversation_id":""}`,
			"", workload.Routing{HasRank: true}},
	} {
		go func() {
			_, m := post(t, ts, c.path, "", c.body)
			done <- m
		}()
		n := 1
		if strings.Contains(c.body, `"n":2`) {
			n = 2
		}
		for _, a := range takeArrivals(t, s, n) {
			require.Equal(t, c.conv, a.ConversationID, c.body)
			require.Equal(t, c.routing, a.Routing, c.body)
			deliver(s, a, "yo")
		}
		m := <-done
		require.NotContains(t, m, "error", c.body)
	}
}

// deliverTokens answers a's call with toks and a response (stopped: it
// ended at a stop token).
func deliverTokens(s *Server, a executor.Arrival, toks []int32, stopped bool, reused int) {
	s.src.finished(a.ID)
	s.mu.Lock()
	c := s.calls[a.ID]
	s.mu.Unlock()
	c.mu.Lock()
	c.toks = append(c.toks, toks...)
	c.resp = &executor.Response{ID: a.ID, Output: toks, Stopped: stopped, ReusedTokens: reused, ArrivalUnixNS: a.ArrivalUnixNS}
	c.mu.Unlock()
	c.signal()
}

// A stop token id ends the answer without its text unless
// include_stop_str_in_output; a stop string is kept with it too;
// prompt_tokens_details counts the reused prefix when enabled.
func TestStopOutputsAndCachedTokens(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) { c.PromptTokensDetails = true })
	tok := s.cfg.Tokenizer
	ask := func(body string, toks []int32, stopped bool) map[string]any {
		done := make(chan map[string]any, 1)
		go func() {
			_, m := post(t, ts, "/v1/completions", "", body)
			done <- m
		}()
		deliverTokens(s, takeArrival(t, s), toks, stopped, 2)
		return <-done
	}
	text := func(m map[string]any) string { return m["choices"].([]any)[0].(map[string]any)["text"].(string) }
	ab := tok.Encode("ab!", modelOpts)
	bang := ab[2]
	m := ask(`{"prompt":"Hi","max_tokens":4,"stop_token_ids":[`+itoa(bang)+`]}`, ab, true)
	require.Equal(t, "ab", text(m))
	require.Equal(t, "stop", m["choices"].([]any)[0].(map[string]any)["finish_reason"])
	require.Equal(t, map[string]any{"cached_tokens": 2.0}, m["usage"].(map[string]any)["prompt_tokens_details"])
	m = ask(`{"prompt":"Hi","max_tokens":4,"stop_token_ids":[`+itoa(bang)+`],"include_stop_str_in_output":true}`, ab, true)
	require.Equal(t, "ab!", text(m))
	m = ask(`{"prompt":"Hi","max_tokens":4,"stop":["b"],"include_stop_str_in_output":true}`, ab, false)
	require.Equal(t, "ab", text(m))
	m = ask(`{"prompt":"Hi","max_tokens":4,"stop":["b"]}`, ab, false)
	require.Equal(t, "a", text(m))
}

// Chat's default max_tokens is the rest of the context, lowered to what
// admission can ever serve.
func TestDefaultMaxTokensIsTheRestOfTheContext(t *testing.T) {
	s, _, _ := fleetServer(t, func(c *Config) {
		c.MaxModelLen = 1000
		c.Admission = func(p, n int) scheduler.AdmissionVerdict {
			if n > 300 {
				return scheduler.AdmissionVerdict{Code: scheduler.NeverFits}
			}
			return scheduler.AdmissionVerdict{}
		}
	})
	require.Equal(t, 300, s.restOfContext(10))
	s.cfg.Admission = func(int, int) scheduler.AdmissionVerdict { return scheduler.AdmissionVerdict{} }
	require.Equal(t, 990, s.restOfContext(10))
	require.Equal(t, 1, s.restOfContext(1000))
	s.cfg.MaxModelLen = 0
	require.Equal(t, defaultChatMaxTokens, s.restOfContext(10))
}

var modelOpts = model.EncodeOptions{}

func itoa(id int32) string { return strconv.Itoa(int(id)) }

// stream_options.continuous_usage_stats puts the usage so far on every
// chunk.
func TestContinuousUsageStats(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := make(chan string, 1)
	go func() {
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(
			`{"prompt":"Hi","max_tokens":4,"stream":true,"stream_options":{"continuous_usage_stats":true}}`))
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	deliver(s, takeArrival(t, s), "yo")
	body := <-done
	var chunks int
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &c))
		u, ok := c["usage"].(map[string]any)
		require.True(t, ok, "chunk without usage: %s", data)
		require.Equal(t, 2.0, u["prompt_tokens"])
		chunks++
	}
	require.GreaterOrEqual(t, chunks, 2, body)
}

// echo puts the prompt before the completion (completions only), whole or
// as the stream's first chunk; chat refuses it.
func TestEcho(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := make(chan map[string]any, 1)
	go func() {
		_, m := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":4,"echo":true}`)
		done <- m
	}()
	deliver(s, takeArrival(t, s), " yo")
	require.Equal(t, "Hi yo", (<-done)["choices"].([]any)[0].(map[string]any)["text"])

	body := make(chan string, 1)
	go func() {
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":[72,105],"max_tokens":4,"echo":true,"stream":true}`))
		if err != nil {
			body <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body <- string(b)
	}()
	deliver(s, takeArrival(t, s), " yo")
	var texts []string
	for _, line := range strings.Split(<-body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &c))
		if ch := c["choices"].([]any); len(ch) > 0 {
			texts = append(texts, ch[0].(map[string]any)["text"].(string))
		}
	}
	require.Equal(t, "Hi", texts[0], "the decoded prompt comes first")
	require.Equal(t, "Hi yo", strings.Join(texts, ""))

	// Chat echoes a final assistant message (TestChatGenerationPromptAndContinuation), without logprobs.
	status, m := post(t, ts, "/v1/chat/completions", "", `{"messages":[{"role":"user","content":"hi"}],"echo":true,"logprobs":true}`)
	require.Equal(t, 400, status)
	require.Equal(t, "echo", m["error"].(map[string]any)["param"])
}

// truncate_prompt_tokens (vLLM's): a prompt keeps its last k tokens (the
// usage and echo say so); -1 is the context length; 0, below -1 and above
// the context length are refused naming the field.
func TestTruncatePromptTokens(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) { c.MaxModelLen = 64 })
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hello world","max_tokens":2,"echo":true,"truncate_prompt_tokens":5}`)
	a := takeArrival(t, s)
	require.Equal(t, []int32{'w', 'o', 'r', 'l', 'd'}, a.Prompt)
	deliver(s, a, "!!")
	m := <-done
	require.Equal(t, "world!!", choicesOf(t, m)[0]["text"])
	require.Equal(t, 5.0, m["usage"].(map[string]any)["prompt_tokens"])

	// A shorter prompt, and -1 (the context length), are left whole; chat
	// truncates the rendered conversation.
	for _, body := range []string{`{"prompt":"Hi","max_tokens":1,"truncate_prompt_tokens":5}`,
		`{"prompt":"Hi","max_tokens":1,"truncate_prompt_tokens":-1}`} {
		done = postAsync(t, ts.URL+"/v1/completions", body)
		a = takeArrival(t, s)
		require.Equal(t, []int32{'H', 'i'}, a.Prompt, body)
		deliver(s, a, "!")
		require.Equal(t, 200.0, (<-done)["status"])
	}
	for _, c := range []string{`0`, `-2`, `65`} {
		_, m := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","truncate_prompt_tokens":`+c+`}`)
		require.Equal(t, "truncate_prompt_tokens", m["error"].(map[string]any)["param"], c)
	}
	_, _, plain := fleetServer(t) // no context length: -1 cannot be resolved
	_, m = post(t, plain, "/v1/completions", "", `{"prompt":"Hi","truncate_prompt_tokens":-1}`)
	require.Equal(t, "truncate_prompt_tokens", m["error"].(map[string]any)["param"])
}

// priority (vLLM's): with --scheduling-policy priority it rides the
// arrival (every choice); under fcfs anything but 0 is refused, as vLLM
// does; it must fit in 32 bits.
func TestPriorityField(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) { c.PriorityScheduling = true })
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":1,"priority":-7,"n":2}`)
	for _, a := range takeArrivals(t, s, 2) {
		require.Equal(t, int32(-7), a.Priority)
		deliver(s, a, "!")
	}
	require.Equal(t, 200.0, (<-done)["status"])
	_, m := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","priority":4294967296}`)
	require.Equal(t, "priority", m["error"].(map[string]any)["param"])

	_, _, fcfs := fleetServer(t)
	_, m = post(t, fcfs, "/v1/completions", "", `{"prompt":"Hi","priority":1}`)
	require.Equal(t, "priority", m["error"].(map[string]any)["param"])
	require.Contains(t, m["error"].(map[string]any)["message"], "--scheduling-policy priority")
}
