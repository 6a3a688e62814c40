//go:build native

package native

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/model/modeltest"
)

// BenchmarkSmolLM2 measures the CPU engine on the real SmolLM2-135M
// (issue 12's yardstick): one step prefilling `batch` prompts of 512 tokens,
// then 32 decode steps of the batch, on 1 and 2 threads (issue 31: the same
// bits on any number), with the exact and the quantised kernels. Reported:
// prefill and decode tokens per second of one engine.
func BenchmarkSmolLM2(b *testing.B) {
	for _, kernels := range bridge.CPUKernelNames {
		for _, c := range []struct{ batch, threads int }{{8, 1}, {8, 2}, {1, 1}, {1, 2}} {
			b.Run(fmt.Sprintf("kernels=%s/batch=%d/threads=%d", kernels, c.batch, c.threads), func(b *testing.B) {
				benchSmolLM2(b, kernels, c.batch, c.threads)
			})
		}
	}
}

func benchSmolLM2(b *testing.B, kernels string, batch, threads int) {
	m, err := model.Load(modeltest.SmolLM2(b))
	if err != nil {
		b.Fatal(err)
	}
	const promptLen, decode, P = 512, 32, 16
	perSeq := (promptLen + decode + P - 1) / P
	eng, err := Open(bridge.Config{Shape: m.Shape, Tensors: m.Tensors, NumPages: batch * perSeq, TokensPerPage: P,
		CPUThreads: threads, CPUKernels: kernels})
	m.Close()
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	var prefill, dec time.Duration
	for it := 0; it < b.N; it++ {
		seqs := make([]bridge.SeqStep, batch)
		for i := range seqs {
			seqs[i] = bridge.SeqStep{Tokens: prompt(uint64(i), promptLen, m.Shape.VocabSize),
				BlockTable: pageRange(i*perSeq, perSeq), Sample: true}
		}
		var res bridge.StepResult
		t0 := time.Now()
		if err := eng.Step(&bridge.StepDesc{Seqs: seqs}, &res); err != nil {
			b.Fatal(err)
		}
		prefill += time.Since(t0)
		t1 := time.Now()
		for s := 0; s < decode; s++ {
			for i := range seqs {
				seqs[i].StartPos += len(seqs[i].Tokens)
				seqs[i].Tokens = []int32{res.Sampled[i]}
			}
			if err := eng.Step(&bridge.StepDesc{Seqs: seqs}, &res); err != nil {
				b.Fatal(err)
			}
		}
		dec += time.Since(t1)
	}
	b.ReportMetric(float64(b.N*batch*promptLen)/prefill.Seconds(), "prefill_tok/s")
	b.ReportMetric(float64(b.N*batch*decode)/dec.Seconds(), "decode_tok/s")
	b.ReportMetric(prefill.Seconds()/float64(b.N), "prefill_s")
	b.ReportMetric(dec.Seconds()/float64(b.N), "decode_s")
}
