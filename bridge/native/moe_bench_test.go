//go:build native

package native

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
)

// BenchmarkMoEExchange measures the MoE exchanges of moe-tiny under
// in-process expert parallelism (EP members are engines on their own
// threads, as --ranks N runs them): per step, every member prefills one
// 128-token chunk (prefill) or decodes 32 sequences at depth 128 (decode).
// Reported per MoE layer and member, averaged over layers, members and
// steps: the bytes one member sends in the layer's dispatch and combine and
// the time it spends in each (on these shared cores mostly waiting for the
// slowest member). The per-layer table is logged.
func BenchmarkMoEExchange(b *testing.B) {
	for _, ep := range []int{1, 2, 4} {
		for _, kind := range []string{"prefill", "decode"} {
			b.Run(fmt.Sprintf("ep=%d/%s", ep, kind), func(b *testing.B) { benchMoE(b, ep, kind) })
		}
	}
}

func benchMoE(b *testing.B, ep int, kind string) {
	shape := bridge.Presets["moe-tiny"]
	const P, depth, seqs, chunk = 16, 128, 32, 128
	g, err := NewCPGroup(ep, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	engines := make([]bridge.Engine, ep)
	for r := range engines {
		cfg := bridge.Config{Preset: "moe-tiny", Seed: 1, NumPages: seqs * (depth/P + 2), TokensPerPage: P}
		if ep > 1 {
			cfg.Expert = &bridge.ExpertMember{Group: g, Rank: r, Size: ep}
		}
		if engines[r], err = Open(cfg); err != nil {
			b.Fatal(err)
		}
		defer engines[r].Close()
	}
	perSeq := depth/P + 2
	desc := func(r int) *bridge.StepDesc {
		if kind == "prefill" {
			return &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(uint64(r), chunk, shape.VocabSize),
				BlockTable: pageRange(0, chunk/P), Sample: true}}}
		}
		d := &bridge.StepDesc{}
		for i := range seqs {
			d.Seqs = append(d.Seqs, bridge.SeqStep{Tokens: []int32{int32(i + r)}, StartPos: depth,
				BlockTable: pageRange(i*perSeq, perSeq), Sample: true})
		}
		return d
	}
	step := func() {
		var wg sync.WaitGroup
		errs := make([]error, ep)
		for r := range ep {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var res bridge.StepResult
				errs[r] = engines[r].Step(desc(r), &res)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	step() // warm-up (scratch buffers), excluded from the counters below
	before := layerStats(b, engines, shape.NumLayers)
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.StopTimer()
	after := layerStats(b, engines, shape.NumLayers)
	n := float64(b.N * ep)
	var dB, cB, dMS, cMS float64
	for l := range shape.NumLayers {
		var ld, lc, ldm, lcm float64
		for r := range ep {
			a, s := after[r][l], before[r][l]
			ld += float64(a.DispatchBytes - s.DispatchBytes)
			lc += float64(a.CombineBytes - s.CombineBytes)
			ldm += a.DispatchMS - s.DispatchMS
			lcm += a.CombineMS - s.CombineMS
		}
		b.Logf("ep=%d %s layer %d: dispatch %.1f KiB %.3f ms, combine %.1f KiB %.3f ms (per member and step)",
			ep, kind, l, ld/n/1024, ldm/n, lc/n/1024, lcm/n)
		dB, cB, dMS, cMS = dB+ld, cB+lc, dMS+ldm, cMS+lcm
	}
	L := n * float64(shape.NumLayers)
	b.ReportMetric(dB/L, "dispatch_B/layer")
	b.ReportMetric(cB/L, "combine_B/layer")
	b.ReportMetric(dMS/L, "dispatch_ms/layer")
	b.ReportMetric(cMS/L, "combine_ms/layer")
}

func layerStats(b *testing.B, engines []bridge.Engine, layers int) [][]MoELayerStats {
	out := make([][]MoELayerStats, len(engines))
	for r, e := range engines {
		for l := range layers {
			s, err := EngineMoELayerStats(e, l)
			if err != nil {
				b.Fatal(err)
			}
			out[r] = append(out[r], s)
		}
	}
	return out
}
