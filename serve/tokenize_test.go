package serve

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model"
)

// /tokenize and /detokenize in vLLM's shapes: the ids are those the
// completions endpoint would queue, token_strs on request, and bad input
// is 400 naming the field.
func TestTokenizeAndDetokenize(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) { c.MaxModelLen = 4096 })
	status, m := post(t, ts, "/tokenize", "", `{"prompt": "Hi!", "return_token_strs": true}`)
	require.Equal(t, 200, status, "%v", m)
	want := s.cfg.Tokenizer.Encode("Hi!", model.EncodeOptions{AddSpecial: true})
	require.Equal(t, float64(len(want)), m["count"])
	require.Equal(t, 4096.0, m["max_model_len"])
	var got []int32
	for _, v := range m["tokens"].([]any) {
		got = append(got, int32(v.(float64)))
	}
	require.Equal(t, want, got)
	require.Equal(t, []any{"H", "i", "!"}, m["token_strs"])
	status, m = post(t, ts, "/tokenize", "", `{"prompt": "Hi"}`)
	require.Equal(t, 200, status)
	require.Nil(t, m["token_strs"], "token_strs is null unless asked")

	status, m = post(t, ts, "/detokenize", "", `{"tokens": [72, 105]}`)
	require.Equal(t, 200, status, "%v", m)
	require.Equal(t, map[string]any{"prompt": "Hi"}, m)

	for _, c := range []struct{ path, body, param string }{
		{"/tokenize", `{}`, "prompt"},
		{"/tokenize", `{"prompt": "a", "messages": [{"role": "user", "content": "a"}]}`, "messages"},
		{"/tokenize", `{"prompt": "a", "add_generation_prompt": true}`, "add_generation_prompt"},
		{"/tokenize", `{"messages": [{"role": "user", "content": "a"}]}`, "messages"}, // no chat template
		{"/tokenize", `{"prompt": "a", "bogus": 1}`, "bogus"},
		{"/detokenize", `{}`, "tokens"},
		{"/detokenize", `{"tokens": [1, 256]}`, "tokens"},
		{"/detokenize", `{"tokens": [1], "model": "other"}`, "model"},
	} {
		status, m := post(t, ts, c.path, "", c.body)
		require.NotEqual(t, 200, status, c.body)
		require.Equal(t, c.param, m["error"].(map[string]any)["param"], c.body)
	}
}

// /version and /ping answer as vLLM's; /ping is /health.
func TestVersionAndPing(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) { c.Version = "1.2.3" })
	resp, err := http.Get(ts.URL + "/version")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.JSONEq(t, `{"version": "1.2.3"}`, string(b))
	for _, method := range []string{"GET", "POST"} {
		req, _ := http.NewRequest(method, ts.URL+"/ping", nil)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, method)
	}
	s.draining.Store(true)
	resp, err = http.Get(ts.URL + "/ping")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode, "/ping while draining")
	require.NotEmpty(t, buildVersion())
}

// X-Request-Id is echoed and names the completion; without one the
// server's id is sent; a bad one is refused.
func TestRequestIDHeader(t *testing.T) {
	s, _, ts := fleetServer(t)
	ask := func(id string) (*http.Response, string) {
		done := make(chan struct{})
		var resp *http.Response
		var body string
		go func() {
			defer close(done)
			req, _ := http.NewRequest("POST", ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"Hi","max_tokens":2}`))
			if id != "" {
				req.Header.Set("X-Request-Id", id)
			}
			var err error
			resp, err = http.DefaultClient.Do(req)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
			}
		}()
		if id == "bad id" {
			<-done
			return resp, body
		}
		deliver(s, takeArrival(t, s), "yo")
		<-done
		return resp, body
	}
	resp, body := ask("req-42")
	require.Equal(t, "req-42", resp.Header.Get("X-Request-Id"))
	require.Contains(t, body, `"id":"cmpl-req-42"`)
	resp, body = ask("")
	require.Equal(t, "1", resp.Header.Get("X-Request-Id"))
	require.Contains(t, body, `"id":"cmpl-1"`)
	resp, body = ask("bad id")
	require.Equal(t, 400, resp.StatusCode)
	require.Contains(t, body, "X-Request-Id")
}
