package bridge

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// referenceLogprobs is log_softmax with the standard library, in float64.
func referenceLogprobs(row []float32) []float64 {
	m := math.Inf(-1)
	for _, l := range row {
		m = math.Max(m, float64(lpLogit(l)))
	}
	s := 0.0
	for _, l := range row {
		s += math.Exp(float64(lpLogit(l)) - m)
	}
	out := make([]float64, len(row))
	for i, l := range row {
		out[i] = float64(lpLogit(l)) - m - math.Log(s)
	}
	return out
}

func TestSamplingLogMatchesMathLog(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		x := 1 + r.Float64()*math.Pow(2, float64(r.IntN(40)))
		got, want := samplingLog(x), math.Log(x)
		if math.Abs(got-want) > 4e-16*math.Max(1, math.Abs(want)) {
			t.Fatalf("samplingLog(%v) = %v, math.Log %v", x, got, want)
		}
	}
	if samplingLog(1) != 0 {
		t.Errorf("samplingLog(1) = %v", samplingLog(1))
	}
}

func TestRowLogprobs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	V := 1000
	row := make([]float32, V)
	for i := range row {
		row[i] = float32(r.NormFloat64() * 4)
	}
	// Ties: three ids share the largest logit, two more share another.
	row[7], row[3], row[900] = 30, 30, 30
	row[11], row[10] = 20, 20
	want := referenceLogprobs(row)
	ids := make([]int32, MaxLogprobs)
	lps := make([]float32, MaxLogprobs)
	tok := int32(500) // not in the top 20
	lp := RowLogprobs(row, tok, ids, lps)
	if math.Abs(float64(lp)-want[tok]) > 1e-5 {
		t.Errorf("token %d: %v, reference %v", tok, lp, want[tok])
	}
	order := make([]int32, V)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int {
		switch {
		case row[a] > row[b]:
			return -1
		case row[a] < row[b]:
			return 1
		}
		return 0
	})
	if !slices.Equal(ids, order[:MaxLogprobs]) {
		t.Fatalf("top ids %v, want %v", ids, order[:MaxLogprobs])
	}
	if ids[0] != 3 || ids[1] != 7 || ids[2] != 900 || ids[3] != 10 || ids[4] != 11 {
		t.Errorf("ties are not ordered by id: %v", ids[:5])
	}
	total := 0.0
	for j, id := range ids {
		if math.Abs(float64(lps[j])-want[id]) > 1e-5 {
			t.Errorf("top %d (id %d): %v, reference %v", j, id, lps[j], want[id])
		}
		if j > 0 && lps[j] > lps[j-1] {
			t.Errorf("top list not descending at %d: %v > %v", j, lps[j], lps[j-1])
		}
		total += math.Exp(float64(lps[j]))
	}
	if total > 1+1e-6 {
		t.Errorf("the top probabilities sum to %v > 1", total)
	}
	all := 0.0
	for i := range row {
		all += math.Exp(want[i])
	}
	if math.Abs(all-1) > 1e-9 {
		t.Errorf("reference sums to %v", all)
	}
	// The sampled token in the top list: the same value both ways.
	if lp := RowLogprobs(row, ids[4], make([]int32, 5), make([]float32, 5)); lp != lps[4] {
		t.Errorf("token %d: %v alone, %v in the top list", ids[4], lp, lps[4])
	}
	// k = 0: the token's only; k > vocab: every id.
	if lp := RowLogprobs(row, tok, nil, nil); math.Abs(float64(lp)-want[tok]) > 1e-5 {
		t.Errorf("k = 0: %v", lp)
	}
	small := []float32{1, float32(math.NaN()), float32(math.Inf(1)), 2}
	sids := make([]int32, 6)
	slps := make([]float32, 6)
	RowLogprobs(small, 0, sids, slps)
	if !slices.Equal(sids[:4], []int32{2, 3, 0, 1}) || sids[4] != 0 {
		t.Errorf("NaN and +Inf: top %v", sids)
	}
	if !math.IsInf(float64(slps[3]), -1) {
		t.Errorf("NaN's log-probability %v, want -Inf", slps[3])
	}
	// No finite logit: uniform.
	inf := float32(math.Inf(-1))
	if lp := RowLogprobs([]float32{inf, inf, inf, inf}, 1, nil, nil); math.Abs(float64(lp)+math.Log(4)) > 1e-6 {
		t.Errorf("all -Inf: %v, want -log 4", lp)
	}
}

func TestCheckStepLogprobs(t *testing.T) {
	c := NewStepChecker(Geometry{DevicePages: 4, TokensPerPage: 4, VocabSize: 32})
	for _, sq := range []SeqStep{{TopLogprobs: 1}, {Logprobs: true, TopLogprobs: MaxLogprobs + 1}, {Logprobs: true, TopLogprobs: -1}} {
		sq.Tokens, sq.BlockTable, sq.Sample = []int32{1}, []int32{0}, true
		if err := c.Check("step", &StepDesc{Seqs: []SeqStep{sq}}); err == nil {
			t.Errorf("logprobs %v top %d accepted", sq.Logprobs, sq.TopLogprobs)
		}
	}
}
