//go:build native

package native

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/cpu"

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
	weightBytes := decodeWeightBytes(m.Tensors, kernels)
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
	// Every decode step reads each projection weight once, whatever the
	// batch: the bandwidth the weights stream at (the KV and activations
	// aside), to set beside BenchmarkCopyBandwidth, decode's physical limit.
	b.ReportMetric(float64(weightBytes)*float64(b.N*decode)/dec.Seconds()/1e9, "weight_GB/s")
}

// decodeWeightBytes is what one decode step reads of the projections and
// the LM head (the tensors the products read; norms and the embedding row
// are negligible). Under the quantised kernels: the blocks (repacked by 8
// columns with float scales: 24 bytes per Q4_1 block, 22 per Q4_0, 36 per
// Q8_0). Under the exact ones, a step of at most 8 rows reads Q8_0, Q4_0 and
// Q4_1 weights from their packed panels where the CPU has AVX-512
// (packed_cpu.h: float scale and offset per column and block, 40 bytes per
// Q8_0 block, 24 per Q4) unless LOCKSTEP_PACKED=none, and everything else
// as float32.
func decodeWeightBytes(ts []bridge.WeightTensor, kernels string) int64 {
	perBlock := map[bridge.DType]int64{bridge.DTypeQ8_0: 36, bridge.DTypeQ4_0: 24, bridge.DTypeQ4_1: 24}
	packed := kernels == "exact" && cpu.X86.HasAVX512F && os.Getenv("LOCKSTEP_PACKED") != "none"
	if packed {
		perBlock = map[bridge.DType]int64{bridge.DTypeQ8_0: 40, bridge.DTypeQ4_0: 24, bridge.DTypeQ4_1: 24}
	}
	var n int64
	for _, t := range ts {
		switch t.Kind {
		case bridge.WeightQ, bridge.WeightK, bridge.WeightV, bridge.WeightO, bridge.WeightGate, bridge.WeightUp,
			bridge.WeightDown, bridge.WeightLMHead, bridge.WeightEmbedding:
		default:
			continue
		}
		if t.Kind == bridge.WeightEmbedding && hasKind(ts, bridge.WeightLMHead) {
			continue // only a tied embedding is the LM head
		}
		if q, ok := perBlock[t.DType]; ok && (kernels == "quant" || packed) {
			n += t.Rows * t.Cols / 32 * q
		} else {
			n += 4 * t.Rows * t.Cols
		}
	}
	return n
}

func hasKind(ts []bridge.WeightTensor, k bridge.WeightKind) bool {
	for _, t := range ts {
		if t.Kind == k {
			return true
		}
	}
	return false
}

// BenchmarkCopyBandwidth is the machine's copy bandwidth, a STREAM-like
// yardstick for decode: copying 256 MiB (read and write counted, as STREAM
// does), on 1 and 2 goroutines each copying its half.
func BenchmarkCopyBandwidth(b *testing.B) {
	const size = 256 << 20
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				part := size / threads
				for k := 0; k < threads; k++ {
					wg.Go(func() { copy(dst[k*part:(k+1)*part], src[k*part:(k+1)*part]) })
				}
				wg.Wait()
			}
			b.ReportMetric(float64(2*size)*float64(b.N)/time.Since(t0).Seconds()/1e9, "copy_GB/s")
		})
	}
}

// BenchmarkSmolLM2PromptScoring is what scoring a prompt (prompt_logprobs,
// echo with logprobs) costs the CPU engine: one 512-token SmolLM2 prefill
// on one thread, unscored, with every row scored (top 0), and with the top
// 5 too. Reported: the step's compute time (the engine's device_ms, its
// CPU-bound work; compare the variants' ratios within one run).
func BenchmarkSmolLM2PromptScoring(b *testing.B) {
	m, err := model.Load(modeltest.SmolLM2(b))
	if err != nil {
		b.Fatal(err)
	}
	const promptLen, P = 512, 16
	eng, err := Open(bridge.Config{Shape: m.Shape, Tensors: m.Tensors, NumPages: promptLen / P, TokensPerPage: P})
	m.Close()
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	tokens := prompt(1, promptLen, m.Shape.VocabSize)
	targets := append(append([]int32(nil), tokens[1:]...), -1)
	for _, c := range []struct {
		name   string
		scored bool
		top    int
	}{{"unscored", false, 0}, {"scored", true, 0}, {"scored_top5", true, 5}} {
		b.Run(c.name, func(b *testing.B) {
			s := bridge.SeqStep{Tokens: tokens, BlockTable: pageRange(0, promptLen/P), Sample: true}
			if c.scored {
				s.ScoreTargets, s.ScoreTop = targets, c.top
			}
			var res bridge.StepResult
			ms := 0.0
			for it := 0; it < b.N; it++ {
				if err := eng.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{s}}, &res); err != nil {
					b.Fatal(err)
				}
				ms += res.DeviceMS
			}
			b.ReportMetric(ms/float64(b.N), "step_ms")
			b.ReportMetric(float64(b.N*promptLen)/(ms/1e3), "prefill_tok/s")
		})
	}
}
