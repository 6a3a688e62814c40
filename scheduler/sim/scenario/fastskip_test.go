package scenario

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/sim"
)

// slowPool is the dry run's pool with the KV side of the scheduler's O(1)
// skips turned off (FirstChunkBlocked and NoFirstChunkFits never promise a
// failure): every first chunk is admitted, matched, refused and released as
// before issue 24.
type slowPool struct{ *dryRunPool }

func (slowPool) FirstChunkBlocked(*scheduler.Request, func(*scheduler.Request, int) int) bool {
	return false
}
func (slowPool) NoFirstChunkFits() bool { return false }

// runRecords dry-runs sc to the end (or limit iterations) and returns its
// records, one JSON line each, with the pool's summary after each one.
func runRecords(t *testing.T, sc *Scenario, slow bool, limit int) string {
	t.Helper()
	pool, err := kvpool.New(sc.pool)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var p sim.Pool = &dryRunPool{Manager: pool, policy: sc.cfg.Policy}
	if slow {
		p = slowPool{p.(*dryRunPool)}
	}
	s, err := scheduler.New(sc.cfg, p)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := sim.New(s, p, sc.specs)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	for i := 0; i < limit && !sm.Done(); i++ {
		rec, o, err := sm.Step()
		if err != nil {
			out.WriteString("error: " + err.Error() + "\n")
			break
		}
		pool.TakeCopies()
		_ = enc.Encode(rec)
		_ = enc.Encode(struct {
			Deferred []uint64
			Pool     string
		}{o.Deferred, pool.String()})
	}
	return out.String()
}

// The scheduler's O(1) skips of a pass (issue 24: a blocked first chunk,
// the walk's stop once no page is left) change no plan: random deep-queue
// scenarios on small pools (MAX_UTILIZATION, chunked, recompute pause on
// and off, prefix-aware or not, equal-cost chunking sometimes) give the
// same records, deferrals and pool states with the KV side of the skips
// turned off.
func TestFastSkipChangesNoPlan(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 1))
	skipped := 0
	for trial := 0; trial < 60; trial++ {
		page := 1 + rng.IntN(8)
		cfg := map[string]any{
			"max_num_tokens": 16 + rng.IntN(200),
			"max_batch_size": 2 + rng.IntN(16),
			"chunking":       map[string]any{"enabled": true, "unit": 1 + rng.IntN(16)},
			"kv":             map[string]any{"pages": 4 + rng.IntN(40), "tokens_per_page": page},
		}
		if rng.IntN(4) == 0 {
			cfg["equal_cost"] = map[string]any{"kv_cost_offset": 1 + rng.IntN(500), "kv_depth_threshold": 1 + rng.IntN(500)}
		}
		var reqs []map[string]any
		for id := range 10 + rng.IntN(40) {
			reqs = append(reqs, map[string]any{"id": id, "arrive": rng.IntN(6), "prompt_len": 1 + rng.IntN(60),
				"max_new_tokens": 1 + rng.IntN(24)})
		}
		raw, _ := json.Marshal(map[string]any{"config": cfg, "requests": reqs})
		sc, err := Parse(raw)
		if err != nil {
			t.Fatalf("trial %d: %v\n%s", trial, err, raw)
		}
		sc.cfg.RecomputePause = rng.IntN(4) != 0
		sc.cfg.PrefixAware = rng.IntN(2) == 0
		sc.pool.EnableBlockReuse = rng.IntN(2) == 0
		fast := runRecords(t, sc, false, 400)
		slow := runRecords(t, sc, true, 400)
		if fast != slow {
			t.Fatalf("trial %d: the O(1) skips changed the plan\n%s\nfast:\n%s\nslow:\n%s", trial, raw, fast, slow)
		}
		skipped += countSkips(t, sc)
	}
	if skipped == 0 {
		t.Fatal("no trial reached an O(1) skip: the test compares nothing")
	}
}

// countSkips counts the first chunks the real pool promised to fail in a run
// of sc (FirstChunkBlocked or NoFirstChunkFits true).
func countSkips(t *testing.T, sc *Scenario) int {
	t.Helper()
	pool, err := kvpool.New(sc.pool)
	if err != nil {
		t.Fatal(err)
	}
	cp := &countingPool{dryRunPool: &dryRunPool{Manager: pool, policy: sc.cfg.Policy}}
	s, err := scheduler.New(sc.cfg, cp)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := sim.New(s, cp, sc.specs)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 400 && !sm.Done(); i++ {
		if _, _, err := sm.Step(); err != nil {
			break
		}
		pool.TakeCopies()
	}
	return cp.n
}

// countingPool counts the promises of the real pool.
type countingPool struct {
	*dryRunPool
	n int
}

func (p *countingPool) FirstChunkBlocked(r *scheduler.Request, f func(*scheduler.Request, int) int) bool {
	ok := p.dryRunPool.FirstChunkBlocked(r, f)
	if ok {
		p.n++
	}
	return ok
}

func (p *countingPool) NoFirstChunkFits() bool {
	ok := p.dryRunPool.NoFirstChunkFits()
	if ok {
		p.n++
	}
	return ok
}

// TestExhaustedWalkDoesNotListDeferrals pins the deliberate difference of
// the walk's stop (scheduler.firstChunksExhausted): once no first chunk can
// get a page, the first chunks left are skipped unprobed, so one whose first
// new block an earlier first chunk of the pass registered is not listed in
// Deferred, where the full walk defers it (spec §8). The plan is the same.
func TestExhaustedWalkDoesNotListDeferrals(t *testing.T) {
	shared := make([]int32, 20)
	for i := range shared {
		shared[i] = int32(100 + i)
	}
	pass := func(slow bool) *scheduler.Output {
		pool, err := kvpool.New(kvpool.Config{NumPages: 4, TokensPerPage: 4, EnableBlockReuse: true})
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var kv scheduler.KVManager = &dryRunPool{Manager: pool, policy: scheduler.MaxUtilization}
		if slow {
			kv = slowPool{kv.(*dryRunPool)}
		}
		s, err := scheduler.New(scheduler.Config{MaxBatchSize: 8, MaxNumTokens: 64, ChunkedContext: true, ChunkUnitSize: 4,
			Policy: scheduler.MaxUtilization, PrefixAware: true, LedgerBlockTokens: 4}, kv)
		if err != nil {
			t.Fatal(err)
		}
		// Request 1's first chunk takes the whole pool (16 tokens, 4 pages)
		// and registers the key of its first block; request 2 starts with
		// the same 16 tokens.
		a := &scheduler.Request{ID: 1, State: scheduler.ContextInit, Tokens: shared[:16], PromptLen: 16, MaxNewTokens: 4,
			BatchIndex: scheduler.NoBatchIndex, UncachedEstimate: scheduler.UnsetEstimate}
		b := &scheduler.Request{ID: 2, State: scheduler.ContextInit, Tokens: shared, PromptLen: 20, MaxNewTokens: 4,
			BatchIndex: scheduler.NoBatchIndex, UncachedEstimate: scheduler.UnsetEstimate}
		out, err := s.Schedule([]*scheduler.Request{a, b}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	slow := pass(true)
	slowCtx, slowDeferred := ids(slow.Context), append([]uint64(nil), slow.Deferred...)
	fast := pass(false)
	if got := ids(fast.Context); !equalIDs(got, slowCtx) || !equalIDs(got, []uint64{1}) {
		t.Fatalf("context chunks: walk with the stop %v, full walk %v; want [1] in both", got, slowCtx)
	}
	if !equalIDs(slowDeferred, []uint64{2}) {
		t.Fatalf("the full walk deferred %v, want [2] (spec §8)", slowDeferred)
	}
	if len(fast.Deferred) != 0 {
		t.Fatalf("the walk with the stop listed %v as deferred; it stops before reading request 2", fast.Deferred)
	}
}

func ids(rs []*scheduler.Request) []uint64 {
	var out []uint64
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func equalIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
