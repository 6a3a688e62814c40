//go:build native

package native

import (
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// BenchmarkCPUStep measures the CPU engine (tiny preset) through the bridge:
// one decode step of 16 sequences at a context of ~256 tokens, and one
// prefill chunk of 256 tokens.
func BenchmarkCPUStep(b *testing.B) {
	const ctx, batch = 256, 16
	pagesPerSeq := (ctx+1+tinyPageTokens-1)/tinyPageTokens + 1

	b.Run("decode-batch16-ctx256", func(b *testing.B) {
		eng := openTiny(b, batch*pagesPerSeq, 0)
		seqs := make([]bridge.SeqStep, batch)
		var res bridge.StepResult
		for i := range seqs {
			pages := pageRange(i*pagesPerSeq, pagesPerSeq)
			// Prefill the context outside the timed loop.
			pre := &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(uint64(i), ctx, 512), BlockTable: pages}}}
			if err := eng.Step(pre, &res); err != nil {
				b.Fatal(err)
			}
			seqs[i] = bridge.SeqStep{Tokens: []int32{int32(i)}, StartPos: ctx, BlockTable: pages, Sample: true}
		}
		desc := &bridge.StepDesc{Seqs: seqs}
		b.ResetTimer()
		for b.Loop() {
			if err := eng.Step(desc, &res); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/token")
	})

	b.Run("prefill-chunk256", func(b *testing.B) {
		eng := openTiny(b, pagesPerSeq, 0)
		desc := &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(7, ctx, 512), BlockTable: pageRange(0, pagesPerSeq), Sample: true}}}
		var res bridge.StepResult
		for b.Loop() {
			if err := eng.Step(desc, &res); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*ctx), "ns/token")
	})
}
