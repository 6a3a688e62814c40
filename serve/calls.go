package serve

import (
	"sync"

	"go.uber.org/zap"

	"github.com/lockstep-ai/lockstep/executor"
)

// call is one request in flight.
type call struct {
	id    uint64
	apiID string // X-Request-Id: the client's, or id in decimal
	wake  chan struct{}
	mu    sync.Mutex
	toks  []int32
	lps   []executor.TokenLogprobs // with toks, when the request asked for them
	resp  *executor.Response
	// promptLps are the prompt's log-probabilities (with its first token)
	// when asked for; gotPrompt once they arrived.
	promptLps []executor.TokenLogprobs
	gotPrompt bool
	err       error
	prompt    int
	// detached: the client's answer is over (it went away, or a stop
	// string ended it) and the ranks were told to withdraw the request;
	// the call stays registered until their answer arrives, then finish
	// is what the metrics record.
	detached bool
	finish   string
	arrival  int64 // arrival time (Unix ns), for a response the fleet never made
	recorded bool  // the metrics counted the call's end (once per call)
	// lastTok is when its last token reached rank 0 (Unix ns) and gaps the
	// seconds between its tokens, kept only for a gapSink.
	lastTok int64
	gaps    []float64
}

func (c *call) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *call) abort(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.signal()
}

// promptLogprobs returns the prompt's log-probabilities, and whether they
// arrived.
func (c *call) promptLogprobs() ([]executor.TokenLogprobs, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.promptLps, c.gotPrompt
}

// take returns the tokens (and their log-probabilities) and the answer
// that arrived since the last call.
func (c *call) take() ([]int32, []executor.TokenLogprobs, *executor.Response, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, lp := c.toks, c.lps
	c.toks, c.lps = nil, nil
	return t, lp, c.resp, c.err
}

func (s *Server) onTokens(deltas []executor.TokenDelta) {
	var now int64
	if s.gaps != nil {
		now = s.cfg.Now().UnixNano()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range deltas {
		if c := s.calls[d.ID]; c != nil {
			c.mu.Lock()
			c.toks = append(c.toks, d.Token)
			if d.Logprobs != nil {
				c.lps = append(c.lps, *d.Logprobs)
			}
			if d.PromptLogprobs != nil {
				c.promptLps, c.gotPrompt = d.PromptLogprobs, true
			}
			if s.gaps != nil {
				if c.lastTok != 0 {
					c.gaps = append(c.gaps, seconds(now-c.lastTok))
				}
				c.lastTok = now
			}
			c.mu.Unlock()
			c.signal()
		}
	}
}

// gapSink is a MetricsSink that observes inter-token latencies (Metrics
// with the vLLM-named families).
type gapSink interface {
	OnResponseGaps(r executor.Response, promptTokens int, finishReason string, gaps []float64)
	wantsGaps() bool
}

func (s *Server) onResponse(r executor.Response) {
	s.src.finished(r.ID)
	s.mu.Lock()
	c := s.calls[r.ID]
	detached := c != nil && c.detached
	if detached {
		delete(s.calls, r.ID)
	}
	s.mu.Unlock()
	switch {
	case c == nil:
	case detached:
		s.record(c, &r, c.finish)
	default:
		c.mu.Lock()
		c.resp = &r
		c.mu.Unlock()
		c.signal()
	}
}

// record counts c's end in the metrics, once per call whatever path ends
// it: r is the fleet's answer, nil when the fleet never made one (the
// request was withdrawn while queued, or the fleet failed).
func (s *Server) record(c *call, r *executor.Response, finish string) {
	c.mu.Lock()
	done := c.recorded
	c.recorded = true
	c.mu.Unlock()
	if done {
		return
	}
	if r == nil {
		r = &executor.Response{ID: c.id, ArrivalUnixNS: c.arrival, Error: finish}
	}
	s.log.Debug("request finished", zap.String("request_id", c.apiID), zap.Uint64("id", c.id),
		zap.String("finish_reason", finish), zap.Int("prompt_tokens", c.prompt), zap.Int("completion_tokens", len(r.Output)),
		zap.Int("rank", r.Rank), zap.Int("reused_tokens", r.ReusedTokens))
	switch {
	case s.gaps != nil:
		c.mu.Lock()
		gaps := c.gaps
		c.mu.Unlock()
		s.gaps.OnResponseGaps(*r, c.prompt, finish, gaps)
	case s.cfg.Metrics != nil:
		s.cfg.Metrics.OnResponse(*r, c.prompt, finish)
	}
}

// detach ends c's answer early and asks the ranks to withdraw the request
// (its metrics are recorded when their answer comes back). A request still
// queued is dropped at once, and one that already finished keeps its
// answer: both are recorded here.
func (s *Server) detach(c *call, finish string) {
	s.mu.Lock()
	if c.detached {
		s.mu.Unlock()
		return
	}
	c.detached, c.finish = true, finish
	s.mu.Unlock()
	if s.src.cancel(c.id) {
		s.mu.Lock()
		delete(s.calls, c.id)
		s.mu.Unlock()
		c.mu.Lock()
		resp := c.resp
		c.mu.Unlock()
		s.record(c, resp, finish)
	}
}
