package main

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/nccl"
)

// checkUserFacing fails the fuzz input when an error is not a message for
// a user: empty, or showing Go internals (a type, a struct dump).
func checkUserFacing(t *testing.T, what string, err error) {
	t.Helper()
	msg := err.Error()
	if strings.TrimSpace(msg) == "" {
		t.Fatalf("%s: empty error", what)
	}
	for _, g := range goIsms {
		if strings.Contains(msg, g) {
			t.Fatalf("%s: error shows a Go internal %q: %s", what, g, msg)
		}
	}
}

// FuzzConfigYAML loads and validates arbitrary bytes as a --config file the
// way `worker run` does before any work: parse, apply under no flags,
// validate, build the scheduler configuration, run the startup checks.
// Nothing may panic; every error is a user-facing message, and the
// parser's errors name the file (and a line where there is one).
func FuzzConfigYAML(f *testing.F) {
	for _, s := range []string{
		"", "engine: fake\nranks: 2\n", "kv:\n  pages: 1.5\n", "ranks: 2.7\n", "engine: fake\n---\nbogus: 1\nranks: -7\n",
		"scheduler:\n  max_num_tokens: 4\n", "scheduler:\n  chunk_unit_size: 2048\n", "cp: 2\nkv:\n  enable_block_reuse: true\n",
		"scheduler:\n  equal_cost:\n    kv_offset: 1\n", "scheduler:\n  equal_cost:\n    kv_cost_offset: 35000\n    kv_depth_threshold: 250000\n",
		"scheduler:\n  demotion: {uncached_tokens: 100, max_iters: -1}\n", "kv: &a\n  pages: 8\nworkload: *a\n",
		"workload:\n  length_scale: .nan\n", "? [x]\n: 1\n", "seed: 18446744073709551616\n", "router: conversation\nranks: 1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		fc, err := parseFileConfig("c.yaml", text)
		if err != nil {
			checkUserFacing(t, "parse", err)
			if !strings.HasPrefix(err.Error(), "c.yaml:") {
				t.Fatalf("a config error must start with the file: %v", err)
			}
			return
		}
		for _, s := range fc.settings {
			if s.line < 1 || s.key == nil {
				t.Fatalf("setting without a line or key: %+v", s)
			}
		}
		o := defaultServeOptions()
		fc.apply(&o, map[string]bool{})
		if o.cp > 1 && !o.ranksSet {
			o.ranks = 1
		}
		if err := o.validate(); err != nil {
			checkUserFacing(t, "validate", err)
			return
		}
		noEnv := func(string) string { return "" }
		sc, _, err := o.schedulerConfig(noEnv)
		if err != nil {
			checkUserFacing(t, "scheduler config", err)
			return
		}
		if _, err := o.startupChecks(sc, nccl.Launch{WorldSize: 1}, noEnv); err != nil {
			checkUserFacing(t, "startup checks", err)
		}
	})
}

// FuzzScenario parses and validates arbitrary bytes as a `worker schedule`
// scenario, and dry-runs the valid ones that are small enough to run in a
// moment (at most 64 iterations). Nothing may panic; every error is a
// user-facing message; a run prints one JSON record per iteration, numbered
// from 0.
func FuzzScenario(f *testing.F) {
	for _, s := range []string{
		`{"config": {"max_num_tokens": 8192, "chunking": {"enabled": true, "unit": 64}, "equal_cost": {"kv_cost_offset": 35000, "kv_depth_threshold": 250000}},
		  "requests": [{"id": 1, "prompt_len": 996608, "position": 900000, "max_new_tokens": 2}, {"id": 2, "prompt_len": 20, "max_new_tokens": 1}], "iterations": 1}`,
		`{"config": {"policy": "guaranteed_no_evict", "kv": {"pages": 9, "tokens_per_page": 4}}, "requests": [{"id": 1, "prompt_len": 12, "max_new_tokens": 8}, {"id": 2, "prompt_len": 12, "max_new_tokens": 8}, {"id": 3, "prompt_len": 4, "max_new_tokens": 4}]}`,
		`{"config": {"max_num_tokens": 64, "max_batch_size": 8, "chunking": {"enabled": true, "unit": 4}, "kv": {"pages": 10, "tokens_per_page": 4, "host_pages": 16}}, "requests": [{"id": 1, "prompt_len": 12, "max_new_tokens": 12}, {"id": 2, "prompt_len": 12, "max_new_tokens": 12}]}`,
		`{"config": {"max_num_tokens": 100, "chunking": {"enabled": true}, "demotion": {"uncached_tokens": 50, "max_iters": 2}}, "requests": [{"id": 1, "prompt_len": 400, "max_new_tokens": 2, "uncached_estimate": 400}, {"id": 2, "arrive": 1, "prompt_len": 30, "max_new_tokens": 3, "uncached_estimate": 30, "in_flight": true}]}`,
		`{"config": {"max_batch_size": 0}, "requests": [{"id": 1, "prompt_len": 10, "max_new_tokens": 1}]}`,
		`{"requests": [{"id": 1, "arrive": 2000000, "prompt_len": 10, "max_new_tokens": 1}]}`,
		`{"iterations": 1000000000}`,
		`{"requests": [{"id": 4, "prompt_len": 10, "position": 10, "generated": 2, "max_new_tokens": 5, "conversation_id": "c"}], "config": {"max_num_tokens": null}}`,
		`{"config": {"chunking": 5}}`, `[]`, `{}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		sc, err := parseScenario(raw)
		if err != nil {
			checkUserFacing(t, "parse", err)
			return
		}
		if !smallScenario(sc) {
			return
		}
		if sc.iterations == 0 || sc.iterations > 64 {
			sc.iterations = 64
		}
		var out bytes.Buffer
		if err := dryRun(sc, &out, io.Discard); err != nil {
			checkUserFacing(t, "dry run", err)
		}
		dec := json.NewDecoder(&out)
		for i := 0; dec.More(); i++ {
			var rec struct {
				Iteration *int `json:"iteration"`
			}
			if err := dec.Decode(&rec); err != nil || rec.Iteration == nil || *rec.Iteration != i {
				t.Fatalf("record %d: %v %v", i, err, rec.Iteration)
			}
		}
	})
}

// smallScenario reports whether a parsed scenario runs in a moment: a small
// pool and few, short requests.
func smallScenario(sc *scenario) bool {
	if sc.pool.NumPages > 1<<12 || sc.pool.HostPages > 1<<12 || len(sc.specs) > 16 {
		return false
	}
	for _, sp := range sc.specs {
		if sp.PromptLen > 1<<14 || sp.MaxNewTokens > 1<<10 || sp.Arrive > 64 {
			return false
		}
	}
	return true
}
