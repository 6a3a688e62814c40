package twin

import (
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// batch64 is a 64-sequence step: 60 decodes at assorted depths and four
// context chunks.
func batch64() []Work {
	w := make([]Work, 0, 64)
	for i := range 60 {
		w = append(w, Work{NewTokens: 1, KVBefore: 500 + 997*i})
	}
	return append(w, Work{NewTokens: 512, KVBefore: 0}, Work{NewTokens: 512, KVBefore: 8192}, Work{NewTokens: 2048, KVBefore: 30000}, Work{NewTokens: 64, KVBefore: 100})
}

func BenchmarkStepCost64Dense(b *testing.B) {
	p := builtin(b, "h200", "llama-8b", Parallelism{})
	w := batch64()
	b.ReportAllocs()
	for b.Loop() {
		_ = p.StepCost(w)
	}
}

func BenchmarkStepCost64MoE(b *testing.B) {
	p := builtin(b, "h200", "deepseek-v3", Parallelism{})
	w := batch64()
	b.ReportAllocs()
	for b.Loop() {
		_ = p.StepCost(w)
	}
}

// BenchmarkFleetStepMS64Ranks combines 64 ranks' costs (MoE, the costlier
// combine).
func BenchmarkFleetStepMS64Ranks(b *testing.B) {
	p, err := builtin(b, "gb300", "deepseek-v3", Parallelism{}).WithRanks(64)
	if err != nil {
		b.Fatal(err)
	}
	ranks := make([]StepCost, 64)
	for r := range ranks {
		ranks[r] = p.StepCost(batch64()[r%8 : 56+r%8])
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = p.FleetStepMS(ranks)
	}
}

// BenchmarkEngineStep64 is a whole twin engine step of 64 sequences:
// validation, cost and sampling.
func BenchmarkEngineStep64(b *testing.B) {
	p := builtin(b, "h200", "llama-8b", Parallelism{})
	const P = 32
	const pages = 1 << 16
	e, err := New(bridge.Config{Preset: "llama-8b", NumPages: pages, TokensPerPage: P}, p)
	if err != nil {
		b.Fatal(err)
	}
	var d bridge.StepDesc
	next := 0
	for _, w := range batch64() {
		n := (w.KVBefore + w.NewTokens + P - 1) / P
		bt := make([]int32, n)
		for i := range bt {
			bt[i] = int32(next)
			next++
		}
		d.Seqs = append(d.Seqs, bridge.SeqStep{Tokens: make([]int32, w.NewTokens), StartPos: w.KVBefore, BlockTable: bt, Sample: true})
	}
	var res bridge.StepResult
	b.ReportAllocs()
	for b.Loop() {
		if err := e.Step(&d, &res); err != nil {
			b.Fatal(err)
		}
	}
}
