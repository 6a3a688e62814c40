package kvpool_test

import (
	"slices"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// Helix ledger scenarios (kvcache.md §11.6, H) and the worked examples of
// §10.9. H-6 and H-8 are in quota_test.go.

// TestLocalLen is H-1: local_len against a brute-force count.
func TestLocalLen(t *testing.T) {
	for _, cp := range []int{1, 2, 4, 8} {
		for _, P := range []int{2, 4, 32} {
			for r := range cp {
				count := 0
				for L := 0; L <= 4*cp*P+2; L++ {
					if got := kvpool.HelixLocalLen(L, r, P, cp); got != count {
						t.Fatalf("local_len(%d, %d) cp %d P %d = %d, want %d", L, r, cp, P, got, count)
					}
					if kvpool.HelixOwner(L, P, cp) == r {
						count++
					}
				}
			}
		}
	}
}

// decodeAll derives every rank's fields for (T, g).
func decodeAll(T, g, P, cp int) (seq, past []int, active []int) {
	for r := range cp {
		s, inactive := kvpool.HelixDecodeFields(T, g, r, P, cp)
		seq = append(seq, s)
		past = append(past, kvpool.HelixPastLen(s, inactive))
		if !inactive {
			active = append(active, r)
		}
	}
	return seq, past, active
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// TestDecodeFields is H-2, H-3 and worked examples 1 and 2.
func TestDecodeFields(t *testing.T) {
	for _, T := range []int{1, 5, 16, 17, 63} {
		for _, g := range []int{0, 1, 2, 7, 40} {
			pos := T + g
			seq, past, active := decodeAll(T, g, 4, 4)
			if len(active) != 1 || active[0] != kvpool.HelixOwner(pos, 4, 4) {
				t.Fatalf("T %d g %d: active %v, want [%d]", T, g, active, kvpool.HelixOwner(pos, 4, 4))
			}
			if sum(seq) != pos+1 || sum(past) != pos || slices.Min(past) < 0 {
				t.Fatalf("T %d g %d: seq %v past %v", T, g, seq, past)
			}
		}
	}
	if _, _, a := decodeAll(17, 0, 4, 4); a[0] != 0 {
		t.Error("17+0 not on rank 0")
	}
	if _, _, a := decodeAll(63, 40, 4, 4); a[0] != 1 {
		t.Error("63+40 = 103 not on rank 1")
	}
	seq, past, _ := decodeAll(17, 0, 4, 4) // example 1
	if !slices.Equal(seq, []int{6, 4, 4, 4}) || !slices.Equal(past, []int{5, 4, 4, 4}) {
		t.Errorf("example 1: seq %v past %v", seq, past)
	}
	seq, _, _ = decodeAll(1000, 17, 32, 8) // H-3, example 2
	if !slices.Equal(seq, []int{128, 128, 128, 128, 128, 128, 128, 122}) || slices.Max(seq)-slices.Min(seq) > 32 {
		t.Errorf("H-3: seq %v", seq)
	}
	// H-12, example C: T = 5, cp 4, P 4.
	var local []int
	for r := range 4 {
		local = append(local, kvpool.HelixLocalLen(5, r, 4, 4))
	}
	seq, _, _ = decodeAll(5, 0, 4, 4)
	if !slices.Equal(local, []int{4, 1, 0, 0}) || !slices.Equal(seq, []int{4, 2, 0, 0}) {
		t.Errorf("H-12: local %v seq %v", local, seq)
	}
}

// helixRanks builds one ledger per CP rank.
func helixRanks(t *testing.T, cp, P, pages int) []*kvpool.Manager {
	var ms []*kvpool.Manager
	for r := range cp {
		ms = append(ms, newCfg(t, kvpool.Config{NumPages: pages, TokensPerPage: P, CP: cp, CPRank: r}))
	}
	return ms
}

// helixPrefill prefills a T-token request on every rank and returns each
// rank's copy of the request.
func helixPrefill(t *testing.T, ms []*kvpool.Manager, id uint64, T int) []*scheduler.Request {
	var rs []*scheduler.Request
	for _, m := range ms {
		r := req(id, T, 100)
		chunk(t, m, r, T)
		r.Generated = 1
		rs = append(rs, r)
	}
	return rs
}

// TestHelixRotation is H-4 and example 3: 48 decode steps from T = 17 write
// positions 17…64 once each, the active rank rotating by page; the
// derivation reads only the manager's counter, so advancing the decoding
// iteration before or after it (non-overlap / overlap) changes nothing.
func TestHelixRotation(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		ms := helixRanks(t, 4, 4, 64)
		rs := helixPrefill(t, ms, 1, 17)
		for step := 1; step <= 48; step++ {
			pos := 17 + step - 1
			total, active := 0, -1
			for i, m := range ms {
				if !overlap {
					rs[i].Generated++
				}
				if !m.TryAllocateGeneration(rs[i]) {
					t.Fatalf("step %d rank %d: allocation failed", step, i)
				}
				if overlap {
					rs[i].Generated++
				}
				total += rs[i].SeqLenThisRankCP
				if !rs[i].InactiveRank {
					active = i
				}
				m.UpdateAfterGeneration(rs[i])
			}
			if active != kvpool.HelixOwner(pos, 4, 4) || total != pos+1 {
				t.Fatalf("overlap %v step %d: active %d total %d, want owner(%d) = %d and %d",
					overlap, step, active, total, pos, kvpool.HelixOwner(pos, 4, 4), pos+1)
			}
		}
		for _, m := range ms {
			if m.Capacity(1) != 65 || len(m.BlockTable(1)) != 5 {
				t.Fatalf("capacity %d blocks %d, want 65 and 5", m.Capacity(1), len(m.BlockTable(1)))
			}
		}
	}
}

// TestHelixRetryAndRevert is H-5, H-9 and H-10.
func TestHelixRetryAndRevert(t *testing.T) {
	m := newCfg(t, kvpool.Config{NumPages: 2, TokensPerPage: 4, CP: 4, CPRank: 1})
	r := req(1, 10, 20)
	chunk(t, m, r, 10)
	for range 5 {
		if !m.TryAllocateGeneration(r) {
			t.Fatal("setup growth failed")
		}
		m.UpdateAfterGeneration(r)
	}
	if r.HelixDecodeCount != 5 {
		t.Fatalf("g = %d, want 5", r.HelixDecodeCount)
	}
	// H-5: pos 15 → page 3 → rank 3; rank 1 inactive with seqlen 4.
	if !m.TryAllocateGeneration(r) || r.SeqLenThisRankCP != 4 || !r.InactiveRank || r.HelixDecodeCount != 6 {
		t.Fatalf("H-5: seqlen %d inactive %v g %d", r.SeqLenThisRankCP, r.InactiveRank, r.HelixDecodeCount)
	}
	capBefore := m.Capacity(1)
	m.RevertAllocateGeneration(r) // H-10
	m.RevertAllocateGeneration(r)
	if r.HelixDecodeCount != 5 || m.Capacity(1) != capBefore-1 || info(t, m, 1).GrowthRecorded {
		t.Fatalf("H-10: g %d capacity %d", r.HelixDecodeCount, m.Capacity(1))
	}
	r.SeqLenThisRankCP, r.InactiveRank = 0, false
	if !m.TryAllocateGeneration(r) || r.SeqLenThisRankCP != 4 || !r.InactiveRank {
		t.Fatal("H-5: commit-then-revert-then-retry gave different fields")
	}
	// H-9: grow until the pool is exhausted; a failure leaves g unchanged.
	for m.TryAllocateGeneration(r) {
		m.UpdateAfterGeneration(r)
	}
	g, seq, inactive := r.HelixDecodeCount, r.SeqLenThisRankCP, r.InactiveRank
	if m.TryAllocateGeneration(r) || r.HelixDecodeCount != g || r.SeqLenThisRankCP != seq || r.InactiveRank != inactive {
		t.Fatal("H-9: failed allocation changed g or the derived fields")
	}
}

// TestHelixExampleA is worked example A (cp 2, P 4, T 16) and B.
func TestHelixExampleA(t *testing.T) {
	ms := helixRanks(t, 2, 4, 16)
	rs := helixPrefill(t, ms, 1, 16)
	if rs[0].SeqLenThisRankCP != 8 || rs[1].SeqLenThisRankCP != 8 {
		t.Fatalf("after prefill: %d / %d, want 8 / 8", rs[0].SeqLenThisRankCP, rs[1].SeqLenThisRankCP)
	}
	want := map[int][2]int{0: {9, 8}, 1: {10, 8}, 3: {12, 8}, 4: {12, 9}, 5: {12, 10}, 8: {13, 12}}
	for g := 0; g <= 8; g++ {
		for i, m := range ms {
			m.TryAllocateGeneration(rs[i])
			m.UpdateAfterGeneration(rs[i])
		}
		if w, ok := want[g]; ok && (rs[0].SeqLenThisRankCP != w[0] || rs[1].SeqLenThisRankCP != w[1]) {
			t.Fatalf("g %d: seqlen %d / %d, want %v", g, rs[0].SeqLenThisRankCP, rs[1].SeqLenThisRankCP, w)
		}
		if g == 0 && len(ms[0].BlockTable(1)) != 3 {
			t.Fatal("capacity 17 did not take the third ledger block")
		}
		if g == 7 && len(ms[1].BlockTable(1)) != 3 {
			t.Fatal("a fourth block before capacity 25")
		}
		if g == 8 && len(ms[1].BlockTable(1)) != 4 {
			t.Fatal("capacity 25 did not take the fourth block")
		}
	}
	// Example B: an 18-token prompt → r0 10, r1 8; 3 ledger blocks.
	ms = helixRanks(t, 2, 4, 16)
	rs = helixPrefill(t, ms, 2, 18)
	if rs[0].SeqLenThisRankCP != 10 || rs[1].SeqLenThisRankCP != 8 || len(ms[0].BlockTable(2)) != 3 {
		t.Fatalf("example B: %d / %d, %d blocks", rs[0].SeqLenThisRankCP, rs[1].SeqLenThisRankCP, len(ms[0].BlockTable(2)))
	}
}

// TestHelixHistory is H-7.
func TestHelixHistory(t *testing.T) {
	for _, cp := range []int{1, 2} {
		m := newCfg(t, kvpool.Config{NumPages: 64, TokensPerPage: 4, CP: cp})
		r := req(1, 50, 10)
		m.PrepareContext(r)
		m.ResizeContext(r, 100)
		r.State, r.Generated = scheduler.GenerationInProgress, 5
		m.UpdateAfterGeneration(r)
		want := 54
		if cp > 1 {
			want = 0
		}
		if s := info(t, m, 1); s.Capacity != 100 || s.History != want {
			t.Errorf("cp %d: capacity %d history %d, want 100 and %d", cp, s.Capacity, s.History, want)
		}
	}
}

// TestHelixDummies is H-11.
func TestHelixDummies(t *testing.T) {
	for _, cp := range []int{2, 4, 8} {
		for _, tokenNum := range []int{2, 5, 33} {
			total := 0
			for r := range cp {
				m := newCfg(t, kvpool.Config{NumPages: 64, TokensPerPage: 4, CP: cp, CPRank: r})
				d := req(1<<62, 1, 1)
				d.IsDummy = true
				if !m.AddDummy(d, tokenNum) {
					t.Fatal("AddDummy failed")
				}
				want, inactive := tokenNum, true
				if r == cp-1 {
					want, inactive = tokenNum-1, false
				}
				if d.SeqLenThisRankCP != want || d.InactiveRank != inactive || d.TotalInputLenCP != tokenNum*cp-1 {
					t.Fatalf("cp %d token_num %d rank %d: %+v", cp, tokenNum, r, d)
				}
				if !m.TryAllocateGeneration(d) || d.HelixDecodeCount != 0 || d.SeqLenThisRankCP != want {
					t.Fatal("a dummy's g or fields moved")
				}
				total += d.SeqLenThisRankCP
			}
			if total != tokenNum*cp-1 {
				t.Fatalf("cp %d token_num %d: Σ %d", cp, tokenNum, total)
			}
		}
	}
}

// TestHelixLedgerFree is H-13.
func TestHelixLedgerFree(t *testing.T) {
	for _, m := range helixRanks(t, 2, 4, 6) {
		r := req(1, 24, 1)
		chunk(t, m, r, 24)
		free := m.FreePages()
		if len(m.BlockTable(1)) != 3 {
			t.Fatalf("%d ledger blocks, want 3", len(m.BlockTable(1)))
		}
		m.Free(r)
		if m.FreePages() != free+3 {
			t.Fatalf("free %d → %d, want +3", free, m.FreePages())
		}
		if m.AvailableTokens() != 6*8 {
			t.Fatalf("AvailableTokens %d, want 48 global tokens", m.AvailableTokens())
		}
	}
}
