package serve

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
)

// The vLLM-named families scrape with expfmt under vLLM's names and labels
// (model_name, engine = the rank), with the values of the requests and
// iterations that fed them; without the option there are none.
func TestVLLMMetricsScrape(t *testing.T) {
	for _, name := range familyNames(scrape(t, NewMetrics("smol", 2))) {
		require.False(t, strings.HasPrefix(name, "vllm:"), "%s without --metrics-compat vllm", name)
	}
	m := NewMetricsWith("smol", 2, MetricsOptions{VLLM: true, MaxModelLen: 1000})
	m.OnIteration(executor.FleetStats{Forward: true, BusyMS: []float64{1, 2}, Ranks: []executor.RankLoad{
		{Running: 3, Waiting: 1, UsedPages: 5, Pages: 10},
		{Running: 1, Waiting: 4, UsedPages: 2, Pages: 8, Suspended: 1, Recompute: 2}}})
	r := response(1, 2, 3, 4) // scheduled, first token, finish (s), 4 tokens
	r.Rank, r.ReusedTokens = 1, 6
	m.OnResponseGaps(r, 10, "stop", []float64{0.02, 0.03, 0.5})
	m.OnResponse(executor.Response{ID: 9, Rank: 0, Error: "cancelled", ArrivalUnixNS: 1}, 7, "cancelled")
	mfs := scrape(t, m)

	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
		"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
		"vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds",
		"vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds", "vllm:request_prompt_tokens",
		"vllm:request_generation_tokens"} {
		require.Contains(t, mfs, name)
		for _, s := range mfs[name].GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			require.Equal(t, "smol", labels["model_name"], name)
			require.Contains(t, []string{"0", "1"}, labels["engine"], name)
		}
	}
	e1 := []string{"model_name", "smol", "engine", "1"}
	check(t, "running", value(t, mfs, "vllm:num_requests_running", e1...), 1)
	check(t, "waiting", value(t, mfs, "vllm:num_requests_waiting", e1...), 4)
	check(t, "kv usage", value(t, mfs, "vllm:kv_cache_usage_perc", e1...), 0.25)
	check(t, "kv usage 0", value(t, mfs, "vllm:kv_cache_usage_perc", "engine", "0"), 0.5)
	check(t, "preemptions", value(t, mfs, "vllm:num_preemptions_total", e1...), 3)
	check(t, "queries", value(t, mfs, "vllm:prefix_cache_queries_total", e1...), 10)
	check(t, "hits", value(t, mfs, "vllm:prefix_cache_hits_total", e1...), 6)
	check(t, "prompt", value(t, mfs, "vllm:prompt_tokens_total", e1...), 10)
	check(t, "generation", value(t, mfs, "vllm:generation_tokens_total", e1...), 4)
	check(t, "success stop", value(t, mfs, "vllm:request_success_total", "engine", "1", "finished_reason", "stop"), 1)
	check(t, "abort", value(t, mfs, "vllm:request_success_total", "engine", "0", "finished_reason", "abort"), 1)
	n, sum := histogram(t, mfs, "vllm:inter_token_latency_seconds", e1...)
	require.Equal(t, uint64(3), n)
	check(t, "itl sum", sum, 0.55)
	n, _ = histogram(t, mfs, "vllm:e2e_request_latency_seconds", e1...)
	require.Equal(t, uint64(1), n)
	n, _ = histogram(t, mfs, "vllm:request_prompt_tokens", "engine", "0")
	require.Zero(t, n, "a request cancelled before its first chunk prefilled nothing")
	h := sample(t, mfs, "vllm:time_to_first_token_seconds", e1...).GetHistogram()
	require.Len(t, h.GetBucket(), len(vllmTTFTBuckets)+1, "vLLM's buckets and +Inf")
	require.Equal(t, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}, buckets125(1000))
}

func familyNames(mfs map[string]*dto.MetricFamily) []string {
	var out []string
	for n := range mfs {
		out = append(out, n)
	}
	return out
}
