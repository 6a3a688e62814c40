//go:build native

package native

import (
	"errors"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// TestSubmitWaitMatchesStep: two submitted steps (a prefill, then a decode
// that reads its K/V) give the same tokens as synchronous steps.
func TestSubmitWaitMatchesStep(t *testing.T) {
	cfg := bridge.Config{Preset: "tiny", Seed: 3, NumPages: 32, TokensPerPage: 8}
	prompt := make([]int32, 29)
	for i := range prompt {
		prompt[i] = int32(i*37%500 + 1)
	}
	bt := []int32{4, 7, 1, 9}
	run := func(async bool) []int32 {
		e, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var res bridge.StepResult
		step := func(d *bridge.StepDesc) int32 {
			if async {
				if err := e.Submit(d); err != nil {
					t.Fatal(err)
				}
				if err := e.Wait(&res); err != nil {
					t.Fatal(err)
				}
			} else if err := e.Step(d, &res); err != nil {
				t.Fatal(err)
			}
			return res.Sampled[0]
		}
		a := step(&bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt, BlockTable: bt, Sample: true}}})
		b := step(&bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: []int32{a}, StartPos: 29, BlockTable: bt, Sample: true}}})
		return []int32{a, b}
	}
	sync, async := run(false), run(true)
	if sync[0] != async[0] || sync[1] != async[1] {
		t.Fatalf("async %v != sync %v", async, sync)
	}
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var res bridge.StepResult
	if err := e.Wait(&res); !errors.Is(err, bridge.ErrInvalidArgument) {
		t.Fatalf("Wait with nothing submitted: %v", err)
	}
	d := &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt, BlockTable: bt, Sample: true}}}
	if err := e.Submit(d); err != nil {
		t.Fatal(err)
	}
	if err := e.Step(d, &res); !errors.Is(err, bridge.ErrInvalidArgument) {
		t.Fatalf("Step while a step is in flight: %v", err)
	}
	if err := e.Wait(&res); err != nil {
		t.Fatal(err)
	}
}
