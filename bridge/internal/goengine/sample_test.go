package goengine

import (
	"slices"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// rowOf is a test engine's row: 0 everywhere, 1 at tok.
func rowOf(dst []float32, _ uint64, tok int32, vocab int) []float32 {
	for v := range vocab {
		x := float32(0)
		if int32(v) == tok {
			x = 1
		}
		dst = append(dst, x)
	}
	return dst
}

// TestSample: a greedy sequence takes hash % vocab without a row, a
// sequence that does not sample gets -1, logits come one row per sampling
// sequence, and log-probabilities are sized for the step only when asked.
func TestSample(t *testing.T) {
	const vocab = 7
	hash := func(sq *bridge.SeqStep) uint64 { return uint64(100 + sq.StartPos) }
	desc := &bridge.StepDesc{WantLogits: true, Seqs: []bridge.SeqStep{
		{Tokens: []int32{1}, StartPos: 3, Sample: true},
		{Tokens: []int32{2, 3}, StartPos: 0},
		{Tokens: []int32{4}, StartPos: 5, Sample: true},
	}}
	var res bridge.StepResult
	rows := 0
	counting := func(dst []float32, h uint64, tok int32, vocab int) []float32 {
		rows++
		return rowOf(dst, h, tok, vocab)
	}
	row := Sample(desc, &res, vocab, hash, counting, nil)
	if want := []int32{103 % vocab, -1, 105 % vocab}; !slices.Equal(res.Sampled, want) {
		t.Fatalf("sampled %v, want %v", res.Sampled, want)
	}
	if len(res.Logits) != 2*vocab || res.Logits[103%vocab] != 1 || res.Logits[vocab+105%vocab] != 1 {
		t.Fatalf("logits %v: want the two sampling sequences' rows", res.Logits)
	}
	if rows != 2 || len(row) != 0 {
		t.Fatalf("%d rows built, scratch %d long: greedy sequences need a row only for their logits", rows, len(row))
	}
	if len(res.Logprobs) != 0 {
		t.Fatalf("logprobs %v without a request for them", res.Logprobs)
	}

	// A second step reuses res and returns to no logits.
	desc.WantLogits = false
	desc.Seqs[2].Logprobs = true
	Sample(desc, &res, vocab, hash, rowOf, row)
	if len(res.Logits) != 0 || len(res.Sampled) != 3 || len(res.Logprobs) != 3 {
		t.Fatalf("second step: %d logits, %d sampled, %d logprobs", len(res.Logits), len(res.Sampled), len(res.Logprobs))
	}
}
