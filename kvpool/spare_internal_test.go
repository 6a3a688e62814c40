package kvpool

import (
	"testing"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// TestSpareSequencesHoldNoBlocks: a closed sequence waits in m.spare for
// reuse with its arrays, and those arrays must not keep radix nodes alive:
// they did (its blocks and claim stamps), so a server kept every evicted
// block reachable from some spare sequence, with its tokens and ancestors,
// and its heap grew with the traffic. Prompts share prefixes (claims) and
// overflow the pool (evictions); some release their admission instead of
// running (ReleaseContextAdmission's path).
func TestSpareSequencesHoldNoBlocks(t *testing.T) {
	m, err := New(Config{NumPages: 24, TokensPerPage: 4, EnableBlockReuse: true, MaxSeqLen: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var open []*scheduler.Request
	for i := range 200 {
		toks := make([]int32, 6+i%21)
		for k := range toks {
			toks[k] = int32((i%7)*1000 + k + (k/8)*(i%3)) // shared heads, differing tails
		}
		r := &scheduler.Request{ID: uint64(i + 1), State: scheduler.ContextInit, PromptLen: len(toks), Tokens: toks,
			MaxNewTokens: 1, BatchIndex: scheduler.NoBatchIndex, UncachedEstimate: scheduler.UnsetEstimate}
		if !m.PrepareContext(r) {
			continue // pool full of open sequences: free them below
		}
		if i%5 == 0 {
			m.ReleaseContextAdmission(r)
			continue
		}
		if !m.ResizeContext(r, r.PromptLen-r.ContextPosition) {
			m.ReleaseContextAdmission(r)
			continue
		}
		r.ContextPosition = r.PromptLen
		m.UpdateAfterContext(r)
		r.State = scheduler.GenerationInProgress
		open = append(open, r)
		if len(open) == 3 {
			for _, o := range open {
				m.Free(o)
			}
			open = open[:0]
		}
		if err := m.CheckInvariants(); err != nil {
			t.Fatalf("request %d: %v", r.ID, err)
		}
	}
	for _, o := range open {
		m.Free(o)
	}
	if len(m.spare) == 0 {
		t.Fatal("no sequence was recycled: the test exercises nothing")
	}
	if m.stats.ReusedTokens == 0 {
		t.Fatal("no prefix was claimed: the test exercises nothing")
	}
	for i, s := range m.spare {
		for k, b := range s.blocks[:cap(s.blocks)] {
			if b.n != nil {
				t.Fatalf("spare sequence %d: blocks[%d] still points at a radix node", i, k)
			}
		}
		for k, st := range s.claimStamps[:cap(s.claimStamps)] {
			if st.n != nil {
				t.Fatalf("spare sequence %d: claimStamps[%d] still points at a radix node", i, k)
			}
		}
		for k, n := range s.inserted[:cap(s.inserted)] {
			if n != nil {
				t.Fatalf("spare sequence %d: inserted[%d] still points at a radix node", i, k)
			}
		}
	}
	for k, n := range m.fullScratch[:cap(m.fullScratch)] {
		if n != nil {
			t.Fatalf("fullScratch[%d] still points at a radix node", k)
		}
	}
}
