package scenario

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"github.com/lockstep-ai/lockstep/internal/usage"
)

// checkUserFacing fails the fuzz input when an error is not a message for
// a user (usage.Unreadable).
func checkUserFacing(t *testing.T, what string, err error) {
	t.Helper()
	if why := usage.Unreadable(err.Error()); why != "" {
		t.Fatalf("%s: the error %s: %s", what, why, err)
	}
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
		sc, err := Parse(raw)
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
		if err := Run(sc, &out, io.Discard); err != nil {
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
func smallScenario(sc *Scenario) bool {
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

// FuzzScenarioRun builds small valid-looking scenarios from numbers (byte
// mutations rarely keep a JSON scenario valid, so FuzzScenario seldom
// reaches a run) and dry-runs them until done, within a lowered iteration
// limit: both capacity policies, chunking, unit, budget, pool, host tier,
// equal-cost and demotion settings, arrivals, continuations and in-flight
// requests. Nothing may panic; a refusal or a failed run is a user-facing
// message; a run prints consecutive records, and no request decodes more
// tokens than it asked for.
func FuzzScenarioRun(f *testing.F) {
	f.Add(uint8(0b000001), uint16(256), uint8(16), uint8(3), uint16(0), uint8(0), uint8(8), []byte{0, 40, 8, 0, 1, 200, 4, 0})
	f.Add(uint8(0b000010), uint16(64), uint8(0), uint8(3), uint16(9), uint8(0), uint8(4), []byte{0, 12, 8, 0, 0, 12, 8, 0, 0, 4, 4, 0})
	f.Add(uint8(0b001001), uint16(64), uint8(4), uint8(3), uint16(10), uint8(16), uint8(8), []byte{0, 12, 12, 0, 0, 12, 12, 0})
	f.Add(uint8(0b110001), uint16(512), uint8(64), uint8(15), uint16(0), uint8(0), uint8(16), []byte{0, 255, 2, 128, 2, 30, 3, 0, 3, 90, 5, 255})
	defer func(n int) { MaxIterations = n }(MaxIterations)
	MaxIterations = 3000
	f.Fuzz(func(t *testing.T, flags uint8, m uint16, unit, page uint8, pages uint16, host, batch uint8, reqs []byte) {
		raw, maxNew := buildScenario(flags, m, unit, page, pages, host, batch, reqs)
		sc, err := Parse(raw)
		if err != nil {
			checkUserFacing(t, "parse", err)
			return
		}
		var out bytes.Buffer
		if err := Run(sc, &out, io.Discard); err != nil {
			checkUserFacing(t, "dry run", err)
		}
		decoded := map[uint64]int{}
		dec := json.NewDecoder(&out)
		for i := 0; dec.More(); i++ {
			var rec struct {
				Iteration  *int     `json:"iteration"`
				Generation []uint64 `json:"generation"`
			}
			if err := dec.Decode(&rec); err != nil || rec.Iteration == nil || *rec.Iteration != i {
				t.Fatalf("record %d: %v %v\n%s", i, err, rec.Iteration, raw)
			}
			for _, id := range rec.Generation {
				decoded[id]++
				if decoded[id] > maxNew[id] {
					t.Fatalf("request %d decoded %d tokens, max_new_tokens %d\n%s", id, decoded[id], maxNew[id], raw)
				}
			}
		}
	})
}

// buildScenario turns FuzzScenarioRun's numbers into a scenario file and
// the max_new_tokens of each request id. reqs holds 4 bytes per request
// (arrive and in-flight, prompt length, max_new_tokens, depth and
// estimate), at most 12 requests.
func buildScenario(flags uint8, m uint16, unit, page uint8, pages uint16, host, batch uint8, reqs []byte) ([]byte, map[uint64]int) {
	kv := map[string]any{"pages": int(pages % 512), "tokens_per_page": int(page%64) + 1, "host_pages": 0}
	cfg := map[string]any{
		"max_num_tokens": int(m),
		"max_batch_size": int(batch % 32),
		"chunking":       map[string]any{"enabled": flags&1 != 0, "unit": int(unit)},
		"kv":             kv,
	}
	if flags&2 != 0 {
		cfg["policy"] = "GUARANTEED_NO_EVICT"
	}
	if flags&4 != 0 {
		cfg["max_num_tokens"] = nil // unlimited
	}
	if flags&8 != 0 {
		kv["host_pages"] = int(host)
	}
	if flags&16 != 0 {
		cfg["equal_cost"] = map[string]any{"kv_cost_offset": 1 + int(m)*7, "kv_depth_threshold": 1 + int(host)*13,
			"per_chunk_depth_tokens": int(flags >> 6)}
	}
	if flags&32 != 0 {
		cfg["demotion"] = map[string]any{"uncached_tokens": 1 + int(unit), "max_iters": int(flags >> 6)}
	}
	var list []map[string]any
	maxNew := map[uint64]int{}
	for i := 0; i+3 < len(reqs) && i < 4*12; i += 4 {
		id, prompt, mnt := i/4, int(reqs[i+1])+1, int(reqs[i+2]%32)+1
		r := map[string]any{"id": id, "arrive": int(reqs[i] % 16), "prompt_len": prompt, "max_new_tokens": mnt,
			"uncached_estimate": int(reqs[i+3]) * 4, "in_flight": reqs[i]&0x80 != 0,
			"conversation_id": string(rune('a' + reqs[i+3]%3))}
		if p := int(reqs[i+3]) * prompt / 256; p > 0 { // a continuation at depth p
			r["position"] = p
		}
		maxNew[uint64(id)] = mnt
		list = append(list, r)
	}
	raw, _ := json.Marshal(map[string]any{"config": cfg, "requests": list})
	return raw, maxNew
}
