package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/serve/loadgen"

	"github.com/lockstep-ai/lockstep/report"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/workload"
)

// fakeOAI is an OpenAI-compatible server with deterministic outputs: a
// request's token j is (sum of its prompt ids + 7j) mod 1000, each written
// as the text "tJ " after ttft (the first) or perToken (the others).
type fakeOAI struct {
	ttft, perToken time.Duration
	// fail, when set, answers the n-th request (from 0, in arrival order)
	// with an HTTP status and message, or (status 0, message non-empty)
	// with an error object in the middle of the stream.
	fail func(n int) (status int, msg string)

	mu       sync.Mutex
	cur, top int
	arrivals []time.Time
	bodies   []map[string]any
	paths    []string
}

func (f *fakeOAI) start(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

func fakeOutput(prompt []int32, n int) []int32 {
	var s int64
	for _, t := range prompt {
		s += int64(t)
	}
	out := make([]int32, n)
	for j := range out {
		out[j] = int32((s + 7*int64(j)) % 1000)
	}
	return out
}

// promptIDs reads the prompt of a request body: a token-id array, or a
// text/messages prompt (its bytes stand in for ids).
func promptIDs(body map[string]any) []int32 {
	var ids []int32
	switch p := body["prompt"].(type) {
	case []any:
		for _, v := range p {
			ids = append(ids, int32(v.(float64)))
		}
	case string:
		for _, c := range []byte(p) {
			ids = append(ids, int32(c))
		}
	}
	if ms, ok := body["messages"].([]any); ok {
		for _, m := range ms {
			for _, c := range []byte(m.(map[string]any)["content"].(string)) {
				ids = append(ids, int32(c))
			}
		}
	}
	return ids
}

func (f *fakeOAI) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (f *fakeOAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"},{"id":"other"}]}`)
		return
	}
	now := time.Now()
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	io.Copy(io.Discard, r.Body) //nolint:errcheck // so that a client's disconnect cancels r.Context()
	f.mu.Lock()
	n := len(f.arrivals)
	f.arrivals = append(f.arrivals, now)
	f.bodies = append(f.bodies, body)
	f.paths = append(f.paths, r.URL.Path)
	f.cur++
	f.top = max(f.top, f.cur)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.cur--
		f.mu.Unlock()
	}()
	var status int
	var failMsg string
	if f.fail != nil {
		status, failMsg = f.fail(n)
	}
	if status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"object":"error","error":{"message":%q,"type":"test","code":%d}}`, failMsg, status)
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	prompt := promptIDs(body)
	out := fakeOutput(prompt, int(body["max_tokens"].(float64)))
	ids, _ := body["return_token_ids"].(bool)
	choice := func(j int, final bool) map[string]any {
		c := map[string]any{"index": 0, "finish_reason": nil}
		text := ""
		if j >= 0 {
			text = fmt.Sprintf("t%d ", out[j])
			if ids {
				c["token_ids"] = []int32{out[j]}
			}
		}
		if chat {
			c["delta"] = map[string]any{"content": text}
		} else {
			c["text"] = text
		}
		if final {
			c["finish_reason"] = "length"
		}
		return c
	}
	usage := map[string]any{"prompt_tokens": len(prompt), "completion_tokens": len(out), "total_tokens": len(prompt) + len(out)}
	if stream, _ := body["stream"].(bool); !stream {
		if !f.sleep(r.Context(), f.ttft+time.Duration(max(0, len(out)-1))*f.perToken) {
			return
		}
		var text strings.Builder
		for j := range out {
			fmt.Fprintf(&text, "t%d ", out[j])
		}
		c := map[string]any{"index": 0, "finish_reason": "length"}
		if chat {
			c["message"] = map[string]any{"role": "assistant", "content": text.String()}
		} else {
			c["text"] = text.String()
		}
		if ids {
			c["token_ids"] = out
		}
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{c}, "usage": usage}) //nolint:errcheck
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
	}
	if chat { // a role-only first chunk, as vLLM sends: no content, no TTFT
		send(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant"}}}})
	}
	for j := range out {
		d := f.perToken
		if j == 0 {
			d = f.ttft
		}
		if !f.sleep(r.Context(), d) {
			return
		}
		if failMsg != "" && j == len(out)/2 {
			send(map[string]any{"error": map[string]any{"message": failMsg, "type": "internal"}})
			return
		}
		send(map[string]any{"choices": []any{choice(j, j == len(out)-1)}})
	}
	send(map[string]any{"choices": []any{}, "usage": usage})
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
}

// writeLGTrace writes a Mooncake trace: request i arrives at arrivals[i] ms,
// with a 20-token prompt (one block, hash id i+1) and out output tokens.
func writeLGTrace(t *testing.T, arrivalsMS []int, out int) string {
	var b strings.Builder
	for i, a := range arrivalsMS {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 20, "output_length": %d, "hash_ids": [%d]}`+"\n", a, out, i+1)
	}
	p := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	return p
}

// loadgenJSON runs `worker loadgen --report json` and decodes the report.
func loadgenJSON(t *testing.T, ctx context.Context, wantErr string, args ...string) (*report.Report, string) {
	t.Helper()
	var out, errb bytes.Buffer
	err := loadgenMain(ctx, append([]string{"--report", "json"}, args...), &out, &errb, func(string) string { return "" })
	if wantErr == "" {
		require.NoError(t, err, "stderr: %s", errb.String())
	} else {
		require.ErrorContains(t, err, wantErr)
	}
	var rep report.Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	return &rep, errb.String()
}

func readRecords(t *testing.T, path string) []loadgen.Record {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var recs []loadgen.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r loadgen.Record
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		recs = append(recs, r)
	}
	return recs
}

func ordered(t *testing.T, p report.Percentiles) {
	t.Helper()
	require.LessOrEqual(t, p.P50, p.P90)
	require.LessOrEqual(t, p.P90, p.P99)
}

func TestLoadgenTraceStreaming(t *testing.T) {
	f := &fakeOAI{ttft: 20 * time.Millisecond, perToken: 5 * time.Millisecond}
	srv := f.start(t)
	arrivals := []int{0, 30, 60, 90, 120, 150}
	trace := writeLGTrace(t, arrivals, 4)
	reqOut := filepath.Join(t.TempDir(), "requests.jsonl")
	t0 := time.Now()
	rep, _ := loadgenJSON(t, context.Background(), "", "--url", srv.URL+"/v1/", "--trace", trace,
		"--return-token-ids", "--requests-out", reqOut, "--vocab-size", "1000", "--seed", "3")

	require.Equal(t, "remote", rep.Engine)
	require.Equal(t, "fake-model", rep.Model) // the first of /v1/models
	require.Equal(t, 6, rep.Requests.Total)
	require.Equal(t, 6, rep.Requests.Completed)
	require.Zero(t, rep.Requests.Rejected)
	require.EqualValues(t, 24, rep.Tokens.Generated)
	require.EqualValues(t, 6*20, rep.Tokens.Prompt)
	// The server waits 20 ms before the first token and 5 ms before each
	// of the 3 others: lower bounds that hold on any machine.
	require.GreaterOrEqual(t, rep.TTFTMS.P50, 20.0)
	require.GreaterOrEqual(t, rep.E2EMS.P50, 35.0)
	require.Greater(t, rep.TPOTMS.P50, 0.0)
	for _, p := range []report.Percentiles{rep.TTFTMS, rep.TPOTMS, rep.E2EMS} {
		ordered(t, p)
	}
	require.GreaterOrEqual(t, rep.E2EMS.P50, rep.TTFTMS.P50)
	require.Greater(t, rep.OutputTokPerS, 0.0)
	require.GreaterOrEqual(t, rep.DurationS, 0.15+0.035)

	// Pacing: request i is sent no earlier than t0 + arrival_i, so the
	// k-th request the server saw came no earlier than the k-th arrival.
	f.mu.Lock()
	got := append([]time.Time(nil), f.arrivals...)
	bodies := f.bodies
	f.mu.Unlock()
	sort.Slice(got, func(a, b int) bool { return got[a].Before(got[b]) })
	for k, a := range arrivals {
		require.GreaterOrEqual(t, got[k].Sub(t0), time.Duration(a)*time.Millisecond, "request %d early", k)
	}

	// The request body: ids, exact lengths, streaming with usage, greedy.
	for _, b := range bodies {
		require.Equal(t, "fake-model", b["model"])
		require.IsType(t, []any{}, b["prompt"])
		require.Len(t, b["prompt"], 20)
		require.EqualValues(t, 4, b["max_tokens"])
		require.EqualValues(t, 4, b["min_tokens"])
		require.Equal(t, true, b["ignore_eos"])
		require.EqualValues(t, 0, b["temperature"])
		require.Equal(t, true, b["stream"])
		require.Equal(t, map[string]any{"include_usage": true}, b["stream_options"])
		require.Equal(t, true, b["return_token_ids"])
	}

	// The digest is the one `worker run` computes for the same outputs.
	reqs, err := workload.ReadFile(trace, workload.Options{LengthScale: 1, ArrivalScale: 1, VocabSize: 1000, Seed: 3})
	require.NoError(t, err)
	resp := make([]*executor.Response, len(reqs))
	for i := range reqs {
		resp[i] = &executor.Response{ID: uint64(i), Output: fakeOutput(reqs[i].Tokens(), reqs[i].MaxNewTokens)}
	}
	require.Equal(t, report.OutputDigest(resp), rep.OutputDigest)
	require.Empty(t, rep.OutputDigestNote)

	recs := readRecords(t, reqOut)
	require.Len(t, recs, 6)
	for i, r := range recs {
		require.Equal(t, i, r.Index)
		require.Equal(t, "completed", r.State)
		require.Equal(t, float64(arrivals[i]), r.ScheduledMS)
		require.GreaterOrEqual(t, r.SentMS, r.ScheduledMS)
		require.Equal(t, 20, r.PromptTokens)
		require.Equal(t, 4, r.OutputTokens)
		require.Equal(t, resp[i].Output, r.Output)
		require.GreaterOrEqual(t, r.TTFTMS, 20.0)
		require.GreaterOrEqual(t, r.E2EMS, r.TTFTMS)
		require.Empty(t, r.Error)
	}
}

func TestLoadgenTextReportWithoutTokenIDs(t *testing.T) {
	f := &fakeOAI{ttft: time.Millisecond, perToken: time.Millisecond}
	srv := f.start(t)
	var out, errb bytes.Buffer
	err := loadgenMain(context.Background(), []string{"--url", srv.URL, "--model", "m", "--trace", writeLGTrace(t, []int{0, 0, 0}, 3),
		"--arrival-scale", "0"}, &out, &errb, func(k string) string {
		if k == "OPENAI_API_KEY" {
			return "sk-test"
		}
		return ""
	})
	require.NoError(t, err, errb.String())
	s := out.String()
	t.Log("\n" + s)
	require.Contains(t, s, "lockstep loadgen report")
	require.Contains(t, s, "3 total, 3 completed, 0 rejected")
	require.Contains(t, s, "output digest none: 3 of 3 completed responses carried no token ids (--return-token-ids")
	require.Contains(t, s, "TTFT")
	for _, b := range f.bodies {
		require.Equal(t, "m", b["model"])
		require.NotContains(t, b, "return_token_ids")
	}
}

func TestLoadgenMaxConcurrency(t *testing.T) {
	f := &fakeOAI{ttft: 10 * time.Millisecond, perToken: 2 * time.Millisecond}
	srv := f.start(t)
	rep, _ := loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--trace", writeLGTrace(t, make([]int, 10), 3),
		"--arrival-scale", "0", "--max-concurrency", "2")
	require.Equal(t, 10, rep.Requests.Completed)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.LessOrEqual(t, f.top, 2)
	require.GreaterOrEqual(t, f.top, 1)
	require.Len(t, f.arrivals, 10)
}

func TestLoadgenErrorsAreRejections(t *testing.T) {
	f := &fakeOAI{ttft: time.Millisecond, perToken: time.Millisecond, fail: func(n int) (int, string) {
		switch n {
		case 1:
			return http.StatusTooManyRequests, "slow down"
		case 2:
			return http.StatusInternalServerError, "engine died"
		case 3:
			return 0, "stream broke"
		}
		return 0, ""
	}}
	srv := f.start(t)
	// One at a time, so the server's n-th request is the trace's n-th.
	rep, _ := loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--trace", writeLGTrace(t, make([]int, 5), 4),
		"--arrival-scale", "0", "--max-concurrency", "1", "--return-token-ids")
	require.Equal(t, 5, rep.Requests.Total)
	require.Equal(t, 2, rep.Requests.Completed)
	require.Equal(t, 3, rep.Requests.Rejected)
	reasons := map[uint64]string{}
	for _, r := range rep.Rejections {
		reasons[r.Index] = r.Reason
	}
	require.Equal(t, "HTTP 429: slow down (test)", reasons[1])
	require.Equal(t, "HTTP 500: engine died (test)", reasons[2])
	require.Contains(t, reasons[3], "server error: stream broke")
	require.EqualValues(t, 8, rep.Tokens.Generated)
	require.NotEmpty(t, rep.OutputDigest) // rejected requests count with length 0, as in `worker run`

	// Nothing served: the report is printed, then the run fails.
	f.fail = func(int) (int, string) { return http.StatusServiceUnavailable, "" }
	rep, _ = loadgenJSON(t, context.Background(), "no request was served", "--url", srv.URL, "--model", "m",
		"--trace", writeLGTrace(t, []int{0}, 2))
	require.Equal(t, 1, rep.Requests.Rejected)
	require.Contains(t, rep.Rejections[0].Reason, "HTTP 503")

	// A server that is not there.
	rep, _ = loadgenJSON(t, context.Background(), "no request was served", "--url", "http://127.0.0.1:1", "--model", "m",
		"--trace", writeLGTrace(t, []int{0}, 2))
	require.Equal(t, 1, rep.Requests.Rejected)
}

func TestLoadgenNonStreaming(t *testing.T) {
	f := &fakeOAI{ttft: 10 * time.Millisecond, perToken: time.Millisecond}
	srv := f.start(t)
	rep, _ := loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--trace", writeLGTrace(t, []int{0, 0}, 5),
		"--arrival-scale", "0", "--stream=false", "--return-token-ids", "--vocab-size", "1000")
	require.Equal(t, 2, rep.Requests.Completed)
	require.EqualValues(t, 10, rep.Tokens.Generated)
	require.Zero(t, rep.TTFTMS.P50) // not measured without streaming
	require.Zero(t, rep.TPOTMS.P50)
	require.Contains(t, rep.LatencyNote, "--stream=false", "the zeros say they were not measured")
	require.GreaterOrEqual(t, rep.E2EMS.P50, 10.0)
	require.NotEmpty(t, rep.OutputDigest)
	for _, b := range f.bodies {
		require.Equal(t, false, b["stream"])
		require.NotContains(t, b, "stream_options")
	}
	// Streamed and not, the same outputs digest the same.
	rep2, _ := loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--trace", writeLGTrace(t, []int{0, 0}, 5),
		"--arrival-scale", "0", "--return-token-ids", "--vocab-size", "1000")
	require.Equal(t, rep.OutputDigest, rep2.OutputDigest)
	require.Empty(t, rep2.LatencyNote, "streamed: measured")
}

func TestLoadgenChatPrompts(t *testing.T) {
	f := &fakeOAI{ttft: 5 * time.Millisecond, perToken: time.Millisecond}
	srv := f.start(t)
	prompts := filepath.Join(t.TempDir(), "prompts.jsonl")
	require.NoError(t, os.WriteFile(prompts, []byte(`{"prompt": "Hello"}
{"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 2}
`), 0o644))
	rep, _ := loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--prompts", prompts, "--endpoint", "chat", "--max-tokens", "3")
	require.Equal(t, 2, rep.Requests.Completed)
	require.EqualValues(t, 5, rep.Tokens.Generated)
	require.GreaterOrEqual(t, rep.TTFTMS.P50, 5.0) // the role-only chunk does not count
	require.Len(t, rep.Outputs, 2)
	require.Equal(t, "Hello", rep.Outputs[0].Prompt)
	require.Equal(t, 3, rep.Outputs[0].Tokens)
	require.Equal(t, fmt.Sprintf("t%d t%d t%d ", fakeOutput(promptIDs(map[string]any{"prompt": "Hello"}), 3)[0],
		fakeOutput(promptIDs(map[string]any{"prompt": "Hello"}), 3)[1], fakeOutput(promptIDs(map[string]any{"prompt": "Hello"}), 3)[2]),
		rep.Outputs[0].Text)
	require.Equal(t, "length", rep.Outputs[1].FinishReason)
	f.mu.Lock()
	for i, b := range f.bodies {
		require.Equal(t, "/v1/chat/completions", f.paths[i])
		require.Contains(t, b, "messages")
		require.NotContains(t, b, "prompt")
		require.NotContains(t, b, "ignore_eos") // prompts end at the model's stop tokens
	}
	f.mu.Unlock()

	// Messages need the chat endpoint.
	var out, errb bytes.Buffer
	code := run([]string{"loadgen", "--url", srv.URL, "--prompts", prompts}, &out, &errb)
	require.Equal(t, 2, code)
	require.Contains(t, errb.String(), "needs --endpoint chat")

	// A trace on the chat endpoint is sent as text.
	rep, _ = loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--trace", writeLGTrace(t, []int{0}, 2), "--endpoint", "chat")
	require.Equal(t, 1, rep.Requests.Completed)
	f.mu.Lock()
	msgs := f.bodies[len(f.bodies)-1]["messages"].([]any)
	f.mu.Unlock()
	require.Len(t, strings.Fields(msgs[0].(map[string]any)["content"].(string)), 20)
}

func TestLoadgenDuration(t *testing.T) {
	f := &fakeOAI{ttft: 5 * time.Millisecond, perToken: time.Millisecond}
	srv := f.start(t)
	start := time.Now()
	reqOut := filepath.Join(t.TempDir(), "requests.jsonl")
	rep, _ := loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--trace", writeLGTrace(t, []int{0, 0, 100_000, 200_000}, 2),
		"--duration", "200ms", "--requests-out", reqOut)
	require.Less(t, time.Since(start), 60*time.Second) // did not wait for the late arrivals
	require.Equal(t, 4, rep.Requests.Total)
	require.Equal(t, 2, rep.Requests.Completed)
	require.Equal(t, 2, rep.Requests.NotSent)
	recs := readRecords(t, reqOut)
	require.Equal(t, "not_sent", recs[3].State)
	f.mu.Lock()
	require.Len(t, f.arrivals, 2)
	f.mu.Unlock()

	// Requests still running at --duration + --grace are cancelled.
	slow := &fakeOAI{ttft: time.Minute}
	srv2 := slow.start(t)
	rep, _ = loadgenJSON(t, context.Background(), "no request was served", "--url", srv2.URL, "--model", "m",
		"--trace", writeLGTrace(t, []int{0}, 2), "--duration", "50ms", "--grace", "50ms")
	require.Equal(t, 1, rep.Requests.Cancelled)
}

func TestLoadgenInterruptReportsPartial(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// Two quick requests and two that never finish; the context (SIGINT
	// in the command) ends once the quick ones are done and the slow ones
	// are in flight.
	f := &fakeOAI{ttft: 5 * time.Millisecond, perToken: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	seen := 0
	var quick, slow sync.WaitGroup
	quick.Add(2)
	slow.Add(2)
	go func() {
		quick.Wait()
		slow.Wait()
		time.Sleep(100 * time.Millisecond) // the client reads the quick responses' ends
		cancel()
	}()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen++
		n := seen
		mu.Unlock()
		if n > 2 {
			io.Copy(io.Discard, r.Body) //nolint:errcheck // a closed connection cancels the context only once the body is read
			slow.Done()
			<-r.Context().Done()
			return
		}
		defer quick.Done()
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	reqOut := filepath.Join(t.TempDir(), "requests.jsonl")
	rep, _ := loadgenJSON(t, ctx, "interrupted", "--url", srv.URL, "--model", "m",
		"--trace", writeLGTrace(t, []int{0, 0, 0, 0, 600_000}, 2), "--max-concurrency", "4", "--requests-out", reqOut)
	require.Equal(t, 5, rep.Requests.Total)
	require.Equal(t, 2, rep.Requests.Completed, "%+v", rep.Rejections)
	require.Equal(t, 2, rep.Requests.Cancelled)
	require.Equal(t, 1, rep.Requests.NotSent)
	states := map[string]int{}
	for _, r := range readRecords(t, reqOut) {
		states[r.State]++
	}
	require.Equal(t, map[string]int{"completed": 2, "cancelled": 2, "not_sent": 1}, states)
}

func TestLoadgenFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--endpoint", "embeddings"}, "--endpoint"},
		{[]string{"--tokens", "ids", "--endpoint", "chat"}, "--tokens ids needs --endpoint completions"},
		{[]string{"--url", "localhost:8000"}, "http://"},
		{[]string{"--trace", "a", "--prompts", "b"}, "mutually exclusive"},
		{[]string{"--max-concurrency", "-1"}, "--max-concurrency"},
		{[]string{"--arrival-scale", "-1"}, "--arrival-scale"},
		{[]string{"--arrivals", "bursty"}, `--arrivals must be trace or poisson, got "bursty"`},
		{[]string{"--duration", "-1s"}, "--duration"},
		{[]string{"--model", "m", "--trace", "/nonexistent.jsonl"}, "/nonexistent.jsonl"},
	}
	trace := filepath.Join(t.TempDir(), "t.jsonl")
	body := []byte(`{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]}` + "\n")
	require.NoError(t, os.WriteFile(trace, body, 0o644))
	cases = append(cases, struct {
		args []string
		want string
	}{[]string{"--model", "m", "--trace", trace, "--requests-out", trace}, `--requests-out "` + trace + `" is the file --trace reads`})
	defer func() {
		got, err := os.ReadFile(trace)
		require.NoError(t, err)
		require.Equal(t, body, got, "the trace is untouched")
	}()
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := run(append([]string{"loadgen"}, c.args...), &out, &errb)
		require.Equal(t, 2, code, "%v: %s", c.args, errb.String())
		require.Contains(t, errb.String(), c.want, c.args)
	}
}

// A replay refused for its workload or its server opens no output: an
// earlier --requests-out file stays as it was (before, it was truncated
// first).
func TestLoadgenRefusalKeepsRequestsOut(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 3000, "output_length": 4, "hash_ids": [1]}`+"\n"), 0o644))
	good := filepath.Join(dir, "good.jsonl")
	require.NoError(t, os.WriteFile(good, []byte(`{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]}`+"\n"), 0o644))
	out := filepath.Join(dir, "requests.jsonl")
	require.NoError(t, os.WriteFile(out, []byte("an earlier replay\n"), 0o644))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "m", "--trace", bad}, `needs 6 blocks`},
		{[]string{"--trace", good, "--url", "http://127.0.0.1:1"}, "GET /v1/models"}, // nobody listens on port 1
	} {
		var stdout, stderr bytes.Buffer
		code := run(append(append([]string{"loadgen"}, c.args...), "--requests-out", out), &stdout, &stderr)
		require.NotEqual(t, 0, code)
		require.Contains(t, stderr.String(), c.want)
		got, err := os.ReadFile(out)
		require.NoError(t, err)
		require.Equal(t, "an earlier replay\n", string(got), "%v: --requests-out is untouched", c.args)
	}
}

// TestLoadgenSendsRoutingFields: a trace request's conversation_id,
// affinity_id, attention_dp_rank and attention_dp_relax go to the server in
// lockstep's routing fields, a request without them sends none (other
// servers see a plain OpenAI body), and --infer-conversations sends the
// conversation ids inferred from the hash_ids prefix chains.
func TestLoadgenSendsRoutingFields(t *testing.T) {
	f := &fakeOAI{ttft: time.Millisecond, perToken: time.Millisecond}
	srv := f.start(t)
	trace := filepath.Join(t.TempDir(), "routing.jsonl")
	lines := []string{
		`{"timestamp": 0, "input_length": 512, "output_length": 2, "hash_ids": [1], "conversation_id": "c1", "affinity_id": "a", "attention_dp_rank": 1, "attention_dp_relax": false}`,
		`{"timestamp": 0, "input_length": 500, "output_length": 2, "hash_ids": [2]}`,
		`{"timestamp": 0, "input_length": 1024, "output_length": 2, "hash_ids": [1, 3], "conversation_id": 7}`,
	}
	require.NoError(t, os.WriteFile(trace, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	rep, _ := loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--trace", trace, "--arrival-scale", "0",
		"--max-concurrency", "1")
	require.Equal(t, 3, rep.Requests.Completed)
	f.mu.Lock()
	bodies := append([]map[string]any(nil), f.bodies...)
	f.bodies = nil
	f.mu.Unlock()
	require.Len(t, bodies, 3)
	var plain, first, third map[string]any
	for _, b := range bodies {
		switch {
		case len(b["prompt"].([]any)) == 1024:
			third = b
		case b["conversation_id"] == "c1":
			first = b
		default:
			plain = b
		}
	}
	require.Equal(t, "a", first["affinity_id"])
	require.EqualValues(t, 1, first["attention_dp_rank"])
	require.Equal(t, false, first["attention_dp_relax"])
	require.Equal(t, "7", third["conversation_id"], "a number as written")
	require.NotContains(t, third, "attention_dp_rank")
	for _, k := range []string{"conversation_id", "affinity_id", "attention_dp_rank", "attention_dp_relax"} {
		require.NotContains(t, plain, k)
	}

	// Inferred: the third request continues the first's chain (hash 1).
	_, _ = loadgenJSON(t, context.Background(), "", "--url", srv.URL, "--trace", trace, "--arrival-scale", "0",
		"--max-concurrency", "1", "--infer-conversations")
	f.mu.Lock()
	bodies = append([]map[string]any(nil), f.bodies...)
	f.mu.Unlock()
	require.Len(t, bodies, 3)
	for _, b := range bodies {
		require.Contains(t, b, "conversation_id", "every request has a conversation once inferred")
	}
}
