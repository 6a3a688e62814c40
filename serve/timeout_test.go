package serve

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
)

// --request-timeout: a request the fleet does not finish in time is
// withdrawn from every rank (the client-disconnect path) and answered 504
// (a stream: an error event, then [DONE]); the ranks' answer is counted as
// cancelled; a request still queued leaves the queue at once.
func TestRequestTimeout(t *testing.T) {
	s, met, ts := fleetServer(t, func(c *Config) { c.RequestTimeout = 150 * time.Millisecond })
	start := time.Now()
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":4}`)
	a := takeArrival(t, s)
	m := <-done
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	require.Equal(t, 504.0, m["status"], m)
	e := m["error"].(map[string]any)
	require.Equal(t, "timeout", e["code"])
	require.Contains(t, e["message"], "--request-timeout")
	require.Equal(t, []uint64{a.ID}, withdrawn(t, s, 1))
	before := finished(t, met)["cancelled"]
	s.onResponse(executor.Response{ID: a.ID, Error: executor.CancelledError, ArrivalUnixNS: a.ArrivalUnixNS})
	require.Equal(t, before+1, finished(t, met)["cancelled"])
	s.mu.Lock()
	require.NotContains(t, s.calls, a.ID)
	s.mu.Unlock()

	// Streaming: the tokens so far, then the error event.
	body := streamBody(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":4,"stream":true}`)
	a = takeArrival(t, s)
	s.onTokens([]executor.TokenDelta{{ID: a.ID, Token: 'o'}, {ID: a.ID, Token: 'k'}})
	got := <-body
	require.Contains(t, got, `"text":"ok"`)
	require.Contains(t, got, `"code":"timeout"`)
	require.True(t, strings.HasSuffix(got, "data: [DONE]\n\n"), got)
	require.Equal(t, []uint64{a.ID}, withdrawn(t, s, 1))

	// Still queued when it expires: dropped from the queue, never handed out.
	before = finished(t, met)["cancelled"]
	m = <-postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":4}`)
	require.Equal(t, 504.0, m["status"], m)
	require.Empty(t, s.src.Due(time.Now()))
	require.Equal(t, before+1, finished(t, met)["cancelled"])
}
