//go:build native

package native

import (
	"errors"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
)

// TestHelixStepContract: under Helix, bridge.StepChecker (ledger blocks of
// P·size tokens, writes only on the member's own pages) and the native
// validation refuse the same steps. Rank 1 of a group of 2 steps alone: a
// step the engine accepts goes on to wait for rank 0's exchange and fails
// with TIMEOUT, not INVALID_ARGUMENT.
func TestHelixStepContract(t *testing.T) {
	const P = 4
	one := func(start int, table ...int32) bridge.SeqStep {
		return bridge.SeqStep{Tokens: prompt(uint64(start), 1, 512), StartPos: start, BlockTable: table, Sample: true}
	}
	prefill := bridge.SeqStep{Tokens: prompt(3, 12, 512), BlockTable: []int32{0, 1}, Sample: true}
	short := prefill
	short.BlockTable = []int32{0}
	for _, c := range []struct {
		name  string
		seqs  []bridge.SeqStep
		valid bool
	}{
		{"two ledger blocks cover 12 tokens", []bridge.SeqStep{prefill}, true},
		{"one ledger block does not", []bridge.SeqStep{short}, false},
		// Global page 1 (rank 1's, local block 0 = page 5), and global
		// page 2 (rank 0's) whose local block 1 is page 5 too: only read here.
		{"a page this member does not write is shared", []bridge.SeqStep{one(4, 5), one(8, 6, 5)}, true},
		// Global page 3 is rank 1's: local block 1 = page 5 is written twice.
		{"a page this member writes is not", []bridge.SeqStep{one(4, 5), one(12, 6, 5)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := NewCPGroup(2, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			cfg := bridge.Config{Preset: "tiny", Seed: 1, NumPages: 8, TokensPerPage: P,
				Helix: &bridge.HelixMember{Group: g, Rank: 1, Size: 2}}
			e, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			d := &bridge.StepDesc{Seqs: c.seqs}
			checkErr := bridge.CheckStep(d, bridge.GeometryOf(cfg, e.Shape()))
			var res bridge.StepResult
			engErr := e.Step(d, &res)
			switch {
			case c.valid && (checkErr != nil || errors.Is(engErr, bridge.ErrInvalidArgument) || !errors.Is(engErr, bridge.ErrTimeout)):
				t.Errorf("want accepted: CheckStep %v, engine %v (want TIMEOUT without rank 0)", checkErr, engErr)
			case !c.valid && (checkErr == nil || !errors.Is(engErr, bridge.ErrInvalidArgument)):
				t.Errorf("want refused: CheckStep %v, engine %v", checkErr, engErr)
			}
		})
	}
}
