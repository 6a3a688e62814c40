package enginetest

import (
	"math"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// badSeq is a descriptor edit the contract refuses, and the keywords every
// engine's message must contain (normalised: "start_pos" matches
// "StartPos").
type badSeq struct {
	name     string
	edit     func(s *bridge.SeqStep)
	keywords []string
}

// badSeqs edits a valid sequence of two tokens at position 0 on page 3.
func badSeqs() []badSeq {
	beyond := int64(math.MaxInt32) + 1
	return []badSeq{
		{"no tokens", func(s *bridge.SeqStep) { s.Tokens = nil }, []string{"num_tokens"}},
		{"negative start", func(s *bridge.SeqStep) { s.StartPos = -1 }, []string{"start_pos"}},
		{"positions beyond int32", func(s *bridge.SeqStep) { s.StartPos = math.MaxInt32 - 1 }, []string{"int32"}},
		{"start beyond int32", func(s *bridge.SeqStep) { s.StartPos = int(beyond) }, []string{"int32"}},
		{"block table too short", func(s *bridge.SeqStep) { s.StartPos = 3 }, []string{"num_blocks"}},
		{"empty block table", func(s *bridge.SeqStep) { s.BlockTable = nil }, []string{"num_blocks"}},
		{"token beyond vocab", func(s *bridge.SeqStep) { s.Tokens[1] = math.MaxInt32 }, []string{"tokens"}},
		{"negative token", func(s *bridge.SeqStep) { s.Tokens[0] = -2 }, []string{"tokens"}},
		{"written page out of range", func(s *bridge.SeqStep) { s.BlockTable = []int32{DevicePages} }, []string{"block_table"}},
		{"negative page", func(s *bridge.SeqStep) { s.BlockTable = []int32{-1} }, []string{"block_table"}},
		{"read page out of range", func(s *bridge.SeqStep) { s.StartPos, s.BlockTable = TokensPerPage, []int32{DevicePages, 3} },
			[]string{"block_table"}},
		{"unused page out of range", func(s *bridge.SeqStep) { s.BlockTable = []int32{3, -7} }, []string{"block_table"}},
		{"write conflict", func(s *bridge.SeqStep) { s.BlockTable = []int32{0} }, []string{"block_table", "also written"}},
		{"temperature", func(s *bridge.SeqStep) { s.Sample, s.Sampling.Temperature = true, -1 }, []string{"temperature"}},
		{"NaN temperature", func(s *bridge.SeqStep) { s.Sample, s.Sampling.Temperature = true, float32(math.NaN()) },
			[]string{"temperature"}},
		{"temperature of an unsampled sequence", func(s *bridge.SeqStep) { s.Sampling.Temperature = -1 }, []string{"temperature"}},
		{"top_k", func(s *bridge.SeqStep) { s.Sample, s.Sampling.TopK = true, -1 }, []string{"top_k"}},
		{"top_p", func(s *bridge.SeqStep) { s.Sample, s.Sampling.TopP = true, 1.5 }, []string{"top_p"}},
		{"mask of the wrong length", func(s *bridge.SeqStep) { s.Sample, s.Allowed = true, []uint32{1} }, []string{"allowed"}},
		{"mask allowing nothing", func(s *bridge.SeqStep) {
			s.Sample, s.Allowed = true, make([]uint32, bridge.AllowedWords(Config().Shape.VocabSize))
		}, []string{"allowed"}},
	}
}

// namesSeq1 reports whether a message names sequence 1: the Go engines'
// "seqs[1]", native's "sequence 1", or one of the ABI's per-sequence
// arrays at index 1.
func namesSeq1(msg string) bool {
	m := normalise(msg)
	for _, k := range []string{"seqs[1]", "sequence 1", "numtokens[1]", "startpos[1]", "numblocks[1]"} {
		if strings.Contains(m, k) {
			return true
		}
	}
	return false
}

// stepValidation: every engine refuses each bad descriptor, from Step and
// from Submit, with INVALID_ARGUMENT naming the op, the sequence and the
// field; bridge.CheckStep refuses it too; a refused step writes nothing
// and queues nothing.
func (s *suite) stepValidation(t *testing.T) {
	e, cfg := s.engine(t)
	g := bridge.GeometryOf(cfg, e.Shape())
	// X: seven tokens on pages 0 and 1; its last step is re-run at the end.
	x := prompt(7, 1)
	step(t, e, desc(bridge.SeqStep{Tokens: x[:6], BlockTable: []int32{0, 1}}))
	last := withLogits(bridge.SeqStep{Tokens: x[6:], StartPos: 6, BlockTable: []int32{0, 1}, Sample: true})
	before := step(t, e, last)
	for _, c := range badSeqs() {
		bad := bridge.SeqStep{Tokens: prompt(2, 5), BlockTable: []int32{3}}
		c.edit(&bad)
		// The valid first sequence overwrites X's page 0: were a refused
		// step partly run, X's re-run would differ.
		d := desc(bridge.SeqStep{Tokens: prompt(3, 9), BlockTable: []int32{0}, Sample: true}, bad)
		if err := bridge.CheckStep(d, g); err == nil {
			t.Errorf("%s: bridge.CheckStep accepts it", c.name)
		}
		var res bridge.StepResult
		for _, op := range []string{"step", "submit"} {
			var err error
			if op == "step" {
				err = e.Step(d, &res)
			} else {
				err = e.Submit(d)
			}
			wantInvalid(t, op+" "+c.name, err, op, c.keywords...)
			if err != nil && !namesSeq1(err.Error()) {
				t.Errorf("%s %s: %q does not name sequence 1", op, c.name, err)
			}
		}
		// The refused Submit queued nothing.
		wantInvalid(t, "wait after a refused submit", e.Wait(&res), "wait", "no submitted step")
	}
	if after := step(t, e, last); !s.sameOutput(before, after) {
		t.Errorf("refused steps changed X's pages: %v then %v", before.Sampled, after.Sampled)
	}
}

// validSteps: descriptors at the edges of the contract are accepted by the
// engine and by bridge.CheckStep alike.
func (s *suite) validSteps(t *testing.T) {
	e, cfg := s.engine(t)
	g := bridge.GeometryOf(cfg, e.Shape())
	first := bridge.SeqStep{Tokens: prompt(3, 9), BlockTable: []int32{0}, Sample: true}
	seq := func(start int, table ...int32) bridge.SeqStep {
		return bridge.SeqStep{Tokens: prompt(2, 5), StartPos: start, BlockTable: table, Sample: true}
	}
	stochastic := seq(0, 3)
	stochastic.Sampling = bridge.SamplingParams{Temperature: 0.8, TopK: 40, TopP: 0.9, Seed: 3}
	for _, c := range []struct {
		name string
		d    *bridge.StepDesc
	}{
		{"two sequences", desc(first, seq(0, 3))},
		{"table exactly covers", desc(first, seq(TokensPerPage-2, 3))},
		{"table longer than needed", desc(first, seq(0, 3, 9, DevicePages-1))},
		{"reads a page another sequence writes", desc(first, seq(TokensPerPage, 0, 3))},
		{"shared read-only prefix", desc(seq(TokensPerPage, 5, 6), seq(TokensPerPage+1, 5, 7))},
		{"stochastic sampling", desc(first, stochastic)},
		{"greedy with a seed", desc(bridge.SeqStep{Tokens: prompt(1, 2), BlockTable: []int32{4},
			Sample: true, Sampling: bridge.SamplingParams{Seed: 99}})},
		{"empty step", desc()},
	} {
		if err := bridge.CheckStep(c.d, g); err != nil {
			t.Errorf("%s: bridge.CheckStep refuses it: %v", c.name, err)
		}
		var res bridge.StepResult
		if err := e.Step(c.d, &res); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// copyValidation: every engine refuses each bad page copy with
// INVALID_ARGUMENT naming the field, as bridge.CheckCopy does, and a
// refused copy changes no page.
func (s *suite) copyValidation(t *testing.T) {
	e, cfg := s.engine(t)
	g := bridge.GeometryOf(cfg, e.Shape())
	x := prompt(7, 2)
	step(t, e, desc(bridge.SeqStep{Tokens: x[:6], BlockTable: []int32{0, 1}}))
	last := withLogits(bridge.SeqStep{Tokens: x[6:], StartPos: 6, BlockTable: []int32{0, 1}, Sample: true})
	before := step(t, e, last)
	dev, host := bridge.TierDevice, bridge.TierHost
	// Each bad list starts with a valid copy of empty page 15 onto X's
	// page 0: were a refused copy partly run, X's re-run would differ.
	for _, c := range []struct {
		name       string
		srcT, dstT bridge.Tier
		src, dst   []int32
		keyword    string
	}{
		{"lengths differ", dev, dev, []int32{15, 1}, []int32{0}, "src has"},
		{"src beyond the device tier", dev, host, []int32{15, DevicePages}, []int32{0, 1}, "src[1]"},
		{"dst beyond the host tier", dev, host, []int32{15, 1}, []int32{0, HostPages}, "dst[1]"},
		{"negative src", dev, dev, []int32{15, -1}, []int32{0, 2}, "src[1]"},
		{"negative dst", dev, dev, []int32{15, 2}, []int32{0, -3}, "dst[1]"},
		{"src tier", bridge.Tier(2), dev, []int32{15}, []int32{0}, "tier"},
		{"dst tier", dev, bridge.Tier(-1), []int32{15}, []int32{0}, "tier"},
	} {
		src, dst := c.src, c.dst
		if err := bridge.CheckCopy(c.srcT, src, c.dstT, dst, g); err == nil {
			t.Errorf("%s: bridge.CheckCopy accepts it", c.name)
		}
		wantInvalid(t, c.name, e.CopyPages(c.srcT, src, c.dstT, dst), "copy_pages", c.keyword)
	}
	if after := step(t, e, last); !s.sameOutput(before, after) {
		t.Errorf("refused copies changed X's pages: %v then %v", before.Sampled, after.Sampled)
	}
	for _, c := range []struct {
		name       string
		srcT, dstT bridge.Tier
		src, dst   []int32
	}{
		{"nothing", dev, host, nil, nil},
		{"device to host", dev, host, []int32{0, 1}, []int32{3, 0}},
		{"host to device", host, dev, []int32{3}, []int32{9}},
		{"a page onto itself", dev, dev, []int32{4}, []int32{4}},
		{"one page to two", dev, dev, []int32{4, 4}, []int32{5, 6}},
	} {
		if err := bridge.CheckCopy(c.srcT, c.src, c.dstT, c.dst, g); err != nil {
			t.Errorf("%s: bridge.CheckCopy refuses it: %v", c.name, err)
		}
		if err := e.CopyPages(c.srcT, c.src, c.dstT, c.dst); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	noHost, _ := s.engine(t, func(c *bridge.Config) { c.NumHostPages = 0 })
	wantInvalid(t, "copy to an absent host tier", noHost.CopyPages(dev, []int32{0}, host, []int32{0}), "copy_pages", "dst[0]")
}
