package serve

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockstep-ai/lockstep/executor"
)

// Prometheus metrics of the server (docs/metrics.md lists them all).
//
// The executor feeds them on rank 0's loop goroutine (OnResponse,
// OnIteration), the HTTP handlers from theirs (RequestReceived,
// RequestRejected), the start-up code SetReady, and scrapes read them
// concurrently: every metric is a client_golang collector (safe for
// concurrent use), and the little state Metrics keeps itself (the previous
// cumulative counters, the prefix-cache sums) sits under a mutex.

// Endpoints, finish reasons and error statuses known in advance: their
// series exist (at zero) from the start, so rate() and absent() behave.
var (
	knownEndpoints     = []string{"completions", "chat", "responses"}
	knownFinishReasons = []string{"stop", "length", "cancelled", "error"}
	knownStatuses      = []int{400, 404, 413, 429, 500, 503}
)

// latencyBuckets spans 1 ms to 10 min (request latencies: first token,
// per output token, end to end, queue time).
var latencyBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
	1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300, 600,
}

// iterationBuckets spans 0.5 ms to 10 s (one iteration of the loop).
var iterationBuckets = []float64{
	0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
	0.075, 0.1, 0.2, 0.5, 1, 2, 5, 10,
}

// Metrics holds the server's Prometheus metrics on a private registry.
type Metrics struct {
	reg     *prometheus.Registry
	handler http.Handler

	received, rejected, finished *prometheus.CounterVec
	receivedBy, finishedBy       map[string]prometheus.Counter // the known label values, resolved once

	promptTokens, generationTokens, reusedTokens prometheus.Counter
	prefixHit                                    prometheus.Gauge

	ttft, tpot, e2e, queue prometheus.Histogram

	running, waiting, queued prometheus.Gauge
	iterations               [2]prometheus.Counter  // forward false, true
	iterDuration             [2]prometheus.Observer // forward false, true
	waste                    prometheus.Gauge
	busyMax                  prometheus.Counter
	tokenBalance             prometheus.Gauge
	adpHeld                  prometheus.Counter
	solForward               prometheus.Counter
	suspends                 prometheus.Counter
	recomputes               prometheus.Counter
	costPubs                 prometheus.Counter
	ready                    prometheus.Gauge

	rankRunning, rankKVUsage, rankKVUsed *prometheus.GaugeVec
	rankBusyTotal                        *prometheus.CounterVec

	mu sync.Mutex // guards what follows
	// ranks holds each rank's label children and its previous cumulative
	// counters; it grows (under mu) if an iteration reports more ranks
	// than NewMetrics was told.
	ranks          []rankMetrics
	lastCostPubs   int64
	prompt, reused float64      // cumulative, for the prefix hit ratio
	vllm           *vllmMetrics // --metrics-compat vllm; nil otherwise
}

// MetricsOptions are NewMetricsWith's options.
type MetricsOptions struct {
	// VLLM adds the vLLM-named families (metrics_vllm.go) beside the
	// lockstep_* ones.
	VLLM bool
	// MaxModelLen sizes the buckets of vLLM's token-count histograms.
	MaxModelLen int
}

// rankMetrics is one rank's resolved label children and the cumulative
// preemption counters of the previous iteration.
type rankMetrics struct {
	running, kvUsage, kvUsed prometheus.Gauge
	busy                     prometheus.Counter
	lastSuspended            int64
	lastRecompute            int64
}

// NewMetrics creates every metric, with the constant label model, on a
// private registry (plus the Go runtime and process collectors). ranks is
// the number of entries FleetStats.Ranks and BusyMS carry, whose per-rank
// series are created (at zero) up front: the attention-DP group size, 1
// with a single rank or a Helix CP group (the executor then reports rank
// 0's entry only). An iteration reporting more ranks adds their series.
func NewMetrics(model string, ranks int) *Metrics {
	return NewMetricsWith(model, ranks, MetricsOptions{})
}

// NewMetricsWith is NewMetrics with options (the vLLM-named families).
func NewMetricsWith(model string, ranks int, opts MetricsOptions) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r := prometheus.WrapRegistererWith(prometheus.Labels{"model": model}, m.reg)

	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		r.MustRegister(c)
		return c
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		r.MustRegister(c)
		return c
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		r.MustRegister(g)
		return g
	}
	gaugeVec := func(name, help string, labels ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
		r.MustRegister(g)
		return g
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
		r.MustRegister(h)
		return h
	}
	histogramVec := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		r.MustRegister(h)
		return h
	}

	// Requests.
	m.received = counterVec("lockstep_requests_received_total",
		"Requests received, by endpoint (completions, chat, responses).", "endpoint")
	m.rejected = counterVec("lockstep_requests_rejected_total",
		"Requests answered with an HTTP error, by endpoint and status code.", "endpoint", "status")
	m.finished = counterVec("lockstep_requests_finished_total",
		"Requests the engine answered, by finish reason (stop, length, cancelled, error).", "finish_reason")
	m.receivedBy = make(map[string]prometheus.Counter, len(knownEndpoints))
	for _, ep := range knownEndpoints {
		m.receivedBy[ep] = m.received.WithLabelValues(ep)
		for _, st := range knownStatuses {
			m.rejected.WithLabelValues(ep, strconv.Itoa(st))
		}
	}
	m.finishedBy = make(map[string]prometheus.Counter, len(knownFinishReasons))
	for _, fr := range knownFinishReasons {
		m.finishedBy[fr] = m.finished.WithLabelValues(fr)
	}

	// Tokens.
	m.promptTokens = counter("lockstep_prompt_tokens_total",
		"Prompt tokens of the requests that reached the engine (answered, or cancelled or failed after their first chunk was scheduled).")
	m.generationTokens = counter("lockstep_generation_tokens_total",
		"Tokens generated (all answers, cancelled ones included).")
	m.reusedTokens = counter("lockstep_prefix_reused_tokens_total",
		"Prompt tokens taken from the prefix (radix) cache instead of prefilled, of the requests counted in lockstep_prompt_tokens_total.")
	m.prefixHit = gauge("lockstep_prefix_hit_ratio",
		"Prefix cache hit ratio since start: lockstep_prefix_reused_tokens_total / lockstep_prompt_tokens_total.")

	// Request latencies.
	m.ttft = histogram("lockstep_time_to_first_token_seconds",
		"Time from a request's arrival to its first generated token.", latencyBuckets)
	m.tpot = histogram("lockstep_time_per_output_token_seconds",
		"Mean time per output token after the first, one observation per request with at least two tokens.", latencyBuckets)
	m.e2e = histogram("lockstep_e2e_request_latency_seconds",
		"Time from a request's arrival to its answer, for requests that finished (stop or length).", latencyBuckets)
	m.queue = histogram("lockstep_request_queue_time_seconds",
		"Time from a request's arrival until its first prompt chunk was scheduled.", latencyBuckets)

	// Fleet load, every iteration.
	m.running = gauge("lockstep_requests_running",
		"Requests holding a slot on some rank (sum over ranks).")
	m.waiting = gauge("lockstep_requests_waiting",
		"Requests routed to a rank and waiting for their first chunk, or suspended until they resume (sum over ranks).")
	m.queued = gauge("lockstep_requests_queued",
		"Requests received and not yet routed to a rank: beyond the ranks' max-active-per-rank cap.")
	m.rankRunning = gaugeVec("lockstep_rank_requests_running",
		"Requests holding a slot on the rank.", "rank")
	m.rankKVUsage = gaugeVec("lockstep_rank_kv_cache_usage_ratio",
		"Fraction of the rank's KV cache pages in use.", "rank")
	m.rankKVUsed = gaugeVec("lockstep_rank_kv_cache_used_pages",
		"KV cache pages in use on the rank.", "rank")
	preempt := counterVec("lockstep_preemptions_total",
		"Preemptions of requests to make room, by kind (suspend, recompute).", "kind")
	m.suspends, m.recomputes = preempt.WithLabelValues("suspend"), preempt.WithLabelValues("recompute")

	// Iterations.
	iters := counterVec("lockstep_iterations_total",
		"Iterations of the executor loop, by whether the fleet ran a forward step.", "forward")
	dur := histogramVec("lockstep_iteration_duration_seconds",
		"Wall time of an iteration on rank 0, by whether the fleet ran a forward step.", iterationBuckets, "forward")
	for i, f := range []string{"false", "true"} {
		m.iterations[i], m.iterDuration[i] = iters.WithLabelValues(f), dur.WithLabelValues(f)
	}
	m.waste = gauge("lockstep_lockstep_waste_ratio",
		"Lockstep waste of the last forward iteration: 1 - mean/max of the ranks' engine busy time.")
	m.rankBusyTotal = counterVec("lockstep_busy_seconds_total",
		"Engine busy time of the rank, summed over forward iterations.", "rank")
	m.tokenBalance = gauge("lockstep_token_balance_ratio",
		"Token balance of the last forward iteration with a real token: mean/max of the ranks' tokens in their batch (padding dummies count 0).")
	m.adpHeld = counter("lockstep_adp_balance_held_iterations_total",
		"Iterations in which ADP Balance (--attention-dp-balance) held back the contexts the ranks had scheduled.")
	m.solForward = counter("lockstep_sol_forward_seconds_total",
		"The slowest rank's busy time of each forward iteration times its token balance, summed: the time a perfectly balanced fleet would need. busy_max/sol_forward times the output token rate is the speed-of-light throughput.")
	m.busyMax = counter("lockstep_busy_max_seconds_total",
		"The slowest rank's engine busy time, summed over forward iterations (the fleet's lockstep time).")
	m.costPubs = counter("lockstep_cost_publications_total",
		"Cost-model publications of the online calibrator.")
	m.ready = gauge("lockstep_ready",
		"1 once every rank passed initialization and the server accepts requests, else 0.")

	if opts.VLLM {
		m.vllm = newVLLMMetrics(m.reg, model, opts.MaxModelLen)
	}
	m.mu.Lock()
	m.growRanks(ranks)
	m.mu.Unlock()

	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// growRanks resolves the per-rank children of ranks [len(m.ranks), n); m.mu held.
func (m *Metrics) growRanks(n int) {
	for i := len(m.ranks); i < n; i++ {
		rk := strconv.Itoa(i)
		m.ranks = append(m.ranks, rankMetrics{
			running: m.rankRunning.WithLabelValues(rk),
			kvUsage: m.rankKVUsage.WithLabelValues(rk),
			kvUsed:  m.rankKVUsed.WithLabelValues(rk),
			busy:    m.rankBusyTotal.WithLabelValues(rk),
		})
	}
	if m.vllm != nil {
		m.vllm.grow(n)
	}
}

// Handler serves the metrics in the Prometheus exposition formats (/metrics).
func (m *Metrics) Handler() http.Handler { return m.handler }

// RequestReceived counts a request on endpoint ("completions", "chat" or
// "responses").
func (m *Metrics) RequestReceived(endpoint string) {
	if c, ok := m.receivedBy[endpoint]; ok {
		c.Inc()
		return
	}
	m.received.WithLabelValues(endpoint).Inc()
}

// RequestRejected counts an error answer of endpoint with HTTP status.
func (m *Metrics) RequestRejected(endpoint string, status int) {
	m.rejected.WithLabelValues(endpoint, strconv.Itoa(status)).Inc()
}

// OnResponse records an answer of the engine: promptTokens is the request's
// prompt length, finishReason "stop", "length", "cancelled" or "error".
func (m *Metrics) OnResponse(r executor.Response, promptTokens int, finishReason string) {
	m.OnResponseGaps(r, promptTokens, finishReason, nil)
}

// OnResponseGaps is OnResponse with the request's inter-token latencies
// (seconds between its tokens' arrivals at rank 0), which the vLLM-named
// histogram observes.
func (m *Metrics) OnResponseGaps(r executor.Response, promptTokens int, finishReason string, gaps []float64) {
	if m.vllm != nil {
		m.mu.Lock()
		m.vllm.onResponse(r, promptTokens, finishReason, gaps)
		m.mu.Unlock()
	}
	if c, ok := m.finishedBy[finishReason]; ok {
		c.Inc()
	} else {
		m.finished.WithLabelValues(finishReason).Inc()
	}
	m.generationTokens.Add(float64(len(r.Output)))

	// The prompt counts once it reached the engine: always for an answer,
	// for a cancelled or failed request once its first chunk was scheduled
	// (a request rejected on arrival never touched the cache).
	if r.Error == "" || r.ScheduledUnixNS != 0 {
		p := float64(max(promptTokens, 0))
		reused := float64(min(max(r.ReusedTokens, 0), max(promptTokens, 0)))
		m.promptTokens.Add(p)
		m.reusedTokens.Add(reused)
		m.mu.Lock()
		m.prompt += p
		m.reused += reused
		if m.prompt > 0 {
			m.prefixHit.Set(m.reused / m.prompt)
		}
		m.mu.Unlock()
	}

	if r.ArrivalUnixNS != 0 {
		if r.ScheduledUnixNS != 0 {
			m.queue.Observe(seconds(r.ScheduledUnixNS - r.ArrivalUnixNS))
		}
		if r.FirstTokenUnixNS != 0 {
			m.ttft.Observe(seconds(r.FirstTokenUnixNS - r.ArrivalUnixNS))
		}
		if (finishReason == "stop" || finishReason == "length") && r.FinishUnixNS != 0 {
			m.e2e.Observe(seconds(r.FinishUnixNS - r.ArrivalUnixNS))
		}
	}
	if n := len(r.Output); n > 1 && r.FirstTokenUnixNS != 0 && r.FinishUnixNS != 0 {
		m.tpot.Observe(seconds(r.FinishUnixNS-r.FirstTokenUnixNS) / float64(n-1))
	}
}

// seconds converts a nanosecond interval (clamped at zero) to seconds.
func seconds(ns int64) float64 { return float64(max(ns, 0)) / 1e9 }

// OnIteration records an iteration's fleet state. It runs every iteration
// on rank 0's loop: it allocates nothing (the label children are resolved
// in advance) and takes one uncontended mutex.
func (m *Metrics) OnIteration(s executor.FleetStats) {
	fwd := 0
	if s.Forward {
		fwd = 1
	}
	m.iterations[fwd].Inc()
	m.iterDuration[fwd].Observe(max(s.IterationMS, 0) / 1000)

	m.mu.Lock()
	defer m.mu.Unlock()
	if n := max(len(s.Ranks), len(s.BusyMS)); n > len(m.ranks) {
		m.growRanks(n)
	}
	var running, waiting, suspends, recomputes int64
	for i, l := range s.Ranks {
		rm := &m.ranks[i]
		running += l.Running
		waiting += l.Waiting
		rm.running.Set(float64(l.Running))
		rm.kvUsed.Set(float64(l.UsedPages))
		if l.Pages > 0 {
			rm.kvUsage.Set(float64(l.UsedPages) / float64(l.Pages))
		} else {
			rm.kvUsage.Set(0)
		}
		ds, dr := increase(l.Suspended, &rm.lastSuspended), increase(l.Recompute, &rm.lastRecompute)
		suspends += ds
		recomputes += dr
		if m.vllm != nil {
			m.vllm.onIteration(i, l, ds+dr)
		}
	}
	m.running.Set(float64(running))
	m.waiting.Set(float64(waiting))
	m.queued.Set(float64(s.Queued))
	if suspends > 0 {
		m.suspends.Add(float64(suspends))
	}
	if recomputes > 0 {
		m.recomputes.Add(float64(recomputes))
	}

	if s.Forward && len(s.BusyMS) > 0 {
		var busyMax float64
		for i, b := range s.BusyMS {
			b = max(b, 0)
			m.ranks[i].busy.Add(b / 1000)
			busyMax = max(busyMax, b)
		}
		m.busyMax.Add(busyMax / 1000)
		m.waste.Set(s.LockstepWaste)
		if s.TokenBalance > 0 {
			m.tokenBalance.Set(s.TokenBalance)
			m.solForward.Add(busyMax / 1000 * s.TokenBalance)
		}
	}

	if s.ContextsHeld {
		m.adpHeld.Inc()
	}
	if d := increase(int64(s.CostPublications), &m.lastCostPubs); d > 0 {
		m.costPubs.Add(float64(d))
	}
}

// increase is the growth of the cumulative counter cur since *last (a
// smaller value is a restart from zero: all of cur is new), and records cur.
func increase(cur int64, last *int64) int64 {
	d := cur - *last
	if d < 0 {
		d = cur
	}
	*last = cur
	return max(d, 0)
}

// SetReady sets lockstep_ready: 1 once every rank passed initialization.
func (m *Metrics) SetReady(ready bool) {
	if ready {
		m.ready.Set(1)
	} else {
		m.ready.Set(0)
	}
}
