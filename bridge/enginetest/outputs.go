package enginetest

import (
	"slices"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// generation prefills a prompt of 9 tokens on pages in chunks (each chunk
// beside the companions' sequences of that step, if any), then decodes
// three tokens greedily and one stochastically, and returns each sampled
// step's row: its token and logits.
func generation(t *testing.T, e bridge.Engine, pages []int32, chunks []int,
	companions func(step int) []bridge.SeqStep) []bridge.StepResult {
	t.Helper()
	toks := prompt(9, 7)
	var out []bridge.StepResult
	for pos, k := 0, 0; len(out) < 4; k++ {
		sq := bridge.SeqStep{StartPos: pos, BlockTable: pages, Sample: true}
		if pos < 9 {
			n := min(chunks[k%len(chunks)], 9-pos)
			sq.Tokens, sq.Sample = toks[pos:pos+n], pos+n == 9
		} else {
			sq.Tokens = toks[pos : pos+1]
		}
		if len(out) == 3 {
			sq.Sampling = bridge.SamplingParams{Temperature: 0.9, TopK: 50, TopP: 0.95, Seed: 11}
		}
		var others []bridge.SeqStep
		if companions != nil {
			others = companions(k)
		}
		res := step(t, e, withLogits(append(others, sq)...))
		pos += len(sq.Tokens)
		if !sq.Sample {
			continue
		}
		V := e.Shape().VocabSize
		row := bridge.StepResult{Sampled: res.Sampled[len(others):], Logits: res.Logits[len(res.Logits)-V:]}
		out = append(out, row)
		toks = append(toks, row.Sampled[0])
	}
	return out
}

// determinism: the same steps on two engines of one configuration give the
// same tokens and bit-identical logits, and re-running a step that
// rewrites the same pages gives its result again.
func (s *suite) determinism(t *testing.T) {
	a, _ := s.engine(t)
	b, _ := s.engine(t)
	ga := generation(t, a, []int32{2, 7, 4, 11}, []int{9}, nil)
	gb := generation(t, b, []int32{2, 7, 4, 11}, []int{9}, nil)
	for i := range ga {
		if !s.sameOutput(ga[i], gb[i]) {
			t.Errorf("token %d: %v on one engine, %v on another", i, ga[i].Sampled, gb[i].Sampled)
		}
	}
	prefill, _ := twoSteps()
	first := step(t, a, prefill)
	if again := step(t, a, prefill); !s.sameOutput(first, again) {
		t.Errorf("the same step twice: %v then %v", first.Sampled, again.Sampled)
	}
}

// batchInvariance (Capabilities.BatchInvariant): a sequence's tokens and
// logits do not depend on how its prompt is chunked, on its pages, or on
// the other sequences of its steps.
func (s *suite) batchInvariance(t *testing.T) {
	if !s.caps.BatchInvariant {
		t.Skip("the engine does not promise batch invariance (Capabilities.BatchInvariant)")
	}
	ref, _ := s.engine(t)
	want := generation(t, ref, []int32{0, 1, 2, 3}, []int{9}, nil)
	companions := func(k int) []bridge.SeqStep {
		return []bridge.SeqStep{
			{Tokens: prompt(1+k%3, k), StartPos: 0, BlockTable: []int32{14}, Sample: true},
			{Tokens: prompt(2, k+1), StartPos: TokensPerPage * k % 8, BlockTable: []int32{13, 15}, Sample: k%2 == 0},
		}
	}
	for _, v := range []struct {
		name       string
		pages      []int32
		chunks     []int
		companions func(int) []bridge.SeqStep
	}{
		{"chunked", []int32{0, 1, 2, 3}, []int{4, 1, 3}, nil},
		{"token at a time, other pages", []int32{8, 5, 11, 6}, []int{1}, nil},
		{"batched", []int32{3, 9, 0, 7}, []int{2, 7}, companions},
	} {
		e, _ := s.engine(t)
		got := generation(t, e, v.pages, v.chunks, v.companions)
		for i := range want {
			if !s.sameOutput(withoutTime(got[i]), withoutTime(want[i])) {
				t.Errorf("%s: token %d is %v, alone %v (or its logits differ)", v.name, i, got[i].Sampled, want[i].Sampled)
			}
		}
	}
}

// withoutTime drops DeviceMS, which depends on the whole batch.
func withoutTime(r bridge.StepResult) bridge.StepResult {
	r.DeviceMS = 0
	return r
}

// pageContent (Capabilities.ReadsPages): with the flag, a block table
// naming another sequence's page and an overwritten page change the logits,
// and a round trip through the host tier restores them; without it,
// neither matters. (Swapping two pages of one table is no test: attention
// over the same keys in another order can give the same logits.)
func (s *suite) pageContent(t *testing.T) {
	e, _ := s.engine(t)
	x := prompt(8, 6)
	step(t, e, desc(bridge.SeqStep{Tokens: x, BlockTable: []int32{0, 1}},
		bridge.SeqStep{Tokens: prompt(4, 10), BlockTable: []int32{5}}))
	decode := func(table ...int32) bridge.StepResult {
		return withoutTime(step(t, e, withLogits(bridge.SeqStep{Tokens: prompt(1, 8), StartPos: 8,
			BlockTable: table, Sample: true})))
	}
	good := decode(0, 1, 2)
	differs := func(what string, got bridge.StepResult) {
		t.Helper()
		if s.caps.ReadsPages == s.sameOutput(got, good) {
			t.Errorf("%s: logits equal %v, want %v (Capabilities.ReadsPages %v)",
				what, s.sameOutput(got, good), !s.caps.ReadsPages, s.caps.ReadsPages)
		}
	}
	differs("another sequence's page in the block table", decode(0, 5, 3))
	// Suspend X to the host tier, scribble over its pages, resume.
	if err := e.CopyPages(bridge.TierDevice, []int32{0, 1}, bridge.TierHost, []int32{0, 1}); err != nil {
		t.Fatal(err)
	}
	step(t, e, desc(bridge.SeqStep{Tokens: prompt(8, 9), BlockTable: []int32{0, 1}}))
	differs("overwritten pages", decode(0, 1, 2))
	if err := e.CopyPages(bridge.TierHost, []int32{0, 1}, bridge.TierDevice, []int32{0, 1}); err != nil {
		t.Fatal(err)
	}
	if got := decode(0, 1, 2); !s.sameOutput(got, good) {
		t.Errorf("after a round trip through the host tier: %v, want %v", got.Sampled, good.Sampled)
	}
}

// logitsAndSampling: with WantLogits there is one row per sampled
// sequence; a greedy token is its row's argmax (lowest index on ties) and a
// stochastic one is bridge.Sample of its row at SeqStep.SamplePos; an
// unsampled sequence gets -1; without WantLogits there are no logits.
func (s *suite) logitsAndSampling(t *testing.T) {
	e, _ := s.engine(t)
	V := e.Shape().VocabSize
	seqs := []bridge.SeqStep{
		{Tokens: prompt(5, 1), BlockTable: []int32{0, 1}, Sample: true},
		{Tokens: prompt(2, 2), BlockTable: []int32{2}},
		{Tokens: prompt(3, 3), BlockTable: []int32{3}, Sample: true,
			Sampling: bridge.SamplingParams{Temperature: 1.3, TopK: 100, TopP: 0.9, Seed: 5}},
		{Tokens: prompt(1, 4), BlockTable: []int32{4}, Sample: true,
			Sampling: bridge.SamplingParams{Temperature: 0.7, Seed: 6}},
	}
	res := step(t, e, withLogits(seqs...))
	if len(res.Sampled) != len(seqs) || len(res.Logits) != 3*V {
		t.Fatalf("%d tokens and %d logits, want %d and 3 rows of %d", len(res.Sampled), len(res.Logits), len(seqs), V)
	}
	row := 0
	for i, sq := range seqs {
		if !sq.Sample {
			if res.Sampled[i] != -1 {
				t.Errorf("unsampled seqs[%d] got %d, want -1", i, res.Sampled[i])
			}
			continue
		}
		r := res.Logits[row*V : (row+1)*V]
		row++
		want := bridge.Argmax(r)
		if !sq.Sampling.IsGreedy() {
			want = bridge.Sample(r, sq.Sampling, sq.SamplePos())
		}
		if res.Sampled[i] != want {
			t.Errorf("seqs[%d] sampled %d, its row gives %d", i, res.Sampled[i], want)
		}
	}
	if plain := step(t, e, desc(seqs...)); len(plain.Logits) != 0 || !slices.Equal(plain.Sampled, res.Sampled) {
		t.Errorf("without WantLogits: %d logits, tokens %v (with: %v)", len(plain.Logits), plain.Sampled, res.Sampled)
	}
}

// resultReuse: Step and Wait overwrite the whole result and reuse its
// slices when large enough.
func (s *suite) resultReuse(t *testing.T) {
	e, _ := s.engine(t)
	d := desc(bridge.SeqStep{Tokens: prompt(2, 1), BlockTable: []int32{0}, Sample: true},
		bridge.SeqStep{Tokens: prompt(2, 2), BlockTable: []int32{1}})
	for _, via := range []string{"step", "wait"} {
		res := bridge.StepResult{Sampled: make([]int32, 7, 8), Logits: []float32{1, 2, 3}, DeviceMS: -1, MoEWaitMS: 42}
		backing := &res.Sampled[0]
		var err error
		if via == "step" {
			err = e.Step(d, &res)
		} else if err = e.Submit(d); err == nil {
			err = e.Wait(&res)
		}
		if err != nil {
			t.Fatalf("%s: %v", via, err)
		}
		if len(res.Sampled) != 2 || &res.Sampled[0] != backing || res.Sampled[1] != -1 || len(res.Logits) != 0 ||
			res.DeviceMS < 0 || res.MoEWaitMS != 0 {
			t.Errorf("%s left %+v: want 2 tokens in the reused array, no logits, DeviceMS ≥ 0, MoEWaitMS 0", via, res)
		}
	}
}
