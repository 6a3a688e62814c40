package enginetest

import (
	"errors"
	"math"
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

// allowedMask: a sampled sequence with an allowed-token mask (structured
// outputs) picks bridge.SampleSeq of its logits row, always an allowed
// id, greedy or not, through Step and through Submit/Wait with the mask
// overwritten after the submit (the engine reads its own copy).
func (s *suite) allowedMask(t *testing.T) {
	e, _ := s.engine(t)
	V := e.Shape().VocabSize
	mask := func(ids ...int) []uint32 {
		m := make([]uint32, bridge.AllowedWords(V))
		for _, id := range ids {
			m[id/32] |= 1 << (id % 32)
		}
		return m
	}
	seqs := []bridge.SeqStep{
		{Tokens: prompt(5, 1), BlockTable: []int32{0, 1}, Sample: true, Allowed: mask(3, V-1)},
		{Tokens: prompt(3, 3), BlockTable: []int32{3}, Sample: true, Allowed: mask(7, 8, 9, V/2),
			Sampling: bridge.SamplingParams{Temperature: 1.3, Seed: 5}},
		{Tokens: prompt(2, 2), BlockTable: []int32{2}, Sample: true, Allowed: mask(V / 3)},
	}
	res := step(t, e, withLogits(seqs...))
	for i, sq := range seqs {
		r := res.Logits[i*V : (i+1)*V]
		if want := bridge.SampleSeq(r, &sq); res.Sampled[i] != want || !bridge.IsAllowed(sq.Allowed, want) {
			t.Errorf("seqs[%d] sampled %d, its row and mask give %d", i, res.Sampled[i], want)
		}
	}
	if res.Sampled[2] != int32(V/3) {
		t.Errorf("a mask with one id set: sampled %d, want %d", res.Sampled[2], V/3)
	}
	e2, _ := s.engine(t)
	d := desc(slices.Clone(seqs)...)
	for i := range d.Seqs {
		d.Seqs[i].Allowed = slices.Clone(seqs[i].Allowed)
	}
	submit(t, e2, d)
	for i := range d.Seqs {
		clear(d.Seqs[i].Allowed)
	}
	if got := wait(t, e2); !slices.Equal(got.Sampled, res.Sampled) {
		t.Errorf("Submit/Wait with the masks cleared after the submit sampled %v, Step %v", got.Sampled, res.Sampled)
	}
}

// logprobs: a sampled sequence that sets Logprobs gets bridge.RowLogprobs
// of its logits row bit for bit (its token's, its TopLogprobs top ids and
// theirs, −1 and 0 past them); the others get 0, −1 and 0; the tokens are
// those of the same step without log-probabilities, through Step and
// Submit/Wait alike; a step without any has empty log-probability slices;
// a bad TopLogprobs is refused.
func (s *suite) logprobs(t *testing.T) {
	e, _ := s.engine(t)
	V := e.Shape().VocabSize
	seqs := []bridge.SeqStep{
		{Tokens: prompt(5, 1), BlockTable: []int32{0, 1}, Sample: true, Logprobs: true, TopLogprobs: 5},
		{Tokens: prompt(2, 2), BlockTable: []int32{2}, Logprobs: true, TopLogprobs: 3},
		{Tokens: prompt(3, 3), BlockTable: []int32{3}, Sample: true, Logprobs: true, TopLogprobs: bridge.MaxLogprobs,
			Sampling:     bridge.SamplingParams{Temperature: 1.3, TopK: 100, TopP: 0.9, Seed: 5, PresencePenalty: 0.5},
			OutputTokens: []int32{1, 2}},
		{Tokens: prompt(1, 4), BlockTable: []int32{4}, Sample: true},
		{Tokens: prompt(1, 5), BlockTable: []int32{5}, Sample: true, Logprobs: true},
	}
	plain := make([]bridge.SeqStep, len(seqs))
	for i, sq := range seqs {
		sq.Logprobs, sq.TopLogprobs = false, 0
		plain[i] = sq
	}
	want := step(t, e, withLogits(plain...))
	if len(want.Logprobs) != 0 || len(want.TopLogprobIDs) != 0 || len(want.TopLogprobs) != 0 {
		t.Errorf("a step without logprobs returned %d, %d, %d log-probability entries",
			len(want.Logprobs), len(want.TopLogprobIDs), len(want.TopLogprobs))
	}
	check := func(via string, res bridge.StepResult, logits bool) {
		t.Helper()
		if !slices.Equal(res.Sampled, want.Sampled) {
			t.Errorf("%s: tokens %v, without logprobs %v", via, res.Sampled, want.Sampled)
		}
		K := bridge.MaxLogprobs
		if len(res.Logprobs) != len(seqs) || len(res.TopLogprobIDs) != len(seqs)*K || len(res.TopLogprobs) != len(seqs)*K {
			t.Fatalf("%s: %d, %d, %d log-probability entries for %d sequences", via,
				len(res.Logprobs), len(res.TopLogprobIDs), len(res.TopLogprobs), len(seqs))
		}
		if logits != (len(res.Logits) == len(want.Logits)) {
			t.Errorf("%s: %d logits (WantLogits %v)", via, len(res.Logits), logits)
		}
		row := 0
		for i, sq := range seqs {
			ids, lps := res.TopLogprobIDs[i*K:(i+1)*K], res.TopLogprobs[i*K:(i+1)*K]
			wantIDs, wantLps := make([]int32, K), make([]float32, K)
			for j := range wantIDs {
				wantIDs[j] = -1
			}
			var wantLp float32
			if sq.Sample {
				r := want.Logits[row*V : (row+1)*V]
				row++
				if sq.Logprobs {
					wantLp = bridge.RowLogprobs(r, want.Sampled[i], wantIDs[:sq.TopLogprobs], wantLps)
				}
			}
			if math.Float32bits(res.Logprobs[i]) != math.Float32bits(wantLp) || !slices.Equal(ids, wantIDs) ||
				!slices.EqualFunc(lps, wantLps, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
				t.Errorf("%s: seqs[%d]: logprob %v, top %v %v; want %v, %v %v", via, i, res.Logprobs[i], ids, lps, wantLp, wantIDs, wantLps)
			}
		}
	}
	check("step", step(t, e, desc(seqs...)), false)
	check("step with logits", step(t, e, withLogits(seqs...)), true)
	submit(t, e, desc(seqs...))
	check("submit/wait", wait(t, e), false)
	for _, bad := range []bridge.SeqStep{{TopLogprobs: 2}, {Logprobs: true, TopLogprobs: bridge.MaxLogprobs + 1}} {
		bad.Tokens, bad.BlockTable, bad.Sample = prompt(1, 9), []int32{6}, true
		var res bridge.StepResult
		if err := e.Step(desc(bad), &res); !errors.Is(err, bridge.ErrInvalidArgument) {
			t.Errorf("logprobs %v top_logprobs %d: %v, want INVALID_ARGUMENT", bad.Logprobs, bad.TopLogprobs, err)
		}
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
