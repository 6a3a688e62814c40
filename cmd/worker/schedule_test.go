package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/scheduler/sim/scenario"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/scheduler/sim"
)

// Equal-cost configurations of scheduler.md §9.6, as scenario config blocks.
const (
	cfgA = `{"max_num_tokens": 8192, "chunking": {"enabled": true, "unit": 64},
	         "equal_cost": {"kv_cost_offset": 35000, "kv_depth_threshold": 250000}}`
	cfgB = `{"max_num_tokens": 1024, "chunking": {"enabled": true, "unit": 64},
	         "equal_cost": {"kv_cost_offset": 1000, "kv_depth_threshold": 1000}}`
	cfgC = `{"max_num_tokens": 8192, "chunking": {"enabled": true, "unit": 64},
	         "equal_cost": {"kv_cost_offset": 35000, "kv_depth_threshold": 250000, "per_chunk_depth_tokens": 3000}}`
	cfgTokensOnly = `{"max_num_tokens": 8192, "chunking": {"enabled": true, "unit": 64}}`
)

// req is a scenario request at depth p (tokens already in KV) with rem left.
func req(id, p, rem int) string {
	return fmt.Sprintf(`{"id": %d, "prompt_len": %d, "position": %d, "max_new_tokens": 1}`, id, p+rem, p)
}

// dryRunScenario writes the scenario to a file, runs `worker schedule` on it
// and decodes the output lines.
func dryRunScenario(t *testing.T, cfg string, iterations int, reqs ...string) []sim.Record {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scenario.json")
	text := fmt.Sprintf(`{"config": %s, "requests": [%s], "iterations": %d}`, cfg, strings.Join(reqs, ","), iterations)
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	var stdout, stderr bytes.Buffer
	require.NoError(t, runSchedule([]string{"--scenario", path}, &stdout, &stderr), stderr.String())
	var recs []sim.Record
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var r sim.Record
		require.NoError(t, dec.Decode(&r))
		recs = append(recs, r)
	}
	return recs
}

// first returns the context chunks of the first iteration as id:chunk pairs.
func chunksOf(rec sim.Record) []string {
	out := []string{}
	for _, c := range rec.Context {
		out = append(out, fmt.Sprintf("%d:%d", c.ID, c.Chunk))
	}
	return out
}

// TestScheduleWorkedExamples reproduces scheduler.md §9.6 W1–W13 through the
// dry-run tool (a real kvpool, the sim's apply rules).
func TestScheduleWorkedExamples(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    string
		reqs   []string
		chunks []string
		cost   int64
	}{
		{"W1", cfgA, []string{req(1, 0, 100000)}, []string{"1:8192"}, 286720000},
		{"W2", cfgA, []string{req(1, 250000, 100000)}, []string{"1:8192"}, 2334720000},
		{"W3", cfgA, []string{req(1, 900000, 96608)}, []string{"1:2496"}, 2333760000},
		{"W4", cfgA, []string{req(1, 900000, 96608), req(2, 0, 100000)}, []string{"1:2496"}, 2333760000},
		{"W5", cfgA, []string{req(1, 900000, 96608), req(2, 0, 20)}, []string{"1:2496", "2:20"}, 2334460000},
		{"W6", cfgA, []string{req(1, 500000, 200000), req(2, 0, 3000)}, []string{"1:4352", "2:128"}, 2328320000 + 35000*128},
		{"W7/300k", cfgA, []string{req(1, 300000, 100000)}, []string{"1:6912"}, 335000 * 6912},
		{"W7/500k", cfgA, []string{req(1, 500000, 100000)}, []string{"1:4352"}, 535000 * 4352},
		{"W7/750k", cfgA, []string{req(1, 750000, 100000)}, []string{"1:2944"}, 785000 * 2944},
		{"W7/990k", cfgA, []string{req(1, 990000, 100000)}, []string{"1:2240"}, 1025000 * 2240},
		{"W7/1200k", cfgA, []string{req(1, 1200000, 100000)}, []string{"1:2048"}, 1235000 * 2048},
		{"W9", cfgB, []string{req(1, 40000, 5000), req(2, 0, 500)}, []string{"1:256"}, 10496000},
		{"W10", cfgB, []string{req(1, 0, 300), req(2, 40000, 5000)}, []string{"1:300"}, 300000},
		{"W11", cfgC, []string{req(1, 250000, 100000)}, []string{"1:8192"}, 3084720000},
		{"W12", cfgC, []string{req(1, 900000, 96608)}, []string{"1:2048"}, 4614880000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := dryRunScenario(t, tc.cfg, 1, tc.reqs...)
			require.Len(t, recs, 1)
			require.Equal(t, tc.chunks, chunksOf(recs[0]))
			require.Equal(t, tc.cost, recs[0].CostUsed)
		})
	}

	// W8 and W13: one 996 608-token prompt from p = 0, alone; run until done
	// (iterations 0). max_new_tokens 1 finishes with the last chunk.
	for _, tc := range []struct {
		name   string
		cfg    string
		passes int
	}{{"W8", cfgA, 243}, {"W8/token budget only", cfgTokensOnly, 122}, {"W13", cfgC, 320}} {
		t.Run(tc.name, func(t *testing.T) {
			recs := dryRunScenario(t, tc.cfg, 0, req(1, 0, 996608))
			require.Len(t, recs, tc.passes)
			total := 0
			for _, r := range recs {
				require.Len(t, r.Context, 1)
				require.Equal(t, total, r.Context[0].Position)
				total += r.Context[0].Chunk
			}
			require.Equal(t, 996608, total)
		})
	}
}

// TestScheduleScenarioErrors: errors name the request id and field, or the config key.
func TestScheduleScenarioErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{`{"requests": [{"id": 7, "prompt_len": "x", "max_new_tokens": 1}]}`, "request 7: prompt_len"},
		{`{"requests": [{"id": 7, "prompt_len": 10, "max_new_tokens": 1, "colour": 1}]}`, "request 7: colour"},
		{`{"requests": [{"id": 7, "prompt_len": 10, "max_new_tokens": 0}]}`, "request 7: max_new_tokens"},
		{`{"requests": [{"id": 7, "prompt_len": 10, "position": 11, "max_new_tokens": 2}]}`, "request 7: position"},
		{`{"requests": [{"id": 7, "prompt_len": 10, "max_new_tokens": 2, "uncached_estimate": -3}]}`, "request 7: uncached_estimate"},
		{`{"requests": [{"prompt_len": 10, "max_new_tokens": 2}]}`, "requests[0]: id"},
		{`{"requests": [{"id": 1, "prompt_len": 10, "max_new_tokens": 2}, {"id": 1, "prompt_len": 10, "max_new_tokens": 2}]}`, "request 1: id: duplicate"},
		{`{"config": {"policy": "static_batch"}, "requests": []}`, "config: policy"},
		{`{"config": {"max_num_tokens": -1}, "requests": []}`, "config: max_num_tokens"},
		{`{"config": {"chunking": {"enabled": true, "unit": -2}}, "requests": []}`, "config.chunking.unit = -2, want ≥ 1"},
		{`{"config": {"equal_cost": {"kv_cost_offset": -1}}, "requests": []}`, "config.equal_cost.kv_cost_offset = -1, want ≥ 0"},
		{`{"config": {"demotion": {"uncached_tokens": -1}}, "requests": []}`, "config.demotion.uncached_tokens = -1, want ≥ 0"},
		{`{"config": {"demotion": {"max_iters": -2}}, "requests": []}`, "config.demotion.max_iters = -2, want ≥ 0"},
		{`{"config": {"equal_cost": {"kv_cost_offset": 1, "kv_depth_threshold": 4611686018427387904}, "chunking": {"enabled": true}}, "requests": []}`,
			"D=4611686018427387904 from config.equal_cost.kv_depth_threshold"},
		{`{"config": {"kv": {"host_pages": -1}}, "requests": []}`, "kv.host_pages: -1, want ≥ 0"},
		{`{"config": {"max_num_tokens": 100}, "requests": [{"id": 3, "prompt_len": 200, "max_new_tokens": 1}]}`, "request 3: prompt_len"},
		{`{"config": {"policy": "GUARANTEED_NO_EVICT", "kv": {"pages": 9, "tokens_per_page": 4}}, "requests": [{"id": 4, "prompt_len": 30, "max_new_tokens": 20}]}`, "request 4: max_new_tokens: needs 13 pages"},
		{`{"iterations": -1}`, "iterations"},
		// Impossible scenarios are refused up front (defect 7).
		{`{"iterations": 1000000000}`, "iterations: 1000000000 is beyond the dry run's limit of 1000000 iterations"},
		{`{"config": {"max_batch_size": 0}, "requests": [{"id": 1, "prompt_len": 10, "max_new_tokens": 1}]}`,
			"config.max_batch_size = 0 leaves no request slot per iteration"},
		{`{"config": {"max_num_tokens": 0}, "requests": [{"id": 1, "prompt_len": 10, "max_new_tokens": 1}]}`,
			"config.max_num_tokens = 0 schedules nothing"},
		{`{"config": {"max_num_tokens": 4, "chunking": {"enabled": true}}, "requests": [{"id": 1, "prompt_len": 10, "max_new_tokens": 1}]}`,
			"chunk unit config.kv.tokens_per_page (the chunk unit while config.chunking.unit is 0) = 64 is larger than the token budget config.max_num_tokens = 4"},
		{`{"config": {"max_num_tokens": 100, "chunking": {"enabled": true, "unit": 128}}, "requests": [{"id": 1, "prompt_len": 10, "max_new_tokens": 1}]}`,
			"chunk unit config.chunking.unit = 128 is larger than the token budget config.max_num_tokens = 100"},
		{`{"requests": [{"id": 1, "arrive": 2000000, "prompt_len": 10, "max_new_tokens": 1}]}`,
			"request 1: arrive: 2000000 is beyond the dry run's limit of 1000000 iterations"},
		{`{"requests": [{"id": 1, "prompt_len": 10, "max_new_tokens": 5000000}]}`,
			"request 1: max_new_tokens: 5000000 tokens need at least 5000000 iterations, beyond the dry run's limit of 1000000"},
		{`{"config": {"max_num_tokens": 64, "chunking": {"enabled": true}}, "requests": [{"id": 5, "arrive": 10, "prompt_len": 640, "max_new_tokens": 999990}]}`,
			"request 5: max_new_tokens: 999990 tokens need at least 1000009 iterations"},
		{`{"config": {"chunking": {"enabled": true}, "max_num_tokens": null}, "requests": [{"id": 1, "prompt_len": 9000000000000000000, "max_new_tokens": 9000000000000000000}], "iterations": 1}`,
			"config: kv.pages: omitted, and a pool holding every request to completion at once needs more than 2147483647 pages"},
		{`{"config": {"kv": {"pages": 2147483648}}}`, "config: kv.pages: 2147483648, want at most 2147483647"},
		{`{"config": {"kv": {"host_pages": 2147483648}}}`, "config: kv.host_pages: 2147483648, want at most 2147483647"},
		// Type errors are JSON terms, never Go types.
		{`{"config": {"chunking": 5}}`, "config: chunking: got a JSON number, want an object"},
		{`{"config": {"max_batch_size": "x"}}`, "config: max_batch_size: got a JSON string, want an integer"},
		{`{"config": {"kv": {"pages": 1.5}}}`, "config: kv.pages: got a JSON number 1.5, want an integer"},
		{`{"requests": [{"id": 1, "prompt_len": 1.5, "max_new_tokens": 1}]}`, "request 1: prompt_len: got a JSON number 1.5, want an integer"},
		{`{"requests": [{"id": 1, "prompt_len": 5, "max_new_tokens": 1, "in_flight": 1}]}`, "request 1: in_flight: got a JSON number, want true or false"},
		{`{"requests": {"id": 1}}`, "requests: got a JSON object, want an array"},
		{`{"requests": [7]}`, "requests[0]: got a JSON number, want an object"},
		{`[1]`, "the scenario: got a JSON array, want an object"},
		{`{"iterations": 2} {}`, "trailing data after the JSON value"},
		{`{"iterations": `, "the scenario: unexpected end of JSON input"},
		{``, "the scenario: no JSON value (the file is empty); want an object"},
		{`{"iterations": 1,}`, "the scenario: invalid JSON at byte 18: invalid character '}'"},
	} {
		path := filepath.Join(t.TempDir(), "bad.json")
		require.NoError(t, os.WriteFile(path, []byte(tc.text), 0o644))
		var stdout, stderr bytes.Buffer
		err := runSchedule([]string{"--scenario", path}, &stdout, &stderr)
		require.ErrorContains(t, err, tc.want, tc.text)
		requireUserFacing(t, err.Error())
		require.Empty(t, stdout.String(), "refused before the first iteration: %s", tc.text)
	}
	var stdout, stderr bytes.Buffer
	require.Error(t, runSchedule(nil, &stdout, &stderr), "--scenario is required")
}

// TestScheduleDryRunStory runs a small capacity story end to end: a full
// pool under MAX_UTILIZATION pauses, GUARANTEED_NO_EVICT never does, and
// both finish every request (spec §18.16 arrivals, 9 pages of 4 tokens).
func TestScheduleDryRunStory(t *testing.T) {
	reqs := []string{
		`{"id": 1, "prompt_len": 12, "max_new_tokens": 8}`,
		`{"id": 2, "prompt_len": 12, "max_new_tokens": 8}`,
		`{"id": 3, "prompt_len": 4, "max_new_tokens": 4}`,
	}
	for _, policy := range []string{"max_utilization", "guaranteed_no_evict"} {
		recs := dryRunScenario(t, `{"policy": "`+policy+`", "kv": {"pages": 9, "tokens_per_page": 4}}`, 0, reqs...)
		paused := 0
		generated := map[uint64]int{}
		for _, r := range recs {
			paused += len(r.Suspended) + len(r.RecomputePaused)
			for _, id := range r.Generation {
				generated[id]++
			}
		}
		if policy == "guaranteed_no_evict" {
			require.Zero(t, paused)
			require.Len(t, recs, 16, "A alone for 8 iterations, then B and C together for 8")
			require.Equal(t, map[uint64]int{1: 7, 2: 7, 3: 3}, generated)
		} else {
			require.NotZero(t, paused)
		}
	}
}

// TestScheduleHostTier: with a host tier, a pool that cannot hold both
// requests suspends the newer one (rung 1) instead of recompute-pausing it;
// both finish, and the suspended request never loses its KV.
func TestScheduleHostTier(t *testing.T) {
	cfg := `{"max_num_tokens": 64, "max_batch_size": 8, "chunking": {"enabled": true, "unit": 4},
		"kv": {"pages": 10, "tokens_per_page": 4, "host_pages": 16}}`
	two := []string{`{"id": 1, "prompt_len": 12, "max_new_tokens": 12}`, `{"id": 2, "prompt_len": 12, "max_new_tokens": 12}`}
	recs := dryRunScenario(t, cfg, 0, two...)
	suspended, gen := 0, map[uint64]int{}
	for _, r := range recs {
		require.Empty(t, r.RecomputePaused, "iteration %d: the host tier is the valve, not recompute", r.Iteration)
		suspended += len(r.Suspended)
		for _, id := range r.Generation {
			gen[id]++
		}
	}
	require.Positive(t, suspended)
	require.Equal(t, 11, gen[1], "request 1: 12 tokens, the first from its context chunk")
	require.Equal(t, 11, gen[2], "request 2 resumes and finishes")
	// Without the host tier the same pool recompute-pauses instead.
	recs = dryRunScenario(t, strings.Replace(cfg, `"host_pages": 16`, `"host_pages": 0`, 1), 0, two...)
	recomputed := 0
	for _, r := range recs {
		recomputed += len(r.RecomputePaused)
	}
	require.Positive(t, recomputed)
}

// TestScheduleLimitReachedIsAnError (defect 7): a run until done that hits
// the iteration limit with requests unfinished exits non-zero naming them,
// after printing the iterations it ran.
func TestScheduleLimitReachedIsAnError(t *testing.T) {
	defer func(n int) { scenario.MaxIterations = n }(scenario.MaxIterations)
	scenario.MaxIterations = 50
	// Each request alone finishes in 40 iterations, but one at a time they
	// need 80.
	path := filepath.Join(t.TempDir(), "s.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"config": {"max_batch_size": 1}, "requests": [
		{"id": 1, "prompt_len": 8, "max_new_tokens": 40}, {"id": 2, "prompt_len": 8, "max_new_tokens": 40},
		{"id": 3, "arrive": 49, "prompt_len": 8, "max_new_tokens": 1}]}`), 0o644))
	var stdout, stderr bytes.Buffer
	err := runSchedule([]string{"--scenario", path}, &stdout, &stderr)
	require.ErrorContains(t, err, "reached the dry run's limit of 50 iterations with 2 requests unfinished: 2, 3")
	require.Equal(t, 50, strings.Count(stdout.String(), "\n"), "the iterations that ran are printed")
	require.Equal(t, 1, run([]string{"schedule", "--scenario", path}, &stdout, &stderr), "exit status 1")

	// With an explicit iteration count, stopping early is what was asked.
	require.NoError(t, os.WriteFile(path, []byte(`{"config": {"max_batch_size": 1}, "requests": [
		{"id": 1, "prompt_len": 8, "max_new_tokens": 40}], "iterations": 3}`), 0o644))
	require.NoError(t, runSchedule([]string{"--scenario", path}, &stdout, &stderr))
}
