package twin

import (
	"math"

	"github.com/lockstep-ai/lockstep/bridge/internal/goengine"
)

// The MoE layer's fleet-coupled part (docs/twin.md "MoE layers"): the
// routed experts' grouped GEMMs on the busiest GPU and the DeepEP-style
// dispatch and combine. DeepEP sends a token once to every GPU that holds
// at least one of its top-k experts (not once per expert), dispatches in
// FP8 with one FP32 scale per 128 channels and combines in BF16; GPUs in
// one NVLink domain talk over NVLink, GPUs in other domains over RDMA, the
// two in parallel.

// moeDerived holds the MoE constants of a profile.
type moeDerived struct {
	ep, topK, experts, expertParams float64
	hidden, width                   float64 // hidden size, expert width
	moeElemPerRow                   float64 // SiLU·mul bytes per routed row
	rowDispatch, rowCombine         float64 // bytes per token sent
	// Routing: the busiest GPU's share of the routed rows, the probability
	// that a token sends to it, and the expected number of other GPUs a
	// token is sent to inside and outside its NVLink domain.
	hotShare, hotHit, destIntra, destInter float64
	// hotExperts are the routing probabilities (per token, of being among
	// its top k) of the busiest GPU's experts under skewed routing; nil
	// when routing is uniform (one closed form serves every expert).
	hotExperts []float64
	missProb   float64 // uniform: P(an expert is not among a token's top k)
	perGPU     float64 // routed experts per GPU
	// Links: ms per byte over NVLink and RDMA, fixed costs.
	nvMSPerByte, rdmaMSPerByte, latMS float64
}

// deriveMoE computes the MoE constants; d has the GEMM constants already.
func deriveMoE(p *Profile, d *derived) moeDerived {
	m, g, r := &p.Model, p.GPU, p.Roofline
	h, mf := float64(m.Hidden), float64(m.MoEIntermediate)
	var md moeDerived
	md.ep, md.topK, md.experts = float64(p.Parallelism.EP), float64(m.TopK), float64(m.RoutedExperts)
	md.expertParams = 3 * h * mf
	md.hidden, md.width = h, mf
	md.moeElemPerRow = 3 * mf * actBytes
	md.rowDispatch = h*1 + math.Ceil(h/128)*4 // FP8 values + FP32 scale per 128 channels
	md.rowCombine = h * actBytes
	md.perGPU = md.experts / md.ep
	md.missProb = 1 - md.topK/md.experts

	shares := expertShares(m.RoutedExperts, r.ExpertZipf.Value)
	ep := p.Parallelism.EP
	// Experts are dealt to GPUs in contiguous blocks of ids (as the CPU
	// engine deals them over ranks); the last GPU may hold fewer.
	per := (m.RoutedExperts + ep - 1) / ep
	hot, hotGPU := 0.0, 0
	gpuShare := make([]float64, ep)
	for e, s := range shares {
		gpuShare[e/per] += s
	}
	for gi, s := range gpuShare {
		if s > hot {
			hot, hotGPU = s, gi
		}
	}
	md.hotShare = hot
	k := md.topK
	// P(a token sends to GPU gi): 1 − P(none of its k experts is there).
	hit := func(s float64, n int) float64 {
		if r.ExpertZipf.Value == 0 {
			// Uniform: k distinct experts of E, n of them on the GPU.
			miss := 1.0
			for i := 0.0; i < k; i++ {
				miss *= math.Max(0, (md.experts-float64(n)-i)/(md.experts-i))
			}
			return 1 - miss
		}
		return 1 - math.Pow(1-s, k) // with replacement: a close bound for skewed shares
	}
	counts := make([]int, ep)
	for e := range shares {
		counts[e/per]++
	}
	md.hotHit = hit(hot, counts[hotGPU])
	// Other GPUs a token is sent to, averaged over the GPU it starts on:
	// the sending GPU's own domain holds gd GPUs.
	gd := min(ep, p.Parallelism.GPUsPerNode)
	var intra, inter float64
	for src := 0; src < ep; src++ {
		dom := src / gd
		for dst := 0; dst < ep; dst++ {
			if dst == src {
				continue
			}
			hp := hit(gpuShare[dst], counts[dst])
			if dst/gd == dom {
				intra += hp
			} else {
				inter += hp
			}
		}
	}
	md.destIntra, md.destInter = intra/float64(ep), inter/float64(ep)
	if r.ExpertZipf.Value > 0 {
		for e := hotGPU * per; e < min(m.RoutedExperts, (hotGPU+1)*per); e++ {
			md.hotExperts = append(md.hotExperts, math.Min(1, k*shares[e]))
		}
	}
	md.nvMSPerByte = 1e3 / (g.NVLinkBytesPerS.Value * r.CommEfficiency.Value)
	md.rdmaMSPerByte = 1e3 / (g.RDMABytesPerS.Value * r.RDMAEfficiency.Value)
	md.latMS = r.CommLatencyMS.Value
	if ep > gd {
		md.latMS += r.RDMALatencyMS.Value
	}
	return md
}

// expertShares is each routed expert's share of the routed rows: uniform
// when zipf is 0, else a Zipf law over popularity ranks, 1/r^zipf
// normalised, with the ranks given to expert ids by a fixed pseudo-random
// permutation (Fisher–Yates driven by a constant-seeded hash), so that hot
// experts are scattered over the GPUs as in a real model, the same in every
// process and every run.
func expertShares(experts int, zipf float64) []float64 {
	s := make([]float64, experts)
	if zipf == 0 {
		for e := range s {
			s[e] = 1 / float64(experts)
		}
		return s
	}
	rank := make([]int, experts)
	for i := range rank {
		rank[i] = i
	}
	for i := experts - 1; i > 0; i-- {
		j := int(goengine.Mix64(uint64(i)*0x9e3779b97f4a7c15+0x1234) % uint64(i+1))
		rank[i], rank[j] = rank[j], rank[i]
	}
	var sum float64
	for e := range s {
		s[e] = math.Pow(float64(rank[e]+1), -zipf)
		sum += s[e]
	}
	for e := range s {
		s[e] /= sum
	}
	return s
}

// moeLayer is the fleet-coupled part of one MoE layer on one GPU when the
// fleet has fleetTokens new tokens and its busiest rank maxTokens: the
// routed experts' GEMMs on the busiest GPU (its share of the fleet's rows;
// the weights of its experts that receive a token, in expectation) and the
// dispatch plus combine.
func (d *derived) moeLayer(fleetTokens, maxTokens float64) (moeMS, a2aMS float64) {
	md := &d.moeD
	rows := fleetTokens * md.topK * md.hotShare // expert rows on the busiest GPU
	var active float64
	if md.hotExperts == nil {
		// P(an expert gets none of the fleet's tokens) = (1 − top_k/E)^tokens.
		active = md.perGPU * (1 - math.Pow(md.missProb, fleetTokens))
	} else {
		for _, q := range md.hotExperts {
			active += 1 - math.Pow(1-q, fleetTokens)
		}
	}
	moeMS = d.expertsMS(rows, active) + d.elemKernelMS + rows*md.moeElemPerRow*d.elemMSPerByte
	if md.ep > 1 {
		// Each GPU sends its share of its rank's tokens once per
		// destination GPU; the busiest GPU receives its hit share of the
		// other GPUs' tokens. The busier of sending and receiving bounds each
		// link; NVLink and RDMA run at once.
		send := maxTokens / d.tp
		recv := fleetTokens / d.tp * (md.ep - 1) / md.ep * md.hotHit // from the other GPUs
		dom := md.destIntra / (md.destIntra + md.destInter + 1e-300)
		link := func(row float64) float64 {
			nv := math.Max(send*md.destIntra, recv*dom) * row * md.nvMSPerByte
			rd := math.Max(send*md.destInter, recv*(1-dom)) * row * md.rdmaMSPerByte
			return math.Max(nv, rd) + md.latMS
		}
		a2aMS = link(md.rowDispatch) + link(md.rowCombine)
	}
	return moeMS, a2aMS
}

// expertsMS is the grouped GEMMs (gate+up, then down) of rows routed rows
// over active experts: two kernels, each expert's rows rounded up to tiles,
// the active experts' weights read once.
func (d *derived) expertsMS(rows, active float64) float64 {
	if rows <= 0 || active <= 0 {
		return 0
	}
	md := &d.moeD
	padded := active * math.Ceil(rows/active/d.tile) * d.tile
	c := 2 * padded * md.expertParams * d.gemmMSPerFLOP
	// Activations: gate+up reads h at wb and writes 2·width BF16; down
	// reads width at wb and writes h BF16.
	act := rows * (md.hidden*(d.wb+actBytes) + md.width*(2*actBytes+d.wb))
	b := (active*md.expertParams*d.wb + act) * d.gemmMSPerByte
	return 2*d.gemmKernelMS + math.Sqrt(c*c+b*b)
}
