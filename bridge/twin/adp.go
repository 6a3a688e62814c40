package twin

import (
	"fmt"
	"slices"
)

// How an engine runs its attention-DP ranks together, beyond the MoE
// layers' lockstep: two mechanisms of TensorRT-LLM's PyTorch executor that
// make one rank's context cost every rank time (docs/twin.md, "Attention
// DP: CUDA graphs and MoE padding", with the file and function of each).
// Both are off by default, so every recorded twin figure stays as it was;
// each can be switched on alone to show its effect.

// CUDA graph modes of AttentionDP.CUDAGraph.
const (
	// GraphRank: a rank's pure-decode step replays its CUDA graph whatever
	// the other ranks run, at its own batch size (the twin's model before
	// AttentionDP existed; the default).
	GraphRank = "rank"
	// GraphFleet: TensorRT-LLM's rule under attention DP. The ranks gather
	// (can run a graph, batch size) each iteration; a graph replays only
	// when every rank's batch is generation-only, and then every rank pads
	// its batch with dummy decodes to the captured size at or above the
	// largest rank's batch. One rank with a context chunk, or a batch over
	// the largest captured size, makes every rank run eager (a kernel
	// launch gap per layer: roofline.layer_overhead_ms).
	GraphFleet = "fleet"
)

// AttentionDP is how the modelled engine couples attention-DP ranks (part
// of a roofline profile; zero = the twin's own model, no coupling beyond
// the MoE layers).
type AttentionDP struct {
	// CUDAGraph is GraphRank ("" reads as it) or GraphFleet.
	CUDAGraph string `json:"cuda_graph,omitempty"`
	// CUDAGraphMaxBatchSize is the largest captured batch with GraphFleet
	// (TensorRT-LLM's cuda_graph_config.max_batch_size); 0 means 128, its
	// default. The captured sizes are TensorRT-LLM's with padding on: 1, 2,
	// 4, the multiples of 8 to 128, the powers of two from 256 below the
	// largest, and the largest.
	CUDAGraphMaxBatchSize int `json:"cuda_graph_max_batch_size,omitempty"`
	// MoEPadding: every rank pads its MoE layers' input to the largest
	// rank's tokens, so the routed experts compute ranks × max tokens rows
	// (TensorRT-LLM's use_dp_padding). MoE models only.
	MoEPadding bool `json:"moe_dp_padding,omitempty"`
}

// defaultGraphMaxBatch is TensorRT-LLM's cuda_graph_config.max_batch_size
// when none is set.
const defaultGraphMaxBatch = 128

// maxGraphBatch bounds CUDAGraphMaxBatchSize (a batch is at most this
// many sequences in any engine the twin models).
const maxGraphBatch = 1 << 16

func (a *AttentionDP) validate(p *Profile) error {
	switch a.CUDAGraph {
	case "", GraphRank, GraphFleet:
	default:
		return fmt.Errorf("attention_dp.cuda_graph must be %q or %q, got %q", GraphRank, GraphFleet, a.CUDAGraph)
	}
	if a.CUDAGraphMaxBatchSize < 0 || a.CUDAGraphMaxBatchSize > maxGraphBatch {
		return fmt.Errorf("attention_dp.cuda_graph_max_batch_size must be in [0, %d] (0: %d), got %d",
			maxGraphBatch, defaultGraphMaxBatch, a.CUDAGraphMaxBatchSize)
	}
	if a.CUDAGraphMaxBatchSize > 0 && a.CUDAGraph != GraphFleet {
		return fmt.Errorf("attention_dp.cuda_graph_max_batch_size %d needs attention_dp.cuda_graph %q", a.CUDAGraphMaxBatchSize, GraphFleet)
	}
	if *a == (AttentionDP{}) {
		return nil
	}
	if p.Kind != KindRoofline {
		return fmt.Errorf("attention_dp: a %s cost profile models no CUDA graphs or MoE layers", p.Kind)
	}
	if a.MoEPadding && !p.Model.MoE() {
		return fmt.Errorf("attention_dp.moe_dp_padding: model %s has no routed experts", p.Model.Name)
	}
	return nil
}

// graphSizes are the captured batch sizes of TensorRT-LLM's
// CudaGraphConfig with padding on, up to max (sorted, max included).
func graphSizes(max int) []int {
	var s []int
	for _, b := range []int{1, 2, 4} {
		if b <= max {
			s = append(s, b)
		}
	}
	for b := 8; b <= 128 && b <= max; b += 8 {
		s = append(s, b)
	}
	for b := 256; b < max; b *= 2 {
		s = append(s, b)
	}
	if s[len(s)-1] != max {
		s = append(s, max)
	}
	return s
}

// graphBatch is the captured batch size a generation-only fleet whose
// largest batch is n pads every rank to, or 0 when n is above the largest
// captured size (the fleet runs eager).
func (d *derived) graphBatch(n int) int {
	i, _ := slices.BinarySearch(d.graphSizes, n)
	if i == len(d.graphSizes) {
		return 0
	}
	return d.graphSizes[i]
}

// WithAttentionDP returns a validated copy of the roofline profile p with
// the attention-DP coupling a (the zero value keeps p's).
func (p *Profile) WithAttentionDP(a AttentionDP) (*Profile, error) {
	q := p.clone()
	if a != (AttentionDP{}) {
		q.AttentionDP = a
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return q, nil
}

// fleetRank is rank r's step as the fleet runs it under GraphFleet:
// unchanged when it has a context chunk (it runs eager anyway) or when
// the fleet replays graphs at its own batch size; padded with dummy
// decodes (KV depth 0: each attends to itself) to batch graph when the
// fleet replays graphs (graph > 0); eager at its own batch when some rank
// cannot replay one (graph == 0).
func (p *Profile) fleetRank(r *StepCost, graph int) StepCost {
	if r.Tokens != r.Seqs || (graph > 0 && r.Seqs == graph) || (graph == 0 && r.Seqs == 0) {
		return *r
	}
	if graph > 0 {
		pad := graph - r.Seqs
		return p.decodeCost(graph, r.DecodeKV+float64(pad), r.DecodeKVWindow+float64(pad), true)
	}
	return p.decodeCost(r.Seqs, r.DecodeKV, r.DecodeKVWindow, false)
}

// decodeCost is the cost of a generation-only step of n decodes whose KV
// reads (each decode's KV depth plus itself) sum to decKV (decKVWindow on
// a sliding-window layer), replaying a CUDA graph or eager.
func (p *Profile) decodeCost(n int, decKV, decKVWindow float64, graph bool) StepCost {
	st := stepSums{tokens: n, decodes: n, attnSums: attnSums{decKV: decKV}, win: attnSums{decKV: decKVWindow}}
	return p.costOf(&st, n, graph)
}
