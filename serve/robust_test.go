package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// byteTokenizer is a byte-level BPE tokenizer with one token per byte (the
// GPT-2 alphabet) and no merges: every text is spelled byte by byte.
func byteTokenizer(t testing.TB) *model.Tokenizer {
	t.Helper()
	var toks []string
	next := rune(256)
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			toks = append(toks, string(rune(b)))
		} else {
			toks = append(toks, string(next))
			next++
		}
	}
	tok, err := model.NewTokenizer(model.TokenizerSpec{Model: "gpt2", Tokens: toks, BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1})
	require.NoError(t, err)
	return tok
}

// fleetServer is a server with a tokenizer and metrics whose fleet is the
// test itself: deliver answers a queued request the way rank 0's executor
// does (tokens and the response), in one wake-up of the handler.
func fleetServer(t testing.TB, mutate ...func(*Config)) (*Server, *Metrics, *httptest.Server) {
	t.Helper()
	met := NewMetrics("m", 1)
	cfg := Config{ModelName: "m", VocabSize: 256, MaxQueue: 8, Tokenizer: byteTokenizer(t), Metrics: met,
		Admission: func(int, int) scheduler.AdmissionVerdict { return scheduler.AdmissionVerdict{} }}
	for _, f := range mutate {
		f(&cfg)
	}
	s := New(cfg)
	s.SetReady()
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, met, ts
}

// takeArrivals waits until the server queued n requests and hands them to
// the (test's) fleet.
func takeArrivals(t *testing.T, s *Server, n int) []executor.Arrival {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var got []executor.Arrival
	for len(got) < n {
		if due := s.src.Due(time.Now()); len(due) > 0 {
			s.src.Cancelled()
			got = append(got, due...)
			continue
		}
		require.True(t, time.Now().Before(deadline), "%d of %d requests reached the fleet", len(got), n)
		time.Sleep(time.Millisecond)
	}
	return got
}

func takeArrival(t *testing.T, s *Server) executor.Arrival { return takeArrivals(t, s, 1)[0] }

// deliver gives the call of a its whole output and its response at once,
// as when the last tokens and the answer arrive in the same iteration.
func deliver(s *Server, a executor.Arrival, text string) {
	toks := s.cfg.Tokenizer.Encode(text, model.EncodeOptions{})
	s.src.finished(a.ID)
	s.mu.Lock()
	c := s.calls[a.ID]
	s.mu.Unlock()
	c.mu.Lock()
	c.toks = append(c.toks, toks...)
	c.resp = &executor.Response{ID: a.ID, Output: toks, ArrivalUnixNS: a.ArrivalUnixNS, ScheduledUnixNS: a.ArrivalUnixNS + 1,
		FirstTokenUnixNS: a.ArrivalUnixNS + 2, FinishUnixNS: a.ArrivalUnixNS + 3}
	c.mu.Unlock()
	c.signal()
}

func finished(t *testing.T, met *Metrics) map[string]float64 {
	t.Helper()
	mfs := scrape(t, met)
	out := map[string]float64{}
	for _, r := range knownFinishReasons {
		out[r] = value(t, mfs, "lockstep_requests_finished_total", "finish_reason", r)
	}
	return out
}

// A stop string found in the chunk that also carries the answer ends the
// completion with finish_reason "stop" and counts it in the finished
// series (issue 23, defect 9).
func TestStopStringInFinalChunkIsCounted(t *testing.T) {
	s, met, ts := fleetServer(t)
	done := make(chan map[string]any, 1)
	go func() {
		_, m := post(t, ts, "/v1/completions", "", `{"prompt":"Story 1: Once upon a time","max_tokens":10,"stop":["made"]}`)
		done <- m
	}()
	a := takeArrival(t, s)
	deliver(s, a, " there was a made up")
	m := <-done
	choice := m["choices"].([]any)[0].(map[string]any)
	require.Equal(t, "stop", choice["finish_reason"])
	require.Equal(t, " there was a ", choice["text"])
	require.Equal(t, map[string]float64{"stop": 1, "length": 0, "cancelled": 0, "error": 0}, finished(t, met))
}

// A request whose client goes away while it is still queued (the fleet
// never took it) ends in the cancelled series.
func TestCancelledWhileQueuedIsCounted(t *testing.T) {
	s, met, ts := fleetServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"Hi","max_tokens":2}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.src.mu.Lock()
		n := len(s.src.queue)
		s.src.mu.Unlock()
		if n == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the request was never queued")
		time.Sleep(time.Millisecond)
	}
	cancel()
	require.Error(t, <-errc)
	for {
		if finished(t, met)["cancelled"] == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the cancelled request is in no finished series: %v", finished(t, met))
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, map[string]float64{"stop": 0, "length": 0, "cancelled": 1, "error": 0}, finished(t, met))
}

// Drained and failed requests end in exactly one finished series too.
func TestDrainedAndFailedRequestsAreCounted(t *testing.T) {
	s, met, ts := fleetServer(t)
	done := make(chan int, 2)
	for range 2 {
		go func() {
			status, _ := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":2}`)
			done <- status
		}()
	}
	takeArrivals(t, s, 2)
	// The fleet withdraws what the drain cancels and answers it.
	go func() {
		for range 200 {
			for _, id := range s.src.Cancelled() {
				s.onResponse(executor.Response{ID: id, Error: executor.CancelledError})
			}
			time.Sleep(time.Millisecond)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	s.Drain(ctx)
	require.Equal(t, http.StatusServiceUnavailable, <-done)
	require.Equal(t, http.StatusServiceUnavailable, <-done)
	deadline := time.Now().Add(10 * time.Second)
	for finished(t, met)["cancelled"] != 2 {
		require.True(t, time.Now().Before(deadline), "drained requests: %v", finished(t, met))
		time.Sleep(time.Millisecond)
	}

	s2, met2, ts2 := fleetServer(t)
	go func() {
		status, _ := post(t, ts2, "/v1/completions", "", `{"prompt":"Hi","max_tokens":2}`)
		done <- status
	}()
	takeArrival(t, s2)
	s2.Fail(io.ErrUnexpectedEOF)
	require.Equal(t, http.StatusInternalServerError, <-done)
	require.Equal(t, map[string]float64{"stop": 0, "length": 0, "cancelled": 0, "error": 1}, finished(t, met2))
}

// A bad top_k names top_k and uses up no request id; trailing data after
// the JSON value is refused; a body over the bound is 413.
func TestRequestDecoding(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) { c.MaxBodyBytes = 1 << 10 })
	status, m := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","temperature":1,"top_k":3000000000}`)
	require.Equal(t, 400, status)
	require.Equal(t, "top_k", m["error"].(map[string]any)["param"])

	status, m = post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":2} garbage}`)
	require.Equal(t, 400, status, "trailing data")
	require.Contains(t, m["error"].(map[string]any)["message"], "after the JSON")
	status, m = post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":2}{"prompt":"again"}`)
	require.Equal(t, 400, status, "a second JSON value")

	status, m = post(t, ts, "/v1/completions", "", `{"prompt":"`+strings.Repeat("x", 2<<10)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, status, "%v", m)
	require.Contains(t, m["error"].(map[string]any)["message"], "1024 bytes")

	done := make(chan map[string]any, 1)
	go func() {
		_, m := post(t, ts, "/v1/completions", "", "{\"prompt\":\"Hi\",\"max_tokens\":2}\n\n ")
		done <- m
	}()
	a := takeArrival(t, s)
	require.Zero(t, a.ID, "refused requests use up no id")
	deliver(s, a, "yo")
	require.Equal(t, "cmpl-0", (<-done)["id"])
}

// Error bodies carry code as OpenAI does (a string or null, never the
// status number); a known path with the wrong method is 405; the bearer
// scheme is case-insensitive.
func TestErrorShapeMethodAndAuth(t *testing.T) {
	_, _, ts := fleetServer(t, func(c *Config) { c.APIKey = "k" })
	for _, c := range []struct {
		auth   string
		status int
		code   any
	}{
		{"Bearer k", 400, nil},
		{"bearer k", 400, nil},
		{"BEARER  k", 400, nil},
		{"Bearer x", 401, "invalid_api_key"},
		{"k", 401, "invalid_api_key"},
	} {
		req, _ := http.NewRequest("POST", ts.URL+"/v1/completions", strings.NewReader(`{}`))
		req.Header.Set("Authorization", c.auth)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var body struct {
			Error map[string]any `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		require.Equal(t, c.status, resp.StatusCode, c.auth)
		code, has := body.Error["code"]
		require.True(t, has, "code is always present")
		require.Equal(t, c.code, code, c.auth)
	}
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/completions", "POST"},
		{"PUT", "/v1/chat/completions", "POST"},
		{"POST", "/health", "GET, HEAD"},
		{"DELETE", "/v1/models", "GET, HEAD"},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
		req.Header.Set("Authorization", "Bearer k")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s: %s", c.method, c.path, b)
		require.Equal(t, c.allow, resp.Header.Get("Allow"))
		require.Contains(t, string(b), `"error"`)
	}
	resp, err := http.Get(ts.URL + "/v2/nothing")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 404, resp.StatusCode)
}

// rawRequest opens a connection and sends a request head announcing a
// body of n bytes, and the first part of it.
func rawRequest(t *testing.T, ts *httptest.Server, n int, first string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", n, first)
	require.NoError(t, err)
	return conn
}

// A body sent byte by byte holds its connection only until the body
// deadline: the client gets 408 and the connection is closed (defect 5).
func TestSlowBodyIsCut(t *testing.T) {
	_, _, ts := fleetServer(t, func(c *Config) { c.BodyTimeout = 300 * time.Millisecond })
	conn := rawRequest(t, ts, 100000, `{"prompt":`)
	start := time.Now()
	go func() {
		for range 20 {
			time.Sleep(100 * time.Millisecond)
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, string(b))
	require.Less(t, time.Since(start), 3*time.Second)
}

// Bodies being read at once share one byte budget: a request that finds
// no room waits until there is some, and the budget is whole again
// afterwards (defect 7).
func TestBodyBytesInFlightAreBounded(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) {
		c.MaxBodyBytes, c.BodyBytesInFlight, c.BodyTimeout = 1000, 2000, 5*time.Second
	})
	held := func() int64 {
		s.bodies.mu.Lock()
		defer s.bodies.mu.Unlock()
		return s.bodies.held
	}
	hold := []net.Conn{rawRequest(t, ts, 1000, "{"), rawRequest(t, ts, 1000, "{")}
	deadline := time.Now().Add(5 * time.Second)
	for held() != 2000 {
		require.True(t, time.Now().Before(deadline), "the two slow bodies hold %d bytes", held())
		time.Sleep(time.Millisecond)
	}
	done := make(chan int, 1)
	go func() {
		status, _ := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":0}`)
		done <- status
	}()
	select {
	case status := <-done:
		t.Fatalf("a body was read beyond the budget (status %d)", status)
	case <-time.After(300 * time.Millisecond):
	}
	require.EqualValues(t, 2000, held())
	for _, c := range hold {
		c.Close()
	}
	require.Equal(t, 400, <-done, "the waiting body is read once the budget has room")
	for held() != 0 {
		require.True(t, time.Now().Before(deadline), "%d body bytes still reserved", held())
		time.Sleep(time.Millisecond)
	}
}

// A model whose chat template recurses without end answers a chat request
// with 400 naming the template, and the server keeps serving (defect 2).
func TestHostileChatTemplateIs400(t *testing.T) {
	tok := byteTokenizer(t)
	spec := tok.Spec()
	spec.ChatTemplate = `{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}`
	bad, err := model.NewTokenizer(spec)
	require.NoError(t, err)
	s, _, ts := fleetServer(t, func(c *Config) { c.Tokenizer = bad })
	status, m := post(t, ts, "/v1/chat/completions", "", `{"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 400, status)
	msg := m["error"].(map[string]any)["message"].(string)
	require.Contains(t, msg, "chat template")
	require.Contains(t, msg, "depth limit")
	done := make(chan int, 1)
	go func() {
		status, _ := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":2}`)
		done <- status
	}()
	deliver(s, takeArrival(t, s), "ok")
	require.Equal(t, 200, <-done, "the server still serves")
}

// A rank whose process dies fails every open request at once, naming the
// rank: a stream with an error event, a waiting request with 500, a new
// one with 500, and /health stops reporting ready (defect 13). After a
// drain the same news is the fleet's normal end.
func TestPeerLostAnswersEveryRequest(t *testing.T) {
	s, met, ts := fleetServer(t)
	streamDone := make(chan string, 1)
	go func() {
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"Hi","max_tokens":50,"stream":true}`))
		if err != nil {
			streamDone <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		streamDone <- string(b)
	}()
	plain := make(chan map[string]any, 1)
	go func() {
		status, m := post(t, ts, "/v1/completions", "", `{"prompt":"Hi","max_tokens":5}`)
		m["status"] = float64(status)
		plain <- m
	}()
	as := takeArrivals(t, s, 2)
	// The stream has started: its first tokens went out.
	for _, a := range as {
		if a.MaxNewTokens == 50 {
			s.onTokens([]executor.TokenDelta{{ID: a.ID, Token: 'o'}})
		}
	}
	time.Sleep(50 * time.Millisecond)
	s.PeerLost(1)
	body := <-streamDone
	require.Contains(t, body, `"error"`)
	require.Contains(t, body, "rank 1's process is gone")
	require.Contains(t, body, "data: [DONE]")
	m := <-plain
	require.Equal(t, 500.0, m["status"])
	require.Contains(t, m["error"].(map[string]any)["message"], "rank 1")
	status, _ := post(t, ts, "/v1/completions", "", `{"prompt":"Hi"}`)
	require.Equal(t, 500, status)
	resp, err := http.Get(ts.URL + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	require.Equal(t, 2.0, finished(t, met)["error"])

	// The normal end: drained, then the peers leave.
	s2, _, ts2 := fleetServer(t)
	s2.Drain(context.Background())
	s2.PeerLost(1)
	require.Nil(t, s2.failed.Load(), "a peer leaving after the drain is no failure")
	resp, err = http.Get(ts2.URL + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode, "draining")
}

// A fleet that stops iterating is reported by /health.
func TestHealthReportsAStall(t *testing.T) {
	_, _, ts := fleetServer(t, func(c *Config) { c.StallAfter = 100 * time.Millisecond })
	get := func() (int, string) {
		resp, err := http.Get(ts.URL + "/health")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	status, _ := get()
	require.Equal(t, 200, status)
	time.Sleep(200 * time.Millisecond)
	status, body := get()
	require.Equal(t, 503, status)
	require.Contains(t, body, "stalled")
}
