package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/stretchr/testify/require"
)

func testServer(t *testing.T, ready bool) (*Server, *httptest.Server) {
	s := New(Config{ModelName: "m", VocabSize: 100, MaxQueue: 8, APIKey: "k",
		Admission: func(p, n int) scheduler.AdmissionVerdict {
			if p+n > 1000 {
				return scheduler.AdmissionVerdict{Code: scheduler.NeverFits, Reason: "longer than the pool"}
			}
			return scheduler.AdmissionVerdict{}
		}})
	if ready {
		s.SetReady()
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts
}

func post(t *testing.T, ts *httptest.Server, path, key, body string) (int, map[string]any) {
	req, _ := http.NewRequest("POST", ts.URL+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(b, &m) //nolint:errcheck
	return resp.StatusCode, m
}

// Bad requests are answered before anything reaches the fleet, in
// OpenAI's error shape, naming the field.
func TestBadRequestsNameTheField(t *testing.T) {
	_, ts := testServer(t, true)
	for _, c := range []struct {
		path, body string
		status     int
		param      string
	}{
		{"/v1/completions", `{`, 400, ""},
		{"/v1/completions", `{"max_tokens": 3}`, 400, "prompt"},
		{"/v1/completions", `{"prompt": "text"}`, 400, "prompt"}, // no tokenizer: ids only
		{"/v1/completions", `{"prompt": [1, 200]}`, 400, "prompt"},
		{"/v1/completions", `{"prompt": [1, 2], "max_tokens": 0}`, 400, "max_tokens"},
		{"/v1/completions", `{"prompt": [1, 2], "temperature": -1}`, 400, "temperature"},
		{"/v1/completions", `{"prompt": [1, 2], "top_p": 0}`, 400, "top_p"},
		{"/v1/completions", `{"prompt": [1, 2], "top_k": -2}`, 400, "top_k"},
		{"/v1/completions", `{"prompt": [1, 2], "n": 129}`, 400, "n"},
		{"/v1/completions", `{"prompt": [1, 2], "logprobs": 21}`, 400, "logprobs"},
		{"/v1/completions", `{"prompt": [1, 2], "stop": ["a","b","c","d","e"]}`, 400, "stop"},
		{"/v1/completions", `{"prompt": [1, 2], "stream_options": {"include_usage": true}}`, 400, "stream_options"},
		{"/v1/completions", `{"prompt": [[1], []]}`, 400, "prompt"},
		{"/v1/completions", `{"model": "other", "prompt": [1]}`, 404, "model"},
		{"/v1/completions", `{"prompt": [1, 2], "max_tokens": 5000}`, 413, "max_tokens"},
		{"/v1/chat/completions", `{"messages": []}`, 400, "messages"},
		{"/v1/chat/completions", `{"messages": [{"content": "hi"}]}`, 400, "messages[0].role"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}]}`, 400, "messages"}, // no template
	} {
		status, m := post(t, ts, c.path, "k", c.body)
		require.Equal(t, c.status, status, c.body)
		e, ok := m["error"].(map[string]any)
		require.True(t, ok, "OpenAI error shape: %v", m)
		require.NotEmpty(t, e["message"])
		if c.param != "" {
			require.Equal(t, c.param, e["param"], c.body)
		}
	}
	status, _ := post(t, ts, "/v1/completions", "", `{"prompt": [1]}`)
	require.Equal(t, 401, status, "no API key")
	status, _ = post(t, ts, "/v1/completions", "wrong", `{"prompt": [1]}`)
	require.Equal(t, 401, status, "wrong API key")
	resp, err := http.Get(ts.URL + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "/health needs no key")
}

// Before every rank passed init, and while draining, requests get 503.
func TestNotReadyAndDraining(t *testing.T) {
	s, ts := testServer(t, false)
	resp, err := http.Get(ts.URL + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	status, _ := post(t, ts, "/v1/completions", "k", `{"prompt": [1]}`)
	require.Equal(t, 503, status)
	s.SetReady()
	s.draining.Store(true)
	status, _ = post(t, ts, "/v1/completions", "k", `{"prompt": [1]}`)
	require.Equal(t, 503, status)
}
