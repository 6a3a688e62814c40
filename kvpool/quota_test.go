package kvpool_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
)

// Quota and initialisation scenarios (kvcache.md §11.4, KQ) and the Helix
// quota cases H-6 and H-8.

func TestDeviceQuota(t *testing.T) {
	for _, helix := range []bool{false, true} { // H-8: the same rules, rank-local bytes
		base := kvpool.QuotaConfig{BytesPerToken: 7, FreeGPUMemoryFraction: 0.5, TokensPerBlock: 32}
		if helix {
			base.CP = 4
		}
		q, err := kvpool.DeviceQuota(base, 1_000_000) // KQ-01
		if err != nil || q != 500_000 {
			t.Errorf("KQ-01: %d, %v", q, err)
		}
		c := base
		c.MaxGPUTotalBytes = 1 << 30 // KQ-02
		if q, _ := kvpool.DeviceQuota(c, 1_000_000); q != 1<<30 {
			t.Errorf("KQ-02: %d", q)
		}
		c = base
		c.HasMaxTokens = true // KQ-03
		if _, err := kvpool.DeviceQuota(c, 1_000_000); err == nil || !strings.Contains(err.Error(), "max_tokens must be positive") {
			t.Errorf("KQ-03: %v", err)
		}
		if _, err := kvpool.DeviceQuota(base, 0); err == nil || !strings.Contains(err.Error(), "free memory") { // KQ-04
			t.Errorf("KQ-04: %v", err)
		}
	}
	// max_tokens with and without a byte quota (§3.3 steps 1–2).
	c := kvpool.QuotaConfig{BytesPerToken: 100, MaxTokens: 970, HasMaxTokens: true}
	if q, _ := kvpool.DeviceQuota(c, 0); q != 100_000 {
		t.Errorf("max_tokens 970: quota %d, want ceil(97000/0.97) = 100000", q)
	}
	c.MaxGPUTotalBytes = 50_000
	if q, _ := kvpool.DeviceQuota(c, 0); q != 50_000 {
		t.Errorf("min with the byte quota: %d", q)
	}
}

// TestWorldSync is KQ-05.
func TestWorldSync(t *testing.T) {
	c := kvpool.QuotaConfig{BytesPerToken: 1000}
	quotas := []int64{}
	for _, tokens := range []int64{1000, 900} {
		quotas = append(quotas, c.QuotaFromTokens(tokens)*100/97+1000)
	}
	tMin := int64(1 << 62)
	for i, q := range quotas {
		t0 := kvpool.WorldSyncTokens(c, q)
		if i == 0 && t0 < 1000 || i == 1 && t0 < 900 {
			t.Fatalf("setup: rank %d has %d tokens", i, t0)
		}
		tMin = min(tMin, t0)
	}
	for i, q := range quotas {
		final := kvpool.ApplyWorldMin(c, q, tMin)
		if got := kvpool.WorldSyncTokens(c, final); got != tMin {
			t.Errorf("rank %d ends with %d tokens, want %d", i, got, tMin)
		}
	}
	if kvpool.PagesFromBytes(10_000, 3_000) != 3 {
		t.Error("PagesFromBytes")
	}
}

// TestHelixQuotaConversions is H-6 (and the quota example of §10.9).
func TestHelixQuotaConversions(t *testing.T) {
	if got := kvpool.HelixTokensFromLocal(100, 32, 4); got != 384 {
		t.Errorf("tokens %d, want 384", got)
	}
	if got := kvpool.HelixTokensFromLocal(kvpool.UnlimitedTokens, 32, 4); got != kvpool.UnlimitedTokens {
		t.Error("+inf did not pass through")
	}
	c := kvpool.QuotaConfig{BytesPerToken: 7, TokensPerBlock: 32, CP: 4}
	if got := c.QuotaFromTokens(401); got != 896 {
		t.Errorf("bytes for 401 = %d, want 896", got)
	}
	c.CP = 1
	if c.TokensFromQuota(700) != 100 || c.QuotaFromTokens(400) != 2800 {
		t.Error("cp 1 is not the identity of the plain converters")
	}
}

// voteRank is one rank of a simulated init vote.
type voteRank struct {
	fail       map[bool]kvpool.InitStatus // per withHost: the build's failure status
	err        map[bool]error
	builds     int
	destroys   int
	allreduces int
}

func (r *voteRank) build(withHost bool) (kvpool.InitStatus, error) {
	r.builds++
	if st, ok := r.fail[withHost]; ok {
		return st, r.err[withHost]
	}
	return kvpool.InitOK, nil
}

// runVote runs the vote on every rank in lockstep phases: each phase's
// allreduce sees all ranks' statuses (a two-pass simulation).
func runVote(ranks []*voteRank, hostTier bool) ([]bool, []error) {
	phase := func(p int, withHost bool) kvpool.InitStatus {
		g := kvpool.InitOK
		for _, r := range ranks {
			st, _ := (&voteRank{fail: r.fail, err: r.err}).build(withHost)
			g = kvpool.CombineInitStatus(g, st)
		}
		return g
	}
	hosts, errs := make([]bool, len(ranks)), make([]error, len(ranks))
	for i, r := range ranks {
		p := 0
		v := kvpool.InitVote{HostTier: hostTier, Build: r.build, Destroy: func() { r.destroys++ },
			AllReduceMax: func(kvpool.InitStatus) (kvpool.InitStatus, error) {
				r.allreduces++
				withHost := hostTier && p == 0
				p++
				return phase(p, withHost), nil
			}}
		hosts[i], errs[i] = v.Run()
	}
	return hosts, errs
}

// TestInitVote is KQ-06 … KQ-11.
func TestInitVote(t *testing.T) {
	fallback := errors.New("fallback init failed")
	hostFail := errors.New("pin failed")
	gpuFail := errors.New("gpu pool allocation failed")

	// KQ-07 (and KQ-06, KQ-10): rank 1's host tier fails.
	ranks := []*voteRank{{}, {fail: map[bool]kvpool.InitStatus{true: kvpool.InitUseNoHost}, err: map[bool]error{true: hostFail}}}
	hosts, errs := runVote(ranks, true)
	for i, r := range ranks {
		if errs[i] != nil || hosts[i] || r.builds != 2 || r.allreduces != 2 {
			t.Errorf("KQ-07 rank %d: host %v err %v builds %d allreduces %d", i, hosts[i], errs[i], r.builds, r.allreduces)
		}
	}
	if ranks[0].destroys != 1 || ranks[1].destroys != 0 {
		t.Errorf("KQ-07: destroys %d / %d, want 1 / 0", ranks[0].destroys, ranks[1].destroys)
	}

	// KQ-08: rank 1's fallback fails too: it raises its own error, rank 0
	// raises "failed on another rank" (KQ-09) and destroys both candidates.
	ranks = []*voteRank{{}, {fail: map[bool]kvpool.InitStatus{true: kvpool.InitUseNoHost, false: kvpool.InitAbort},
		err: map[bool]error{true: hostFail, false: fallback}}}
	_, errs = runVote(ranks, true)
	if !errors.Is(errs[1], fallback) || !errors.Is(errs[0], kvpool.ErrInitFailedElsewhere) || ranks[0].destroys != 2 {
		t.Errorf("KQ-08/09: errors %v / %v, rank 0 destroys %d", errs[0], errs[1], ranks[0].destroys)
	}

	// KQ-11: GPU-only aggregated Helix, rank 1's GPU pool fails: one
	// allreduce, ABORT everywhere.
	ranks = []*voteRank{{}, {fail: map[bool]kvpool.InitStatus{false: kvpool.InitAbort}, err: map[bool]error{false: gpuFail}}}
	_, errs = runVote(ranks, false)
	if !errors.Is(errs[0], kvpool.ErrInitFailedElsewhere) || !errors.Is(errs[1], gpuFail) ||
		ranks[0].allreduces != 1 || ranks[0].destroys != 1 {
		t.Errorf("KQ-11: %v / %v, allreduces %d destroys %d", errs[0], errs[1], ranks[0].allreduces, ranks[0].destroys)
	}

	// A world of one rank: no collective; success keeps the host tier.
	if host, err := (kvpool.InitVote{HostTier: true, Build: func(bool) (kvpool.InitStatus, error) { return kvpool.InitOK, nil }}).Run(); !host || err != nil {
		t.Errorf("single rank: %v %v", host, err)
	}
}
