package twin_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/twin"
)

const P = 16

func profile(t testing.TB, gpu, model string) *twin.Profile {
	t.Helper()
	p, err := twin.BuiltinProfile(gpu, model, twin.Parallelism{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newEngine(t testing.TB, model string, pages, hostPages int) *twin.Engine {
	t.Helper()
	e, err := twin.New(bridge.Config{Preset: model, Seed: 11, NumPages: pages, TokensPerPage: P, NumHostPages: hostPages},
		profile(t, "h200", model))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// prompt returns n deterministic tokens below vocab 1000.
func prompt(n, salt int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((i*37 + salt*101 + 5) % 1000)
	}
	return out
}

// table returns a block table of consecutive pages from first covering n tokens.
func table(first, n int) []int32 {
	bt := make([]int32, (n+P-1)/P)
	for i := range bt {
		bt[i] = int32(first + i)
	}
	return bt
}

// generate prefills toks in chunks of chunk tokens (each chunk in its own
// step, padded with a decoy sequence when withDecoy), then decodes steps
// tokens, and returns the sampled tokens.
func generate(t *testing.T, e *twin.Engine, toks []int32, chunk, firstPage, steps int, withDecoy bool) []int32 {
	t.Helper()
	total := len(toks) + steps
	bt := table(firstPage, total)
	decoy := bridge.SeqStep{Tokens: prompt(5, 9), BlockTable: []int32{0}, Sample: true}
	var res bridge.StepResult
	var out []int32
	seq := append([]int32(nil), toks...)
	for pos := 0; pos < len(seq); {
		n := min(chunk, len(seq)-pos)
		d := bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: seq[pos : pos+n], StartPos: pos, BlockTable: bt, Sample: pos+n == len(seq)}}}
		if withDecoy {
			d.Seqs = append([]bridge.SeqStep{decoy}, d.Seqs...)
		}
		if err := e.Step(&d, &res); err != nil {
			t.Fatal(err)
		}
		pos += n
		if pos == len(seq) {
			last := res.Sampled[len(res.Sampled)-1]
			out = append(out, last)
			if len(out) < steps {
				seq = append(seq, last)
			}
		}
	}
	return out
}

func TestTokensIndependentOfBatchingChunkingAndRank(t *testing.T) {
	toks := prompt(45, 1)
	a := generate(t, newEngine(t, "llama-8b", 64, 0), toks, 45, 10, 6, false)
	b := generate(t, newEngine(t, "llama-8b", 64, 0), toks, 7, 20, 6, true)   // chunked, batched, other pages
	c := generate(t, newEngine(t, "llama-8b", 128, 4), toks, 16, 90, 6, true) // another "rank"
	if len(a) != 6 || !slices.Equal(a, b) || !slices.Equal(a, c) {
		t.Errorf("tokens differ across batching/chunking/rank:\n%v\n%v\n%v", a, b, c)
	}
	other, _ := twin.New(bridge.Config{Preset: "llama-8b", Seed: 12, NumPages: 64, TokensPerPage: P}, profile(t, "h200", "llama-8b"))
	if d := generate(t, other, toks, 45, 10, 6, false); slices.Equal(a, d) {
		t.Error("a different seed must give different tokens")
	}
}

func TestDeviceMSIsTheModelledCost(t *testing.T) {
	e := newEngine(t, "deepseek-v3", 64, 0)
	p := e.Profile()
	d := bridge.StepDesc{Seqs: []bridge.SeqStep{
		{Tokens: prompt(1, 1), StartPos: 300, BlockTable: table(0, 301)},
		{Tokens: prompt(40, 2), StartPos: 17, BlockTable: table(30, 57), Sample: true},
	}}
	var res bridge.StepResult
	if err := e.Step(&d, &res); err != nil {
		t.Fatal(err)
	}
	want := p.StepCost([]twin.Work{{NewTokens: 1, KVBefore: 300}, {NewTokens: 40, KVBefore: 17}})
	if res.DeviceMS != want.MS() || e.LastStepCost() != want {
		t.Errorf("DeviceMS %v, LastStepCost %+v; want %v, %+v", res.DeviceMS, e.LastStepCost(), want.MS(), want)
	}
	if res.Sampled[0] != -1 || res.Sampled[1] < 0 {
		t.Errorf("sampled %v: -1 where not sampled, a token where sampled", res.Sampled)
	}
	// Submit two, wait in order: each Wait delivers its own step's cost.
	d1 := bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(1, 3), StartPos: 5, BlockTable: table(0, 6), Sample: true}}}
	d2 := bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(200, 4), StartPos: 0, BlockTable: table(0, 200), Sample: true}}}
	if err := e.Submit(&d1); err != nil {
		t.Fatal(err)
	}
	if err := e.Submit(&d2); err != nil {
		t.Fatal(err)
	}
	for _, w := range []twin.Work{{NewTokens: 1, KVBefore: 5}, {NewTokens: 200, KVBefore: 0}} {
		if err := e.Wait(&res); err != nil {
			t.Fatal(err)
		}
		if c := p.StepCost([]twin.Work{w}); res.DeviceMS != c.MS() || e.LastStepCost() != c {
			t.Errorf("wait %+v: DeviceMS %v, want %v", w, res.DeviceMS, c.MS())
		}
	}
}

func TestLogitsArgmaxIsTheSampledToken(t *testing.T) {
	e := newEngine(t, "llama-8b", 8, 0)
	d := bridge.StepDesc{WantLogits: true, Seqs: []bridge.SeqStep{
		{Tokens: prompt(3, 1), BlockTable: []int32{0}, Sample: true},
		{Tokens: prompt(3, 2), BlockTable: []int32{1}},
		{Tokens: prompt(9, 3), BlockTable: []int32{2}, Sample: true},
	}}
	var res bridge.StepResult
	if err := e.Step(&d, &res); err != nil {
		t.Fatal(err)
	}
	V := e.Shape().VocabSize
	if len(res.Logits) != 2*V {
		t.Fatalf("%d logits, want 2 rows of %d", len(res.Logits), V)
	}
	for row, seq := range []int{0, 2} {
		r := res.Logits[row*V : (row+1)*V]
		if best := slices.Index(r, slices.Max(r)); int32(best) != res.Sampled[seq] {
			t.Errorf("row %d argmax %d, sampled %d", row, best, res.Sampled[seq])
		}
	}
}

func TestShapes(t *testing.T) {
	if got := newEngine(t, "llama-70b", 4, 0).Shape(); got != bridge.Presets["llama-70b"] {
		t.Errorf("llama-70b shape %+v", got)
	}
	s := newEngine(t, "deepseek-v3", 4, 0).Shape()
	if err := s.Validate(); err != nil || s.VocabSize != 129280 || s.NumLayers != 61 {
		t.Errorf("deepseek-v3 shape %+v: %v", s, err)
	}
}

func TestNewRejects(t *testing.T) {
	p := profile(t, "h200", "llama-8b")
	for _, tc := range []struct {
		cfg  bridge.Config
		prof *twin.Profile
		want string
		is   error
	}{
		{bridge.Config{NumPages: 4, TokensPerPage: P}, nil, "needs a cost profile", bridge.ErrInvalidArgument},
		{bridge.Config{NumPages: 4, TokensPerPage: P}, &twin.Profile{}, "not validated", bridge.ErrInvalidArgument},
		{bridge.Config{Preset: "llama-70b", NumPages: 4, TokensPerPage: P}, p, `model "llama-70b" does not match the cost profile's model "llama-8b"`, bridge.ErrInvalidArgument},
		{bridge.Config{Shape: bridge.Presets["tiny"], NumPages: 4, TokensPerPage: P}, p, "does not match the cost profile's model", bridge.ErrInvalidArgument},
		{bridge.Config{NumPages: 0, TokensPerPage: P}, p, "num_pages must be positive", bridge.ErrInvalidArgument},
		{bridge.Config{NumPages: 4, TokensPerPage: 0}, p, "tokens_per_page must be positive", bridge.ErrInvalidArgument},
		{bridge.Config{NumPages: 4, TokensPerPage: P, NumHostPages: -1}, p, "num_host_pages must not be negative", bridge.ErrInvalidArgument},
		{bridge.Config{NumPages: 4, TokensPerPage: P, Helix: &bridge.HelixMember{Size: 2}}, p, "Helix", bridge.ErrUnsupported},
	} {
		_, err := twin.New(tc.cfg, tc.prof)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.is) {
			t.Errorf("New(%+v): %v, want %q (%v)", tc.cfg, err, tc.want, tc.is)
		}
	}
}

func TestStepValidation(t *testing.T) {
	V := int32(bridge.Presets["llama-8b"].VocabSize)
	for _, tc := range []struct {
		name string
		seqs []bridge.SeqStep
		want string
	}{
		{"no tokens", []bridge.SeqStep{{BlockTable: []int32{0}}}, "seqs[0]: num_tokens must be >= 1, got 0"},
		{"negative start", []bridge.SeqStep{{Tokens: prompt(1, 1), StartPos: -1, BlockTable: []int32{0}}}, "seqs[0]: start_pos must be >= 0"},
		{"short table", []bridge.SeqStep{{Tokens: prompt(2, 1), StartPos: P - 1, BlockTable: []int32{0}}},
			"seqs[0]: num_blocks 1 covers 16 tokens, positions up to 16 need 2 blocks"},
		{"token range", []bridge.SeqStep{{Tokens: []int32{5, V}, BlockTable: []int32{0}}}, "seqs[0]: tokens[1] = 128256 outside [0, vocab_size 128256)"},
		{"negative token", []bridge.SeqStep{{Tokens: []int32{-2}, BlockTable: []int32{0}}}, "tokens[0] = -2"},
		{"page range", []bridge.SeqStep{{Tokens: prompt(3, 1), StartPos: P, BlockTable: []int32{0, 8}}},
			"seqs[0]: block_table[1] = 8 outside [0, num_pages 8)"},
		{"negative page", []bridge.SeqStep{{Tokens: prompt(3, 1), BlockTable: []int32{-1}}}, "block_table[0] = -1"},
		// Refused since the shared contract (bridge.CheckStep), as by the
		// fake and native engines: the twin checked only written entries.
		{"read-only page range", []bridge.SeqStep{{Tokens: prompt(3, 1), StartPos: P, BlockTable: []int32{8, 0}}},
			"seqs[0]: block_table[0] = 8 outside [0, num_pages 8)"},
		{"unused page range", []bridge.SeqStep{{Tokens: prompt(3, 1), BlockTable: []int32{0, -4}}}, "seqs[0]: block_table[1] = -4"},
		{"int32 positions", []bridge.SeqStep{{Tokens: prompt(2, 1), StartPos: 1<<31 - 2, BlockTable: []int32{0}}},
			"seqs[0]: start_pos + num_tokens = 2147483648 exceeds the int32 position range"},
		{"write conflict", []bridge.SeqStep{
			{Tokens: prompt(3, 1), BlockTable: []int32{2}},
			{Tokens: prompt(2, 2), StartPos: P, BlockTable: []int32{1, 2}},
		}, "seqs[1]: block_table[1] = page 2 is also written by seqs[0] in this step"},
	} {
		e := newEngine(t, "llama-8b", 8, 0)
		var res bridge.StepResult
		err := e.Step(&bridge.StepDesc{Seqs: tc.seqs}, &res)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, bridge.ErrInvalidArgument) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		if e.LastStepCost() != (twin.StepCost{}) {
			t.Errorf("%s: a refused step must not record a cost", tc.name)
		}
		// The engine stays usable, and the refused step left no writer marks.
		ok := bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(2, 1), BlockTable: []int32{2}}, {Tokens: prompt(2, 1), BlockTable: []int32{1}}}}
		if err := e.Step(&ok, &res); err != nil {
			t.Errorf("%s: valid step after a refused one: %v", tc.name, err)
		}
	}
	// Sequences may share pages they only read (a common prefix).
	e := newEngine(t, "llama-8b", 8, 0)
	shared := bridge.StepDesc{Seqs: []bridge.SeqStep{
		{Tokens: prompt(1, 1), StartPos: P, BlockTable: []int32{0, 3}, Sample: true},
		{Tokens: prompt(1, 2), StartPos: P + 4, BlockTable: []int32{0, 4}, Sample: true},
	}}
	var res bridge.StepResult
	if err := e.Step(&shared, &res); err != nil {
		t.Errorf("shared read-only prefix page: %v", err)
	}
	// An empty step is valid (as in the native engine) and costs nothing.
	if err := e.Step(&bridge.StepDesc{}, &res); err != nil || res.DeviceMS != 0 || len(res.Sampled) != 0 {
		t.Errorf("empty step: %v, %+v", err, res)
	}
}

func TestCallOrderAndLifecycle(t *testing.T) {
	e := newEngine(t, "llama-8b", 8, 2)
	d := bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(1, 1), BlockTable: []int32{0}, Sample: true}}}
	var res bridge.StepResult
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"nil desc", func() error { return e.Step(nil, &res) }, "desc and res must not be nil"},
		{"wait idle", func() error { return e.Wait(&res) }, "no submitted step to wait for"},
		{"submit 1", func() error { return e.Submit(&d) }, ""},
		{"step while in flight", func() error { return e.Step(&d, &res) }, "1 submitted steps have not been waited for"},
		{"submit 2", func() error { return e.Submit(&d) }, ""},
		{"submit 3", func() error { return e.Submit(&d) }, "2 steps are already in flight"},
		{"wait 1", func() error { return e.Wait(&res) }, ""},
		{"wait 2", func() error { return e.Wait(&res) }, ""},
		{"copy ok", func() error { return e.CopyPages(bridge.TierDevice, []int32{0, 7}, bridge.TierHost, []int32{1, 0}) }, ""},
		{"copy lengths", func() error { return e.CopyPages(bridge.TierDevice, []int32{0}, bridge.TierHost, nil) }, "src has 1 pages, dst 0"},
		{"copy host range", func() error { return e.CopyPages(bridge.TierHost, []int32{2}, bridge.TierDevice, []int32{0}) }, "src[0] = 2 outside host pages [0, 2)"},
		{"copy device range", func() error { return e.CopyPages(bridge.TierHost, []int32{0}, bridge.TierDevice, []int32{8}) }, "dst[0] = 8 outside device pages [0, 8)"},
		{"copy tier", func() error { return e.CopyPages(2, []int32{0}, bridge.TierDevice, []int32{0}) }, "tier must be 0 (device) or 1 (host), got 2"},
	} {
		err := tc.call()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	noHost := newEngine(t, "llama-8b", 8, 0)
	if err := noHost.CopyPages(bridge.TierDevice, []int32{0}, bridge.TierHost, []int32{0}); err == nil {
		t.Error("copy to a host tier that does not exist must fail")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Step(&d, &res); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("step after close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	vo, err := twin.New(bridge.Config{Preset: "llama-8b", NumPages: 4, TokensPerPage: P, ValidateOnly: true}, profile(t, "h200", "llama-8b"))
	if err != nil {
		t.Fatal(err)
	}
	if err := vo.Step(&d, &res); !errors.Is(err, bridge.ErrUnsupported) {
		t.Errorf("validate-only step: %v", err)
	}
}
