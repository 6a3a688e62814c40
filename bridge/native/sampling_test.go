//go:build native

package native

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// TestSampleAgreesWithNative: bridge.Sample (pure Go, the fake and twin
// engines) and the native procedure (eng_sample_row, the CPU and CUDA
// backends) pick the same token on random logits for many seeds, positions
// and parameters, including ties, -Inf/NaN logits and tiny temperatures.
func TestSampleAgreesWithNative(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	temps := []float32{0, 1e-3, 0.3, 0.8, 1, 1.7, 5}
	topKs := []int{0, 1, 2, 40, 299, 300, 1000}
	topPs := []float32{0, 1e-4, 0.5, 0.9, 0.95, 1}
	cases, sampled := 0, 0
	for c := range 3000 {
		V := 1 + rng.IntN(300)
		lg := make([]float32, V)
		scale := []float64{0.01, 1, 4, 30}[c%4]
		for i := range lg {
			lg[i] = float32(rng.NormFloat64() * scale)
		}
		switch c % 7 { // special rows
		case 1:
			for i := range lg {
				lg[i] = float32(math.Round(float64(lg[i]))) // many ties
			}
		case 2:
			lg[rng.IntN(V)] = float32(math.Inf(-1))
			lg[rng.IntN(V)] = float32(math.NaN())
		case 3:
			lg[rng.IntN(V)] = float32(math.Inf(1))
		}
		p := bridge.SamplingParams{Temperature: temps[rng.IntN(len(temps))], TopK: topKs[rng.IntN(len(topKs))],
			TopP: topPs[rng.IntN(len(topPs))], Seed: rng.Uint64()}
		pos := rng.Int64N(1 << 40)
		want, err := SampleRow(lg, p, pos)
		if err != nil {
			t.Fatal(err)
		}
		if got := bridge.Sample(lg, p, pos); got != want {
			t.Fatalf("case %d (V %d, %+v, pos %d): Go picked %d, native %d", c, V, p, pos, got, want)
		}
		cases++
		if !p.IsGreedy() && want != bridge.Argmax(lg) {
			sampled++
		}
	}
	if sampled < cases/6 {
		t.Errorf("only %d of %d cases picked a non-argmax token: the test exercises too little", sampled, cases)
	}
	if _, err := SampleRow([]float32{1}, bridge.SamplingParams{TopP: 2}, 0); err == nil {
		t.Error("SampleRow accepted top_p 2")
	}
}

// TestStepSamplingMatchesGo: a CPU-engine step that samples picks what
// bridge.Sample picks on the logits it returns, and temperature 0 is the
// greedy step.
func TestStepSamplingMatchesGo(t *testing.T) {
	e, err := Open(bridge.Config{Preset: "tiny", NumPages: 16, TokensPerPage: 8, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompt := []int32{5, 17, 99, 3, 250, 11, 42, 7, 8, 1}
	var res bridge.StepResult
	for s := range 40 {
		p := bridge.SamplingParams{Temperature: 0.9, TopK: []int{0, 40}[s%2], TopP: []float32{0, 0.9}[s/2%2], Seed: uint64(s)}
		desc := &bridge.StepDesc{WantLogits: true, Seqs: []bridge.SeqStep{
			{Tokens: prompt, BlockTable: []int32{0, 1}, Sample: true, Sampling: p},
			{Tokens: prompt[:4], BlockTable: []int32{2}, Sample: true}, // greedy next to it
		}}
		if err := e.Step(desc, &res); err != nil {
			t.Fatal(err)
		}
		V := e.Shape().VocabSize
		if got, want := res.Sampled[0], bridge.Sample(res.Logits[:V], p, int64(len(prompt))); got != want {
			t.Fatalf("seed %d: engine sampled %d, bridge.Sample %d", s, got, want)
		}
		if got, want := res.Sampled[1], bridge.Argmax(res.Logits[V:2*V]); got != want {
			t.Fatalf("greedy row: %d, argmax %d", got, want)
		}
	}
	// Invalid parameters are refused with the sequence named.
	err = e.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt, BlockTable: []int32{0, 1}, Sample: true,
		Sampling: bridge.SamplingParams{Temperature: -1}}}}, &res)
	if err == nil {
		t.Fatal("temperature -1 accepted")
	}
}

// TestProcessorsAgreeWithNative: with min_p, logit bias, the three
// penalties and allowed-token masks (greedy and sampled rows), bridge.SampleSeq and the native
// procedure pick the same token, and the processors change the pick often
// enough for the check to mean something.
func TestProcessorsAgreeWithNative(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	changed := 0
	const cases = 2000
	for c := range cases {
		V := 2 + rng.IntN(200)
		lg := make([]float32, V)
		for i := range lg {
			lg[i] = float32(rng.NormFloat64() * []float64{0.5, 2, 8}[c%3])
		}
		ids := func(n int) []int32 {
			out := make([]int32, n)
			for i := range out {
				out[i] = int32(rng.IntN(V))
			}
			return out
		}
		s := bridge.SeqStep{Tokens: []int32{0}, StartPos: rng.IntN(1 << 20), Sample: true,
			PromptTokens: ids(rng.IntN(30)), OutputTokens: ids(rng.IntN(30))}
		s.Sampling = bridge.SamplingParams{Temperature: []float32{0, 0.7, 1, 1.5}[c%4], TopK: []int{0, 20}[c/4%2],
			TopP: []float32{0, 0.9}[c/8%2], Seed: rng.Uint64(), MinP: []float32{0, 0.05, 0.3}[c%3],
			PresencePenalty: []float32{0, 0.5, -1}[c/3%3], FrequencyPenalty: []float32{0, 0.3, 1.7}[c/9%3],
			RepetitionPenalty: []float32{0, 1, 1.3, 0.8}[c/27%4]}
		for range rng.IntN(4) {
			s.LogitBias = append(s.LogitBias, bridge.TokenBias{ID: int32(rng.IntN(V)), Bias: float32(rng.NormFloat64() * 5)})
		}
		if c%3 == 1 {
			// An allowed-token mask (structured outputs) with a few ids set.
			s.Allowed = make([]uint32, bridge.AllowedWords(V))
			for range 1 + rng.IntN(5) {
				id := rng.IntN(V)
				s.Allowed[id/32] |= 1 << (id % 32)
			}
		}
		want, err := SampleSeqRow(lg, &s)
		if err != nil {
			t.Fatal(err)
		}
		if !bridge.IsAllowed(s.Allowed, want) {
			t.Fatalf("case %d: native picked %d, which the mask does not allow", c, want)
		}
		if got := bridge.SampleSeq(lg, &s); got != want {
			t.Fatalf("case %d (V %d, %+v, bias %v): Go picked %d, native %d", c, V, s.Sampling, s.LogitBias, got, want)
		}
		if plain := bridge.Sample(lg, bridge.SamplingParams{Temperature: s.Sampling.Temperature, TopK: s.Sampling.TopK,
			TopP: s.Sampling.TopP, Seed: s.Sampling.Seed}, s.SamplePos()); plain != want {
			changed++
		}
	}
	if changed < cases/10 {
		t.Errorf("the processors changed only %d of %d picks: the test exercises too little", changed, cases)
	}
	bad := bridge.SeqStep{Tokens: []int32{0}, Sample: true, LogitBias: []bridge.TokenBias{{ID: 5, Bias: 1}}}
	if _, err := SampleSeqRow([]float32{1, 2}, &bad); err == nil || !strings.Contains(err.Error(), "bias_ids[0]") {
		t.Errorf("a bias id outside the vocabulary: got %v, want an error naming bias_ids[0]", err)
	}
	none := bridge.SeqStep{Tokens: []int32{0}, Sample: true, Allowed: []uint32{1 << 5}}
	if _, err := SampleSeqRow([]float32{1, 2}, &none); err == nil || !strings.Contains(err.Error(), "allows no token") {
		t.Errorf("a mask allowing no id of the vocabulary: got %v, want an error saying it allows no token", err)
	}
}

// TestLogprobsAgreeWithNative: bridge.RowLogprobs (the fake and twin
// engines) and the native procedure (eng_logprobs_row, every native
// backend's step) give bit-identical log-probabilities and the same top
// ids on random rows of many sizes, with ties, ±Inf and NaN logits.
func TestLogprobsAgreeWithNative(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	for c := range 1500 {
		V := 1 + rng.IntN(2000)
		if c%100 == 0 {
			V = 49152 // SmolLM2's vocabulary
		}
		row := make([]float32, V)
		for i := range row {
			switch r := rng.IntN(100); {
			case r == 0:
				row[i] = float32(math.NaN())
			case r == 1:
				row[i] = float32(math.Inf(-1))
			case r == 2 && c%7 == 0:
				row[i] = float32(math.Inf(1))
			case r < 20:
				row[i] = float32(rng.IntN(4)) // ties
			default:
				row[i] = float32(rng.NormFloat64() * 8)
			}
		}
		if c%50 == 1 {
			for i := range row {
				row[i] = float32(math.Inf(-1))
			}
		}
		k := rng.IntN(bridge.MaxLogprobs + 1)
		tok := int32(rng.IntN(V))
		want, wantIDs, wantLps, err := LogprobsRow(row, tok, k)
		if err != nil {
			t.Fatal(err)
		}
		ids, lps := make([]int32, k), make([]float32, k)
		got := bridge.RowLogprobs(row, tok, ids, lps)
		m := min(k, V)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("case %d (V %d, token %d): Go %v, native %v", c, V, tok, got, want)
		}
		for j := range m {
			if ids[j] != wantIDs[j] || math.Float32bits(lps[j]) != math.Float32bits(wantLps[j]) {
				t.Fatalf("case %d (V %d, k %d): top %d: Go %d %v, native %d %v", c, V, k, j, ids[j], lps[j], wantIDs[j], wantLps[j])
			}
		}
	}
	if _, _, _, err := LogprobsRow([]float32{1, 2}, 2, 1); err == nil || !strings.Contains(err.Error(), "token 2") {
		t.Errorf("a token outside the row: %v", err)
	}
}
