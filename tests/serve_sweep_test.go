//go:build native

package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/racetest"
)

// TestRandomServeTrafficLosesNothing runs seeded random deployments of
// `worker serve`: the CPU engine's tiny presets on attention-DP ranks or a
// Helix group, in-process or under mpirun, or 8 to 64 in-process ranks of
// the pure-Go engine; either capacity policy, small pools, chunked prefill
// on or off, small token and batch budgets, a short queue bound, a small
// max-active-per-rank, max_seq_len, a request timeout. Each is hit by a
// burst of random concurrent clients: completions of one or several
// token-id prompts, n choices, streaming or not, log-probabilities, stop
// token ids, penalties, echo, usage options, routing fields (recurring
// conversation ids and prompt cache keys, target ranks relaxed or strict),
// some requests malformed, some clients going away mid-answer, and in some
// runs SIGTERM amid the traffic. Every answer must be well formed: 200 with
// every choice finished once, or 400/413/429 with an error body (504 under
// a timeout, 503 once draining); never a 500, a lost or hung request, or a
// crash. Once the clients are gone the fleet must be idle (no request
// running, waiting or queued; no page in use but cached prefix blocks), a
// request of most of max_model_len must still be served (no page was
// leaked), and SIGTERM must drain and exit 0.
// LOCKSTEP_SWEEP_RUNS sets the number of deployments (default 16, about
// 15 s; 180 passed when it was written), LOCKSTEP_SWEEP_FIRST the first seed.
func TestRandomServeTrafficLosesNothing(t *testing.T) {
	if racetest.Enabled {
		t.Skip("end-to-end runs of the worker binary: covered by the normal pass")
	}
	first, last := sweepSeeds(t, 16)
	bin := worker(t)
	served, refused := 0, 0
	for seed := first; seed <= last; seed++ {
		rng := rand.New(rand.NewPCG(uint64(seed), 0x5e7e))
		d := drawServeDeployment(rng)
		cmdline := "bin/worker serve " + strings.Join(d.args, " ")
		if d.mpirun > 0 {
			needMPIRun(t)
			cmdline = fmt.Sprintf("mpirun --allow-run-as-root --oversubscribe -np %d %s", d.mpirun, cmdline)
		}
		srv, ok := startServeOrRefusal(t, bin, d)
		if !ok {
			refused++
			continue
		}
		func() {
			defer srv.kill()
			if d.sigterm {
				// SIGTERM amid the traffic: every client still gets an
				// answer (the drain's), and the process exits 0.
				go func() {
					time.Sleep(time.Duration(20+rng.IntN(200)) * time.Millisecond)
					srv.signal(t)
				}()
				trafficBurst(t, rng, srv.base, d, seed, cmdline, srv.out)
				srv.stop(t, seed, cmdline, false) // a second signal would exit at once
				return
			}
			trafficBurst(t, rng, srv.base, d, seed, cmdline, srv.out)
			requireIdle(t, srv.base, d, seed, cmdline, srv.out)
			requireFullPoolServed(t, srv.base, d, seed, cmdline, srv.out)
			srv.stop(t, seed, cmdline, true)
		}()
		served++
	}
	t.Logf("%d deployments took the traffic, %d refused to start", served, refused)
	require.Positive(t, served)
}

// serveDeployment is a drawn server configuration.
type serveDeployment struct {
	args     []string
	ranks    int // attention-DP ranks (1 for a Helix group)
	maxQueue int
	reuse    bool // prefix reuse on
	timeout  bool // --request-timeout: 504, or an error event on a stream, is an answer
	sigterm  bool // SIGTERM while the clients are still sending
	mpirun   int  // > 0: that many processes under mpirun instead of in-process ranks
	maxSeq   int  // --max-seq-len (0: none)
	wide     bool // the fake engine on 8–64 ranks, 96 clients
}

func drawServeDeployment(rng *rand.Rand) serveDeployment {
	pick := func(v ...string) string { return v[rng.IntN(len(v))] }
	d := serveDeployment{ranks: 1 + rng.IntN(3), maxQueue: []int{4, 16, 256}[rng.IntN(3)], reuse: rng.IntN(2) == 0}
	// A wide fleet: 8 to 64 in-process ranks of the pure-Go engine under
	// four times the clients.
	d.wide = rng.IntN(4) == 0
	engine, model := "cpu", pick("tiny", "tiny", "moe-tiny", "deepseek-tiny")
	if d.wide {
		engine, model = "fake", "tiny"
	}
	d.args = []string{"--engine", engine, "--model", model, "--log-level", "error",
		"--policy", pick("max_utilization", "guaranteed_no_evict"),
		"--max-batch-size", pick("1", "4", "16", "64"), "--max-num-tokens", pick("32", "64", "256", "1024"),
		"--chunked-prefill=" + pick("true", "true", "false"), "--pages", pick("16", "32", "64", "256"),
		"--tokens-per-page", pick("4", "8", "16"), "--max-queue", strconv.Itoa(d.maxQueue)}
	mpi := rng.IntN(5) == 0
	switch {
	case d.wide:
		d.ranks = []int{8, 16, 32, 64}[rng.IntN(4)]
		d.args = append(d.args, "--ranks", strconv.Itoa(d.ranks))
	case rng.IntN(4) == 0:
		d.ranks = 1
		cp := pick("2", "4")
		d.args = append(d.args, "--cp", cp)
		if mpi {
			d.mpirun, _ = strconv.Atoi(cp)
		} else {
			d.args = append(d.args, "--ranks", "1")
		}
	case mpi:
		d.ranks = 2 + rng.IntN(2)
		d.mpirun = d.ranks
	default:
		d.args = append(d.args, "--ranks", strconv.Itoa(d.ranks))
	}
	if !d.reuse {
		d.args = append(d.args, "--no-prefix-reuse")
	}
	maybe := func(p float64, extra ...string) {
		if rng.Float64() < p {
			d.args = append(d.args, extra...)
		}
	}
	maybe(0.3, "--admission-lookahead", pick("4", "64"))
	maybe(0.2, "--host-pages", "64")
	maybe(0.3, "--chunk-unit", pick("4", "16", "64"))
	maybe(0.2, "--overlap", "off")
	if rng.IntN(5) == 0 {
		d.maxSeq = []int{64, 256}[rng.IntN(2)]
		d.args = append(d.args, "--max-seq-len", strconv.Itoa(d.maxSeq))
	}
	if rng.IntN(5) == 0 {
		d.timeout = true
		d.args = append(d.args, "--request-timeout", pick("100ms", "1s"))
	}
	if rng.IntN(4) == 0 {
		d.sigterm = true
		d.args = append(d.args, "--drain-timeout", pick("200ms", "2s", "30s"))
	}
	maybe(0.3, "--metrics-compat", "vllm")
	maybe(0.3, "--enable-prompt-tokens-details")
	if d.ranks > 1 {
		// Attention DP's balancing and the conversation router under live
		// traffic (issue 25's modes).
		maybe(0.3, "--attention-dp-balance", "--attention-dp-timeout-iters", pick("2", "50"))
		maybe(0.3, "--attention-dp-cost-leveling")
		maybe(0.3, "--router", "conversation", "--new-conv-placement",
			pick("round_robin", "least_queued", "least_tokens", "least_prefill"))
	}
	if d.mpirun == 0 && rng.IntN(4) == 0 {
		// KV cache events published over ZeroMQ, with nobody subscribed:
		// bound, or connected to a peer that is not there.
		_, port, _ := strings.Cut(freePort(), ":")
		d.args = append(d.args, "--kv-events-endpoint", pick("tcp://*:", "tcp://127.0.0.1:")+port)
	}
	// Drawn last, so that the draws above stay those of the seeds already
	// run: a small cap H holds most of the traffic in the fleet's queue.
	maybe(0.25, "--max-active-per-rank", pick("1", "2", "8"))
	return d
}

// servedProcess is a running `worker serve`.
type servedProcess struct {
	bin  string
	mpi  bool // under mpirun: signals go to rank 0's process
	cmd  *exec.Cmd
	base string
	out  *bytes.Buffer
	done chan error // the exit, once
	over bool       // done was read
}

func (s *servedProcess) kill() {
	if s.over {
		return
	}
	s.cmd.Process.Kill() //nolint:errcheck
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
	}
}

// stop sends SIGTERM and requires a drain and exit 0.
func (s *servedProcess) stop(t *testing.T, seed int, cmdline string, signal bool) {
	t.Helper()
	if signal {
		s.signal(t)
	}
	select {
	case err := <-s.done:
		s.over = true
		require.NoError(t, err, "seed %d: SIGTERM must drain and exit 0: %s\n%s", seed, cmdline, s.out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("seed %d: no exit 60 s after SIGTERM: %s\n%s", seed, cmdline, s.out.String())
	}
}

// signal sends SIGTERM to the server (under mpirun, to rank 0's process:
// mpirun itself tears a job down on SIGTERM).
func (s *servedProcess) signal(t *testing.T) {
	if s.mpi {
		syscall.Kill(rankZeroPID(t, s.bin), syscall.SIGTERM) //nolint:errcheck
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
}

// startServeOrRefusal starts `worker serve` and waits for /health; a
// configuration it refuses (exit status 2 before serving, saying why) is
// reported as not started.
func startServeOrRefusal(t *testing.T, bin string, d serveDeployment) (*servedProcess, bool) {
	t.Helper()
	addr := freeAddr(t)
	args := d.args
	full := append([]string{bin, "serve", "--http", addr}, args...)
	if d.mpirun > 0 {
		full = append([]string{"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(d.mpirun)}, full...)
	}
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &syncWriter{w: &out}, &syncWriter{w: &out}
	require.NoError(t, cmd.Start())
	s := &servedProcess{bin: bin, mpi: d.mpirun > 0, cmd: cmd, base: "http://" + addr, out: &out, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-s.done:
			var exit *exec.ExitError
			require.False(t, isPanic(out.String()), "worker serve %s panicked: %s", strings.Join(args, " "), lastLines(out.String(), 30))
			require.True(t, errors.As(err, &exit) && exit.ExitCode() == 2,
				"worker serve %s ended before serving (%v), not as a refusal: %s", strings.Join(args, " "), err, out.String())
			require.NotEmpty(t, strings.TrimSpace(out.String()), "a refusal says why")
			t.Logf("refused: %s", lastLines(out.String(), 1))
			return nil, false
		default:
		}
		resp, err := http.Get(s.base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s, true
			}
		}
		if time.Now().After(deadline) {
			s.kill()
			t.Fatalf("worker serve %s never became ready: %s", strings.Join(args, " "), out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncWriter serialises the process's two output streams into one buffer.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// chaosRequest is one drawn request and what a correct answer to it is.
type chaosRequest struct {
	body    map[string]any
	choices int // prompts × n
	stream  bool
	bad     bool // malformed on purpose: 400 is the answer
	leave   int  // > 0: the client goes away after this many stream events (or this many ms)
	maxTok  int
}

func drawChaosRequest(rng *rand.Rand, maxQueue, ranks int) chaosRequest {
	prompt := func() []int {
		p := make([]int, 1+rng.IntN([]int{8, 64, 400}[rng.IntN(3)]))
		for i := range p {
			p[i] = rng.IntN(512)
		}
		return p
	}
	var c chaosRequest
	prompts := 1
	var body = map[string]any{}
	if rng.IntN(5) == 0 {
		prompts = 1 + rng.IntN(3)
		ps := make([][]int, prompts)
		for i := range ps {
			ps[i] = prompt()
		}
		body["prompt"] = ps
	} else {
		body["prompt"] = prompt()
	}
	c.maxTok = 1 + rng.IntN([]int{4, 32, 200}[rng.IntN(3)])
	body["max_tokens"] = c.maxTok
	n := 1
	if rng.IntN(4) == 0 {
		n = 1 + rng.IntN(4)
		body["n"] = n
	}
	c.choices = prompts * n
	c.bad = c.choices > maxQueue // more engine requests than --max-queue: 400 naming n
	c.stream = rng.IntN(2) == 0
	body["stream"] = c.stream
	if c.stream && rng.IntN(2) == 0 {
		body["stream_options"] = map[string]any{"include_usage": true, "continuous_usage_stats": rng.IntN(2) == 0}
	}
	maybe := func(p float64, k string, v func() any) {
		if rng.Float64() < p {
			body[k] = v()
		}
	}
	maybe(0.5, "temperature", func() any { return []float64{0, 0.7, 1.5}[rng.IntN(3)] })
	maybe(0.3, "seed", func() any { return rng.IntN(1000) })
	maybe(0.2, "top_k", func() any { return 1 + rng.IntN(50) })
	maybe(0.2, "top_p", func() any { return 0.5 + rng.Float64()/2 })
	maybe(0.3, "ignore_eos", func() any { return true })
	maybe(0.2, "logprobs", func() any { return rng.IntN(6) })
	maybe(0.2, "stop_token_ids", func() any { return []int{rng.IntN(512), rng.IntN(512)} })
	maybe(0.1, "presence_penalty", func() any { return rng.Float64() })
	maybe(0.1, "repetition_penalty", func() any { return 1 + rng.Float64() })
	maybe(0.1, "logit_bias", func() any { return map[string]int{strconv.Itoa(rng.IntN(512)): 5} })
	maybe(0.2, "return_token_ids", func() any { return true })
	if _, lp := body["logprobs"]; !lp {
		maybe(0.1, "echo", func() any { return true })
	}
	// Routing (docs/serving.md): a few conversations and affinities that
	// recur across the clients, and targets, relaxed or strict, that a small
	// max-active-per-rank makes wait.
	maybe(0.3, "conversation_id", func() any { return "c" + strconv.Itoa(rng.IntN(4)) })
	maybe(0.15, "prompt_cache_key", func() any { return "k" + strconv.Itoa(rng.IntN(2)) })
	if rng.IntN(6) == 0 {
		body["attention_dp_rank"] = rng.IntN(max(ranks, 1))
		maybe(0.5, "attention_dp_relax", func() any { return rng.IntN(2) == 0 })
	}
	if rng.IntN(10) == 0 {
		c.bad = true
		switch rng.IntN(6) {
		case 0:
			body["no_such_field"] = 1
		case 1:
			body["max_tokens"] = -1
		case 2:
			body["n"] = 0
		case 3:
			body["logprobs"] = 25
		case 4:
			body["prompt"] = []int{1, 2, 100000}
		case 5:
			body["prompt"] = []int{}
		}
	}
	if !c.bad && rng.IntN(5) == 0 {
		c.leave = 1 + rng.IntN(20)
	}
	c.body = body
	return c
}

// trafficBurst runs 24 clients (96 on a wide fleet) of 1–3 random requests
// each, at once.
func trafficBurst(t *testing.T, rng *rand.Rand, base string, d serveDeployment, seed int, cmdline string, out *bytes.Buffer) {
	t.Helper()
	var reqs [][]chaosRequest
	clients := 24
	if d.wide {
		clients = 96
	}
	for range clients {
		var rs []chaosRequest
		for range 1 + rng.IntN(3) {
			rs = append(rs, drawChaosRequest(rng, d.maxQueue, d.ranks))
		}
		reqs = append(reqs, rs)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for _, rs := range reqs {
		wg.Go(func() {
			for _, r := range rs {
				if err := chaosExchange(base, r, d); err != nil {
					b, _ := json.Marshal(r.body)
					if len(b) > 400 {
						b = append(b[:400], "…"...)
					}
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%v\n  request: %s", err, b))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, failures, "seed %d: %s\nserver: %s", seed, cmdline, lastLines(out.String(), 20))
}

// chaosExchange sends r and checks the answer. Under a request timeout a
// 504 (a stream: an error event) is an answer too; once SIGTERM was sent, a
// 503, the drain's error event, or a refused connection.
func chaosExchange(base string, r chaosRequest, d serveDeployment) error {
	b, _ := json.Marshal(r.body)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if r.leave > 0 && !r.stream {
		ctx, cancel = context.WithTimeout(ctx, time.Duration(r.leave)*time.Millisecond)
		defer cancel()
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if r.leave > 0 && errors.Is(err, context.DeadlineExceeded) {
			return nil // went away before the answer
		}
		if d.sigterm && !errors.Is(err, context.DeadlineExceeded) {
			return nil // the listener closed
		}
		return fmt.Errorf("no answer: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case 200:
	case 400, 413, 429, 503, 504:
		body, err := io.ReadAll(resp.Body)
		if err != nil && r.leave > 0 {
			return nil
		}
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if json.Unmarshal(body, &e) != nil || e.Error.Message == "" {
			return fmt.Errorf("status %d without an OpenAI error body: %s", resp.StatusCode, body)
		}
		switch {
		case resp.StatusCode == 400 && !r.bad:
			return fmt.Errorf("a well-formed request answered 400: %s", body)
		case resp.StatusCode == 503 && !d.sigterm:
			return fmt.Errorf("503 while serving: %s", body)
		case resp.StatusCode == 504 && !d.timeout:
			return fmt.Errorf("504 without a request timeout: %s", body)
		}
		return nil
	default:
		body, _ := io.ReadAll(resp.Body)
		if r.leave > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil
		}
		return fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	if r.bad {
		return errors.New("a malformed request was answered 200")
	}
	if r.stream {
		return checkStream(resp.Body, r, d)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		if r.leave > 0 {
			return nil
		}
		return fmt.Errorf("reading the answer: %w", err)
	}
	var ans struct {
		Choices []struct {
			Index        int     `json:"index"`
			FinishReason *string `json:"finish_reason"`
			TokenIDs     []int   `json:"token_ids"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		return fmt.Errorf("answer is not JSON: %v: %s", err, body)
	}
	if len(ans.Choices) != r.choices {
		return fmt.Errorf("%d choices, want %d: %s", len(ans.Choices), r.choices, body)
	}
	seen := make([]bool, r.choices)
	for _, c := range ans.Choices {
		if c.Index < 0 || c.Index >= r.choices || seen[c.Index] {
			return fmt.Errorf("choice index %d repeated or out of range: %s", c.Index, body)
		}
		seen[c.Index] = true
		if c.FinishReason == nil || *c.FinishReason != "stop" && *c.FinishReason != "length" {
			return fmt.Errorf("choice %d has no finish reason stop/length: %s", c.Index, body)
		}
	}
	if ans.Usage.CompletionTokens > r.maxTok*r.choices {
		return fmt.Errorf("usage.completion_tokens %d over max_tokens × choices %d", ans.Usage.CompletionTokens, r.maxTok*r.choices)
	}
	return nil
}

// checkStream reads a server-sent-event answer to [DONE]: every choice ends
// exactly once with stop/length, and no event is an error (but a timeout's
// or the drain's, which ends the stream). A client that leaves closes the
// stream after r.leave events.
func checkStream(body io.Reader, r chaosRequest, d serveDeployment) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	finished := make([]int, r.choices)
	events := 0
	ended := false // an error event came
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return fmt.Errorf("stream line without data: %q", line)
		}
		if data == "[DONE]" {
			if ended {
				return nil
			}
			for i, f := range finished {
				if f != 1 {
					return fmt.Errorf("choice %d finished %d times before [DONE]", i, f)
				}
			}
			return nil
		}
		if ended {
			return fmt.Errorf("an event after the error event: %s", data)
		}
		events++
		if r.leave > 0 && events >= r.leave {
			return nil // the client goes away: the body is closed
		}
		var ev struct {
			Error   *struct{ Message string } `json:"error"`
			Choices []struct {
				Index        int     `json:"index"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return fmt.Errorf("stream event is not JSON: %v: %s", err, data)
		}
		if ev.Error != nil {
			if !d.timeout && !d.sigterm {
				return fmt.Errorf("error event: %s", ev.Error.Message)
			}
			ended = true
			continue
		}
		for _, c := range ev.Choices {
			if c.Index < 0 || c.Index >= r.choices {
				return fmt.Errorf("stream choice index %d out of range", c.Index)
			}
			if c.FinishReason != nil {
				if *c.FinishReason != "stop" && *c.FinishReason != "length" {
					return fmt.Errorf("choice %d finished with %q", c.Index, *c.FinishReason)
				}
				finished[c.Index]++
			}
		}
	}
	if r.leave > 0 || ended {
		return nil
	}
	return fmt.Errorf("stream ended without [DONE] (%v) after %d events", sc.Err(), events)
}

// requireIdle waits until no request runs, waits on a rank or waits in the
// fleet's queue, and no rank has a page in use (cached prefix blocks no
// request holds count as free): the requests that finished, were refused or
// were abandoned left nothing behind.
func requireIdle(t *testing.T, base string, d serveDeployment, seed int, cmdline string, out *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mt := scrape(t, base, "")
		idle := mt["lockstep_requests_running{}"] == 0 && mt["lockstep_requests_waiting{}"] == 0 &&
			mt["lockstep_requests_queued{}"] == 0
		for k, v := range mt {
			if strings.HasPrefix(k, "lockstep_rank_kv_cache_used_pages{") && v != 0 {
				idle = false
			}
		}
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("seed %d: the fleet is not idle 60 s after the last client: %s\nmetrics: %v\nserver: %s", seed, cmdline,
				pick(mt, "lockstep_requests_running", "lockstep_requests_waiting", "lockstep_requests_queued",
					"lockstep_rank_kv_cache_used_pages"),
				lastLines(out.String(), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireFullPoolServed sends one request of most of max_model_len (the
// pool's tokens, or max_seq_len), or the longest the configuration can ever
// serve (413 names the rest: a prompt over the budget without chunked
// prefill, a reservation over one rank's pool): a page leaked by the traffic
// before would leave it waiting for ever.
func requireFullPoolServed(t *testing.T, base string, d serveDeployment, seed int, cmdline string, out *bytes.Buffer) {
	t.Helper()
	resp, err := http.Get(base + "/v1/models")
	require.NoError(t, err)
	var models struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&models))
	resp.Body.Close()
	require.Len(t, models.Data, 1)
	l := models.Data[0].MaxModelLen
	if d.maxSeq > 0 {
		require.LessOrEqual(t, l, d.maxSeq, "seed %d: max_model_len is at most --max-seq-len: %s", seed, cmdline)
	}
	retries := 0 // of the smallest request: --request-timeout 100ms can pass on a loaded machine
	for total := l - 1; ; total = total * 3 / 4 {
		if total == 0 && d.timeout && retries < 10 {
			total, retries = 1, retries+1
			time.Sleep(100 * time.Millisecond)
		}
		require.Positive(t, total, "seed %d: not even a 1-token request is served: %s", seed, cmdline)
		prompt := make([]int, max(1, total*3/4))
		for i := range prompt {
			prompt[i] = (i * 7) % 512
		}
		maxTok := max(1, total-len(prompt))
		b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTok, "ignore_eos": true, "return_token_ids": true})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", bytes.NewReader(b))
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err, "seed %d: a request of %d+%d tokens (max_model_len %d) after the traffic: %s\nserver: %s",
			seed, len(prompt), maxTok, l, cmdline, lastLines(out.String(), 20))
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode == http.StatusRequestEntityTooLarge && total > 1 ||
			resp.StatusCode == http.StatusGatewayTimeout && d.timeout && (total > 1 || retries < 10) {
			continue // never servable here, or not within --request-timeout: a shorter one
		}
		require.Equal(t, 200, resp.StatusCode, "seed %d: a request of %d+%d tokens after the traffic: %s\n%s", seed, len(prompt), maxTok, cmdline, body)
		var ans struct {
			Choices []struct {
				TokenIDs []int `json:"token_ids"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal(body, &ans))
		require.Len(t, ans.Choices, 1)
		require.Len(t, ans.Choices[0].TokenIDs, maxTok, "seed %d: ignore_eos runs to max_tokens: %s", seed, cmdline)
		return
	}
}

func pick(m map[string]float64, prefixes ...string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				out[k] = v
			}
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort is a free local TCP address (host:port).
func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
