package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
)

// deliverLogprobs answers a's call with toks, their log-probabilities and
// the response, in one wake-up.
func deliverLogprobs(s *Server, a executor.Arrival, toks []int32, lps []executor.TokenLogprobs) {
	s.src.finished(a.ID)
	s.mu.Lock()
	c := s.calls[a.ID]
	s.mu.Unlock()
	c.mu.Lock()
	c.toks = append(c.toks, toks...)
	c.lps = append(c.lps, lps...)
	c.resp = &executor.Response{ID: a.ID, Output: toks, Logprobs: lps, ArrivalUnixNS: a.ArrivalUnixNS}
	c.mu.Unlock()
	c.signal()
}

// chatServer is fleetServer with a byte tokenizer that has a chat template.
func chatServer(t *testing.T) (*Server, *Metrics, string) {
	tok := byteTokenizer(t)
	spec := tok.Spec()
	spec.ChatTemplate = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
	ct, err := model.NewTokenizer(spec)
	require.NoError(t, err)
	s, met, ts := fleetServer(t, func(c *Config) { c.Tokenizer = ct })
	return s, met, ts.URL
}

// The tokens "ab" ('a' = 97, 'b' = 98): 'a' is the top token at its
// position, 'b' is not among the top 2 at its (the sampled token is then
// reported on its own), and -Inf comes out as vLLM's -9999.
var (
	lpToks = []int32{'a', 'b'}
	lpVals = []executor.TokenLogprobs{
		{Logprob: -0.5, TopIDs: []int32{'a', 'c'}, TopLogprobs: []float32{-0.5, -1.25}},
		{Logprob: float32(math.Inf(-1)), TopIDs: []int32{'x', 'y'}, TopLogprobs: []float32{-0.125, -2}},
	}
)

// lpValsChat is lpToks with lpVals in chat's shape (and the Responses
// API's output_text logprobs), as decoded JSON.
func lpValsChat() []any {
	return []any{
		map[string]any{"token": "a", "logprob": -0.5, "bytes": []any{97.0}, "top_logprobs": []any{
			map[string]any{"token": "a", "logprob": -0.5, "bytes": []any{97.0}},
			map[string]any{"token": "c", "logprob": -1.25, "bytes": []any{99.0}}}},
		map[string]any{"token": "b", "logprob": -9999.0, "bytes": []any{98.0}, "top_logprobs": []any{
			map[string]any{"token": "x", "logprob": -0.125, "bytes": []any{120.0}},
			map[string]any{"token": "y", "logprob": -2.0, "bytes": []any{121.0}}}},
	}
}

func TestCompletionLogprobs(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":2,"logprobs":2}`)
	a := takeArrival(t, s)
	require.True(t, a.Logprobs)
	require.Equal(t, 2, a.TopLogprobs)
	deliverLogprobs(s, a, lpToks, lpVals)
	m := <-done
	require.Equal(t, 200.0, m["status"], m)
	ch := choicesOf(t, m)[0]
	require.Equal(t, "ab", ch["text"])
	lp := ch["logprobs"].(map[string]any)
	require.Equal(t, []any{"a", "b"}, lp["tokens"])
	require.Equal(t, []any{-0.5, -9999.0}, lp["token_logprobs"])
	require.Equal(t, []any{0.0, 1.0}, lp["text_offset"])
	require.Equal(t, []any{
		map[string]any{"a": -0.5, "c": -1.25},
		map[string]any{"x": -0.125, "y": -2.0, "b": -9999.0},
	}, lp["top_logprobs"])

	// logprobs 0: the sampled tokens' only; streaming: one chunk per
	// delivery with its tokens' entries, offsets continuing.
	body := streamBody(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":2,"logprobs":0,"stream":true}`)
	a = takeArrival(t, s)
	require.True(t, a.Logprobs)
	require.Zero(t, a.TopLogprobs)
	deliverLogprobs(s, a, lpToks, []executor.TokenLogprobs{{Logprob: -0.5}, {Logprob: -3}})
	var got []any
	for _, c := range sseChunks(t, <-body) {
		for _, ch := range choicesOf(t, c) {
			if l, ok := ch["logprobs"].(map[string]any); ok {
				got = append(got, l)
			}
		}
	}
	require.Equal(t, []any{map[string]any{"tokens": []any{"a", "b"}, "token_logprobs": []any{-0.5, -3.0},
		"top_logprobs": []any{map[string]any{"a": -0.5}, map[string]any{"b": -3.0}}, "text_offset": []any{0.0, 1.0}}}, got)
}

func TestChatLogprobs(t *testing.T) {
	s, _, url := chatServer(t)
	msgs := `"messages":[{"role":"user","content":"Hi"}]`
	done := postAsync(t, url+"/v1/chat/completions", `{`+msgs+`,"max_tokens":2,"logprobs":true,"top_logprobs":2}`)
	a := takeArrival(t, s)
	require.True(t, a.Logprobs)
	require.Equal(t, 2, a.TopLogprobs)
	deliverLogprobs(s, a, lpToks, lpVals)
	m := <-done
	require.Equal(t, 200.0, m["status"], m)
	ch := choicesOf(t, m)[0]
	want := lpValsChat()
	require.Equal(t, map[string]any{"content": want}, ch["logprobs"])

	// Streaming: the deltas carry the same entries.
	body := streamBody(t, url+"/v1/chat/completions", `{`+msgs+`,"max_tokens":2,"logprobs":true,"top_logprobs":2,"stream":true}`)
	a = takeArrival(t, s)
	deliverLogprobs(s, a, lpToks, lpVals)
	var got []any
	for _, c := range sseChunks(t, <-body) {
		for _, ch := range choicesOf(t, c) {
			if l, ok := ch["logprobs"].(map[string]any); ok {
				got = append(got, l["content"].([]any)...)
			}
		}
	}
	require.Equal(t, want, got)

	// Without logprobs a chat choice has none.
	done = postAsync(t, url+"/v1/chat/completions", `{`+msgs+`,"max_tokens":2}`)
	a = takeArrival(t, s)
	require.False(t, a.Logprobs)
	deliverTokens(s, a, lpToks, false, 0)
	m = <-done
	require.NotContains(t, choicesOf(t, m)[0], "logprobs")
}

// The fields' bounds: 400 naming the field.
func TestLogprobsFieldsRefused(t *testing.T) {
	s, _, url := chatServer(t)
	_ = s
	for _, c := range []struct{ path, body, param string }{
		{"/v1/completions", `{"prompt":[1],"logprobs":21}`, "logprobs"},
		{"/v1/completions", `{"prompt":[1],"logprobs":-1}`, "logprobs"},
		{"/v1/completions", `{"prompt":[1],"logprobs":true}`, "logprobs"},
		{"/v1/completions", `{"prompt":[1],"top_logprobs":2}`, "top_logprobs"},
		{"/v1/completions", `{"prompt":[1],"prompt_logprobs":-1}`, "prompt_logprobs"},
		{"/v1/completions", `{"prompt":[1],"prompt_logprobs":21}`, "prompt_logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"prompt_logprobs":-2}`, "prompt_logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"logprobs":2}`, "logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, "top_logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}`, "top_logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":-1}`, "top_logprobs"},
	} {
		resp, err := http.Post(url+c.path, "application/json", strings.NewReader(c.body))
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, c.body)
		require.Equal(t, c.param, m["error"].(map[string]any)["param"], c.body)
	}
	// The largest counts are accepted.
	p, e := (&rawParams{Logprobs: json.RawMessage("true"), TopLogprobs: ptr(bridge.MaxLogprobs)}).check(restOfContext)
	require.Nil(t, e)
	require.True(t, p.Logprobs)
	require.Equal(t, bridge.MaxLogprobs, p.TopLogprobs)
	p, e = (&rawParams{Logprobs: json.RawMessage("false"), TopLogprobs: ptr(0)}).check(restOfContext)
	require.Nil(t, e)
	require.False(t, p.Logprobs)
}

func ptr[T any](v T) *T { return &v }

// streamBody posts a streaming request and returns a channel of its body.
func streamBody(t *testing.T, url, body string) chan string {
	done := make(chan string, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			done <- "transport: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- string(b)
	}()
	return done
}

// sseChunks parses a stream's chunks (until [DONE], which must come).
func sseChunks(t *testing.T, body string) []map[string]any {
	t.Helper()
	lines := strings.Split(body, "\n")
	require.Contains(t, lines, "data: [DONE]", body)
	var out []map[string]any
	for _, line := range lines {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &c), data)
		if _, ok := c["choices"]; ok {
			out = append(out, c)
		}
	}
	return out
}

// return_tokens_as_token_ids (vLLM's, the request's or the server's
// --return-tokens-as-token-ids): the log-probabilities name every token
// "token_id:N" (chat's bytes are that text's), and the answer's text is
// unchanged.
func TestTokensAsTokenIDs(t *testing.T) {
	s, _, url := chatServer(t)
	msgs := `"messages":[{"role":"user","content":"Hi"}]`
	done := postAsync(t, url+"/v1/chat/completions", `{`+msgs+`,"max_tokens":2,"logprobs":true,"top_logprobs":1,"return_tokens_as_token_ids":true}`)
	deliverLogprobs(s, takeArrival(t, s), lpToks, lpVals)
	ch := choicesOf(t, <-done)[0]
	content := ch["logprobs"].(map[string]any)["content"].([]any)
	first := content[0].(map[string]any)
	name := fmt.Sprintf("token_id:%d", lpToks[0])
	require.Equal(t, name, first["token"])
	require.Len(t, first["bytes"], len(name))
	require.Equal(t, fmt.Sprintf("token_id:%d", lpVals[0].TopIDs[0]), first["top_logprobs"].([]any)[0].(map[string]any)["token"])
	require.Equal(t, s.cfg.Tokenizer.Decode(lpToks), ch["message"].(map[string]any)["content"])

	done = postAsync(t, url+"/v1/completions", `{"prompt":"Hi","max_tokens":2,"logprobs":1,"return_tokens_as_token_ids":true}`)
	deliverLogprobs(s, takeArrival(t, s), lpToks, lpVals)
	lp := choicesOf(t, <-done)[0]["logprobs"].(map[string]any)
	require.Equal(t, []any{fmt.Sprintf("token_id:%d", lpToks[0]), fmt.Sprintf("token_id:%d", lpToks[1])}, lp["tokens"])
	require.Equal(t, []any{0.0, 1.0}, lp["text_offset"], "the offsets are the text's")

	// The server's flag does it for every request.
	s.cfg.TokensAsIDs = true
	done = postAsync(t, url+"/v1/chat/completions", `{`+msgs+`,"max_tokens":2,"logprobs":true}`)
	deliverLogprobs(s, takeArrival(t, s), lpToks, lpVals)
	content = choicesOf(t, <-done)[0]["logprobs"].(map[string]any)["content"].([]any)
	require.Equal(t, name, content[0].(map[string]any)["token"])
}
