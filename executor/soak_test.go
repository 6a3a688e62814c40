package executor

// Scheduler soak (issue 9): random traces, configurations and policies on
// tiny pools, driven iteration by iteration with invariant checks after
// every pass on every rank — no lost request, no leaked or double-owned
// page, every request that fits alone finishes with the reference tokens.
// CI runs a short soak; LOCKSTEP_SOAK_PASSES=1000000 runs the long one:
//
//	LOCKSTEP_SOAK_PASSES=1000000 go test ./executor -run TestSchedulerSoak -v -timeout 2h

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/kvpool"
)

// soakCase builds one random fleet: half the time a fits-alone case (prefix
// reuse, host tier, both policies, attention DP), otherwise a case of the
// trace-equality generator (which also draws aggregated Helix groups).
func soakCase(seed uint64, rng *rand.Rand) (g *rig, reqs []Arrival, name string) {
	if seed%2 == 0 {
		c := randomFitsCase(rng)
		g = &rig{n: c.ranks, overlap: c.overlap, ppt: c.ppt, pages: c.pages, sc: c.sc, src: c.source(rng),
			kvcfg: func(_ int, kc *kvpool.Config) {
				kc.EnableBlockReuse, kc.DisablePartialReuse, kc.ReusePolicy = c.reuse, !c.partial, c.policy
				kc.HostPages = c.host
			}}
		return g, c.reqs, fmt.Sprintf("seed %d (fits-alone): %v", seed, c)
	}
	c := randomCase(rng)
	g = &rig{n: c.ranks, helix: c.helix, overlap: c.overlap, ppt: c.ppt, pages: c.pages, sc: c.sc, src: c.source(rng)}
	return g, c.reqs, fmt.Sprintf("seed %d (trace-equality): %v", seed, c)
}

// checkRankAfterPass is the per-pass invariant check of one rank, run on
// the rank's own goroutine: the pool's books (no leaked or double-owned
// page, references and rows consistent) and the rank's request books (an
// id is active at most once and never both active and answered).
func checkRankAfterPass(rr *rigRank) error {
	if err := rr.pool.CheckInvariants(); err != nil {
		return fmt.Errorf("rank %d pass %d: %w", rr.rank, len(rr.plan.passes), err)
	}
	seen := make(map[uint64]bool, len(rr.ex.active))
	for _, r := range rr.ex.active {
		if seen[r.ID] {
			return fmt.Errorf("rank %d pass %d: request %d is active twice", rr.rank, len(rr.plan.passes), r.ID)
		}
		seen[r.ID] = true
	}
	return nil
}

func TestSchedulerSoak(t *testing.T) {
	target := 20000
	if v := os.Getenv("LOCKSTEP_SOAK_PASSES"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "LOCKSTEP_SOAK_PASSES")
		target = n
	}
	passes, runs, requests := 0, 0, 0
	for seed := uint64(1); passes < target; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x50a4))
		g, reqs, name := soakCase(seed, rng)
		// Reference: one rank, roomy pool, everything at once.
		ref := (&rig{n: 1, seqEngine: g.helix, src: allAtOnce(reqs...)}).build(t)
		ref.run()
		ref.requireNoErrors(t)
		want := ref.outputs(t)

		g.build(t)
		errs := make([]error, g.n)
		g.after = func(rr *rigRank) {
			if errs[rr.rank] == nil {
				errs[rr.rank] = checkRankAfterPass(rr)
			}
		}
		g.drive(0)
		for _, rr := range g.ranks {
			errs = append(errs, rr.err)
		}
		require.NoError(t, errors.Join(errs...), name)
		got := g.outputs(t)
		require.Len(t, got, len(reqs), "%s: a request was lost", name)
		for _, a := range reqs {
			require.Empty(t, got[a.ID].Error, "%s: request %d", name, a.ID)
			require.Equal(t, want[a.ID].Output, got[a.ID].Output, "%s: request %d", name, a.ID)
		}
		for _, rr := range g.ranks {
			require.NoError(t, rr.pool.CheckInvariants(), name)
			require.Equal(t, rr.pool.TotalPages(), rr.pool.FreePages()+rr.pool.CachedPages(), "%s: rank %d leaked pages", name, rr.rank)
			passes += len(rr.plan.passes)
		}
		runs++
		requests += len(reqs)
	}
	t.Logf("soak: %d scheduler passes (summed over ranks) in %d runs, %d requests, every invariant held after every pass",
		passes, runs, requests)
}
