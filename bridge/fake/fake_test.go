package fake_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
)

const P = 4

func newEngine(t *testing.T, pages, hostPages int) *fake.Engine {
	t.Helper()
	e, err := fake.New(bridge.Config{Preset: "tiny", Seed: 7, NumPages: pages, TokensPerPage: P, NumHostPages: hostPages})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// prompt returns n deterministic tokens below the tiny vocab.
func prompt(n, salt int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((i*31 + salt*17 + 3) % 512)
	}
	return out
}

// prefill runs tokens through e in chunks of the given sizes and returns the
// token sampled by the last chunk.
func prefill(t *testing.T, e *fake.Engine, tokens []int32, table []int32, chunks ...int) int32 {
	t.Helper()
	var res bridge.StepResult
	pos := 0
	for k, n := range chunks {
		seq := bridge.SeqStep{Tokens: tokens[pos : pos+n], StartPos: pos, BlockTable: table, Sample: k == len(chunks)-1}
		if err := e.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{seq}}, &res); err != nil {
			t.Fatal(err)
		}
		pos += n
	}
	if pos != len(tokens) {
		t.Fatalf("chunks cover %d of %d tokens", pos, len(tokens))
	}
	return res.Sampled[0]
}

func TestNewValidation(t *testing.T) {
	good := bridge.Config{Preset: "tiny", NumPages: 4, TokensPerPage: 4}
	bad := bridge.Presets["tiny"]
	bad.HeadDim = 3
	tests := []struct {
		name string
		edit func(c *bridge.Config)
		want string
	}{
		{"unknown preset", func(c *bridge.Config) { c.Preset = "gpt-5" }, "unknown model preset"},
		{"invalid shape", func(c *bridge.Config) { c.Preset = ""; c.Shape = bad }, "head_dim"},
		{"no pages", func(c *bridge.Config) { c.NumPages = 0 }, "num_pages"},
		{"no page size", func(c *bridge.Config) { c.TokensPerPage = -1 }, "tokens_per_page"},
		{"negative host", func(c *bridge.Config) { c.NumHostPages = -1 }, "num_host_pages"},
	}
	for _, tt := range tests {
		cfg := good
		tt.edit(&cfg)
		_, err := fake.New(cfg)
		if !errors.Is(err, bridge.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %q", tt.name, err, tt.want)
		}
	}
	cfg := good
	cfg.Preset, cfg.Shape = "", bridge.Presets["tiny"]
	if e, err := fake.New(cfg); err != nil || e.Shape() != bridge.Presets["tiny"] {
		t.Errorf("explicit shape: %v", err)
	}
}

func TestChunkInvariance(t *testing.T) {
	tokens := prompt(13, 1)
	table := []int32{5, 0, 3, 7}
	var want int32 = -2
	for _, chunks := range [][]int{{13}, {4, 9}, {1, 1, 11}, {5, 8}, {12, 1}} {
		e := newEngine(t, 8, 0)
		got := prefill(t, e, tokens, table, chunks...)
		if want == -2 {
			want = got
		} else if got != want {
			t.Errorf("chunks %v sampled %d, want %d", chunks, got, want)
		}
	}
	// Same content through another block table: same token.
	if got := prefill(t, newEngine(t, 8, 0), tokens, []int32{1, 2, 4, 6}, 13); got != want {
		t.Errorf("other pages sampled %d, want %d", got, want)
	}
}

func TestBatchInvariance(t *testing.T) {
	seqs := []bridge.SeqStep{
		{Tokens: prompt(6, 1), BlockTable: []int32{0, 1}, Sample: true},
		{Tokens: prompt(3, 2), BlockTable: []int32{2}, Sample: false},
		{Tokens: prompt(9, 3), BlockTable: []int32{3, 4, 5}, Sample: true},
	}
	alone := make([]int32, len(seqs))
	for i, sq := range seqs {
		var res bridge.StepResult
		if err := newEngine(t, 8, 0).Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{sq}}, &res); err != nil {
			t.Fatal(err)
		}
		alone[i] = res.Sampled[0]
	}
	var res bridge.StepResult
	if err := newEngine(t, 8, 0).Step(&bridge.StepDesc{Seqs: seqs, WantLogits: true}, &res); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Sampled, alone) || res.Sampled[1] != -1 {
		t.Fatalf("batched %v, alone %v", res.Sampled, alone)
	}
	// Logits: one row per sampled sequence, argmax = sampled token.
	vocab := bridge.Presets["tiny"].VocabSize
	if len(res.Logits) != 2*vocab {
		t.Fatalf("logits len %d, want %d", len(res.Logits), 2*vocab)
	}
	for row, seq := range []int{0, 2} {
		r := res.Logits[row*vocab : (row+1)*vocab]
		if argmax := slices.Index(r, slices.Max(r)); int32(argmax) != res.Sampled[seq] {
			t.Errorf("row %d argmax %d, sampled %d", row, argmax, res.Sampled[seq])
		}
	}
	if res.DeviceMS <= 0 {
		t.Errorf("DeviceMS = %g", res.DeviceMS)
	}
}

// TestContentSensitivity: the sample reads the pages, so a wrong block
// table or a corrupted page changes it.
func TestContentSensitivity(t *testing.T) {
	tokens := prompt(8, 4)
	e := newEngine(t, 8, 0)
	prefill(t, e, tokens, []int32{0, 1}, 8)
	decode := func(table []int32) int32 {
		var res bridge.StepResult
		seq := bridge.SeqStep{Tokens: []int32{9}, StartPos: 8, BlockTable: table, Sample: true}
		if err := e.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{seq}}, &res); err != nil {
			t.Fatal(err)
		}
		return res.Sampled[0]
	}
	good := decode([]int32{0, 1, 2})
	if bad := decode([]int32{1, 0, 3}); bad == good {
		t.Error("swapped block table gave the same token")
	}
	if err := e.CopyPages(bridge.TierDevice, []int32{5}, bridge.TierDevice, []int32{0}); err != nil {
		t.Fatal(err) // page 5 is empty: page 0 is now corrupted
	}
	if bad := decode([]int32{0, 1, 2}); bad == good {
		t.Error("corrupted page gave the same token")
	}
}

func TestStepValidation(t *testing.T) {
	ok := bridge.SeqStep{Tokens: []int32{1, 2}, StartPos: 0, BlockTable: []int32{0}}
	tests := []struct {
		name string
		edit func(s *bridge.SeqStep)
		want string
	}{
		{"no tokens", func(s *bridge.SeqStep) { s.Tokens = nil }, "num_tokens"},
		{"negative start", func(s *bridge.SeqStep) { s.StartPos = -1 }, "start_pos"},
		{"token range", func(s *bridge.SeqStep) { s.Tokens = []int32{1, 512} }, "tokens[1] = 512"},
		{"negative token", func(s *bridge.SeqStep) { s.Tokens = []int32{-3} }, "tokens[0] = -3"},
		{"page range", func(s *bridge.SeqStep) { s.BlockTable = []int32{8} }, "block_table[0] = 8"},
		{"short table", func(s *bridge.SeqStep) { s.StartPos = 3 }, "num_blocks 1"},
		{"empty table", func(s *bridge.SeqStep) { s.BlockTable = nil }, "num_blocks 0"},
		// Since the shared contract (bridge.CheckStep): the fake accepted
		// write conflicts, and named only the block table for positions
		// beyond int32.
		{"int32 positions", func(s *bridge.SeqStep) { s.StartPos = math.MaxInt32 - 1 }, "exceeds the int32 position range"},
		{"write conflict", func(s *bridge.SeqStep) { s.BlockTable = []int32{1} }, "page 1 is also written by seqs[0]"},
	}
	for _, tt := range tests {
		e := newEngine(t, 8, 0)
		bad := ok
		tt.edit(&bad)
		// A valid sequence first: nothing may be written when a later one fails.
		first := bridge.SeqStep{Tokens: []int32{4}, BlockTable: []int32{1}}
		var res bridge.StepResult
		err := e.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{first, bad}}, &res)
		if !errors.Is(err, bridge.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) ||
			!strings.Contains(err.Error(), "seqs[1]") {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming seqs[1] and %q", tt.name, err, tt.want)
		}
		if page, _ := e.ReadPage(bridge.TierDevice, 1); page[0] != -1 {
			t.Errorf("%s: a failed step wrote page 1: %v", tt.name, page)
		}
	}
	e := newEngine(t, 8, 0)
	if err := e.Step(nil, &bridge.StepResult{}); !errors.Is(err, bridge.ErrInvalidArgument) {
		t.Errorf("nil desc: %v", err)
	}
}

func TestCopyRoundTrip(t *testing.T) {
	tokens := prompt(10, 5)
	table := []int32{2, 5, 7}
	decode := func(e *fake.Engine) int32 {
		var res bridge.StepResult
		seq := bridge.SeqStep{Tokens: []int32{11}, StartPos: 10, BlockTable: table, Sample: true}
		if err := e.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{seq}}, &res); err != nil {
			t.Fatal(err)
		}
		return res.Sampled[0]
	}
	ref := newEngine(t, 8, 3)
	prefill(t, ref, tokens, table, 10)
	want := decode(ref)

	e := newEngine(t, 8, 3)
	prefill(t, e, tokens, table, 10)
	if err := e.CopyPages(bridge.TierDevice, table, bridge.TierHost, []int32{0, 1, 2}); err != nil {
		t.Fatal(err)
	}
	// Another sequence scribbles over the device pages while "suspended".
	prefill(t, e, prompt(12, 9), table, 12)
	if err := e.CopyPages(bridge.TierHost, []int32{0, 1, 2}, bridge.TierDevice, table); err != nil {
		t.Fatal(err)
	}
	if got := decode(e); got != want {
		t.Fatalf("after round trip sampled %d, want %d", got, want)
	}
}

func TestCopyValidation(t *testing.T) {
	e := newEngine(t, 4, 2)
	prefill(t, e, prompt(4, 1), []int32{0}, 4)
	before, _ := e.ReadPage(bridge.TierDevice, 1)
	tests := []struct {
		src, dst   []int32
		srcT, dstT bridge.Tier
		want       string
	}{
		{[]int32{0, 1}, []int32{1}, bridge.TierDevice, bridge.TierDevice, "lengths"},
		{[]int32{0, 4}, []int32{1, 2}, bridge.TierDevice, bridge.TierDevice, "src[1] = 4"},
		{[]int32{0, 1}, []int32{1, 2}, bridge.TierDevice, bridge.TierHost, "dst[1] = 2 outside host"},
		{[]int32{0}, []int32{-1}, bridge.TierDevice, bridge.TierDevice, "dst[0] = -1"},
		{[]int32{0}, []int32{1}, bridge.Tier(2), bridge.TierDevice, "tier"},
	}
	for _, tt := range tests {
		err := e.CopyPages(tt.srcT, tt.src, tt.dstT, tt.dst)
		if !errors.Is(err, bridge.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("copy %v→%v: %v, want %q", tt.src, tt.dst, err, tt.want)
		}
	}
	if after, _ := e.ReadPage(bridge.TierDevice, 1); !slices.Equal(before, after) {
		t.Error("a rejected copy changed page 1")
	}
}

func TestCostModel(t *testing.T) {
	e := newEngine(t, 8, 0)
	run := func(n int) float64 {
		var res bridge.StepResult
		seq := bridge.SeqStep{Tokens: prompt(n, 0), BlockTable: []int32{0, 1, 2, 3}}
		if err := e.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{seq}}, &res); err != nil {
			t.Fatal(err)
		}
		return res.DeviceMS
	}
	if a, b, c := run(4), run(16), run(4); !(a < b) || a != c {
		t.Errorf("DeviceMS 4→%g 16→%g 4→%g: want monotone and reproducible", a, b, c)
	}
}

func TestResultReuse(t *testing.T) {
	e := newEngine(t, 8, 0)
	res := bridge.StepResult{Sampled: make([]int32, 0, 4)}
	backing := &res.Sampled[:1][0]
	seq := bridge.SeqStep{Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true}
	other := seq
	other.BlockTable = []int32{1} // two sequences never write one page
	if err := e.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{seq, other}}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Sampled) != 2 || &res.Sampled[0] != backing || len(res.Logits) != 0 {
		t.Errorf("result not reused: %+v", res)
	}
}

func TestClosedAndValidateOnly(t *testing.T) {
	e := newEngine(t, 4, 1)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	var res bridge.StepResult
	desc := &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: []int32{1}, BlockTable: []int32{0}}}}
	if err := e.Step(desc, &res); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("step after close: %v", err)
	}
	if err := e.CopyPages(bridge.TierDevice, nil, bridge.TierHost, nil); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("copy after close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	v, err := fake.New(bridge.Config{Preset: "llama-70b", NumPages: 1 << 20, TokensPerPage: 64, ValidateOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Step(desc, &res); !errors.Is(err, bridge.ErrUnsupported) {
		t.Errorf("validate-only step: %v", err)
	}
}
