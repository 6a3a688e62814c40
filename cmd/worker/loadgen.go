package main

// `worker loadgen` replays a Mooncake trace (or a prompts file) against any
// OpenAI-compatible HTTP endpoint — lockstep's `worker serve`, vLLM, SGLang,
// trtllm-serve — at the trace's (scaled) timestamps, streaming, and reports
// TTFT, TPOT, E2E and throughput in the JSON shape of `worker run`
// (docs/loadgen.md).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockstep-ai/lockstep/workload/prompts"

	"github.com/lockstep-ai/lockstep/report"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/workload"
)

// loadgenOptions are `worker loadgen`'s flags.
type loadgenOptions struct {
	url, model, apiKey        string
	trace, promptsFile        string
	limit                     int
	lengthScale, arrivalScale float64
	maxConcurrency            int
	duration, grace, timeout  time.Duration
	endpoint, report, tokens  string
	requestsOut               string
	stream, returnTokenIDs    bool
	ignoreEOS                 bool
	maxTokens                 int
	vocabSize                 int
	seed                      uint64
}

// defaultVocabSize bounds the synthesised prompt ids of a trace when
// neither --vocab-size nor a lockstep preset name says better: every
// common tokenizer (Llama 2: 32000; Llama 3: 128256; Qwen: 151936) has
// at least this many tokens.
const defaultVocabSize = 32000

func defaultLoadgenOptions() loadgenOptions {
	return loadgenOptions{url: "http://127.0.0.1:8000", lengthScale: 1, arrivalScale: 1, grace: 30 * time.Second,
		timeout: 10 * time.Minute, endpoint: "completions", report: "text", stream: true, ignoreEOS: true,
		maxTokens: 128, seed: 1}
}

func (o *loadgenOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.url, "url", o.url, "base URL of the OpenAI-compatible server (the /v1/... paths are appended)")
	fs.StringVar(&o.model, "model", o.model, "model name sent with each request (default: the first of GET /v1/models)")
	fs.StringVar(&o.apiKey, "api-key", o.apiKey, "Bearer token (default: $OPENAI_API_KEY)")
	fs.StringVar(&o.trace, "trace", o.trace, "Mooncake JSON Lines trace to replay (default: the built-in sample of 64 requests)")
	fs.StringVar(&o.promptsFile, "prompts", o.promptsFile, "JSON Lines of prompts, each {\"prompt\": TEXT} or {\"messages\": [...]}, optional \"max_tokens\"; sent at once")
	fs.IntVar(&o.limit, "limit", o.limit, "send at most N requests (0 = all)")
	fs.Float64Var(&o.lengthScale, "length-scale", o.lengthScale, "multiply a trace's input, output and block lengths by F")
	fs.Float64Var(&o.arrivalScale, "arrival-scale", o.arrivalScale, "multiply trace arrival times by F (0 = every request at once)")
	fs.IntVar(&o.maxConcurrency, "max-concurrency", o.maxConcurrency, "most requests in flight (0 = unbounded); a request due while N are in flight waits")
	fs.DurationVar(&o.duration, "duration", o.duration, "stop issuing requests after D (0 = no limit); requests in flight then get --grace to finish")
	fs.DurationVar(&o.grace, "grace", o.grace, "with --duration: how long requests in flight may run past it before they are cancelled")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "per-request limit, whole response included (0 = none)")
	fs.StringVar(&o.endpoint, "endpoint", o.endpoint, "completions (/v1/completions) or chat (/v1/chat/completions; prompts with \"messages\" need it)")
	fs.StringVar(&o.report, "report", o.report, "report format: text or json")
	fs.StringVar(&o.requestsOut, "requests-out", o.requestsOut, "write one JSON line per request to this file")
	fs.StringVar(&o.tokens, "tokens", o.tokens, "how a trace's synthesised prompt is sent: ids (a token-id array; completions only) "+
		"or text (one common word per token, lengths approximate); default ids, text with --endpoint chat")
	fs.BoolVar(&o.stream, "stream", o.stream, "stream responses (SSE); --stream=false measures E2E only")
	fs.BoolVar(&o.returnTokenIDs, "return-token-ids", o.returnTokenIDs, "ask for the output token ids (\"return_token_ids\": true: lockstep's server, recent vLLM) "+
		"to compute output_digest as worker run does")
	fs.BoolVar(&o.ignoreEOS, "ignore-eos", o.ignoreEOS, "trace requests: send \"ignore_eos\": true and \"min_tokens\" = max_tokens so that output lengths match the trace")
	fs.IntVar(&o.maxTokens, "max-tokens", o.maxTokens, "with --prompts: max_tokens of a prompt that does not give its own")
	fs.IntVar(&o.vocabSize, "vocab-size", o.vocabSize, fmt.Sprintf("trace prompt ids are in [0, N) (0: the preset's when --model names a lockstep preset, else %d)", defaultVocabSize))
	fs.Uint64Var(&o.seed, "seed", o.seed, "seed of the synthesised prompt ids (as worker run --seed)")
}

func (o *loadgenOptions) validate(getenv func(string) string) error {
	if err := usage.OneOf("--endpoint", o.endpoint, "completions", "chat"); err != nil {
		return err
	}
	if err := usage.OneOf("--report", o.report, "text", "json"); err != nil {
		return err
	}
	if o.tokens == "" {
		o.tokens = "ids"
		if o.endpoint == "chat" {
			o.tokens = "text"
		}
	}
	if err := usage.OneOf("--tokens", o.tokens, "ids", "text"); err != nil {
		return err
	}
	if o.tokens == "ids" && o.endpoint == "chat" {
		return usage.Errorf("--tokens ids needs --endpoint completions (chat messages are text)")
	}
	if !strings.HasPrefix(o.url, "http://") && !strings.HasPrefix(o.url, "https://") {
		return usage.Errorf("--url %q: give an http:// or https:// base URL", o.url)
	}
	o.url = strings.TrimSuffix(strings.TrimSuffix(o.url, "/"), "/v1")
	if o.apiKey == "" {
		o.apiKey = getenv("OPENAI_API_KEY")
	}
	if o.trace != "" && o.promptsFile != "" {
		return usage.Errorf("--trace and --prompts are mutually exclusive")
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"--limit", o.limit}, {"--max-concurrency", o.maxConcurrency}, {"--vocab-size", o.vocabSize}} {
		if p.v < 0 {
			return usage.Errorf("%s must be non-negative, got %d", p.name, p.v)
		}
	}
	if o.vocabSize == 1 {
		return usage.Errorf("--vocab-size must be at least 2, got 1")
	}
	if o.maxTokens < 1 {
		return usage.Errorf("--max-tokens must be at least 1, got %d", o.maxTokens)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--duration", o.duration}, {"--grace", o.grace}, {"--timeout", o.timeout}} {
		if d.v < 0 {
			return usage.Errorf("%s must be non-negative, got %v", d.name, d.v)
		}
	}
	if err := workload.CheckLengthScale(o.lengthScale, "--length-scale"); err != nil {
		return usage.Wrap(err)
	}
	if err := workload.CheckArrivalScale(o.arrivalScale, "--arrival-scale"); err != nil {
		return usage.Wrap(err)
	}
	return nil
}

// lgRequest is one request of the replay: a trace request (its prompt is
// synthesised when it is sent) or a prompt of a prompts file.
type lgRequest struct {
	index     int
	arrival   time.Duration
	trace     *workload.Request
	prompt    *prompts.Input
	maxTokens int
}

// lgState is how a request ended.
type lgState int

const (
	lgNotSent lgState = iota
	lgCompleted
	lgRejected
	lgCancelled
)

func (s lgState) String() string {
	return [...]string{"not_sent", "completed", "rejected", "cancelled"}[s]
}

// lgResult is one request's outcome. Times are offsets from the replay's
// start; ttft and e2e are from the moment the request was sent.
type lgResult struct {
	state           lgState
	err             string
	sent, end       time.Duration
	ttft, e2e       time.Duration
	hasTTFT         bool
	promptTokens    int // usage.prompt_tokens, else the ids sent (0: unknown)
	outputTokens    int // usage.completion_tokens, else token ids, else content chunks
	ids             []int32
	idsKnown        bool
	text            string
	finishReason    string
	promptForReport string
}

// generator is one replay.
type generator struct {
	o      *loadgenOptions
	model  string
	reqs   []lgRequest
	client *http.Client
	start  time.Time
}

// runLoadgen is `worker loadgen`.
func runLoadgen(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal stops the replay (the report covers what finished);
	// a second one kills the process as usual.
	go func() {
		<-ctx.Done()
		stop()
	}()
	return loadgenMain(ctx, args, stdout, stderr, os.Getenv)
}

// loadgenMain parses args, replays, and prints the report; ctx's
// cancellation (SIGINT) stops the replay, and the report covers what
// finished.
func loadgenMain(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	o := defaultLoadgenOptions()
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage.Wrap(err)
	}
	if fs.NArg() > 0 {
		return usage.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := o.validate(getenv); err != nil {
		return err
	}
	var reqOut *outputFile
	if o.requestsOut != "" {
		var err error
		if reqOut, err = createOutput("--requests-out", o.requestsOut, false, nil); err != nil {
			return usage.Wrap(err)
		}
		defer reqOut.close() //nolint:errcheck // closed again below, where its error is reported
	}
	g, err := newGenerator(ctx, &o, stderr)
	if err != nil {
		return err
	}
	defer g.client.CloseIdleConnections()
	results, wall := g.replay(ctx)
	rep := g.buildReport(results, wall)
	if o.report == "json" {
		err = rep.WriteJSON(stdout)
	} else {
		err = g.writeText(stdout, rep)
	}
	if reqOut != nil {
		err = errors.Join(err, g.writeRequests(reqOut, results), reqOut.close())
	}
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: the report covers the %d requests that completed", rep.Requests.Completed)
	}
	return rep.NothingServed()
}

// newGenerator reads the workload and resolves the model name.
func newGenerator(ctx context.Context, o *loadgenOptions, stderr io.Writer) (*generator, error) {
	idle := 256
	if o.maxConcurrency > 0 {
		idle = o.maxConcurrency
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     90 * time.Second,
		// SSE must arrive as it is written: no transparent gzip.
		DisableCompression: true,
	}
	g := &generator{o: o, model: o.model, client: &http.Client{Transport: tr}}
	if g.model == "" {
		m, err := g.firstModel(ctx)
		if err != nil {
			tr.CloseIdleConnections()
			return nil, fmt.Errorf("%w (give --model)", err)
		}
		g.model = m
	}
	if err := g.loadWorkload(stderr); err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	return g, nil
}

// firstModel is the id of the first model GET /v1/models lists.
func (g *generator) firstModel(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.o.url+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	g.authorize(req)
	resp, err := g.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET /v1/models: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /v1/models: %s", httpError(resp.StatusCode, body))
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return "", fmt.Errorf("GET /v1/models: %v", err)
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", errors.New("GET /v1/models lists no model")
	}
	return list.Data[0].ID, nil
}

// loadWorkload reads the trace (or the built-in sample) or the prompts.
func (g *generator) loadWorkload(stderr io.Writer) error {
	o := g.o
	if o.promptsFile != "" {
		inputs, err := prompts.ReadFile(o.promptsFile)
		if err != nil {
			return err
		}
		if o.limit > 0 && len(inputs) > o.limit {
			inputs = inputs[:o.limit]
		}
		for i := range inputs {
			p := &inputs[i]
			if p.Messages != nil && o.endpoint != "chat" {
				return usage.Errorf("%s: a prompt with \"messages\" needs --endpoint chat", p.Place)
			}
			mt := o.maxTokens
			if p.MaxTokens > 0 {
				mt = p.MaxTokens
			}
			g.reqs = append(g.reqs, lgRequest{index: i, prompt: p, maxTokens: mt})
		}
		return nil
	}
	vocab := o.vocabSize
	if vocab == 0 {
		vocab = defaultVocabSize
		if s, err := bridge.LookupPreset(g.model); err == nil {
			vocab = s.VocabSize
		} else if o.tokens == "ids" {
			fmt.Fprintf(stderr, "worker loadgen: prompt token ids in [0, %d) (--vocab-size sets the model's vocabulary)\n", vocab)
		}
	}
	opt := workload.Options{Limit: o.limit, LengthScale: o.lengthScale, ArrivalScale: o.arrivalScale,
		VocabSize: vocab, Seed: o.seed}
	var reqs []workload.Request
	var err error
	if o.trace == "" {
		reqs, err = workload.Sample(opt)
	} else {
		reqs, err = workload.ReadFile(o.trace, opt)
	}
	if err != nil {
		return usage.Wrap(err)
	}
	for i := range reqs {
		g.reqs = append(g.reqs, lgRequest{index: i, arrival: reqs[i].Arrival, trace: &reqs[i], maxTokens: reqs[i].MaxNewTokens})
	}
	return nil
}

func (g *generator) authorize(req *http.Request) {
	if g.o.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+g.o.apiKey)
	}
}

// replay issues every request at its time and waits for the responses.
// It returns one result per request (in trace order) and the wall time.
func (g *generator) replay(ctx context.Context) ([]lgResult, time.Duration) {
	o := g.o
	results := make([]lgResult, len(g.reqs))
	g.start = time.Now()
	// issue bounds when a request may start; flight bounds the requests
	// in flight (--duration + --grace). Both end on SIGINT.
	issue, stopIssue := context.WithCancel(ctx)
	flight, stopFlight := context.WithCancelCause(ctx)
	defer stopIssue()
	defer stopFlight(nil)
	var cutoff <-chan time.Time
	if o.duration > 0 {
		issue, stopIssue = context.WithDeadline(issue, g.start.Add(o.duration))
		defer stopIssue()
		t := time.NewTimer(o.duration + o.grace)
		defer t.Stop()
		cutoff = t.C
	}
	order := make([]int, len(g.reqs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return g.reqs[order[a]].arrival < g.reqs[order[b]].arrival })
	var sem chan struct{}
	if o.maxConcurrency > 0 {
		sem = make(chan struct{}, o.maxConcurrency)
	}
	var wg sync.WaitGroup
	for _, i := range order {
		if !sleepUntil(issue, g.start.Add(g.reqs[i].arrival)) {
			break
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-issue.Done():
			}
			if issue.Err() != nil {
				break
			}
		}
		wg.Go(func() {
			if sem != nil {
				defer func() { <-sem }()
			}
			g.do(flight, &g.reqs[i], &results[i])
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-cutoff:
		stopFlight(errGraceOver)
		<-done
	}
	return results, time.Since(g.start)
}

// errGraceOver cancels the requests still in flight at --duration + --grace.
var errGraceOver = errors.New("still running when --duration + --grace ran out")

// sleepUntil waits until t (never returning true earlier) and reports
// whether ctx still allows work then.
func sleepUntil(ctx context.Context, t time.Time) bool {
	if d := time.Until(t); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return false
		}
	}
	return ctx.Err() == nil
}

// completionRequest is the body of /v1/completions and
// /v1/chat/completions. ignore_eos and min_tokens are vLLM / SGLang /
// TensorRT-LLM extensions; return_token_ids is lockstep's.
type completionRequest struct {
	Model          string              `json:"model"`
	Prompt         any                 `json:"prompt,omitempty"`
	Messages       []model.ChatMessage `json:"messages,omitempty"`
	MaxTokens      int                 `json:"max_tokens"`
	MinTokens      int                 `json:"min_tokens,omitempty"`
	IgnoreEOS      bool                `json:"ignore_eos,omitempty"`
	Temperature    float64             `json:"temperature"`
	Stream         bool                `json:"stream"`
	StreamOptions  *streamOptions      `json:"stream_options,omitempty"`
	ReturnTokenIDs bool                `json:"return_token_ids,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// body builds a request's JSON body; promptTokens is the prompt's length
// when it is sent as ids (0: the server's usage says).
func (g *generator) body(r *lgRequest) (body []byte, promptTokens int, shown string, err error) {
	o := g.o
	cr := completionRequest{Model: g.model, MaxTokens: r.maxTokens, Stream: o.stream, ReturnTokenIDs: o.returnTokenIDs}
	if o.stream {
		cr.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	var text string
	switch {
	case r.trace != nil:
		ids := r.trace.Tokens()
		if o.tokens == "ids" {
			cr.Prompt, promptTokens = ids, len(ids)
		} else {
			text = wordsFor(ids)
		}
		if o.ignoreEOS {
			cr.IgnoreEOS, cr.MinTokens = true, r.maxTokens
		}
	case r.prompt.Messages != nil:
		cr.Messages = r.prompt.Messages
		b, _ := json.Marshal(r.prompt.Messages)
		shown = string(b)
	default:
		text, shown = r.prompt.Text, r.prompt.Text
	}
	if cr.Prompt == nil && cr.Messages == nil {
		if o.endpoint == "chat" {
			cr.Messages = []model.ChatMessage{{Role: "user", Content: text}}
		} else {
			cr.Prompt = text
		}
	}
	body, err = json.Marshal(cr)
	return body, promptTokens, shown, err
}

// promptWords make a trace's prompt text for --tokens text: one word per
// token id, words most tokenizers encode as one token after a space.
var promptWords = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his
from at which but have an had they you were their one all we can her has there been if more when will would who
so no time out up people into some could them than first other new way may only most what over very years after
make many also should well two day`)

func wordsFor(ids []int32) string {
	var b strings.Builder
	for i, t := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(promptWords[uint32(t)%uint32(len(promptWords))])
	}
	return b.String()
}

func (g *generator) path() string {
	if g.o.endpoint == "chat" {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// do sends one request and fills res. flight's cancellation (SIGINT, or
// --duration + --grace) marks the request cancelled.
func (g *generator) do(flight context.Context, r *lgRequest, res *lgResult) {
	body, promptTokens, shown, err := g.body(r)
	res.promptTokens, res.promptForReport = promptTokens, shown
	if err != nil {
		res.state, res.err = lgRejected, fmt.Sprintf("building the request: %v", err)
		return
	}
	ctx := flight
	if g.o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(flight, g.o.timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.o.url+g.path(), bytes.NewReader(body))
	if err != nil {
		res.state, res.err = lgRejected, err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if g.o.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	g.authorize(req)
	sent := time.Now()
	res.sent = sent.Sub(g.start)
	defer func() { res.end = time.Since(g.start) }()
	fail := func(err error) {
		switch {
		case flight.Err() != nil:
			res.state, res.err = lgCancelled, "cancelled: interrupted"
			if errors.Is(context.Cause(flight), errGraceOver) {
				res.err = "cancelled: " + errGraceOver.Error()
			}
		case ctx.Err() != nil:
			res.state, res.err = lgRejected, fmt.Sprintf("timed out after %v (--timeout)", g.o.timeout)
		default:
			res.state, res.err = lgRejected, err.Error()
		}
	}
	resp, err := g.client.Do(req)
	if err != nil {
		fail(err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if flight.Err() != nil || ctx.Err() != nil {
			fail(nil)
			return
		}
		res.state, res.err = lgRejected, httpError(resp.StatusCode, b)
		return
	}
	acc := &lgAccumulator{sent: sent}
	if g.o.stream {
		err = acc.readStream(resp.Body)
	} else {
		err = acc.readJSON(resp.Body)
	}
	res.e2e = time.Since(sent)
	if err != nil {
		if flight.Err() != nil || ctx.Err() != nil {
			fail(err)
			return
		}
		res.state, res.err = lgRejected, err.Error()
		return
	}
	// Leave the connection reusable: whatever follows [DONE] is read.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck
	acc.finish(res)
}

// httpError is the reason of a non-200 response: the status and the
// server's error message.
func httpError(status int, body []byte) string {
	msg := strings.TrimSpace(string(body))
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  any             `json:"detail"`
	}
	if json.Unmarshal(body, &e) == nil {
		switch {
		case len(e.Error) > 0:
			msg = errorMessage(e.Error)
		case e.Message != "":
			msg = e.Message
		case e.Detail != nil:
			msg = fmt.Sprint(e.Detail)
		}
	}
	if len(msg) > 500 {
		msg = msg[:500] + "..."
	}
	if msg == "" {
		return fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
	}
	return fmt.Sprintf("HTTP %d: %s", status, msg)
}

// errorMessage reads an OpenAI "error" value: an object with "message"
// (and maybe "type", "code"), or a string.
func errorMessage(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var e struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		if e.Type != "" {
			return fmt.Sprintf("%s (%s)", e.Message, e.Type)
		}
		return e.Message
	}
	return string(raw)
}

// oaChunk is a streamed chunk or a whole response, of either endpoint.
type oaChunk struct {
	Object  string          `json:"object"`
	Message string          `json:"message"`
	Error   json.RawMessage `json:"error"`
	Choices []struct {
		Index int     `json:"index"`
		Text  *string `json:"text"`
		Delta *struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"delta"`
		Message *struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"message"`
		TokenIDs     *[]int32 `json:"token_ids"`
		FinishReason *string  `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// lgAccumulator gathers one response.
type lgAccumulator struct {
	sent         time.Time
	ttft         time.Duration
	hasTTFT      bool
	text         strings.Builder
	ids          []int32
	sawIDs       bool // some chunk carried token_ids
	missingIDs   bool // some chunk carried text without token_ids
	chunks       int  // chunks with content
	usage        bool
	promptTokens int
	outputTokens int
	finishReason string
	done         bool
}

// readStream reads an SSE stream: "data: {...}" events up to "data: [DONE]".
func (a *lgAccumulator) readStream(body io.Reader) error {
	br := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if stop, perr := a.streamLine(line); perr != nil || stop {
				return perr
			}
		}
		if err == io.EOF {
			if a.finishReason != "" || a.usage {
				return nil // the server ended without [DONE], after a final chunk
			}
			return errors.New("the stream ended before [DONE]")
		}
		if err != nil {
			return fmt.Errorf("reading the stream: %w", err)
		}
	}
}

func (a *lgAccumulator) streamLine(line []byte) (stop bool, err error) {
	line = bytes.TrimRight(line, "\r\n")
	payload, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return false, nil // blank line, comment, event:, id:, retry:
	}
	payload = bytes.TrimSpace(payload)
	if string(payload) == "[DONE]" {
		a.done = true
		return true, nil
	}
	if len(payload) == 0 {
		return false, nil
	}
	var c oaChunk
	if err := json.Unmarshal(payload, &c); err != nil {
		return false, fmt.Errorf("bad stream chunk %.200q: %v", payload, err)
	}
	return false, a.add(&c, time.Since(a.sent))
}

// readJSON reads a non-streamed response.
func (a *lgAccumulator) readJSON(body io.Reader) error {
	b, err := io.ReadAll(body)
	if err != nil {
		return fmt.Errorf("reading the response: %w", err)
	}
	var c oaChunk
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("bad response %.200q: %v", b, err)
	}
	return a.add(&c, -1)
}

// add takes one chunk in; at < 0 is a non-streamed response (no TTFT).
func (a *lgAccumulator) add(c *oaChunk, at time.Duration) error {
	if len(c.Error) > 0 && string(c.Error) != "null" {
		return fmt.Errorf("server error: %s", errorMessage(c.Error))
	}
	if c.Object == "error" {
		return fmt.Errorf("server error: %s", c.Message)
	}
	if c.Usage != nil {
		a.usage = true
		a.promptTokens, a.outputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		if ch.Index != 0 {
			continue // n = 1
		}
		var text string
		if ch.Text != nil {
			text = *ch.Text
		}
		if d := ch.Delta; d != nil {
			for _, s := range []*string{d.ReasoningContent, d.Content} {
				if s != nil {
					text += *s
				}
			}
		}
		if m := ch.Message; m != nil {
			for _, s := range []*string{m.ReasoningContent, m.Content} {
				if s != nil {
					text += *s
				}
			}
		}
		var ids []int32
		if ch.TokenIDs != nil {
			a.sawIDs = true
			ids = *ch.TokenIDs
		} else if text != "" {
			a.missingIDs = true
		}
		if text != "" || len(ids) > 0 {
			a.chunks++
			if !a.hasTTFT && at >= 0 {
				a.ttft, a.hasTTFT = at, true
			}
		}
		a.text.WriteString(text)
		a.ids = append(a.ids, ids...)
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			a.finishReason = *ch.FinishReason
		}
	}
	return nil
}

// finish fills a completed request's result.
func (a *lgAccumulator) finish(res *lgResult) {
	res.state = lgCompleted
	res.ttft, res.hasTTFT = a.ttft, a.hasTTFT
	res.text, res.finishReason = a.text.String(), a.finishReason
	res.idsKnown = a.sawIDs && !a.missingIDs
	if res.idsKnown {
		res.ids = a.ids
	}
	switch {
	case a.usage:
		res.outputTokens = a.outputTokens
		if a.promptTokens > 0 {
			res.promptTokens = a.promptTokens
		}
	case res.idsKnown:
		res.outputTokens = len(a.ids)
	default:
		res.outputTokens = a.chunks
	}
}

// tpot is a completed streamed request's time per output token after the
// first.
func (r *lgResult) tpot() (float64, bool) {
	if !r.hasTTFT || r.outputTokens < 2 {
		return 0, false
	}
	return float64(r.e2e-r.ttft) / 1e6 / float64(r.outputTokens-1), true
}

func ms(d time.Duration) float64 { return report.Round(float64(d)/1e6, 3) }

// buildReport summarises a replay in `worker run`'s report shape.
func (g *generator) buildReport(results []lgResult, wall time.Duration) *report.Report {
	rep := &report.Report{Engine: "remote", Model: g.model, URL: g.o.url, Clock: "wall", Rejections: []report.Rejection{}}
	rep.Requests.Total = len(results)
	var ttft, tpot, e2e []float64
	var last time.Duration
	missingIDs := 0
	for i := range results {
		r := &results[i]
		switch r.state {
		case lgNotSent:
			rep.Requests.NotSent++
			continue
		case lgCancelled:
			rep.Requests.Cancelled++
			continue
		case lgRejected:
			rep.Requests.Rejected++
			rep.Rejections = append(rep.Rejections, report.Rejection{Index: uint64(i), Reason: r.err})
			continue
		}
		rep.Requests.Completed++
		last = max(last, r.end)
		rep.Tokens.Prompt += int64(r.promptTokens)
		rep.Tokens.Generated += int64(r.outputTokens)
		e2e = append(e2e, float64(r.e2e)/1e6)
		if r.hasTTFT {
			ttft = append(ttft, float64(r.ttft)/1e6)
		}
		if v, ok := r.tpot(); ok {
			tpot = append(tpot, v)
		}
		if !r.idsKnown {
			missingIDs++
		}
	}
	rep.TTFTMS, rep.TPOTMS, rep.E2EMS = report.Pct(ttft), report.Pct(tpot), report.Pct(e2e)
	rep.WallS = report.Round(wall.Seconds(), 3)
	rep.DurationS = report.Round(last.Seconds(), 3)
	if last > 0 {
		s := last.Seconds()
		rep.OutputTokPerS = report.Round(float64(rep.Tokens.Generated)/s, 1)
		rep.InputTokPerS = report.Round(float64(rep.Tokens.Prompt)/s, 1)
		rep.RequestsPerS = report.Round(float64(rep.Requests.Completed)/s, 3)
	}
	if missingIDs == 0 {
		rep.OutputDigest = report.DigestOutputs(len(results), func(i int) []int32 {
			if results[i].state == lgCompleted {
				return results[i].ids
			}
			return nil
		})
	} else {
		rep.OutputDigestNote = fmt.Sprintf("%d of %d completed responses carried no token ids", missingIDs, rep.Requests.Completed)
		if !g.o.returnTokenIDs {
			rep.OutputDigestNote += " (--return-token-ids asks lockstep's server for them)"
		}
	}
	if g.o.promptsFile != "" {
		rep.Outputs = make([]report.PromptOutput, len(results))
		for i := range results {
			r := &results[i]
			p := report.PromptOutput{Index: i, Prompt: r.promptForReport, PromptTokens: r.promptTokens, Text: r.text,
				Tokens: r.outputTokens, FinishReason: r.finishReason}
			if r.state != lgCompleted {
				p.Error = r.err
				if p.Error == "" {
					p.Error = r.state.String()
				}
			}
			rep.Outputs[i] = p
		}
	}
	return rep
}

// maxListedTextRejections bounds the rejections the text report lists.
const maxListedTextRejections = 20

func (g *generator) writeText(w io.Writer, rep *report.Report) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	mode := "streamed"
	if !g.o.stream {
		mode = "not streamed: E2E only"
	}
	p("lockstep loadgen report\n")
	p("  server %s, model %s, %s (%s), wall clock\n", rep.URL, rep.Model, g.path(), mode)
	p("  requests     %d total, %d completed, %d rejected", rep.Requests.Total, rep.Requests.Completed, rep.Requests.Rejected)
	if rep.Requests.NotSent > 0 {
		p(", %d not sent (--duration)", rep.Requests.NotSent)
	}
	if rep.Requests.Cancelled > 0 {
		p(", %d cancelled", rep.Requests.Cancelled)
	}
	p("\n")
	p("  tokens       %d prompt, %d generated\n", rep.Tokens.Prompt, rep.Tokens.Generated)
	p("  duration     %.2f s to the last response (wall %.2f s): %.2f requests/s, %.1f output tokens/s, %.1f input tokens/s\n",
		rep.DurationS, rep.WallS, rep.RequestsPerS, rep.OutputTokPerS, rep.InputTokPerS)
	rep.WriteLatencies(w)
	for i, r := range rep.Rejections {
		if i == maxListedTextRejections {
			p("  ... and %d more rejected\n", len(rep.Rejections)-i)
			break
		}
		p("  rejected #%d: %s\n", r.Index, r.Reason)
	}
	if rep.OutputDigest != "" {
		p("  output digest %s\n", rep.OutputDigest)
	} else {
		p("  output digest none: %s\n", rep.OutputDigestNote)
	}
	return nil
}

// loadgenRecord is one line of `worker loadgen --requests-out`.
type loadgenRecord struct {
	Index int    `json:"index"`
	State string `json:"state"` // completed, rejected, cancelled or not_sent
	// ScheduledMS is when the request was due and SentMS when it was sent,
	// from the replay's start (queue_ms = the difference: --max-concurrency).
	ScheduledMS  float64 `json:"scheduled_ms"`
	SentMS       float64 `json:"sent_ms"`
	QueueMS      float64 `json:"queue_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	TTFTMS       float64 `json:"ttft_ms"`
	TPOTMS       float64 `json:"tpot_ms"`
	E2EMS        float64 `json:"e2e_ms"`
	Output       []int32 `json:"output,omitempty"` // the token ids, when the server returned them
	Text         string  `json:"text,omitempty"`   // the completion (--prompts)
	FinishReason string  `json:"finish_reason,omitempty"`
	Error        string  `json:"error,omitempty"`
}

func (g *generator) writeRequests(w io.Writer, results []lgResult) error {
	enc := json.NewEncoder(w)
	for i := range results {
		r := &results[i]
		rec := loadgenRecord{Index: i, State: r.state.String(), ScheduledMS: ms(g.reqs[i].arrival), Error: r.err}
		if r.state != lgNotSent {
			rec.SentMS = ms(r.sent)
			rec.QueueMS = ms(max(0, r.sent-g.reqs[i].arrival))
			rec.PromptTokens = r.promptTokens
		}
		if r.state == lgCompleted {
			rec.OutputTokens, rec.E2EMS, rec.FinishReason = r.outputTokens, ms(r.e2e), r.finishReason
			if r.hasTTFT {
				rec.TTFTMS = ms(r.ttft)
			}
			if v, ok := r.tpot(); ok {
				rec.TPOTMS = report.Round(v, 3)
			}
			if r.idsKnown {
				rec.Output = r.ids
			}
			if g.o.promptsFile != "" {
				rec.Text = r.text
			}
		}
		if err := enc.Encode(rec); err != nil {
			return fmt.Errorf("--requests-out: %w", err)
		}
	}
	return nil
}
