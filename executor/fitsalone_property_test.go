package executor

// Fits-alone property (issue 9, defect 1): a request whose KV fits the pool
// alone always completes, with or without prefix reuse, with or without a
// host tier, under either capacity policy and in both loops; cached blocks
// that only the radix cache holds never block a requester, including the
// blocks the requester matched itself. Random small traces with shared
// prefixes and identical prompts run on tiny pools (1–16 pages) over 1–4
// attention-DP ranks; no run may end in the stall error, and every output
// equals a reference run (one rank, roomy pool, no reuse).

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/racetest"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// fitsCase is one random fits-alone scenario.
type fitsCase struct {
	reqs      []Arrival
	staggered bool
	ranks     int
	overlap   bool
	ppt       int
	pages     int
	host      int
	reuse     bool
	partial   bool
	policy    scheduler.ReusePolicy
	sc        scheduler.Config
}

func (c fitsCase) String() string {
	return fmt.Sprintf("reqs %d staggered %v ranks %d overlap %v P %d pages %d host %d reuse %v partial %v reuse-policy %v chunked %v M %d unit %d batch %d policy %v prefix-aware %v",
		len(c.reqs), c.staggered, c.ranks, c.overlap, c.ppt, c.pages, c.host, c.reuse, c.partial, c.policy,
		c.sc.ChunkedContext, c.sc.MaxNumTokens, c.sc.ChunkUnitSize, c.sc.MaxBatchSize, c.sc.Policy, c.sc.PrefixAware)
}

// randomFitsCase draws a pool of 1–16 pages first, then requests that each
// fit it alone (prompt + new tokens ≤ pages·P): prompts are random, share a
// common prefix, or repeat an earlier prompt exactly.
func randomFitsCase(rng *rand.Rand) fitsCase {
	c := fitsCase{ranks: 1 + rng.IntN(4), overlap: rng.IntN(2) == 0, staggered: rng.IntN(2) == 0,
		ppt: []int{4, 8, 16}[rng.IntN(3)], pages: 1 + rng.IntN(16), reuse: rng.IntN(5) != 0,
		partial: rng.IntN(4) != 0}
	if rng.IntN(3) == 0 {
		c.host = 1 + rng.IntN(2*c.pages)
	}
	c.policy = []scheduler.ReusePolicy{scheduler.AllReusable, scheduler.AllReusable, scheduler.PerRequest}[rng.IntN(3)]
	capTokens := c.pages * c.ppt
	shared := make([]int32, capTokens)
	for i := range shared {
		shared[i] = int32(rng.IntN(509))
	}
	n := 2 + rng.IntN(8)
	maxPrompt, maxTotal := 0, 0
	for i := 0; i < n; i++ {
		total := 2 + rng.IntN(capTokens-1) // prompt ≥ 1, new ≥ 1, total ≤ pages·P
		if total > capTokens {
			total = capTokens
		}
		maxNew := 1 + rng.IntN(min(total-1, 12))
		plen := total - maxNew
		var prompt []int32
		switch k := rng.IntN(3); {
		case k == 0 && i > 0: // an identical prompt
			prev := c.reqs[rng.IntN(i)]
			prompt = prev.Prompt
			if len(prompt)+maxNew > capTokens {
				maxNew = capTokens - len(prompt)
			}
		default:
			prompt = make([]int32, plen)
			for j := range prompt {
				prompt[j] = int32(rng.IntN(509))
			}
			if k == 1 { // a shared prefix
				copy(prompt, shared[:rng.IntN(plen+1)])
			}
		}
		c.reqs = append(c.reqs, Arrival{ID: uint64(i), Prompt: prompt, MaxNewTokens: maxNew})
		maxPrompt = max(maxPrompt, len(prompt))
		maxTotal = max(maxTotal, len(prompt)+maxNew)
	}
	c.sc = defaultSched()
	c.sc.MaxBatchSize = 1 + rng.IntN(8)
	c.sc.ChunkedContext = rng.IntN(3) != 0
	c.sc.ChunkUnitSize = []int{4, 8}[rng.IntN(2)]
	if c.sc.ChunkedContext {
		c.sc.MaxNumTokens = []int{8, 16, 64, scheduler.Unlimited}[rng.IntN(4)]
	} else {
		// Every prompt fits one pass; a recompute-reset prompt may not, and
		// is re-prefilled in chunks (TestRecomputeResetBeyondMaxNumTokens).
		c.sc.MaxNumTokens = max(maxPrompt, c.sc.ChunkUnitSize) + rng.IntN(maxTotal-maxPrompt+16)
	}
	c.sc.PrefixAware = rng.IntN(2) == 0
	if rng.IntN(3) == 0 {
		c.sc.Policy = scheduler.GuaranteedNoEvict
	}
	return c
}

// fitsSource spreads the arrivals over iterations when staggered.
func (c fitsCase) source(rng *rand.Rand) *scriptSource {
	return propCase{reqs: c.reqs, staggered: c.staggered}.source(rng)
}

// runFitsCase runs c and checks the property; it returns the recompute
// preemptions and prefix-reused tokens seen, so the caller can check the
// generator exercises them.
func runFitsCase(t *testing.T, seed uint64, c fitsCase, rng *rand.Rand) (recomputed, reused int) {
	t.Helper()
	name := fmt.Sprintf("seed %d: %v", seed, c)
	ref := (&rig{n: 1, src: allAtOnce(c.reqs...)}).build(t)
	ref.run()
	ref.requireNoErrors(t)
	want := ref.outputs(t)

	g := (&rig{n: c.ranks, overlap: c.overlap, ppt: c.ppt, pages: c.pages, sc: c.sc, src: c.source(rng),
		kvcfg: func(_ int, kc *kvpool.Config) {
			kc.EnableBlockReuse, kc.DisablePartialReuse, kc.ReusePolicy = c.reuse, !c.partial, c.policy
			kc.HostPages = c.host
		}}).build(t)
	g.run()
	var errs []error
	for _, rr := range g.ranks {
		errs = append(errs, rr.err)
	}
	require.NoError(t, errors.Join(errs...), name)
	got := g.outputs(t)
	require.Len(t, got, len(c.reqs), name)
	for _, a := range c.reqs {
		r := got[a.ID]
		require.Empty(t, r.Error, "%s: request %d", name, a.ID)
		require.Equal(t, want[a.ID].Output, r.Output, "%s: request %d", name, a.ID)
		recomputed += r.Recomputed
	}
	for _, rr := range g.ranks {
		require.NoError(t, rr.pool.CheckInvariants(), "%s: rank %d", name, rr.rank)
		require.Equal(t, rr.pool.TotalPages(), rr.pool.FreePages()+rr.pool.CachedPages(), "%s: rank %d leaked pages", name, rr.rank)
		reused += int(rr.pool.PrefixStats().ReusedTokens)
	}
	return recomputed, reused
}

func TestPropertyRequestThatFitsAloneCompletes(t *testing.T) {
	seeds := uint64(racetest.Size(1500, 300))
	if testing.Short() {
		seeds = 300
	}
	if v := os.Getenv("LOCKSTEP_PROPERTY_SEEDS"); v != "" { // longer soaks by hand
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "LOCKSTEP_PROPERTY_SEEDS")
		seeds = n
	}
	recomputed, reused, withHost, gne := 0, 0, 0, 0
	first := uint64(1)
	if v := os.Getenv("LOCKSTEP_PROPERTY_SEED"); v != "" { // replay one seed
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "LOCKSTEP_PROPERTY_SEED")
		first, seeds = n, n
	}
	for seed := first; seed <= seeds; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0xf175a10e))
		c := randomFitsCase(rng)
		rc, ru := runFitsCase(t, seed, c, rng)
		recomputed += rc
		reused += ru
		if c.host > 0 {
			withHost++
		}
		if c.sc.Policy == scheduler.GuaranteedNoEvict {
			gne++
		}
	}
	t.Logf("%d recompute preemptions, %d reused prompt tokens, %d runs with a host tier, %d GUARANTEED_NO_EVICT runs",
		recomputed, reused, withHost, gne)
	require.Positive(t, recomputed, "no run forced a recompute preemption")
	require.Positive(t, reused, "no run reused a cached prefix")
	require.Positive(t, withHost)
	require.Positive(t, gne)
}

// TestIdenticalPromptsOnePagePool is the reproduction at the
// executor level: two identical 11-token prompts with 3 new tokens each on a
// pool of one 16-token page. The second request matches the first one's
// cached partial block; that block is its only way to a page.
func TestIdenticalPromptsOnePagePool(t *testing.T) {
	p := arrival(0, 11, 3)
	for _, overlap := range []bool{false, true} {
		for _, host := range []int{0, 2} {
			for _, pol := range []scheduler.Policy{scheduler.MaxUtilization, scheduler.GuaranteedNoEvict} {
				sc := defaultSched()
				sc.Policy = pol
				name := fmt.Sprintf("overlap %v host %d policy %v", overlap, host, pol)
				g := (&rig{n: 1, overlap: overlap, ppt: 16, pages: 1, sc: sc,
					src:   allAtOnce(p, Arrival{ID: 1, Prompt: p.Prompt, MaxNewTokens: 3}),
					kvcfg: func(_ int, kc *kvpool.Config) { kc.EnableBlockReuse, kc.HostPages = true, host }}).build(t)
				g.run()
				for _, rr := range g.ranks {
					require.NoError(t, rr.err, name)
				}
				out := g.outputs(t)
				require.Len(t, out, 2, name)
				require.Equal(t, out[0].Output, out[1].Output, name)
				require.Len(t, out[1].Output, 3, name)
			}
		}
	}
}
