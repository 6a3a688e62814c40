package twin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// ProfileVersion is the profile file format this package reads and writes.
// Version 1 was the cost model before FP8 GEMMs had their own efficiency,
// before the GEMM transition, the fixed kernel costs and the network
// between nodes (its roofline lacks their keys): print a new profile with
// `worker twin-profile` and carry the edits over.
const ProfileVersion = 2

// Profile kinds.
const (
	// KindRoofline models a GPU: per-op rooflines of the GPU's peak rates
	// scaled by achieved-fraction coefficients.
	KindRoofline = "roofline"
	// KindLinear models an engine whose step time is not a GPU roofline
	// (the CPU engine): a linear function fitted to its iteration logs.
	KindLinear = "linear"
)

// Profile is a cost profile: one model on one GPU (roofline) or one fitted
// engine (linear), with every coefficient and its source. It is the content
// of a --cost-profile file. After changing any field call Validate, which
// also recomputes the constants StepCost uses; a Profile must not change
// while engines use it.
type Profile struct {
	// Version is the file format, ProfileVersion.
	Version int `json:"version"`
	// Kind is KindRoofline or KindLinear.
	Kind string `json:"kind"`
	// GPU is set for roofline profiles only.
	GPU *GPU `json:"gpu,omitempty"`
	// Model is the model's shape and element sizes.
	Model Model `json:"model"`
	// Parallelism is the layout of one attention-DP rank (roofline; a
	// linear profile has tp 1, ep 1).
	Parallelism Parallelism `json:"parallelism"`
	// Roofline holds the efficiencies, overheads and memory reserve of a
	// roofline profile.
	Roofline *RooflineCoefficients `json:"roofline,omitempty"`
	// Linear holds the terms of a linear profile.
	Linear *LinearTerms `json:"linear,omitempty"`
	// AttentionDP is how the modelled engine couples its attention-DP
	// ranks' steps (roofline only; absent: no coupling beyond the MoE
	// layers). adp.go, docs/twin.md.
	AttentionDP AttentionDP `json:"attention_dp,omitzero"`
	// HostOverheadMS is the modelled host time of one iteration (scheduler,
	// executor, the cgo call): not part of a step's device time. The
	// virtual clock adds it to the device time when host and device work
	// do not overlap, and takes the larger of the two when they do.
	HostOverheadMS Coef `json:"host_overhead_ms"`

	d     derived // constants for StepCost, rebuilt by Validate
	ready bool
}

// Parallelism is how one attention-DP rank maps onto GPUs.
type Parallelism struct {
	// TP is the tensor-parallel degree of a rank: its attention heads,
	// dense weights, embedding and LM head are split over TP GPUs, with an
	// all-reduce over NVLink after attention and after a dense MLP.
	TP int `json:"tp"`
	// EP is the number of GPUs the routed experts are spread over (MoE
	// models; normally ranks × TP, see WithRanks). Must be 1 for dense
	// models.
	EP int `json:"ep"`
	// GPUsPerNode is how many GPUs share one NVLink domain (roofline
	// profiles; 0 in a linear one). The fleet's GPUs fill domains in rank
	// order: a TP group or an expert-parallel group larger than a domain
	// sends part of its traffic over the RDMA network.
	GPUsPerNode int `json:"gpus_per_node,omitempty"`
}

// RooflineCoefficients are the achieved fractions of peak, the fixed
// per-kernel costs, the overheads and the memory reserve of a roofline
// profile. Every figure names its source: a published kernel result, a
// fit to a published table (docs/twin.md gives each fit; `worker
// twin-validate --fit` recomputes them), or an assumption with its reasoning.
type RooflineCoefficients struct {
	// GEMMEfficiency: achieved fraction of the BF16 tensor-core peak of the
	// model's BF16 GEMMs when compute-bound.
	GEMMEfficiency Coef `json:"gemm_efficiency"`
	// FP8GEMMEfficiency: the same for FP8 GEMMs (FP8 weights) of the FP8 peak.
	FP8GEMMEfficiency Coef `json:"fp8_gemm_efficiency"`
	// FP4GEMMEfficiency: the same for NVFP4 GEMMs (NVFP4 weights and
	// activations) of the FP4 peak. Optional: a profile without it (written
	// before the key existed) runs NVFP4 GEMMs at fp8_gemm_efficiency.
	FP4GEMMEfficiency Coef `json:"fp4_gemm_efficiency,omitzero"`
	// GEMMBandwidthEfficiency: achieved fraction of HBM bandwidth of a GEMM
	// bound by reading its weights (decode-sized batches).
	GEMMBandwidthEfficiency Coef `json:"gemm_bandwidth_efficiency"`
	// GEMMTileTokens: the token (M) tile of the GEMM kernels; a GEMM's
	// arithmetic is that of its tokens rounded up to whole tiles.
	GEMMTileTokens Coef `json:"gemm_tile_tokens"`
	// GEMMKernelMS: fixed cost of one GEMM kernel (prologue, last wave,
	// epilogue) on top of its roofline time, ms.
	GEMMKernelMS Coef `json:"gemm_kernel_ms"`
	// PrefillAttentionEfficiency: achieved fraction of the BF16 peak of
	// attention when compute-bound (context chunks; MLA's absorbed decode).
	PrefillAttentionEfficiency Coef `json:"prefill_attention_efficiency"`
	// DecodeAttentionEfficiency: achieved fraction of HBM bandwidth of
	// attention when bound by reading the KV cache.
	DecodeAttentionEfficiency Coef `json:"decode_attention_efficiency"`
	// AttentionKernelMS: fixed cost of one attention kernel (the context
	// and the decode kernel of a layer each pay it), ms.
	AttentionKernelMS Coef `json:"attention_kernel_ms"`
	// ElementwiseEfficiency: achieved fraction of HBM bandwidth of norms,
	// RoPE, activations, residual adds and the KV-cache append.
	ElementwiseEfficiency Coef `json:"elementwise_efficiency"`
	// ElementwiseKernelMS: fixed cost of one element-wise kernel, ms.
	ElementwiseKernelMS Coef `json:"elementwise_kernel_ms"`
	// CommEfficiency: achieved fraction of the per-direction NVLink
	// bandwidth of the MoE dispatch and combine.
	CommEfficiency Coef `json:"comm_efficiency"`
	// CommLatencyMS: fixed cost of one dispatch or combine inside an NVLink
	// domain, ms.
	CommLatencyMS Coef `json:"comm_latency_ms"`
	// AllReduceNVLinkFraction: a tensor-parallel all-reduce's ring bus
	// bandwidth, 2(n−1)/n·bytes over time, as a fraction of the
	// per-direction NVLink bandwidth. It may exceed 1 (up to 2): NVLink
	// SHARP (NVLS) reduces in the NVSwitch, so each GPU sends less than a
	// ring would.
	AllReduceNVLinkFraction Coef `json:"allreduce_nvlink_fraction"`
	// AllReduceLatencyMS: fixed cost of one all-reduce inside an NVLink
	// domain, ms.
	AllReduceLatencyMS Coef `json:"allreduce_latency_ms"`
	// RDMAEfficiency: achieved fraction of a GPU's RDMA bandwidth of
	// traffic between NVLink domains.
	RDMAEfficiency Coef `json:"rdma_efficiency"`
	// RDMALatencyMS: extra fixed cost of a collective that crosses the
	// network, ms.
	RDMALatencyMS Coef `json:"rdma_latency_ms"`
	// ExpertZipf: the skew of routed-expert popularity, the exponent s of a
	// Zipf law (the expert of popularity rank r gets a share ∝ 1/r^s); 0 is
	// uniform routing.
	ExpertZipf Coef `json:"expert_zipf"`
	// StepOverheadMS: fixed device-side cost of a step outside the layers
	// (input upload, sampling, result download), ms.
	StepOverheadMS Coef `json:"step_overhead_ms"`
	// LayerOverheadMS: kernel-launch gaps of one layer in a step that is
	// not a CUDA graph (any step with a context chunk), ms.
	LayerOverheadMS Coef `json:"layer_overhead_ms"`
	// GraphLayerOverheadMS: the same for a pure-decode step, which runs as
	// a CUDA graph, ms.
	GraphLayerOverheadMS Coef `json:"graph_layer_overhead_ms"`
	// ReserveBytes: memory per GPU kept for the CUDA context, workspaces
	// and communication buffers, bytes.
	ReserveBytes Coef `json:"reserve_bytes"`
	// ReserveFraction: share of what is left after weights and
	// ReserveBytes that the KV pool leaves free (activations, allocator).
	ReserveFraction Coef `json:"reserve_fraction"`
}

// defaultHostOverhead is the built-in host time of one iteration.
func defaultHostOverhead() Coef {
	return Coef{0.20, "assumption: Go scheduler, executor and one cgo call per iteration ~0.2 ms on a server CPU; " +
		"replace with the host_ms of an iteration log"}
}

// BuiltinProfile is the roofline profile of a built-in model on a built-in
// GPU. A zero TP means 1; a zero EP means 1 for dense models and 8 (one
// 8-GPU node) for MoE models; use WithRanks to spread experts over a fleet.
// A zero GPUsPerNode means the GPU's NVLink domain (8, or 72 for GB300).
func BuiltinProfile(gpu, model string, par Parallelism) (*Profile, error) {
	g, err := BuiltinGPU(gpu)
	if err != nil {
		return nil, err
	}
	m, err := BuiltinModel(model)
	if err != nil {
		return nil, err
	}
	if par.TP == 0 {
		par.TP = 1
	}
	if par.EP == 0 {
		par.EP = 1
		if m.MoE() {
			par.EP = 8
		}
	}
	if par.GPUsPerNode == 0 {
		par.GPUsPerNode = int(g.NVLinkDomainGPUs.Value)
	}
	rc := defaultRoofline()
	p := &Profile{Version: ProfileVersion, Kind: KindRoofline, GPU: &g, Model: m, Parallelism: par,
		Roofline: &rc, HostOverheadMS: defaultHostOverhead()}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// WithRanks returns a copy of p for a fleet of ranks attention-DP ranks: an
// MoE model's experts are spread over ranks × TP GPUs (EP). Dense and linear
// profiles are returned as validated copies.
func (p *Profile) WithRanks(ranks int) (*Profile, error) {
	if ranks < 1 {
		return nil, fmt.Errorf("ranks must be at least 1, got %d", ranks)
	}
	q := p.clone()
	if q.Kind == KindRoofline && q.Model.MoE() {
		q.Parallelism.EP = ranks * q.Parallelism.TP
	}
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("%d ranks: %w", ranks, err)
	}
	return q, nil
}

// clone copies p, including what its pointers hold.
func (p *Profile) clone() *Profile {
	q := *p
	if p.GPU != nil {
		g := *p.GPU
		q.GPU = &g
	}
	if p.Roofline != nil {
		r := *p.Roofline
		q.Roofline = &r
	}
	if p.Linear != nil {
		l := *p.Linear
		q.Linear = &l
	}
	q.ready = false
	return &q
}

// LoadProfile reads and validates a profile file.
func LoadProfile(path string) (*Profile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cost profile: %w", err)
	}
	defer f.Close()
	p, err := ReadProfile(f)
	if err != nil {
		return nil, fmt.Errorf("cost profile %s: %w", path, err)
	}
	return p, nil
}

// ReadProfile decodes and validates a profile. Decoding is strict: unknown
// fields, trailing data and a version other than ProfileVersion are errors.
func ReadProfile(r io.Reader) (*Profile, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	// The version first, leniently, so that a newer file is refused for
	// its version rather than for a field this build does not know.
	var head struct {
		Version int `json:"version"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&head); err != nil {
		return nil, fmt.Errorf("not a JSON profile: %w", err)
	}
	if head.Version == 1 {
		return nil, fmt.Errorf("version 1 is the earlier cost model (no FP8 GEMM efficiency, GEMM transition, kernel fixed costs " +
			"or network between nodes); print a version 2 profile with `worker twin-profile` and carry your edits over")
	}
	if head.Version != ProfileVersion {
		return nil, fmt.Errorf("version must be %d, got %d", ProfileVersion, head.Version)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Profile
	if err := dec.Decode(&p); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the profile object")
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// WriteJSON writes the profile as indented JSON (the file format).
func (p *Profile) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(p)
}

// Validate checks every field (the error names it) and rebuilds the
// constants StepCost uses.
func (p *Profile) Validate() error {
	p.ready = false
	if p.Version != ProfileVersion {
		return fmt.Errorf("version must be %d, got %d", ProfileVersion, p.Version)
	}
	if err := p.Model.validate(); err != nil {
		return err
	}
	if err := p.HostOverheadMS.nonNegative("host_overhead_ms"); err != nil {
		return err
	}
	switch p.Kind {
	case KindRoofline:
		if err := p.validateRoofline(); err != nil {
			return err
		}
	case KindLinear:
		if err := p.validateLinear(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("kind must be %q or %q, got %q", KindRoofline, KindLinear, p.Kind)
	}
	if err := p.AttentionDP.validate(p); err != nil {
		return err
	}
	p.d = derive(p)
	p.ready = true
	if ms := p.probeMS(); !(ms >= 0 && ms <= probeLimitMS) {
		p.ready = false
		return fmt.Errorf("the profile models a step of one %d-token prompt and %d decodes at KV depth %d as %g ms "+
			"(a few seconds on any GPU): a rate or efficiency is far too low, or an overhead far too high; check the units",
			probePrompt, probeDecodes, probeKV, ms)
	}
	return nil
}

// The probe step of Validate: every figure of a profile can be in range
// alone and still give steps of years (an efficiency of 1e-300, a rate in
// the wrong unit), which the virtual clock would turn into infinities.
const (
	probePrompt, probeDecodes, probeKV = 8192, 256, 4096
	probeLimitMS                       = 1e6 // about 17 minutes
)

// probeMS is the modelled time of the probe step.
func (p *Profile) probeMS() float64 {
	var w [probeDecodes + 1]Work
	w[0] = Work{NewTokens: probePrompt}
	for i := 1; i < len(w); i++ {
		w[i] = Work{NewTokens: 1, KVBefore: probeKV}
	}
	c := p.StepCost(w[:])
	return max(c.MS(), p.FleetStepMS([]StepCost{c, c}))
}

func (p *Profile) validateRoofline() error {
	switch {
	case p.GPU == nil:
		return fmt.Errorf("gpu is missing (a roofline profile needs one)")
	case p.Roofline == nil:
		return fmt.Errorf("roofline is missing (a roofline profile needs its coefficients)")
	case p.Linear != nil:
		return fmt.Errorf("linear must be absent in a roofline profile")
	}
	if err := p.GPU.validate(); err != nil {
		return err
	}
	if err := p.validateParallelism(); err != nil {
		return err
	}
	r := p.Roofline
	checks := []error{
		r.GEMMEfficiency.fraction("roofline.gemm_efficiency"),
		r.FP8GEMMEfficiency.fraction("roofline.fp8_gemm_efficiency"),
		r.FP4GEMMEfficiency.optionalFraction("roofline.fp4_gemm_efficiency"),
		r.GEMMBandwidthEfficiency.fraction("roofline.gemm_bandwidth_efficiency"),
		r.GEMMTileTokens.wholeAtLeast1("roofline.gemm_tile_tokens"),
		r.GEMMKernelMS.nonNegative("roofline.gemm_kernel_ms"),
		r.PrefillAttentionEfficiency.fraction("roofline.prefill_attention_efficiency"),
		r.DecodeAttentionEfficiency.fraction("roofline.decode_attention_efficiency"),
		r.AttentionKernelMS.nonNegative("roofline.attention_kernel_ms"),
		r.ElementwiseEfficiency.fraction("roofline.elementwise_efficiency"),
		r.ElementwiseKernelMS.nonNegative("roofline.elementwise_kernel_ms"),
		r.CommEfficiency.fraction("roofline.comm_efficiency"),
		r.CommLatencyMS.nonNegative("roofline.comm_latency_ms"),
		r.AllReduceNVLinkFraction.positiveUpTo("roofline.allreduce_nvlink_fraction", 2,
			"a fraction of the per-direction NVLink bandwidth; NVLS in-switch reduction allows up to 2"),
		r.AllReduceLatencyMS.nonNegative("roofline.allreduce_latency_ms"),
		r.RDMAEfficiency.fraction("roofline.rdma_efficiency"),
		r.RDMALatencyMS.nonNegative("roofline.rdma_latency_ms"),
		r.ExpertZipf.inRange("roofline.expert_zipf", 4, "a Zipf exponent: 0 is uniform routing, 1 is strongly skewed"),
		r.StepOverheadMS.nonNegative("roofline.step_overhead_ms"),
		r.LayerOverheadMS.nonNegative("roofline.layer_overhead_ms"),
		r.GraphLayerOverheadMS.nonNegative("roofline.graph_layer_overhead_ms"),
		r.ReserveBytes.nonNegative("roofline.reserve_bytes"),
		r.ReserveFraction.nonNegative("roofline.reserve_fraction"),
	}
	if r.ReserveFraction.Value >= 1 {
		checks = append(checks, fmt.Errorf("roofline.reserve_fraction.value must be below 1, got %g", r.ReserveFraction.Value))
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return nil
}

func (p *Profile) validateParallelism() error {
	tp, ep, m := p.Parallelism.TP, p.Parallelism.EP, &p.Model
	switch {
	case tp < 1:
		return fmt.Errorf("parallelism.tp must be at least 1, got %d", tp)
	case m.Heads%tp != 0:
		return fmt.Errorf("parallelism.tp %d must divide num_heads %d", tp, m.Heads)
	case !m.MLA() && m.KVHeads%tp != 0 && tp%m.KVHeads != 0:
		return fmt.Errorf("parallelism.tp %d must divide num_kv_heads %d or be a multiple of it", tp, m.KVHeads)
	case !m.MoE() && ep != 1:
		return fmt.Errorf("parallelism.ep must be 1 for a dense model, got %d", ep)
	case m.MoE() && (ep < 1 || ep > m.RoutedExperts):
		return fmt.Errorf("parallelism.ep must be in [1, routed_experts %d], got %d", m.RoutedExperts, ep)
	case p.Kind == KindRoofline && p.Parallelism.GPUsPerNode < 1:
		return fmt.Errorf("parallelism.gpus_per_node must be at least 1, got %d (the GPUs of one NVLink domain)", p.Parallelism.GPUsPerNode)
	}
	return nil
}

// The Coef checks name the field and require a source.
func (c Coef) check(field string) error {
	if c == (Coef{}) {
		return fmt.Errorf("%s is missing: give its value and source", field)
	}
	if math.IsNaN(c.Value) || math.IsInf(c.Value, 0) {
		return fmt.Errorf("%s.value must be finite, got %g", field, c.Value)
	}
	if strings.TrimSpace(c.Source) == "" {
		return fmt.Errorf("%s.source is empty: say where the figure comes from", field)
	}
	return nil
}

func (c Coef) positive(field string) error {
	if err := c.check(field); err != nil {
		return err
	}
	if c.Value <= 0 {
		return fmt.Errorf("%s.value must be positive, got %g", field, c.Value)
	}
	return nil
}

func (c Coef) nonNegative(field string) error {
	if err := c.check(field); err != nil {
		return err
	}
	if c.Value < 0 {
		return fmt.Errorf("%s.value must not be negative, got %g", field, c.Value)
	}
	return nil
}

// inRange requires a value in [0, hi]; what says what the value is.
func (c Coef) inRange(field string, hi float64, what string) error {
	if err := c.check(field); err != nil {
		return err
	}
	if !(c.Value >= 0 && c.Value <= hi) {
		return fmt.Errorf("%s.value must be in [0, %g] (%s), got %g", field, hi, what, c.Value)
	}
	return nil
}

// positiveUpTo requires a value in (0, hi]; what says what the value is.
func (c Coef) positiveUpTo(field string, hi float64, what string) error {
	if err := c.inRange(field, hi, what); err != nil {
		return err
	}
	if c.Value == 0 {
		return fmt.Errorf("%s.value must be in (0, %g] (%s), got 0", field, hi, what)
	}
	return nil
}

// wholeAtLeast1 requires a whole number ≥ 1 (a count).
func (c Coef) wholeAtLeast1(field string) error {
	if err := c.check(field); err != nil {
		return err
	}
	if !(c.Value >= 1 && c.Value == math.Trunc(c.Value) && c.Value <= 1<<20) {
		return fmt.Errorf("%s.value must be a whole number of at least 1, got %g", field, c.Value)
	}
	return nil
}

// optionalFraction is fraction for a coefficient that may be left out
// (the zero Coef).
func (c Coef) optionalFraction(field string) error {
	if c == (Coef{}) {
		return nil
	}
	return c.fraction(field)
}

// fp4Efficiency is the NVFP4 GEMM efficiency: fp4_gemm_efficiency, or
// fp8_gemm_efficiency for a profile without it.
func (r *RooflineCoefficients) fp4Efficiency() float64 {
	if r.FP4GEMMEfficiency.Value > 0 {
		return r.FP4GEMMEfficiency.Value
	}
	return r.FP8GEMMEfficiency.Value
}

func (c Coef) fraction(field string) error {
	if err := c.check(field); err != nil {
		return err
	}
	if !(c.Value > 0 && c.Value <= 1) {
		return fmt.Errorf("%s.value must be in (0, 1] (a fraction of the peak), got %g", field, c.Value)
	}
	return nil
}
