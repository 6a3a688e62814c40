package enginetest

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// promptScores: a scored row (SeqStep.ScoreTargets) gets bridge.RowLogprobs
// of the logits row of a sequence ending at its token (sampled on its own,
// with logits) bit for bit, whether its prompt runs in one chunk or two,
// beside an unscored sequence, through Step and Submit/Wait; unscored rows
// get 0, −1 and 0; a step that scores nothing has empty score slices; the
// sampled tokens are those of the same step unscored; bad targets and top
// counts are refused.
func (s *suite) promptScores(t *testing.T) {
	e, _ := s.engine(t)
	V := e.Shape().VocabSize
	const L, K = 11, 4
	p := prompt(L, 7)
	K0 := bridge.MaxLogprobs
	wantLp, wantRank := make([]float32, L), make([]int32, L)
	wantIDs, wantTop := make([]int32, L*K0), make([]float32, L*K0)
	for j := range wantIDs {
		wantIDs[j] = -1
	}
	for r := 0; r+1 < L; r++ {
		res := step(t, e, withLogits(bridge.SeqStep{Tokens: p[:r+1], BlockTable: []int32{8, 9, 10}, Sample: true}))
		wantLp[r] = bridge.RowLogprobs(res.Logits, p[r+1], wantIDs[r*K0:r*K0+K], wantTop[r*K0:(r+1)*K0])
		wantRank[r] = bridge.RowRank(res.Logits, p[r+1])
	}
	targets := append(slices.Clone(p[1:]), -1)
	bits := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }
	check := func(via string, res bridge.StepResult, at, from, to int) {
		t.Helper()
		for r := from; r < to; r++ {
			row := at + r - from
			if row >= len(res.ScoreLogprobs) || len(res.ScoreTopIDs) != len(res.ScoreLogprobs)*K0 || len(res.ScoreRanks) != len(res.ScoreLogprobs) ||
				len(res.ScoreTopLogprobs) != len(res.ScoreTopIDs) {
				t.Fatalf("%s: %d, %d, %d score entries, row %d wanted", via, len(res.ScoreLogprobs), len(res.ScoreTopIDs),
					len(res.ScoreTopLogprobs), row)
			}
			if !bits(res.ScoreLogprobs[row], wantLp[r]) || !slices.Equal(res.ScoreTopIDs[row*K0:(row+1)*K0], wantIDs[r*K0:(r+1)*K0]) ||
				!slices.EqualFunc(res.ScoreTopLogprobs[row*K0:(row+1)*K0], wantTop[r*K0:(r+1)*K0], bits) {
				t.Errorf("%s: prompt row %d: %v %v %v; want %v %v %v", via, r, res.ScoreLogprobs[row],
					res.ScoreTopIDs[row*K0:row*K0+K], res.ScoreTopLogprobs[row*K0:row*K0+K], wantLp[r],
					wantIDs[r*K0:r*K0+K], wantTop[r*K0:r*K0+K])
			}
		}
	}
	other := bridge.SeqStep{Tokens: prompt(3, 2), BlockTable: []int32{0}, Sample: true}
	whole := bridge.SeqStep{Tokens: p, BlockTable: []int32{1, 2, 3}, Sample: true, ScoreTargets: targets, ScoreTop: K}
	plain := whole
	plain.ScoreTargets, plain.ScoreTop = nil, 0
	want := step(t, e, desc(other, plain))
	if len(want.ScoreLogprobs)+len(want.ScoreTopIDs)+len(want.ScoreTopLogprobs) != 0 {
		t.Errorf("a step scoring nothing returned %d, %d, %d score entries", len(want.ScoreLogprobs),
			len(want.ScoreTopIDs), len(want.ScoreTopLogprobs))
	}
	for _, via := range []string{"step", "submit/wait"} {
		var res bridge.StepResult
		if via == "step" {
			res = step(t, e, desc(other, whole))
		} else {
			submit(t, e, desc(other, whole))
			res = wait(t, e)
		}
		if !slices.Equal(res.Sampled, want.Sampled) {
			t.Errorf("%s: tokens %v, unscored %v", via, res.Sampled, want.Sampled)
		}
		for row := range 3 {
			if len(res.ScoreLogprobs) > row && (res.ScoreLogprobs[row] != 0 || res.ScoreTopIDs[row*K0] != -1) {
				t.Errorf("%s: unscored row %d: %v %v", via, row, res.ScoreLogprobs[row], res.ScoreTopIDs[row*K0])
			}
		}
		check(via, res, 3, 0, L)
		for r := 0; r+1 < L; r++ {
			if res.ScoreRanks[3+r] != wantRank[r] || wantRank[r] < 1 {
				t.Errorf("%s: prompt row %d: rank %d, want %d (≥ 1)", via, r, res.ScoreRanks[3+r], wantRank[r])
			}
		}
		if res.ScoreRanks[3+L-1] != 0 || res.ScoreRanks[0] != 0 {
			t.Errorf("%s: unscored rows' ranks %d, %d; want 0", via, res.ScoreRanks[0], res.ScoreRanks[3+L-1])
		}
		// Two chunks on other pages: rows 0..5 unsampled, then 6..10.
		first := bridge.SeqStep{Tokens: p[:6], BlockTable: []int32{4, 5}, ScoreTargets: targets[:6], ScoreTop: K}
		second := bridge.SeqStep{Tokens: p[6:], StartPos: 6, BlockTable: []int32{4, 5, 6}, Sample: true,
			ScoreTargets: targets[6:], ScoreTop: K}
		check(via+", first chunk", step(t, e, desc(first)), 0, 0, 6)
		check(via+", second chunk", step(t, e, desc(second)), 0, 6, L)
	}
	for _, bad := range []bridge.SeqStep{
		{ScoreTargets: targets[:3]},
		{ScoreTargets: append(slices.Clone(targets[:L-1]), int32(V))},
		{ScoreTargets: append(slices.Clone(targets[:L-1]), -2)},
		{ScoreTargets: targets, ScoreTop: bridge.MaxLogprobs + 1},
		{ScoreTop: -1},
	} {
		bad.Tokens, bad.BlockTable, bad.Sample = p, []int32{1, 2, 3}, true
		var res bridge.StepResult
		if err := e.Step(desc(bad), &res); !errors.Is(err, bridge.ErrInvalidArgument) {
			t.Errorf("score_targets %v score_top %d: %v, want INVALID_ARGUMENT", bad.ScoreTargets, bad.ScoreTop, err)
		}
	}
}
