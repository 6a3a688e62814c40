package serve

import (
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lockstep-ai/lockstep/executor"
)

// scrape GETs the handler and parses the text exposition.
func scrape(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape: content type %q", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// sample finds the metric of family name whose labels include want (given
// as name, value pairs); it fails the test if there is none.
func sample(t *testing.T, mfs map[string]*dto.MetricFamily, name string, want ...string) *dto.Metric {
	t.Helper()
	mf := mfs[name]
	if mf == nil {
		t.Fatalf("no family %s", name)
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if have[want[i]] != want[i+1] {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no sample %s%v", name, want)
	return nil
}

func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	m := sample(t, mfs, name, labels...)
	switch mfs[name].GetType() {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	}
	t.Fatalf("%s is a %v", name, mfs[name].GetType())
	return 0
}

func histogram(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels ...string) (count uint64, sum float64) {
	t.Helper()
	if mfs[name].GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("%s is a %v", name, mfs[name].GetType())
	}
	h := sample(t, mfs, name, labels...).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func check(t *testing.T, what string, got, want float64) {
	t.Helper()
	if !near(got, want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

const ms = int64(1e6) // nanoseconds

// response builds a Response arriving at t0 with the given offsets (ms; a
// negative offset leaves the timestamp 0) and n output tokens.
func response(sched, first, finish int64, n int) executor.Response {
	const t0 = int64(1_700_000_000) * 1e9
	at := func(off int64) int64 {
		if off < 0 {
			return 0
		}
		return t0 + off*ms
	}
	return executor.Response{ArrivalUnixNS: t0, ScheduledUnixNS: at(sched), FirstTokenUnixNS: at(first),
		FinishUnixNS: at(finish), Output: make([]int32, n)}
}

func TestMetricsRequests(t *testing.T) {
	m := NewMetrics("smol", 2)
	for range 3 {
		m.RequestReceived("completions")
	}
	m.RequestReceived("chat")
	m.RequestRejected("chat", 429)
	m.RequestRejected("chat", 429)
	m.RequestRejected("completions", 400)

	r1 := response(10, 50, 450, 5) // stop: queue 10 ms, TTFT 50 ms, e2e 450 ms, TPOT 100 ms
	r1.ReusedTokens, r1.Stopped = 40, true
	m.OnResponse(r1, 100, "stop")
	r2 := response(20, 100, 200, 3) // length: TPOT 50 ms
	m.OnResponse(r2, 60, "length")
	r3 := response(5, 30, 40, 1) // cancelled after one token: no e2e, no TPOT
	r3.Error, r3.ReusedTokens = executor.CancelledError, 20
	m.OnResponse(r3, 20, "cancelled")
	r4 := response(-1, -1, 0, 0) // rejected by the engine: no prompt, no latency
	r4.Error = "prompt too long"
	m.OnResponse(r4, 1000, "error")
	r5 := response(-1, -1, 1, 0) // cancelled while queued: no prompt processed
	r5.Error = executor.CancelledError
	m.OnResponse(r5, 50, "cancelled")

	mfs := scrape(t, m)
	check(t, "received completions", value(t, mfs, "lockstep_requests_received_total", "endpoint", "completions"), 3)
	check(t, "received chat", value(t, mfs, "lockstep_requests_received_total", "endpoint", "chat"), 1)
	check(t, "rejected chat 429", value(t, mfs, "lockstep_requests_rejected_total", "endpoint", "chat", "status", "429"), 2)
	check(t, "rejected completions 400", value(t, mfs, "lockstep_requests_rejected_total", "endpoint", "completions", "status", "400"), 1)
	check(t, "rejected completions 503 (pre-created)", value(t, mfs, "lockstep_requests_rejected_total", "endpoint", "completions", "status", "503"), 0)
	for reason, n := range map[string]float64{"stop": 1, "length": 1, "cancelled": 2, "error": 1} {
		check(t, "finished "+reason, value(t, mfs, "lockstep_requests_finished_total", "finish_reason", reason), n)
	}
	check(t, "prompt tokens", value(t, mfs, "lockstep_prompt_tokens_total"), 180)
	check(t, "generation tokens", value(t, mfs, "lockstep_generation_tokens_total"), 9)
	check(t, "reused tokens", value(t, mfs, "lockstep_prefix_reused_tokens_total"), 60)
	check(t, "prefix hit ratio", value(t, mfs, "lockstep_prefix_hit_ratio"), 60.0/180)

	for _, h := range []struct {
		name  string
		count uint64
		sum   float64
	}{
		{"lockstep_request_queue_time_seconds", 3, 0.035},
		{"lockstep_time_to_first_token_seconds", 3, 0.180},
		{"lockstep_e2e_request_latency_seconds", 2, 0.650},
		{"lockstep_time_per_output_token_seconds", 2, 0.150},
	} {
		c, s := histogram(t, mfs, h.name)
		if c != h.count || !near(s, h.sum) {
			t.Errorf("%s: count %d sum %v, want %d and %v", h.name, c, s, h.count, h.sum)
		}
	}
	// Buckets from 1 ms to minutes.
	b := sample(t, mfs, "lockstep_time_to_first_token_seconds").GetHistogram().GetBucket()
	if lo, hi := b[0].GetUpperBound(), b[len(b)-1].GetUpperBound(); lo != 0.001 || hi < 300 {
		t.Errorf("TTFT buckets span %v..%v s", lo, hi)
	}
	// The 50 ms TTFT and the 30 ms one are in the 50 ms bucket, the 100 ms one is not.
	for _, bk := range b {
		if bk.GetUpperBound() == 0.05 && bk.GetCumulativeCount() != 2 {
			t.Errorf("TTFT le=0.05: %d, want 2", bk.GetCumulativeCount())
		}
	}
	check(t, "ready before SetReady", value(t, mfs, "lockstep_ready"), 0)
	m.SetReady(true)
	check(t, "ready", value(t, scrape(t, m), "lockstep_ready"), 1)
	m.SetReady(false)
	check(t, "ready after SetReady(false)", value(t, scrape(t, m), "lockstep_ready"), 0)
}

func TestMetricsIterations(t *testing.T) {
	m := NewMetrics("smol", 2)
	m.OnIteration(executor.FleetStats{Iter: 0, Forward: true, BusyMS: []float64{10, 5}, LockstepWaste: 0.25,
		Ranks: []executor.RankLoad{
			{Running: 3, Waiting: 1, UsedPages: 50, Pages: 200, Suspended: 1},
			{Running: 2, Waiting: 2, UsedPages: 100, Pages: 200, Recompute: 2},
		}, IterationMS: 12, CostPublications: 1})
	mfs := scrape(t, m)
	check(t, "suspend after 1", value(t, mfs, "lockstep_preemptions_total", "kind", "suspend"), 1)
	check(t, "recompute after 1", value(t, mfs, "lockstep_preemptions_total", "kind", "recompute"), 2)

	m.OnIteration(executor.FleetStats{Iter: 1, Forward: false,
		Ranks: []executor.RankLoad{
			{Running: 1, Waiting: 0, UsedPages: 20, Pages: 200, Suspended: 3, Recompute: 2},
			{Running: 4, Waiting: 3, UsedPages: 150, Pages: 200, Suspended: 1, Recompute: 3},
		}, IterationMS: 1, CostPublications: 1})
	m.OnIteration(executor.FleetStats{Iter: 2, Forward: true, BusyMS: []float64{8, 8}, LockstepWaste: 0,
		Ranks: []executor.RankLoad{
			{Running: 1, Waiting: 0, UsedPages: 30, Pages: 200, Suspended: 3, Recompute: 2},
			{Running: 4, Waiting: 3, UsedPages: 160, Pages: 200, Suspended: 1, Recompute: 3},
		}, IterationMS: 9, CostPublications: 3, Queued: 17})

	mfs = scrape(t, m)
	check(t, "running", value(t, mfs, "lockstep_requests_running"), 5)
	check(t, "waiting", value(t, mfs, "lockstep_requests_waiting"), 3)
	check(t, "queued", value(t, mfs, "lockstep_requests_queued"), 17)
	check(t, "rank 0 running", value(t, mfs, "lockstep_rank_requests_running", "rank", "0"), 1)
	check(t, "rank 1 running", value(t, mfs, "lockstep_rank_requests_running", "rank", "1"), 4)
	check(t, "rank 0 kv used", value(t, mfs, "lockstep_rank_kv_cache_used_pages", "rank", "0"), 30)
	check(t, "rank 1 kv used", value(t, mfs, "lockstep_rank_kv_cache_used_pages", "rank", "1"), 160)
	check(t, "rank 0 kv usage", value(t, mfs, "lockstep_rank_kv_cache_usage_ratio", "rank", "0"), 0.15)
	check(t, "rank 1 kv usage", value(t, mfs, "lockstep_rank_kv_cache_usage_ratio", "rank", "1"), 0.8)
	// Increases of the cumulative counters: suspend 1 + (2 + 1) + 0,
	// recompute 2 + (2 + 1) + 0.
	check(t, "suspend", value(t, mfs, "lockstep_preemptions_total", "kind", "suspend"), 4)
	check(t, "recompute", value(t, mfs, "lockstep_preemptions_total", "kind", "recompute"), 5)
	check(t, "forward iterations", value(t, mfs, "lockstep_iterations_total", "forward", "true"), 2)
	check(t, "idle iterations", value(t, mfs, "lockstep_iterations_total", "forward", "false"), 1)
	if c, s := histogram(t, mfs, "lockstep_iteration_duration_seconds", "forward", "true"); c != 2 || !near(s, 0.021) {
		t.Errorf("forward iteration durations: count %d sum %v", c, s)
	}
	if c, s := histogram(t, mfs, "lockstep_iteration_duration_seconds", "forward", "false"); c != 1 || !near(s, 0.001) {
		t.Errorf("idle iteration durations: count %d sum %v", c, s)
	}
	check(t, "waste (last forward)", value(t, mfs, "lockstep_lockstep_waste_ratio"), 0)
	check(t, "rank 0 busy", value(t, mfs, "lockstep_busy_seconds_total", "rank", "0"), 0.018)
	check(t, "rank 1 busy", value(t, mfs, "lockstep_busy_seconds_total", "rank", "1"), 0.013)
	check(t, "busy max", value(t, mfs, "lockstep_busy_max_seconds_total"), 0.018)
	check(t, "cost publications", value(t, mfs, "lockstep_cost_publications_total"), 3)
	// The windowed waste the docs compute from the counters: 1 − Σbusy/(ranks·Σmax).
	check(t, "windowed waste", 1-(0.018+0.013)/(2*0.018), 1-31.0/36)

	// A restarted cumulative counter (smaller than before) counts in full;
	// a rank that did not exist before gets its series.
	m.OnIteration(executor.FleetStats{Iter: 3, Forward: true, BusyMS: []float64{4, 2, 1}, LockstepWaste: 1 - 7.0/3/4,
		TokensPerRank: []int64{30, 10, 20}, TokenBalance: 0.5, ContextsHeld: true,
		Ranks: []executor.RankLoad{
			{Running: 1, UsedPages: 30, Pages: 200, Suspended: 1, Recompute: 2},
			{Running: 4, UsedPages: 160, Pages: 200, Suspended: 1, Recompute: 3},
			{Running: 7, UsedPages: 10, Pages: 0, Suspended: 2},
		}, IterationMS: 5, CostPublications: 3})
	mfs = scrape(t, m)
	check(t, "suspend after restart and a new rank", value(t, mfs, "lockstep_preemptions_total", "kind", "suspend"), 4+1+2)
	check(t, "rank 2 running", value(t, mfs, "lockstep_rank_requests_running", "rank", "2"), 7)
	check(t, "rank 2 kv usage without pages", value(t, mfs, "lockstep_rank_kv_cache_usage_ratio", "rank", "2"), 0)
	check(t, "rank 2 busy", value(t, mfs, "lockstep_busy_seconds_total", "rank", "2"), 0.001)
	check(t, "waste", value(t, mfs, "lockstep_lockstep_waste_ratio"), 1-7.0/3/4)
	check(t, "token balance (last forward)", value(t, mfs, "lockstep_token_balance_ratio"), 0.5)
	check(t, "speed-of-light forward time", value(t, mfs, "lockstep_sol_forward_seconds_total"), 0.004*0.5)
	check(t, "ADP Balance holds", value(t, mfs, "lockstep_adp_balance_held_iterations_total"), 1)
}

// TestMetricsLint: every family but the Go runtime and process ones is
// lockstep_*, carries the model label, has help, and promlint finds nothing.
func TestMetricsLint(t *testing.T) {
	m := NewMetrics("smol", 2)
	m.OnIteration(executor.FleetStats{Forward: true, BusyMS: []float64{1, 2}, TokensPerRank: []int64{2, 1}, TokenBalance: 0.75,
		Ranks: make([]executor.RankLoad, 2)})
	m.OnResponse(response(1, 2, 3, 2), 4, "stop")
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ours []*dto.MetricFamily
	for _, mf := range mfs {
		name := mf.GetName()
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		if !strings.HasPrefix(name, "lockstep_") {
			t.Errorf("metric %s: not lockstep_*", name)
		}
		if mf.GetHelp() == "" {
			t.Errorf("metric %s: no help", name)
		}
		for _, s := range mf.GetMetric() {
			found := false
			for _, l := range s.GetLabel() {
				found = found || l.GetName() == "model" && l.GetValue() == "smol"
			}
			if !found {
				t.Errorf("metric %s: a sample without model=\"smol\"", name)
			}
		}
		ours = append(ours, mf)
	}
	if len(ours) != 28 {
		t.Errorf("%d lockstep families, want 28", len(ours))
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	// The Go and process collectors are there.
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, n := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if !have[n] && (n != "process_cpu_seconds_total" || runtime.GOOS == "linux") {
			t.Errorf("no %s", n)
		}
	}
}

// TestMetricsOnIterationAllocs: OnIteration allocates nothing once the
// ranks' series exist.
func TestMetricsOnIterationAllocs(t *testing.T) {
	m := NewMetrics("smol", 4)
	s := executor.FleetStats{Forward: true, BusyMS: []float64{1, 2, 3, 4}, LockstepWaste: 0.375, IterationMS: 5,
		Ranks: make([]executor.RankLoad, 4)}
	for i := range s.Ranks {
		s.Ranks[i] = executor.RankLoad{Running: 2, Waiting: 1, UsedPages: 10, Pages: 100}
	}
	if n := testing.AllocsPerRun(1000, func() {
		s.Ranks[0].Suspended++
		s.CostPublications++
		m.OnIteration(s)
	}); n != 0 {
		t.Errorf("OnIteration: %v allocations per call", n)
	}
}

// TestMetricsConcurrent exercises every method from several goroutines
// while scraping (run with -race).
func TestMetricsConcurrent(t *testing.T) {
	m := NewMetrics("smol", 2)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	var wg sync.WaitGroup
	const n = 200
	wg.Go(func() { // the executor's rank-0 goroutine
		for i := range n {
			m.OnIteration(executor.FleetStats{Iter: int64(i), Forward: i%2 == 0, BusyMS: []float64{1, 2},
				Ranks: []executor.RankLoad{{Running: 1, Suspended: int64(i)}, {Running: 2, Recompute: int64(i)}}, IterationMS: 1})
			m.OnResponse(response(1, 2, 3, 2), 10, "stop")
		}
	})
	for g := range 3 { // HTTP handlers
		wg.Go(func() {
			for i := range n {
				m.RequestReceived("chat")
				if i%10 == 0 {
					m.RequestRejected("chat", 429)
				}
				m.SetReady(g%2 == 0)
			}
		})
	}
	wg.Go(func() { // a second (misbehaving) iteration reporter
		for i := range n / 4 {
			m.OnIteration(executor.FleetStats{Ranks: make([]executor.RankLoad, 3+i%2)})
		}
	})
	wg.Go(func() {
		for range 5 {
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		}
	})
	wg.Wait()
	mfs := scrape(t, m)
	check(t, "received", value(t, mfs, "lockstep_requests_received_total", "endpoint", "chat"), 3*n)
	check(t, "finished", value(t, mfs, "lockstep_requests_finished_total", "finish_reason", "stop"), n)
	if c, _ := histogram(t, mfs, "lockstep_time_to_first_token_seconds"); c != n {
		t.Errorf("TTFT count %d, want %d", c, n)
	}
}
