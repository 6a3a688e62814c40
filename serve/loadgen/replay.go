package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/serve/openai"
	"github.com/lockstep-ai/lockstep/workload"
	"github.com/lockstep-ai/lockstep/workload/prompts"
)

// request is one request of the replay: a trace request (its prompt is
// synthesised when it is sent) or a prompt of a prompts file.
type request struct {
	index     int
	arrival   time.Duration
	trace     *workload.Request
	prompt    *prompts.Input
	maxTokens int
}

// outcome is how a request ended.
type outcome int

const (
	notSent outcome = iota
	completed
	rejected
	cancelled
)

func (s outcome) String() string {
	return [...]string{"not_sent", "completed", "rejected", "cancelled"}[s]
}

// Result is one request's outcome. Times are offsets from the replay's
// start; ttft and e2e are from the moment the request was sent.
type Result struct {
	state           outcome
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

// Generator is one replay.
type Generator struct {
	o      *Options
	model  string
	reqs   []request
	client *http.Client
	start  time.Time
}

// New prepares a replay: it reads the workload and resolves the model
// name (GET /v1/models when Options.Model is empty). Close it when done.
func New(ctx context.Context, o *Options, stderr io.Writer) (*Generator, error) {
	idle := 256
	if o.MaxConcurrency > 0 {
		idle = o.MaxConcurrency
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     90 * time.Second,
		// SSE must arrive as it is written: no transparent gzip.
		DisableCompression: true,
	}
	g := &Generator{o: o, model: o.Model, client: &http.Client{Transport: tr}}
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

// Close drops the replay's idle connections.
func (g *Generator) Close() { g.client.CloseIdleConnections() }

// firstModel is the id of the first model GET /v1/models lists.
func (g *Generator) firstModel(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.o.URL+"/v1/models", nil)
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
	var list openai.ModelList
	if err := json.Unmarshal(body, &list); err != nil {
		return "", fmt.Errorf("GET /v1/models: %v", err)
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", errors.New("GET /v1/models lists no model")
	}
	return list.Data[0].ID, nil
}

// loadWorkload reads the trace (or the built-in sample) or the prompts.
func (g *Generator) loadWorkload(stderr io.Writer) error {
	o := g.o
	if o.PromptsFile != "" {
		inputs, err := prompts.ReadFile(o.PromptsFile)
		if err != nil {
			return err
		}
		if o.Limit > 0 && len(inputs) > o.Limit {
			inputs = inputs[:o.Limit]
		}
		for i := range inputs {
			p := &inputs[i]
			if p.Messages != nil && o.Endpoint != "chat" {
				return usage.Errorf("%s: a prompt with \"messages\" needs --endpoint chat", p.Place)
			}
			mt := o.MaxTokens
			if p.MaxTokens > 0 {
				mt = p.MaxTokens
			}
			g.reqs = append(g.reqs, request{index: i, prompt: p, maxTokens: mt})
		}
		return nil
	}
	vocab := o.VocabSize
	if vocab == 0 {
		vocab = DefaultVocabSize
		if s, err := bridge.LookupPreset(g.model); err == nil {
			vocab = s.VocabSize
		} else if o.Tokens == "ids" {
			fmt.Fprintf(stderr, "worker loadgen: prompt token ids in [0, %d) (--vocab-size sets the model's vocabulary)\n", vocab)
		}
	}
	opt := workload.Options{Limit: o.Limit, LengthScale: o.LengthScale, ArrivalScale: o.ArrivalScale,
		VocabSize: vocab, Seed: o.Seed}
	reqs, err := workload.Load(o.Trace, opt)
	if err != nil {
		return usage.Wrap(err)
	}
	if o.Arrivals == workload.ArrivalsPoisson {
		workload.PoissonArrivals(reqs, o.Seed)
	}
	if o.InferConversations {
		workload.InferConversations(reqs)
	}
	for i := range reqs {
		g.reqs = append(g.reqs, request{index: i, arrival: reqs[i].Arrival, trace: &reqs[i], maxTokens: reqs[i].MaxNewTokens})
	}
	return nil
}

func (g *Generator) authorize(req *http.Request) {
	if g.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+g.o.APIKey)
	}
}

// Replay issues every request at its time and waits for the responses.
// It returns one Result per request (in trace order) and the wall time.
func (g *Generator) Replay(ctx context.Context) ([]Result, time.Duration) {
	o := g.o
	results := make([]Result, len(g.reqs))
	g.start = time.Now()
	// issue bounds when a request may start; flight bounds the requests
	// in flight (--duration + --grace). Both end on SIGINT.
	issue, stopIssue := context.WithCancel(ctx)
	flight, stopFlight := context.WithCancelCause(ctx)
	defer stopIssue()
	defer stopFlight(nil)
	var cutoff <-chan time.Time
	if o.Duration > 0 {
		issue, stopIssue = context.WithDeadline(issue, g.start.Add(o.Duration))
		defer stopIssue()
		t := time.NewTimer(o.Duration + o.Grace)
		defer t.Stop()
		cutoff = t.C
	}
	order := make([]int, len(g.reqs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return g.reqs[order[a]].arrival < g.reqs[order[b]].arrival })
	var sem chan struct{}
	if o.MaxConcurrency > 0 {
		sem = make(chan struct{}, o.MaxConcurrency)
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

// body builds a request's JSON body; promptTokens is the prompt's length
// when it is sent as ids (0: the server's usage says).
func (g *Generator) body(r *request) (body []byte, promptTokens int, shown string, err error) {
	o := g.o
	cr := openai.CompletionRequest{Model: g.model, MaxTokens: r.maxTokens, Stream: o.Stream, ReturnTokenIDs: o.ReturnTokenIDs}
	if o.Stream {
		cr.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
	}
	var text string
	switch {
	case r.trace != nil:
		cr.ConversationID, cr.AffinityID = r.trace.ConversationID, r.trace.Routing.AffinityID
		if rt := r.trace.Routing; rt.HasRank {
			rank, relax := rt.Rank, !rt.Strict
			cr.AttentionDPRank, cr.AttentionDPRelax = &rank, &relax
		}
		ids := r.trace.Tokens()
		if o.Tokens == "ids" {
			cr.Prompt, promptTokens = ids, len(ids)
		} else {
			text = wordsFor(ids)
		}
		if o.IgnoreEOS {
			cr.IgnoreEOS, cr.MinTokens = true, r.maxTokens
		}
	case r.prompt.Messages != nil:
		for _, m := range r.prompt.Messages {
			cr.Messages = append(cr.Messages, openai.ChatMessage{Role: m.Role, Content: m.Content})
		}
		b, _ := json.Marshal(r.prompt.Messages)
		shown = string(b)
	default:
		text, shown = r.prompt.Text, r.prompt.Text
	}
	if cr.Prompt == nil && cr.Messages == nil {
		if o.Endpoint == "chat" {
			cr.Messages = []openai.ChatMessage{{Role: "user", Content: text}}
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

func (g *Generator) path() string {
	if g.o.Endpoint == "chat" {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// do sends one request and fills res. flight's cancellation (SIGINT, or
// --duration + --grace) marks the request cancelled.
func (g *Generator) do(flight context.Context, r *request, res *Result) {
	body, promptTokens, shown, err := g.body(r)
	res.promptTokens, res.promptForReport = promptTokens, shown
	if err != nil {
		res.state, res.err = rejected, fmt.Sprintf("building the request: %v", err)
		return
	}
	ctx := flight
	if g.o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(flight, g.o.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.o.URL+g.path(), bytes.NewReader(body))
	if err != nil {
		res.state, res.err = rejected, err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if g.o.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	g.authorize(req)
	sent := time.Now()
	res.sent = sent.Sub(g.start)
	defer func() { res.end = time.Since(g.start) }()
	fail := func(err error) {
		switch {
		case flight.Err() != nil:
			res.state, res.err = cancelled, "cancelled: interrupted"
			if errors.Is(context.Cause(flight), errGraceOver) {
				res.err = "cancelled: " + errGraceOver.Error()
			}
		case ctx.Err() != nil:
			res.state, res.err = rejected, fmt.Sprintf("timed out after %v (--timeout)", g.o.Timeout)
		default:
			res.state, res.err = rejected, err.Error()
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
		res.state, res.err = rejected, httpError(resp.StatusCode, b)
		return
	}
	acc := &accumulator{sent: sent}
	if g.o.Stream {
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
		res.state, res.err = rejected, err.Error()
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
