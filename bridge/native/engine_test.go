//go:build native

package native

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
)

const tinyPageTokens = 8

func openTiny(t testing.TB, pages, hostPages int) bridge.Engine {
	t.Helper()
	eng, err := Open(bridge.Config{Preset: "tiny", Seed: 7, NumPages: pages, TokensPerPage: tinyPageTokens,
		NumHostPages: hostPages})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	return eng
}

// prompt returns n deterministic token ids below vocab.
func prompt(seed uint64, n, vocab int) []int32 {
	out := make([]int32, n)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range out {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		out[i] = int32(x % uint64(vocab))
	}
	return out
}

func pageRange(first, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(first + i)
	}
	return p
}

func TestPresetsMatchBridge(t *testing.T) {
	for name, want := range bridge.Presets {
		got, err := PresetShape(name)
		if err != nil {
			t.Fatalf("PresetShape(%q): %v", name, err)
		}
		if !got.Equal(want) {
			t.Errorf("preset %q: native %+v, bridge %+v", name, got, want)
		}
	}
	_, err := PresetShape("llama-7b")
	if !errors.Is(err, bridge.ErrInvalidArgument) || !strings.Contains(err.Error(), "llama-7b") {
		t.Errorf("unknown preset: err = %v", err)
	}
	if !slices.Contains(SupportedBackends(), "cpu") {
		t.Errorf("SupportedBackends() = %v, want cpu", SupportedBackends())
	}
}

func TestTinyStep(t *testing.T) {
	eng := openTiny(t, 16, 0)
	if eng.Shape() != bridge.Presets["tiny"] {
		t.Fatalf("Shape() = %+v", eng.Shape())
	}
	desc := &bridge.StepDesc{WantLogits: true, Seqs: []bridge.SeqStep{
		{Tokens: prompt(1, 11, 512), BlockTable: pageRange(0, 2), Sample: true},
		{Tokens: prompt(2, 5, 512), BlockTable: pageRange(2, 1), Sample: false},
	}}
	var res bridge.StepResult
	if err := eng.Step(desc, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Sampled) != 2 || res.Sampled[0] < 0 || res.Sampled[0] >= 512 || res.Sampled[1] != -1 {
		t.Errorf("Sampled = %v", res.Sampled)
	}
	if len(res.Logits) != 512 || res.DeviceMS <= 0 {
		t.Errorf("len(Logits) = %d, DeviceMS = %g", len(res.Logits), res.DeviceMS)
	}
	best := 0
	for i, v := range res.Logits {
		if v > res.Logits[best] {
			best = i
		}
	}
	if int32(best) != res.Sampled[0] {
		t.Errorf("sampled %d but argmax of logits is %d", res.Sampled[0], best)
	}
}

func TestValidationErrors(t *testing.T) {
	eng := openTiny(t, 4, 2)
	valid := func() bridge.SeqStep {
		return bridge.SeqStep{Tokens: []int32{1, 2, 3}, BlockTable: []int32{0}, Sample: true}
	}
	cases := []struct {
		name   string
		mutate func(s *bridge.SeqStep)
		want   []string
	}{
		{"token out of range", func(s *bridge.SeqStep) { s.Tokens[1] = 512 }, []string{"tokens[4]", "sequence 1", "512"}},
		{"negative token", func(s *bridge.SeqStep) { s.Tokens[0] = -5 }, []string{"tokens[3]", "-5"}},
		{"no tokens", func(s *bridge.SeqStep) { s.Tokens = nil }, []string{"num_tokens[1]"}},
		{"negative start", func(s *bridge.SeqStep) { s.StartPos = -1 }, []string{"start_pos[1]", "-1"}},
		{"page out of range", func(s *bridge.SeqStep) { s.BlockTable[0] = 4 }, []string{"block_table[1]", "sequence 1", "4"}},
		{"block table short", func(s *bridge.SeqStep) { s.StartPos = 6 }, []string{"num_blocks[1]", "too short"}},
		{"start beyond int32", func(s *bridge.SeqStep) { s.StartPos = math.MaxInt32 + 1 }, []string{"Seqs[1].StartPos"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := valid()
			bad.BlockTable = []int32{1}
			c.mutate(&bad)
			var res bridge.StepResult
			err := eng.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{valid(), bad}}, &res)
			if !errors.Is(err, bridge.ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	err := eng.CopyPages(bridge.TierDevice, []int32{0, 9}, bridge.TierHost, []int32{0, 1})
	if !errors.Is(err, bridge.ErrInvalidArgument) || !strings.Contains(err.Error(), "src[1]") {
		t.Errorf("CopyPages bad index: %v", err)
	}
	err = eng.CopyPages(bridge.TierDevice, []int32{0}, bridge.TierHost, nil)
	if !errors.Is(err, bridge.ErrInvalidArgument) {
		t.Errorf("CopyPages length mismatch: %v", err)
	}

	openCases := []struct {
		name string
		cfg  bridge.Config
		want error
		msg  string
	}{
		{"unknown preset", bridge.Config{Preset: "gpt", NumPages: 1, TokensPerPage: 1}, bridge.ErrInvalidArgument, "gpt"},
		{"zero pages", bridge.Config{Preset: "tiny", TokensPerPage: 1}, bridge.ErrInvalidArgument, "num_pages"},
		{"bad shape", bridge.Config{Shape: bridge.ModelShape{NumLayers: 1}, NumPages: 1, TokensPerPage: 1}, bridge.ErrInvalidArgument, "num_heads"},
		{"unknown backend", bridge.Config{Preset: "tiny", NumPages: 1, TokensPerPage: 1, Backend: "tpu"}, bridge.ErrInvalidArgument, "tpu"},
		{"too big for cpu", bridge.Config{Preset: "llama-8b", NumPages: 1, TokensPerPage: 1}, bridge.ErrOutOfMemory, "validate_only"},
	}
	if !slices.Contains(SupportedBackends(), "cuda") {
		openCases = append(openCases, struct {
			name string
			cfg  bridge.Config
			want error
			msg  string
		}{"cuda", bridge.Config{Preset: "tiny", NumPages: 1, TokensPerPage: 1, Backend: "cuda"}, bridge.ErrUnsupported, "CUDA"})
	}
	for _, c := range openCases {
		eng, err := Open(c.cfg)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("Open(%s) = %v; want %v mentioning %q", c.name, err, c.want, c.msg)
		}
		if eng != nil {
			t.Errorf("Open(%s) returned an engine with an error", c.name)
		}
	}

	// validate_only: a huge shape opens, steps are refused.
	big, err := Open(bridge.Config{Preset: "llama-70b", NumPages: 100000, TokensPerPage: 64, ValidateOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	var res bridge.StepResult
	if err := big.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{valid()}}, &res); !errors.Is(err, bridge.ErrUnsupported) {
		t.Errorf("validate_only Step: %v", err)
	}
}

// generate feeds p in chunks (sizes cycle) then decodes n tokens greedily,
// alone in each step unless with is non-nil, which adds companion sequences
// (on other pages) to every step. It returns the sampled tokens and logits.
func generate(t *testing.T, eng bridge.Engine, p []int32, chunks []int, pages []int32, n int,
	with func(step int) []bridge.SeqStep) ([]int32, []float32) {
	t.Helper()
	var toks []int32
	var logits []float32
	fed, step := 0, 0
	var res bridge.StepResult
	for len(toks) < n {
		var s bridge.SeqStep
		if fed < len(p) {
			c := min(chunks[step%len(chunks)], len(p)-fed)
			s = bridge.SeqStep{Tokens: p[fed : fed+c], StartPos: fed, BlockTable: pages, Sample: fed+c == len(p)}
			fed += c
		} else {
			s = bridge.SeqStep{Tokens: toks[len(toks)-1:], StartPos: len(p) + len(toks) - 1, BlockTable: pages, Sample: true}
		}
		seqs := []bridge.SeqStep{s}
		if with != nil {
			seqs = append(with(step), s)
		}
		if err := eng.Step(&bridge.StepDesc{Seqs: seqs, WantLogits: true}, &res); err != nil {
			t.Fatal(err)
		}
		if s.Sample {
			last := len(seqs) - 1
			toks = append(toks, res.Sampled[last])
			// Our row is the last sampled one.
			v := eng.Shape().VocabSize
			logits = append(logits, res.Logits[len(res.Logits)-v:]...)
		}
		step++
	}
	return toks, logits
}

func TestBatchInvariance(t *testing.T) {
	p := prompt(42, 37, 512)
	ref := openTiny(t, 64, 0)
	wantTok, wantLogits := generate(t, ref, p, []int{37}, pageRange(0, 6), 8, nil)

	eng := openTiny(t, 64, 0)
	other := prompt(43, 64, 512)
	companions := func(step int) []bridge.SeqStep {
		// Two other sequences, one prefilling in chunks, one sampled.
		start := (step * 5) % 56
		return []bridge.SeqStep{
			{Tokens: other[start : start+5], StartPos: start, BlockTable: pageRange(40, 8), Sample: true},
			{Tokens: other[:3], StartPos: 0, BlockTable: pageRange(50, 1), Sample: step%2 == 0},
		}
	}
	variants := []struct {
		name   string
		chunks []int
		pages  []int32
		with   func(int) []bridge.SeqStep
	}{
		{"chunked", []int{5, 1, 13}, pageRange(0, 6), nil},
		{"token at a time", []int{1}, pageRange(10, 6), nil},
		{"batched, scattered pages", []int{9, 28}, []int32{33, 7, 21, 2, 30, 12}, companions},
	}
	for _, v := range variants {
		gotTok, gotLogits := generate(t, eng, p, v.chunks, v.pages, 8, v.with)
		if !slices.Equal(gotTok, wantTok) {
			t.Errorf("%s: tokens %v, want %v", v.name, gotTok, wantTok)
		}
		for i := range wantLogits {
			if math.Float32bits(gotLogits[i]) != math.Float32bits(wantLogits[i]) {
				t.Errorf("%s: logit %d = %g, want %g (bit-exact)", v.name, i, gotLogits[i], wantLogits[i])
				break
			}
		}
	}
}

func TestCloseThenStep(t *testing.T) {
	eng, err := Open(bridge.Config{Preset: "tiny", NumPages: 4, TokensPerPage: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	var res bridge.StepResult
	desc := &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: []int32{1}, BlockTable: []int32{0}}}}
	if err := eng.Step(desc, &res); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("Step after Close: %v, want ErrClosed", err)
	}
	if err := eng.CopyPages(bridge.TierDevice, nil, bridge.TierDevice, nil); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("CopyPages after Close: %v, want ErrClosed", err)
	}
	if err := eng.Close(); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
}

func TestStepAllocatesNothing(t *testing.T) {
	eng := openTiny(t, 8, 0)
	desc := &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(1, 9, 512), BlockTable: pageRange(0, 2), Sample: true}}}
	var res bridge.StepResult
	if err := eng.Step(desc, &res); err != nil {
		t.Fatal(err)
	}
	// The least of three measurements: Step hands the call to the engine
	// thread over a channel, and a blocked channel operation takes a waiter
	// record (sudog) from the runtime's per-P cache, which it refills by
	// allocating when that P's cache is empty (seen once under a loaded
	// full test run). An allocation of Step's own shows in every try.
	allocs := math.Inf(1)
	for range 3 {
		allocs = min(allocs, testing.AllocsPerRun(20, func() {
			if err := eng.Step(desc, &res); err != nil {
				t.Fatal(err)
			}
		}))
	}
	if allocs > 0 {
		t.Errorf("Step allocates %.1f times per call in steady state", allocs)
	}
}

// TestDequantizeRowRefusals: a row whose size does not fit its type, a
// column count the blocks do not divide and an unknown type are refused by
// name; a Q8_0 block converts as d*q.
func TestDequantizeRowRefusals(t *testing.T) {
	block := make([]byte, 34)
	block[0], block[1] = 0x00, 0x3c // d = 1.0 (f16)
	for i := range 32 {
		block[2+i] = byte(int8(i - 16))
	}
	got, err := DequantizeRow(bridge.DTypeQ8_0, block, 32)
	require.NoError(t, err)
	require.Equal(t, float32(-16), got[0])
	require.Equal(t, float32(15), got[31])
	for _, c := range []struct {
		dtype bridge.DType
		data  []byte
		cols  int64
		want  string
	}{
		{bridge.DTypeQ8_0, block[:33], 32, "nbytes 33"},
		{bridge.DTypeQ4_K, make([]byte, 144), 128, "not a multiple"},
		{bridge.DType(99), block, 32, "dtype 99"},
		{bridge.DTypeQ6_K, make([]byte, 210), 0, "columns"},
	} {
		_, err := DequantizeRow(c.dtype, c.data, c.cols)
		require.ErrorContains(t, err, c.want)
	}
}
