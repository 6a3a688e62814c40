package serve

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockstep-ai/lockstep/executor"
)

// vLLM-named metrics (--metrics-compat vllm), beside the lockstep_* ones,
// for the dashboards and routers that read vLLM's (llm-d, the common
// Grafana boards). Names, kinds, buckets and labels follow vLLM's
// PrometheusStatLogger (vllm/v1/metrics/loggers.py): labels model_name (the
// served name) and engine (here the attention-DP rank, as vLLM numbers its
// data-parallel engines); counters are exposed with the _total suffix as
// prometheus_client does. docs/metrics.md says how each is measured here.

// vLLM's buckets.
var (
	vllmTTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
		10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	vllmITLBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
		10.0, 20.0, 40.0, 80.0}
	vllmRequestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
		60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// buckets125 is vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up
// to max (at least the first bucket).
func buckets125(max int) []float64 {
	out := []float64{}
	for base := 1; base <= max; base *= 10 {
		for _, m := range []int{1, 2, 5} {
			if v := base * m; v <= max {
				out = append(out, float64(v))
			}
		}
	}
	if len(out) == 0 {
		out = append(out, 1)
	}
	return out
}

// vllmFinishReason is vLLM's name of a finish reason (its FinishReason:
// stop, length, abort); a cancelled or failed request is an abort.
func vllmFinishReason(r string) string {
	switch r {
	case "stop", "length":
		return r
	}
	return "abort"
}

// vllmMetrics are the vLLM-named families; every family has one child per
// engine (rank), resolved up front or as ranks appear.
type vllmMetrics struct {
	model string

	running, waiting, kvUsage                                     *prometheus.GaugeVec
	prefixQueries, prefixHits, preemptions, promptTok, generation *prometheus.CounterVec
	success                                                       *prometheus.CounterVec
	ttft, itl, tpot, e2e, queue, inference, prefill, decode       *prometheus.HistogramVec
	promptHist, genHist                                           *prometheus.HistogramVec

	engines []vllmEngine
}

// vllmEngine is one engine's resolved children.
type vllmEngine struct {
	running, waiting, kvUsage                                     prometheus.Gauge
	prefixQueries, prefixHits, preemptions, promptTok, generation prometheus.Counter
	ttft, itl, tpot, e2e, queue, inference, prefill, decode       prometheus.Observer
	promptHist, genHist                                           prometheus.Observer
}

func newVLLMMetrics(reg prometheus.Registerer, model string, maxModelLen int) *vllmMetrics {
	labels := []string{"model_name", "engine"}
	v := &vllmMetrics{model: model}
	gauge := func(name, help string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
		reg.MustRegister(g)
		return g
	}
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name + "_total", Help: help}, append(labels, extra...))
		reg.MustRegister(c)
		return c
	}
	hist := func(name, help string, b []float64) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b}, labels)
		reg.MustRegister(h)
		return h
	}
	v.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
	v.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
	v.kvUsage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
	v.prefixQueries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
	v.prefixHits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
	v.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
	v.promptTok = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
	v.generation = counter("vllm:generation_tokens", "Number of generation tokens processed.")
	v.success = counter("vllm:request_success", "Count of successfully processed requests.", "finished_reason")
	v.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", vllmTTFTBuckets)
	v.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", vllmITLBuckets)
	v.tpot = hist("vllm:time_per_output_token_seconds",
		"Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.", vllmITLBuckets)
	v.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", vllmRequestLatencyBuckets)
	v.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", vllmRequestLatencyBuckets)
	v.inference = hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", vllmRequestLatencyBuckets)
	v.prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", vllmRequestLatencyBuckets)
	v.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", vllmRequestLatencyBuckets)
	b := buckets125(max(maxModelLen, 1))
	v.promptHist = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", b)
	v.genHist = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", b)
	return v
}

// grow resolves the children of engines [len(v.engines), n); the caller
// holds Metrics.mu.
func (v *vllmMetrics) grow(n int) {
	for i := len(v.engines); i < n; i++ {
		l := []string{v.model, strconv.Itoa(i)}
		v.engines = append(v.engines, vllmEngine{
			running: v.running.WithLabelValues(l...), waiting: v.waiting.WithLabelValues(l...),
			kvUsage: v.kvUsage.WithLabelValues(l...), prefixQueries: v.prefixQueries.WithLabelValues(l...),
			prefixHits: v.prefixHits.WithLabelValues(l...), preemptions: v.preemptions.WithLabelValues(l...),
			promptTok: v.promptTok.WithLabelValues(l...), generation: v.generation.WithLabelValues(l...),
			ttft: v.ttft.WithLabelValues(l...), itl: v.itl.WithLabelValues(l...), tpot: v.tpot.WithLabelValues(l...),
			e2e: v.e2e.WithLabelValues(l...), queue: v.queue.WithLabelValues(l...),
			inference: v.inference.WithLabelValues(l...), prefill: v.prefill.WithLabelValues(l...),
			decode: v.decode.WithLabelValues(l...), promptHist: v.promptHist.WithLabelValues(l...),
			genHist: v.genHist.WithLabelValues(l...),
		})
		for _, fr := range []string{"stop", "length", "abort"} {
			v.success.WithLabelValues(v.model, strconv.Itoa(i), fr)
		}
	}
}

// onResponse records a finished request on its engine (a request refused
// before routing counts on engine 0); the caller holds Metrics.mu. gaps
// are its inter-token latencies in seconds, as rank 0 saw the tokens come.
func (v *vllmMetrics) onResponse(r executor.Response, promptTokens int, finish string, gaps []float64) {
	rank := max(r.Rank, 0)
	v.grow(rank + 1)
	e := &v.engines[rank]
	v.success.WithLabelValues(v.model, strconv.Itoa(rank), vllmFinishReason(finish)).Inc()
	e.generation.Add(float64(len(r.Output)))
	if r.Error == "" || r.ScheduledUnixNS != 0 {
		p := max(promptTokens, 0)
		e.promptTok.Add(float64(p))
		e.prefixQueries.Add(float64(p))
		e.prefixHits.Add(float64(min(max(r.ReusedTokens, 0), p)))
		e.promptHist.Observe(float64(p))
		e.genHist.Observe(float64(len(r.Output)))
	}
	for _, g := range gaps {
		e.itl.Observe(g)
		e.tpot.Observe(g)
	}
	if r.ArrivalUnixNS == 0 {
		return
	}
	if r.ScheduledUnixNS != 0 {
		e.queue.Observe(seconds(r.ScheduledUnixNS - r.ArrivalUnixNS))
	}
	if r.FirstTokenUnixNS != 0 {
		e.ttft.Observe(seconds(r.FirstTokenUnixNS - r.ArrivalUnixNS))
	}
	if r.FinishUnixNS == 0 {
		return
	}
	e.e2e.Observe(seconds(r.FinishUnixNS - r.ArrivalUnixNS))
	if r.ScheduledUnixNS != 0 {
		e.inference.Observe(seconds(r.FinishUnixNS - r.ScheduledUnixNS))
		if r.FirstTokenUnixNS != 0 {
			e.prefill.Observe(seconds(r.FirstTokenUnixNS - r.ScheduledUnixNS))
			e.decode.Observe(seconds(r.FinishUnixNS - r.FirstTokenUnixNS))
		}
	}
}

// onIteration sets the engines' gauges from their loads and counts their
// new preemptions (suspends and recomputes, as vLLM counts a preemption of
// either kind); the caller holds Metrics.mu.
func (v *vllmMetrics) onIteration(i int, l executor.RankLoad, preempted int64) {
	v.grow(i + 1)
	e := &v.engines[i]
	e.running.Set(float64(l.Running))
	e.waiting.Set(float64(l.Waiting))
	if l.Pages > 0 {
		e.kvUsage.Set(float64(l.UsedPages) / float64(l.Pages))
	} else {
		e.kvUsage.Set(0)
	}
	if preempted > 0 {
		e.preemptions.Add(float64(preempted))
	}
}

// wantsGaps: the vLLM-named inter-token latency histogram needs the gaps.
func (m *Metrics) wantsGaps() bool { return m.vllm != nil }
