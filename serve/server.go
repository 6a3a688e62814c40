package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/structured"
)

// MetricsSink receives the server's events (Metrics implements it).
type MetricsSink interface {
	RequestReceived(endpoint string)
	RequestRejected(endpoint string, status int)
	OnResponse(r executor.Response, promptTokens int, finishReason string)
	OnIteration(s executor.FleetStats)
	SetReady(ready bool)
	Handler() http.Handler
}

// Config configures a server.
type Config struct {
	// ModelName is the model's name in the API (requests must name it).
	ModelName string
	// Tokenizer turns text into ids and back; nil for a synthetic preset
	// (prompts as token ids only, completions carry token ids only).
	Tokenizer *model.Tokenizer
	VocabSize int
	// AttentionDPRanks bounds a request's attention_dp_rank (0: 1 rank).
	AttentionDPRanks int
	// MaxModelLen is reported by /v1/models (0: unknown).
	MaxModelLen int
	// Admission is the fleet's admission verdict (scheduler.Admission.Verdict):
	// 413 when it says NeverFits; a request that fits is queued.
	Admission func(promptLen, maxNewTokens int) scheduler.AdmissionVerdict
	// MaxQueue bounds the accepted, unfinished requests (429 beyond).
	MaxQueue int
	// APIKey, when set, is required as a Bearer token except on /health.
	APIKey string
	// MaxBodyBytes bounds one request body (413 beyond); 0: DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyBytesInFlight bounds the body bytes being read and parsed at once,
	// over all requests (a request waits for room, up to BodyTimeout); 0:
	// DefaultBodyBytesInFlight. It is raised to MaxBodyBytes if smaller.
	BodyBytesInFlight int64
	// BodyTimeout bounds the time to receive one body (408 beyond), and the
	// wait for room in BodyBytesInFlight; 0: DefaultBodyTimeout.
	BodyTimeout time.Duration
	Metrics     MetricsSink
	// StallAfter: with no iteration finished for this long the fleet is
	// taken as hung and /health stops reporting ready (an idle fleet still
	// iterates every few milliseconds); 0: DefaultStallAfter.
	StallAfter time.Duration
	// PromptTokensDetails adds usage.prompt_tokens_details.cached_tokens
	// (vLLM's --enable-prompt-tokens-details).
	PromptTokensDetails bool
	// Log receives a line per finished request (debug level), named by its
	// X-Request-Id; nil: no log.
	Log *zap.Logger
	// RequestTimeout bounds a completion request from its acceptance to its
	// last token (queue, prefill and decode); past it every choice is
	// withdrawn from every rank (as when the client goes away) and the
	// client gets 504, or an error event on a stream. 0: no bound.
	RequestTimeout time.Duration
	// Version is GET /version's answer; the binary's build version when "".
	Version string
	// Guides compiles structured outputs' patterns for the model's
	// vocabulary (the fleet's own cache: fleet.Options.Guides); nil: no
	// tokenizer, requests asking for structured outputs are refused.
	Guides *structured.Cache
	// PriorityScheduling (vLLM's --scheduling-policy priority): a request's
	// priority orders it (executor.Arrival.Priority); without it a
	// priority other than 0 is refused, as vLLM does under fcfs.
	PriorityScheduling bool
	// NoPromptLogprobs: the engine does not score prompts (the CUDA
	// engine), so prompt_logprobs and echo with logprobs are refused.
	NoPromptLogprobs bool
	// ToolCallParser turns on tool_choice "auto" (vLLM's
	// --enable-auto-tool-choice with --tool-call-parser): the parser, one of
	// ToolCallParsers, that reads the model's calls. "": requests with
	// tools must say tool_choice "none".
	ToolCallParser string
	// ReasoningParser (vLLM's --reasoning-parser), one of
	// ReasoningParsers: a chat answer's thinking goes to reasoning_content.
	ReasoningParser string
	// TrustRequestChatTemplate (vLLM's --trust-request-chat-template):
	// a request may bring its own chat_template; refused otherwise.
	TrustRequestChatTemplate bool
	// TokensAsIDs (vLLM's --return-tokens-as-token-ids): every answer's
	// log-probabilities name tokens "token_id:N", as a request's
	// return_tokens_as_token_ids asks for its own.
	TokensAsIDs bool
	// Now is the clock (tests); time.Now when nil.
	Now func() time.Time
}

// DefaultStallAfter is Config.StallAfter's default: half the collective
// watchdog's default timeout, after which the fleet fails on its own.
const DefaultStallAfter = 30 * time.Second

// maxRequestIDLen bounds an X-Request-Id.
const maxRequestIDLen = 256

// validRequestID: 1 to maxRequestIDLen printable ASCII characters.
func validRequestID(id string) bool {
	if len(id) == 0 || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// Server is the HTTP API on rank 0.
type Server struct {
	cfg      Config
	log      *zap.Logger
	src      *source
	nextID   atomic.Uint64
	mu       sync.Mutex
	calls    map[uint64]*call
	ready    atomic.Bool
	draining atomic.Bool
	failed   atomic.Pointer[error]
	idle     chan struct{} // closed when draining and no call is left
	stops    map[int32]bool
	bodies   *bodyBudget
	lastIter atomic.Int64     // Unix ns of the last iteration rank 0 finished
	gaps     gapSink          // the metrics, when they observe inter-token latencies
	tools    *toolParser      // Config.ToolCallParser's; nil without
	thinking *reasoningParser // Config.ReasoningParser's; nil without
}

// New builds a server; wire Source and Hooks into rank 0's executor.
// It panics on a Config.ToolCallParser outside ToolCallParsers, or a
// Config.ReasoningParser outside ReasoningParsers (callers check the flags
// against them first, as worker serve does).
func New(cfg Config) *Server {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var tools *toolParser
	if cfg.ToolCallParser != "" {
		var err error
		if tools, err = newToolParser(cfg.ToolCallParser); err != nil {
			panic("serve: " + err.Error())
		}
	}
	var thinking *reasoningParser
	if cfg.ReasoningParser != "" {
		var err error
		if thinking, err = newReasoningParser(cfg.ReasoningParser); err != nil {
			panic("serve: " + err.Error())
		}
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Version == "" {
		cfg.Version = buildVersion()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.BodyBytesInFlight <= 0 {
		cfg.BodyBytesInFlight = DefaultBodyBytesInFlight
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.StallAfter <= 0 {
		cfg.StallAfter = DefaultStallAfter
	}
	// One body of the largest size must always fit the budget.
	cfg.BodyBytesInFlight = max(cfg.BodyBytesInFlight, cfg.MaxBodyBytes)
	s := &Server{cfg: cfg, log: cfg.Log, src: newSource(), calls: map[uint64]*call{}, stops: map[int32]bool{},
		bodies: newBodyBudget(cfg.BodyBytesInFlight), tools: tools, thinking: thinking}
	if g, ok := cfg.Metrics.(gapSink); ok && g.wantsGaps() {
		s.gaps = g
	}
	if cfg.Tokenizer != nil {
		for _, t := range cfg.Tokenizer.StopTokens() {
			s.stops[t] = true
		}
	}
	return s
}

// Source is rank 0's executor.Source.
func (s *Server) Source() executor.Source { return s.src }

// Hooks sets the serving callbacks on rank 0's executor configuration.
// Every rank's configuration needs Stream = true (the same gathers).
func (s *Server) Hooks(c *executor.Config) {
	c.Stream = true
	c.DiscardResponses = true
	c.OnTokens = s.onTokens
	c.OnResponse = s.onResponse
	c.OnIteration = func(st executor.FleetStats) {
		s.lastIter.Store(time.Now().UnixNano())
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.OnIteration(st)
		}
	}
}

// SetReady marks the fleet initialised (every rank passed init): /health
// answers 200 from now on.
func (s *Server) SetReady() {
	s.lastIter.Store(time.Now().UnixNano())
	s.ready.Store(true)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.SetReady(true)
	}
}

// Fail answers every waiting client with a 500 naming err (the fleet
// stopped) and refuses new requests.
func (s *Server) Fail(err error) {
	s.failed.Store(&err)
	s.ready.Store(false)
	s.mu.Lock()
	for _, c := range s.calls {
		if c.detached {
			// Its client is gone; no answer will come back now.
			s.record(c, nil, c.finish)
		}
		c.signal()
	}
	s.mu.Unlock()
	s.src.close()
}

// PeerLost is told that rank's process left the fleet (fleet wiring:
// nccl.ProcessGroup.OnPeerGone). While requests can still come or are in
// flight the fleet cannot go on: every open request is answered (500, or
// an error event on a stream) naming the rank, /health stops reporting
// ready, and new requests get 500, before the launcher tears rank 0 down.
// After a drain (nothing open, the source closed) it is the fleet's normal
// end and changes nothing.
func (s *Server) PeerLost(rank int) {
	s.mu.Lock()
	open := len(s.calls)
	s.mu.Unlock()
	if open == 0 && s.src.isClosed() {
		return
	}
	s.Fail(fmt.Errorf("rank %d's process is gone (its connection to rank 0 closed); the fleet cannot go on", rank))
}

// Drain stops accepting requests, lets the accepted ones finish until ctx
// is done, cancels what is left, then ends the source so that the loop
// exits once the ranks have withdrawn them.
func (s *Server) Drain(ctx context.Context) {
	s.draining.Store(true)
	for {
		s.mu.Lock()
		n := len(s.calls)
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			left := make([]*call, 0, len(s.calls))
			for _, c := range s.calls {
				left = append(left, c)
			}
			s.mu.Unlock()
			for _, c := range left {
				s.detach(c, "cancelled")
				c.abort(errDrained)
			}
			// Give the ranks a moment to withdraw them before the source ends.
			time.Sleep(50 * time.Millisecond)
			s.src.close()
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	s.src.close()
}

var errDrained = errors.New("the server is shutting down")

// completions is POST /v1/completions.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	s.handle(w, r, "completions", &req, &req.rawParams, 16, func(*genParams) ([]promptIn, *apiError) {
		return req.prompts(s.cfg.Tokenizer, s.cfg.VocabSize)
	})
}

// chat is POST /v1/chat/completions.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	s.handle(w, r, "chat", &req, &req.rawParams, restOfContext, s.chatPrompt(&req))
}

// chatPrompt renders a chat request's conversation (and tools) with the
// model's template into its one prompt.
func (s *Server) chatPrompt(req *chatRequest) func(p *genParams) ([]promptIn, *apiError) {
	return func(p *genParams) ([]promptIn, *apiError) {
		msgs, e := req.messages()
		if e != nil {
			return nil, e
		}
		kwargs, e := chatTemplateKwargs(req.ChatTemplateKwargs)
		if e != nil {
			return nil, e
		}
		tok := s.cfg.Tokenizer
		if tok == nil {
			return nil, badRequest("messages", "the model %s has no tokenizer: use /v1/completions with token ids", s.cfg.ModelName)
		}
		tmpl, e := s.chatTemplateOf(req.ChatTemplate)
		if e != nil {
			return nil, e
		}
		gen, e := req.generationPrompt()
		if e != nil {
			return nil, e
		}
		if e := s.toolsFor(p, tmpl); e != nil {
			return nil, e
		}
		if s.thinking != nil && p.Guide != "" && p.forced == nil {
			// A structured output constrains the content: the thinking
			// before it is free (vLLM's grammar starts after the reasoning).
			p.Guide = "(?:" + s.thinking.guidePrefix() + ")(?:" + p.Guide + ")"
		}
		text, err := model.RenderChatKwargs(tmpl, msgs, p.Tools, kwargs, gen, tok.TokenText(tok.BOS()), tok.TokenText(tok.EOS()))
		if err != nil {
			return nil, badRequest("messages", "the chat template failed on these messages: %v", err)
		}
		if req.ContinueFinalMessage {
			if text, e = continueFinal(text, msgs[len(msgs)-1]); e != nil {
				return nil, e
			}
		}
		in := promptIn{ids: tok.Encode(text, model.EncodeOptions{ParseSpecial: true}), text: text}
		if p.Echo {
			// vLLM's chat echo: the answer starts with the last message when
			// it is the assistant's (the one the model continues).
			echo := ""
			if last := msgs[len(msgs)-1]; last.Role == "assistant" {
				echo = last.Content
			}
			in.echo = &echo
		}
		return []promptIn{in}, nil
	}
}

// toolsFor settles a chat request's tools against the server: tool_choice
// "auto" needs the server's parser (which then reads the answer, with the
// control tokens' text kept, since the markers of a call may be control
// tokens), and tools need a template that renders them.
func (s *Server) toolsFor(p *genParams, template string) *apiError {
	if p.ToolChoice == "auto" {
		if s.tools == nil {
			return badRequest("tool_choice", "tool_choice \"auto\" (the default with tools) needs worker serve --enable-auto-tool-choice "+
				"and --tool-call-parser; or send tool_choice \"none\"")
		}
		p.ToolParser, p.SpecialTokens = s.tools.forRequest(p.Tools), true
	}
	if p.forced != nil {
		p.ToolParser = p.forced.parser()
	}
	if p.Tools != nil && !strings.Contains(template, "tools") {
		return badRequest("tools", "the chat template of %s does not render tools, so the model would never see them: "+
			"give worker serve a --chat-template that does", s.cfg.ModelName)
	}
	return nil
}

// handle is both endpoints: parse, check, admit, then answer (streaming or
// not) from the tokens the fleet produces. A request of P prompts and n
// choices is P·n engine requests (calls), choice index prompt·n + j, all
// answered together.
func (s *Server) handle(w http.ResponseWriter, r *http.Request, endpoint string, req any, raw *rawParams,
	defaultMax int, prompt func(p *genParams) ([]promptIn, *apiError)) {
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.RequestReceived(endpoint)
	}
	fail := func(e *apiError) {
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.RequestRejected(endpoint, e.Status)
		}
		writeError(w, e)
	}
	// X-Request-Id: the client's id is echoed and names the request (its
	// API id, its log lines); without one the server's numeric id is sent.
	reqID := r.Header.Get("X-Request-Id")
	if reqID != "" {
		if !validRequestID(reqID) {
			fail(badRequest("X-Request-Id", "the X-Request-Id header must be 1 to %d printable ASCII characters", maxRequestIDLen))
			return
		}
		w.Header().Set("X-Request-Id", reqID)
	}
	if e := s.unavailable(); e != nil {
		fail(e)
		return
	}
	cr, e := s.parse(w, r, req, raw, defaultMax, prompt)
	if e != nil {
		if t, ok := req.(translated); ok {
			e.Param = t.param(e.Param) // the field as the client named it
		}
		fail(e)
		return
	}
	p := cr.params
	if endpoint == "chat" || endpoint == "responses" {
		p.Reasoning = s.thinking
	}
	if endpoint == "responses" && p.Reasoning != nil && p.Logprobs {
		// (Its log-probabilities belong to the message's text; the
		// thinking's tokens would need their own list.)
		fail(badRequest("include", "log-probabilities are not given on the Responses API with --reasoning-parser; use /v1/chat/completions"))
		return
	}
	if s.cfg.MaxQueue > 0 && len(cr.choices) > s.cfg.MaxQueue {
		fail(badRequest("n", "%d choices (prompts × n) exceed the server's bound of %d requests in flight (--max-queue)",
			len(cr.choices), s.cfg.MaxQueue))
		return
	}
	wake := make(chan struct{}, 1)
	runs := make([]*choiceRun, len(cr.choices))
	s.mu.Lock()
	if s.cfg.MaxQueue > 0 && len(s.calls)+len(runs) > s.cfg.MaxQueue {
		s.mu.Unlock()
		fail(&apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
			Message: fmt.Sprintf("%d requests in flight, the server's bound (--max-queue); retry later", s.cfg.MaxQueue)})
		return
	}
	for i := range cr.choices {
		ch := &cr.choices[i]
		// The ids are taken only by a request that is accepted: ids stay dense.
		ch.ID = s.nextID.Add(1) - 1
		c := &call{id: ch.ID, wake: wake, prompt: len(ch.Prompt), arrival: ch.ArrivalUnixNS, apiID: reqID}
		if i == 0 && reqID == "" {
			reqID = strconv.FormatUint(ch.ID, 10)
			w.Header().Set("X-Request-Id", reqID)
		}
		c.apiID = reqID
		s.calls[ch.ID] = c
		runs[i] = &choiceRun{c: c, index: i, echo: ch.echo, firstOfPrompt: ch.firstOfPrompt, prompt: ch.Prompt}
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, ch := range runs {
			if !ch.c.detached {
				delete(s.calls, ch.c.id)
			}
		}
		s.mu.Unlock()
	}()
	for i, ch := range cr.choices {
		if !s.src.push(ch.Arrival) {
			for _, pushed := range runs[:i] {
				s.detach(pushed.c, "cancelled")
			}
			for _, left := range runs[i:] {
				s.record(left.c, nil, "cancelled")
			}
			fail(&apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: "the server is shutting down"})
			return
		}
	}
	s.answer(w, r, endpoint, reqID, runs, p, req)
}

// unavailable is the error for every request while the fleet failed, is
// draining or not yet initialised.
func (s *Server) unavailable() *apiError {
	if p := s.failed.Load(); p != nil {
		return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: "the fleet failed: " + (*p).Error()}
	}
	if s.draining.Load() {
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: "the server is shutting down"}
	}
	if !s.ready.Load() {
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: "the fleet is starting: not every rank has passed init"}
	}
	return nil
}

// checkedChoice is one engine request of a request that passed every
// check, not yet numbered.
type checkedChoice struct {
	executor.Arrival
	echo          string // echo: its prompt's text
	firstOfPrompt bool   // choice 0 of its prompt (its prompt tokens count in the usage)
}

// checkedRequest is a request that passed every check: its choices in
// index order (prompt-major).
type checkedRequest struct {
	params  genParams
	choices []checkedChoice
}

// parse reads and checks a request body: the JSON (bounded in size, time
// and bytes in flight), the model, the parameters, the prompts and their
// admission. Nothing of the fleet is touched.
func (s *Server) parse(w http.ResponseWriter, r *http.Request, req any, raw *rawParams, defaultMax int,
	prompt func(p *genParams) ([]promptIn, *apiError)) (checkedRequest, *apiError) {
	release, e := s.decodeBody(w, r, req)
	if e != nil {
		return checkedRequest{}, e
	}
	// The body's bytes are garbage once the prompt is tokenised.
	defer release()
	if t, ok := req.(translated); ok {
		if e := t.translate(); e != nil {
			return checkedRequest{}, e
		}
	}
	if e := s.checkModel(raw.Model); e != nil {
		return checkedRequest{}, e
	}
	p, e := raw.check(defaultMax)
	if e != nil {
		return checkedRequest{}, e
	}
	prompts, e := prompt(&p)
	if e != nil {
		return checkedRequest{}, e
	}
	if len(prompts)*p.N > maxChoices {
		return checkedRequest{}, badRequest("n", "%d prompts × n %d = %d choices, more than %d", len(prompts), p.N, len(prompts)*p.N, maxChoices)
	}
	if e := p.checkVocab(s.cfg.VocabSize); e != nil {
		return checkedRequest{}, e
	}
	if e := s.checkGuide(&p); e != nil {
		return checkedRequest{}, e
	}
	if p.Priority != 0 && !s.cfg.PriorityScheduling {
		return checkedRequest{}, badRequest("priority", "request priority %d needs the server's --scheduling-policy priority (under the default, fcfs, requests are served in arrival order)", p.Priority)
	}
	if score, _ := p.scoresPrompt(); score && s.cfg.NoPromptLogprobs {
		param := "prompt_logprobs"
		if !p.WantPromptLogprobs {
			param = "echo"
		}
		return checkedRequest{}, badRequest(param, "the prompt's log-probabilities (prompt_logprobs, or echo with logprobs) are not supported by this fleet's engine (the CUDA engine does not score prompts yet)")
	}
	badWords, e := badWordTokens(p.BadWords, s.cfg.Tokenizer)
	if e != nil {
		return checkedRequest{}, e
	}
	if ranks := max(s.cfg.AttentionDPRanks, 1); p.Routing.HasRank && p.Routing.Rank >= ranks {
		return checkedRequest{}, badRequest("attention_dp_rank", "attention_dp_rank %d is out of range: the fleet has %d attention-DP ranks (allowed: 0 to %d)",
			p.Routing.Rank, ranks, ranks-1)
	}
	keep := p.TruncatePrompt
	if keep == -1 {
		if keep = s.cfg.MaxModelLen; keep <= 0 {
			return checkedRequest{}, badRequest("truncate_prompt_tokens", "truncate_prompt_tokens -1 needs the model's context length, which this server does not know; give a count")
		}
	}
	if s.cfg.MaxModelLen > 0 && keep > s.cfg.MaxModelLen {
		return checkedRequest{}, badRequest("truncate_prompt_tokens", "truncate_prompt_tokens %d is above the model's context length %d", keep, s.cfg.MaxModelLen)
	}
	cr := checkedRequest{params: p}
	now := s.cfg.Now().UnixNano()
	for pi, pr := range prompts {
		ids := pr.ids
		truncated := keep > 0 && len(ids) > keep
		if truncated {
			// vLLM's truncate_prompt_tokens: the prompt's last tokens.
			ids = ids[len(ids)-keep:]
		}
		echo := ""
		if p.Echo {
			// vLLM's echo: the prompt as sent, or its ids decoded (the
			// kept ones when it was truncated).
			echo = pr.text
			if (echo == "" || truncated) && s.cfg.Tokenizer != nil {
				echo = s.cfg.Tokenizer.Decode(ids)
			}
			if pr.echo != nil {
				echo = *pr.echo // chat: the last message's text, not the prompt
			}
		}
		maxTokens := p.MaxTokens
		if maxTokens == restOfContext {
			maxTokens = s.restOfContext(len(ids))
		}
		if v := s.cfg.Admission(len(ids), maxTokens); v.Code == scheduler.NeverFits {
			what := ""
			if len(prompts) > 1 {
				what = fmt.Sprintf("prompt %d: ", pi)
			}
			return checkedRequest{}, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Param: "max_tokens",
				Code:    "context_length_exceeded",
				Message: fmt.Sprintf("%s%d prompt tokens + max_tokens %d can never be served: %s", what, len(ids), maxTokens, v.Reason)}
		}
		for j := 0; j < p.N; j++ {
			a := executor.Arrival{ArrivalUnixNS: now, MaxNewTokens: maxTokens,
				Prompt: ids, StopAtEOS: !p.IgnoreEOS, LogitBias: p.LogitBias, StopTokenIDs: p.StopTokenIDs,
				Logprobs: p.Logprobs, TopLogprobs: p.TopLogprobs, ConversationID: p.ConversationID, Routing: p.Routing,
				Guide: p.Guide, MinTokens: min(p.MinTokens, maxTokens), AllowedTokenIDs: p.AllowedTokenIDs,
				BadWords: badWords, Priority: p.Priority}
			// Every choice scores its prompt: a streamed choice's first
			// chunk carries them whichever choice starts first.
			a.PromptLogprobs, a.PromptTopLogprobs = p.scoresPrompt()
			if e := setSampling(&a, choiceParams(p, j)); e != nil {
				return checkedRequest{}, e
			}
			cr.choices = append(cr.choices, checkedChoice{Arrival: a, echo: echo, firstOfPrompt: j == 0})
		}
	}
	return cr, nil
}

// defaultChatMaxTokens is chat's default max_tokens when the context
// length is unknown (Config.MaxModelLen 0).
const defaultChatMaxTokens = 512

// restOfContext is the default max_tokens of a prompt of n tokens: the rest
// of the context (vLLM's default), lowered to the largest value the fleet
// can ever serve (Admission) when the context is longer than that; at
// least 1 (a prompt that fills the context is then refused by admission).
func (s *Server) restOfContext(n int) int {
	if s.cfg.MaxModelLen <= 0 {
		return defaultChatMaxTokens
	}
	hi := s.cfg.MaxModelLen - n
	if hi < 1 {
		return 1
	}
	if s.cfg.Admission(n, hi).Code != scheduler.NeverFits {
		return hi
	}
	// Admission is monotone in max_tokens: the largest that fits.
	lo := 0
	for lo < hi-1 {
		mid := lo + (hi-lo)/2
		if s.cfg.Admission(n, mid).Code == scheduler.NeverFits {
			hi = mid
		} else {
			lo = mid
		}
	}
	return max(lo, 1)
}
