package bridge

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// geom is a small geometry: 8 device pages, 2 host pages of 4 tokens, a
// vocabulary of 100.
var geom = Geometry{DevicePages: 8, HostPages: 2, TokensPerPage: 4, VocabSize: 100, HelixSize: 1}

func TestGeometryOf(t *testing.T) {
	cfg := Config{NumPages: 8, NumHostPages: 2, TokensPerPage: 4}
	if g := GeometryOf(cfg, ModelShape{VocabSize: 100}); g != geom {
		t.Errorf("GeometryOf = %+v, want %+v", g, geom)
	}
	cfg.Helix = &HelixMember{Rank: 1, Size: 3}
	if g := GeometryOf(cfg, ModelShape{VocabSize: 100}); g.HelixSize != 3 || g.HelixRank != 1 {
		t.Errorf("Helix geometry %+v", g)
	}
}

// wantInvalid fails unless err is an INVALID_ARGUMENT *Error of op whose
// message contains want.
func wantInvalid(t *testing.T, name string, err error, op, want string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrInvalidArgument) || e.Op != op || !strings.Contains(e.Msg, want) {
		t.Errorf("%s: %v, want INVALID_ARGUMENT of %s containing %q", name, err, op, want)
	}
}

func TestCheckStepRules(t *testing.T) {
	ok := SeqStep{Tokens: []int32{1, 2}, BlockTable: []int32{0}}
	tests := []struct {
		name string
		edit func(s *SeqStep)
		want string // "" = valid
	}{
		{"valid", func(s *SeqStep) {}, ""},
		{"table exactly covers", func(s *SeqStep) { s.StartPos = 2 }, ""},
		{"longer table", func(s *SeqStep) { s.BlockTable = []int32{0, 5, 7} }, ""},
		{"greedy with seed", func(s *SeqStep) { s.Sampling.Seed = 9 }, ""},
		{"no tokens", func(s *SeqStep) { s.Tokens = nil }, "seqs[1]: num_tokens must be >= 1, got 0"},
		{"negative start", func(s *SeqStep) { s.StartPos = -1 }, "seqs[1]: start_pos must be >= 0, got -1"},
		{"int32 range", func(s *SeqStep) { s.StartPos = math.MaxInt32 - 1 },
			"seqs[1]: start_pos + num_tokens = 2147483648 exceeds the int32 position range"},
		{"int32 range, last position", func(s *SeqStep) { s.StartPos = math.MaxInt32 - 2 }, "seqs[1]: num_blocks 1"},
		{"start beyond int32", func(s *SeqStep) { s.StartPos = math.MaxInt32 + 5 }, "int32 position range"},
		{"short table", func(s *SeqStep) { s.StartPos = 3 },
			"seqs[1]: num_blocks 1 covers 4 tokens, positions up to 4 need 2 blocks"},
		{"empty table", func(s *SeqStep) { s.BlockTable = nil }, "seqs[1]: num_blocks 0 covers 0 tokens"},
		{"temperature", func(s *SeqStep) { s.Sampling.Temperature = -1 }, "seqs[1]: sampling temperature"},
		{"NaN temperature", func(s *SeqStep) { s.Sampling.Temperature = float32(math.NaN()) }, "seqs[1]: sampling temperature"},
		{"top_k", func(s *SeqStep) { s.Sampling.TopK = -1 }, "seqs[1]: sampling top_k"},
		{"top_p", func(s *SeqStep) { s.Sampling.TopP = 1.5 }, "seqs[1]: sampling top_p"},
		{"token range", func(s *SeqStep) { s.Tokens = []int32{1, 100} }, "seqs[1]: tokens[1] = 100 outside [0, vocab_size 100)"},
		{"negative token", func(s *SeqStep) { s.Tokens = []int32{-3} }, "seqs[1]: tokens[0] = -3"},
		{"written page range", func(s *SeqStep) { s.BlockTable = []int32{8} }, "seqs[1]: block_table[0] = 8 outside [0, num_pages 8)"},
		{"negative page", func(s *SeqStep) { s.BlockTable = []int32{-1} }, "seqs[1]: block_table[0] = -1"},
		{"read-only page range", func(s *SeqStep) { s.StartPos, s.BlockTable = 4, []int32{9, 2} }, "seqs[1]: block_table[0] = 9"},
		{"unused page range", func(s *SeqStep) { s.BlockTable = []int32{2, math.MinInt32} }, "seqs[1]: block_table[1] = -2147483648"},
		{"write conflict", func(s *SeqStep) { s.BlockTable = []int32{3} },
			"seqs[1]: block_table[0] = page 3 is also written by seqs[0] in this step"},
		{"reads the page another writes", func(s *SeqStep) { s.StartPos, s.BlockTable = 4, []int32{3, 6} }, ""},
	}
	c := NewStepChecker(geom)
	for _, tt := range tests {
		// A valid first sequence (writing page 3): the bad one is seqs[1].
		seq := ok
		tt.edit(&seq)
		d := &StepDesc{Seqs: []SeqStep{{Tokens: []int32{7}, BlockTable: []int32{3}}, seq}}
		err := c.Check("submit", d)
		if tt.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want valid", tt.name, err)
			}
			continue
		}
		wantInvalid(t, tt.name, err, "submit", tt.want)
		// The package-level function agrees and names op "step".
		wantInvalid(t, tt.name, CheckStep(d, geom), "step", tt.want)
	}
	if err := c.Check("step", &StepDesc{}); err != nil {
		t.Errorf("empty step: %v", err)
	}
	wantInvalid(t, "nil desc", c.Check("step", nil), "step", "desc must not be nil")
}

// TestCheckStepLeavesNoWriterMarks: a refused or accepted step leaves the
// checker's scratch clean, so the next step's conflicts are its own.
func TestCheckStepLeavesNoWriterMarks(t *testing.T) {
	c := NewStepChecker(geom)
	a := SeqStep{Tokens: []int32{1}, BlockTable: []int32{2}}
	b := SeqStep{Tokens: []int32{1}, BlockTable: []int32{4}}
	conflict := &StepDesc{Seqs: []SeqStep{a, b, {Tokens: []int32{1}, BlockTable: []int32{2}}}}
	wantInvalid(t, "conflict", c.Check("step", conflict), "step", "seqs[2]: block_table[0] = page 2 is also written by seqs[0]")
	for range 2 {
		if err := c.Check("step", &StepDesc{Seqs: []SeqStep{b, a}}); err != nil {
			t.Fatalf("after a refused step: %v", err)
		}
	}
	// A sequence may write the same page twice (several new tokens in it).
	if err := c.Check("step", &StepDesc{Seqs: []SeqStep{{Tokens: []int32{1, 2, 3, 4, 5}, BlockTable: []int32{2, 4}}}}); err != nil {
		t.Errorf("one sequence over two pages: %v", err)
	}
}

// TestCheckStepHelix follows native build_batch: a block-table entry is a
// ledger block of P·size tokens, and only the owner's pages are written.
func TestCheckStepHelix(t *testing.T) {
	g := geom
	g.HelixSize, g.HelixRank = 2, 1
	c := NewStepChecker(g)
	// Positions [0, 12): global pages 0, 1, 2 → ledger blocks 0, 0, 1.
	seq := SeqStep{Tokens: make([]int32, 12), BlockTable: []int32{0, 1}}
	if err := c.Check("step", &StepDesc{Seqs: []SeqStep{seq}}); err != nil {
		t.Fatalf("two ledger blocks cover 16 tokens: %v", err)
	}
	seq.BlockTable = []int32{0}
	wantInvalid(t, "short", c.Check("step", &StepDesc{Seqs: []SeqStep{seq}}), "step",
		"seqs[0]: num_blocks 1 covers 8 tokens, positions up to 11 need 2 blocks")
	// Rank 1 writes global page 1 (local block 0) for the first sequence; the
	// second writes global page 2 (rank 0's), so its local block 1 = page 5
	// is only read here and may be shared.
	first := SeqStep{Tokens: []int32{1}, StartPos: 4, BlockTable: []int32{5}}
	second := SeqStep{Tokens: []int32{1}, StartPos: 8, BlockTable: []int32{6, 5}}
	if err := c.Check("step", &StepDesc{Seqs: []SeqStep{first, second}}); err != nil {
		t.Errorf("a page rank 1 does not write is shared: %v", err)
	}
	second.StartPos = 12 // global page 3: rank 1's, local block 1 = page 5
	wantInvalid(t, "owned conflict", c.Check("step", &StepDesc{Seqs: []SeqStep{first, second}}), "step",
		"seqs[1]: block_table[1] = page 5 is also written by seqs[0]")
}

func TestCheckCopyRules(t *testing.T) {
	tests := []struct {
		srcT, dstT Tier
		src, dst   []int32
		want       string // "" = valid
	}{
		{TierDevice, TierHost, []int32{0, 7}, []int32{1, 0}, ""},
		{TierDevice, TierDevice, nil, nil, ""},
		{TierDevice, TierDevice, []int32{3, 3}, []int32{3, 4}, ""},
		{TierDevice, TierDevice, []int32{0, 1}, []int32{1}, "src has 2 pages, dst 1: lengths must be equal"},
		{TierDevice, TierDevice, []int32{0, 8}, []int32{1, 2}, "src[1] = 8 outside device pages [0, 8)"},
		{TierDevice, TierHost, []int32{0, 1}, []int32{1, 2}, "dst[1] = 2 outside host pages [0, 2)"},
		{TierHost, TierDevice, []int32{-1}, []int32{0}, "src[0] = -1 outside host pages"},
		{TierDevice, TierDevice, []int32{0}, []int32{-1}, "dst[0] = -1"},
		{Tier(2), TierDevice, []int32{0}, []int32{1}, "tier must be 0 (device) or 1 (host), got 2"},
		{TierDevice, Tier(-1), []int32{0}, []int32{1}, "tier must be 0 (device) or 1 (host), got -1"},
		{Tier(2), TierDevice, []int32{0, 1}, []int32{1}, "tier must be"}, // tiers before lengths
	}
	for _, tt := range tests {
		err := CheckCopy(tt.srcT, tt.src, tt.dstT, tt.dst, geom)
		name := tt.srcT.String() + "→" + tt.dstT.String()
		if tt.want == "" {
			if err != nil {
				t.Errorf("%s %v→%v: %v, want valid", name, tt.src, tt.dst, err)
			}
			continue
		}
		wantInvalid(t, name, err, "copy_pages", tt.want)
	}
	noHost := geom
	noHost.HostPages = 0
	wantInvalid(t, "no host tier", CheckCopy(TierDevice, []int32{0}, TierHost, []int32{0}, noHost), "copy_pages",
		"dst[0] = 0 outside host pages [0, 0)")
}

func TestTierString(t *testing.T) {
	for tier, want := range map[Tier]string{TierDevice: "device", TierHost: "host", 5: "Tier(5)"} {
		if got := tier.String(); got != want {
			t.Errorf("Tier(%d).String() = %q, want %q", int(tier), got, want)
		}
	}
}

func BenchmarkCheckStep64(b *testing.B) {
	g := Geometry{DevicePages: 1 << 16, TokensPerPage: 32, VocabSize: 128256, HelixSize: 1}
	var d StepDesc
	next := int32(0)
	for i := range 64 {
		n := 1 + i*997/32
		bt := make([]int32, n)
		for k := range bt {
			bt[k] = next
			next++
		}
		d.Seqs = append(d.Seqs, SeqStep{Tokens: []int32{1}, StartPos: n*32 - 1, BlockTable: bt})
	}
	c := NewStepChecker(g)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Check("step", &d); err != nil {
			b.Fatal(err)
		}
	}
}
