// Package bridge is the pure-Go face of the model engine: the Engine interface,
// the step descriptor and result types, the one step and page-copy contract
// every engine enforces (StepChecker, CheckStep, CheckCopy; check.go), and
// the mapping of native status codes to Go errors. It knows nothing of scheduling or page allocation: it speaks
// page indices and token arrays only (DESIGN.md §1).
package bridge

import (
	"errors"
	"fmt"
	"reflect"
	"time"
)

// ModelShape is the shape of a Llama-architecture decoder, synthetic or
// loaded from a checkpoint. It mirrors eng_model_shape in
// native/include/engine.h.
type ModelShape struct {
	NumLayers        int     `json:"num_layers"`
	HiddenSize       int     `json:"hidden_size"`
	NumHeads         int     `json:"num_heads"`
	NumKVHeads       int     `json:"num_kv_heads"`
	HeadDim          int     `json:"head_dim"`
	IntermediateSize int     `json:"intermediate_size"`
	VocabSize        int     `json:"vocab_size"`
	RopeTheta        float32 `json:"rope_theta"`
	RMSEps           float32 `json:"rms_eps"`
	// RopeScaling is Llama-3-style RoPE frequency scaling; nil = none.
	RopeScaling *RopeScaling `json:"rope_scaling,omitempty"`
	// TiedEmbeddings: the output projection is the embedding matrix.
	TiedEmbeddings bool `json:"tied_embeddings,omitempty"`
	// Mixture of experts (docs/moe.md). NumExperts 0 = dense (the other
	// MoE fields are then 0). With NumExperts > 0 every layer's MLP is a
	// MoE block: a router over NumExperts, NumExpertsPerTok routed SwiGLU
	// experts of width MoEIntermediateSize per token (summed in expert-id
	// order), plus NumSharedExperts always-on experts of the same width;
	// IntermediateSize is then unused by the engines.
	NumExperts          int        `json:"num_experts,omitempty"`
	NumExpertsPerTok    int        `json:"num_experts_per_tok,omitempty"`
	MoEIntermediateSize int        `json:"moe_intermediate_size,omitempty"`
	NumSharedExperts    int        `json:"num_shared_experts,omitempty"`
	RouterNorm          RouterNorm `json:"router_norm,omitempty"`
	// QKNorm: every head of q and k is RMS-normed over HeadDim (gains
	// WeightQNorm/WeightKNorm) after the projections, before RoPE (Qwen3).
	QKNorm bool `json:"qk_norm,omitempty"`
	// QKVBias: the q, k and v projections add a bias (WeightQBias,
	// WeightKBias, WeightVBias) right after the product, before the q/k
	// norms and RoPE (Qwen2, Qwen2.5).
	QKVBias bool `json:"qkv_bias,omitempty"`
	// Granite's multipliers, each 0 = none: EmbeddingScale multiplies the
	// embedding, ResidualScale each layer's attention and MLP outputs
	// before the residual add, AttentionScale replaces 1/sqrt(head_dim),
	// and the logits are multiplied by 1/LogitScale.
	EmbeddingScale float32 `json:"embedding_scale,omitempty"`
	ResidualScale  float32 `json:"residual_scale,omitempty"`
	AttentionScale float32 `json:"attention_scale,omitempty"`
	LogitScale     float32 `json:"logit_scale,omitempty"`
	// Gemma's decoder (engine.h; docs/models.md "Gemma"), each zero =
	// none: MLPGelu makes the MLP's gate activation GELU (tanh form)
	// instead of SiLU; PostNorms RMS-norms each layer's attention and MLP
	// outputs (WeightAttnPostNorm, WeightMLPPostNorm) before the residual
	// adds; AttnSoftcap and FinalSoftcap cap scores and logits as
	// cap·tanh(x/cap); SlidingWindow limits the sliding layers' attention
	// to the last SlidingWindow positions, every layer with
	// SlidingWindowPattern 0, else all but each p-th (l % p == p-1);
	// RopeLocalTheta is the sliding layers' RoPE base; RopeLinearFactor
	// divides the other layers' positions.
	MLPGelu              bool    `json:"mlp_gelu,omitempty"`
	PostNorms            bool    `json:"post_norms,omitempty"`
	AttnSoftcap          float32 `json:"attn_softcap,omitempty"`
	FinalSoftcap         float32 `json:"final_softcap,omitempty"`
	SlidingWindow        int     `json:"sliding_window,omitempty"`
	SlidingWindowPattern int     `json:"sliding_window_pattern,omitempty"`
	RopeLocalTheta       float32 `json:"rope_local_theta,omitempty"`
	RopeLinearFactor     float32 `json:"rope_linear_factor,omitempty"`
	// PartialRotaryDim > 0: RoPE turns only the first PartialRotaryDim
	// dimensions of each head (Phi-4-mini's partial_rotary_factor 0.75);
	// RopeAttnFactor multiplies every RoPE cos and sin (LongRoPE's
	// attention factor); 0 = 1.
	PartialRotaryDim int     `json:"partial_rotary_dim,omitempty"`
	RopeAttnFactor   float32 `json:"rope_attn_factor,omitempty"`

	// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2; docs/models.md
	// "MLA"); KVLoraRank 0 = GQA (the other MLA fields are then 0). With
	// KVLoraRank > 0, NumKVHeads = NumHeads, HeadDim = QKNopeHeadDim +
	// QKRopeHeadDim, and a token's cache per layer is one latent of
	// KVLoraRank + QKRopeHeadDim elements.
	QLoraRank     int `json:"q_lora_rank,omitempty"`
	KVLoraRank    int `json:"kv_lora_rank,omitempty"`
	QKNopeHeadDim int `json:"qk_nope_head_dim,omitempty"`
	QKRopeHeadDim int `json:"qk_rope_head_dim,omitempty"`
	VHeadDim      int `json:"v_head_dim,omitempty"`
	// FirstDenseLayers (MoE shapes): layers below it keep a dense SwiGLU MLP
	// of IntermediateSize (DeepSeek's first_k_dense_replace).
	FirstDenseLayers int `json:"first_dense_layers,omitempty"`
	// RoutedScalingFactor multiplies the routed experts' weights (0 = 1).
	RoutedScalingFactor float32 `json:"routed_scaling_factor,omitempty"`
	// Group-limited routing (DeepSeek's n_group, topk_group); 0 = none.
	ExpertGroups     int `json:"n_group,omitempty"`
	ExpertGroupsUsed int `json:"topk_group,omitempty"`
	// Yarn is DeepSeek's YaRN RoPE scaling (MLA shapes only); nil = none.
	Yarn *YarnScaling `json:"yarn,omitempty"`
}

// Equal reports whether two shapes are the same, comparing RopeScaling and
// Yarn by value (== compares their pointers).
func (s ModelShape) Equal(o ModelShape) bool { return reflect.DeepEqual(s, o) }

// RopeDim is how many dimensions of each head RoPE turns: the head, its
// PartialRotaryDim, or an MLA shape's QKRopeHeadDim.
func (s ModelShape) RopeDim() int {
	switch {
	case s.MLA():
		return s.QKRopeHeadDim
	case s.PartialRotaryDim > 0:
		return s.PartialRotaryDim
	}
	return s.HeadDim
}

// MLA reports whether the shape uses multi-head latent attention.
func (s ModelShape) MLA() bool { return s.KVLoraRank > 0 }

// MoELayer reports whether layer l's MLP is a mixture of experts.
func (s ModelShape) MoELayer(l int) bool { return s.NumExperts > 0 && l >= s.FirstDenseLayers }

// YarnScaling is Hugging Face's rope_scaling of type "yarn" as DeepSeek-V3
// uses it (engine.h: the yarn_* fields).
type YarnScaling struct {
	Factor               float32 `json:"factor"`
	OriginalMaxPositions int     `json:"original_max_position_embeddings"`
	BetaFast             float32 `json:"beta_fast"`
	BetaSlow             float32 `json:"beta_slow"`
	MScale               float32 `json:"mscale"`
	MScaleAllDim         float32 `json:"mscale_all_dim"`
}

// MoE reports whether the shape is a mixture of experts.
func (s ModelShape) MoE() bool { return s.NumExperts > 0 }

// RouterNorm is how a MoE router weights its top-k experts (eng_router_norm).
// Both pick the largest logits, ties to the lower expert id.
type RouterNorm int32

// Router normalisations.
const (
	// RouterSoftmaxTopK: softmax over every expert, top-k, renormalised
	// over the k (Qwen3-MoE with norm_topk_prob).
	RouterSoftmaxTopK RouterNorm = 0
	// RouterTopKSoftmax: top-k logits, softmax over the k (Mixtral).
	RouterTopKSoftmax RouterNorm = 1
	// RouterSoftmaxTopKRaw: softmax over every expert, top-k, not
	// renormalised (DeepSeek-V2, norm_topk_prob false).
	RouterSoftmaxTopKRaw RouterNorm = 2
	// RouterSigmoidTopK: sigmoid scores, top-k by score + the router bias
	// (WeightRouterBias), weights the unbiased scores renormalised over the k
	// (DeepSeek-V3, Kimi K2).
	RouterSigmoidTopK RouterNorm = 3
	// RouterSigmoidTopKRaw: as RouterSigmoidTopK, not renormalised.
	RouterSigmoidTopKRaw RouterNorm = 4
)

// Sigmoid reports whether the router scores with a sigmoid.
func (r RouterNorm) Sigmoid() bool { return r == RouterSigmoidTopK || r == RouterSigmoidTopKRaw }

func (r RouterNorm) String() string {
	switch r {
	case RouterSoftmaxTopK:
		return "softmax_topk"
	case RouterTopKSoftmax:
		return "topk_softmax"
	case RouterSoftmaxTopKRaw:
		return "softmax_topk_raw"
	case RouterSigmoidTopK:
		return "sigmoid_topk"
	case RouterSigmoidTopKRaw:
		return "sigmoid_topk_raw"
	}
	return fmt.Sprintf("RouterNorm(%d)", int32(r))
}

// RopeScaling is Hugging Face's rope_scaling of rope_type "llama3".
type RopeScaling struct {
	Factor               float32 `json:"factor"`
	LowFreqFactor        float32 `json:"low_freq_factor"`
	HighFreqFactor       float32 `json:"high_freq_factor"`
	OriginalMaxPositions int     `json:"original_max_position_embeddings"`
}

// DType is a checkpoint tensor's element encoding (eng_dtype).
type DType int32

// Tensor encodings. Quantised types store each row as blocks of 32
// elements (Q8_0 .. Q5_1), or super-blocks of 256 (the "K" types), in
// ggml's layouts.
const (
	DTypeF32  DType = 0
	DTypeF16  DType = 1
	DTypeBF16 DType = 2
	DTypeQ8_0 DType = 3
	DTypeQ4_0 DType = 4
	DTypeQ4_1 DType = 5
	DTypeQ5_0 DType = 6
	DTypeQ5_1 DType = 7
	DTypeQ2_K DType = 8
	DTypeQ3_K DType = 9
	DTypeQ4_K DType = 10
	DTypeQ5_K DType = 11
	DTypeQ6_K DType = 12
)

var dtypeNames = [...]string{"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}

// dtypeBlocks are the quantised types' block sizes: elements, bytes.
var dtypeBlocks = map[DType][2]int64{
	DTypeQ8_0: {32, 34}, DTypeQ4_0: {32, 18}, DTypeQ4_1: {32, 20}, DTypeQ5_0: {32, 22}, DTypeQ5_1: {32, 24},
	DTypeQ2_K: {256, 84}, DTypeQ3_K: {256, 110}, DTypeQ4_K: {256, 144}, DTypeQ5_K: {256, 176}, DTypeQ6_K: {256, 210},
}

func (d DType) String() string {
	if d >= 0 && int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", int32(d))
}

// RowBytes is the size of one row of cols elements, or an error when a
// quantised type's 32-element blocks do not divide cols.
func (d DType) RowBytes(cols int64) (int64, error) {
	switch d {
	case DTypeF32:
		return 4 * cols, nil
	case DTypeF16, DTypeBF16:
		return 2 * cols, nil
	}
	if b, ok := dtypeBlocks[d]; ok {
		if cols%b[0] != 0 {
			return 0, fmt.Errorf("%s rows need a multiple of %d elements, got %d", d, b[0], cols)
		}
		return cols / b[0] * b[1], nil
	}
	return 0, fmt.Errorf("unknown tensor type %s", d)
}

// WeightKind says which weight a tensor is (eng_weight).
type WeightKind int32

// Weight kinds; Embedding, FinalNorm and LMHead are global (Layer -1).
const (
	WeightEmbedding WeightKind = 0  // [vocab][hidden]
	WeightFinalNorm WeightKind = 1  // [1][hidden]
	WeightLMHead    WeightKind = 2  // [vocab][hidden]; absent when TiedEmbeddings
	WeightAttnNorm  WeightKind = 3  // [1][hidden]
	WeightQ         WeightKind = 4  // [heads*head_dim][hidden]
	WeightK         WeightKind = 5  // [kv_heads*head_dim][hidden]
	WeightV         WeightKind = 6  // [kv_heads*head_dim][hidden]
	WeightO         WeightKind = 7  // [hidden][heads*head_dim]
	WeightMLPNorm   WeightKind = 8  // [1][hidden]
	WeightGate      WeightKind = 9  // [intermediate][hidden]
	WeightUp        WeightKind = 10 // [intermediate][hidden]
	WeightDown      WeightKind = 11 // [hidden][intermediate]
	// WeightRopeFreqs is optional, [1][head_dim/2]: llama.cpp's
	// per-dimension RoPE divisors (its GGUF form of Llama-3 scaling).
	WeightRopeFreqs WeightKind = 12
	// QKNorm shapes: the per-head gains, [1][head_dim] each.
	WeightQNorm WeightKind = 13
	WeightKNorm WeightKind = 14
	// MoE shapes (no WeightGate/Up/Down): the router [experts][hidden] and
	// routed expert WeightTensor.Expert's SwiGLU, [moe_intermediate][hidden]
	// (gate, up) and [hidden][moe_intermediate] (down).
	WeightRouter     WeightKind = 15
	WeightExpertGate WeightKind = 16
	WeightExpertUp   WeightKind = 17
	WeightExpertDown WeightKind = 18
	// NumSharedExperts > 0: the shared experts as one SwiGLU of width
	// S = NumSharedExperts × MoEIntermediateSize: [S][hidden], [S][hidden],
	// [hidden][S].
	WeightSharedGate WeightKind = 19
	WeightSharedUp   WeightKind = 20
	WeightSharedDown WeightKind = 21
	// MLA shapes (no WeightK/WeightV; WeightQ is [heads*(nope+rope)][q_lora
	// or hidden], WeightO [hidden][heads*v_head_dim]); either WeightKVB or
	// WeightKB and WeightVB.
	WeightQA         WeightKind = 22 // [q_lora][hidden]
	WeightQANorm     WeightKind = 23 // [1][q_lora]
	WeightKVA        WeightKind = 24 // [kv_lora+rope][hidden]
	WeightKVANorm    WeightKind = 25 // [1][kv_lora]
	WeightKVB        WeightKind = 26 // [heads*(nope+v)][kv_lora]
	WeightKB         WeightKind = 27 // [heads*kv_lora][nope] (llama.cpp's attn_k_b)
	WeightVB         WeightKind = 28 // [heads*v][kv_lora] (llama.cpp's attn_v_b)
	WeightRouterBias WeightKind = 29 // [1][experts]: a sigmoid router's choice bias
	// QKVBias shapes: the projections' biases, in WeightQ/K/V's output order.
	WeightQBias WeightKind = 30 // [1][heads*head_dim]
	WeightKBias WeightKind = 31 // [1][kv_heads*head_dim]
	WeightVBias WeightKind = 32 // [1][kv_heads*head_dim]
	// PostNorms shapes: the gains of the attention and MLP outputs' norms.
	WeightAttnPostNorm WeightKind = 33 // [1][hidden]
	WeightMLPPostNorm  WeightKind = 34 // [1][hidden]
)

// IsExpert reports whether the kind is a routed expert's (indexed by
// WeightTensor.Expert).
func (k WeightKind) IsExpert() bool { return k >= WeightExpertGate && k <= WeightExpertDown }

// WeightTensor is one checkpoint tensor handed to an engine at creation: a
// row-major [Rows][Cols] matrix (a linear layer's [out][in]) in DType. Data
// is read while the engine is created only, typically straight from a
// memory-mapped file.
type WeightTensor struct {
	Name  string // the checkpoint's name, for messages
	Kind  WeightKind
	Layer int // -1 for global tensors
	DType DType
	// InterleavedRopeHeads > 0 marks WQ/WK rows in llama.cpp's interleaved
	// RoPE order (GGUF); the engine restores rotate-half order. MLA shapes:
	// WQ (NumHeads) and WKVA (1), only each head's QKRopeHeadDim tail.
	InterleavedRopeHeads int
	// Expert is the routed expert of a WeightExpert* tensor (a slice of a
	// stacked [experts][rows][cols] checkpoint tensor, or a per-expert one);
	// 0 for every other kind.
	Expert     int
	Rows, Cols int64
	Data       []byte
}

// KVBytesPerToken is the K and V storage of one token over every layer, given
// the element size in bytes (4 for the CPU engine's float32, 2 for bf16).
// An MLA shape stores one latent of KVLoraRank + QKRopeHeadDim per layer.
func (s ModelShape) KVBytesPerToken(elemBytes int) int {
	if s.MLA() {
		return s.NumLayers * (s.KVLoraRank + s.QKRopeHeadDim) * elemBytes
	}
	return 2 * s.NumLayers * s.NumKVHeads * s.HeadDim * elemBytes
}

// Config describes an engine to build.
type Config struct {
	Preset string     // "tiny", "llama-8b", "llama-70b"; "" uses Shape
	Shape  ModelShape // used when Preset is ""
	Seed   uint64     // synthetic weights are a deterministic function of (shape, seed)
	// Tensors are checkpoint weights (every tensor of Shape once); nil =
	// synthetic weights from Seed. Requires Preset "".
	Tensors       []WeightTensor
	NumPages      int  // device-tier pages
	TokensPerPage int  // tokens per page (P)
	NumHostPages  int  // host-tier pages; 0 = no host tier
	DeviceID      int  // CUDA device (local rank); ignored on CPU
	ValidateOnly  bool // validate shape and sizes, allocate nothing, refuse steps
	// Helix makes the engine a member of a Helix CP group (nil: no Helix).
	Helix *HelixMember
	// Expert makes the engine a member of an expert-parallel group (MoE
	// shapes only; nil: every expert local).
	Expert  *ExpertMember
	Backend string // native backend: "cpu" (default when "") or "cuda"
	// CPUThreads is how many threads the CPU engine runs a step on (0 = 1).
	// Every thread count gives the same bits: the threads share out whole
	// output elements. Other engines ignore it.
	CPUThreads int
	// CPUKernels is the CPU engine's products: "exact" (or ""), float32 in
	// the reference order, or "quant": a checkpoint's Q8_0/Q4_0/Q4_1 dense
	// projections multiplied in their blocks against 8-bit activations
	// (faster, not the exact bits; the same bits for any thread count and
	// batch). Other engines ignore it.
	CPUKernels string
}

// CPUKernelNames are the CPU engine's products (Config.CPUKernels).
var CPUKernelNames = []string{"exact", "quant"}

// HelixMember places an engine in a Helix context-parallel group. Group is an
// engine-specific handle (bridge/native.CPGroup for the native engine) shared
// by the Size members; Rank is this engine's CP rank. Under Helix, positions
// are global and a block table lists the member's local pages, one per ledger
// block of TokensPerPage·Size global tokens (kvcache.md §10).
type HelixMember struct {
	Group any
	Rank  int
	Size  int
}

// ExpertMember places an engine in an expert-parallel group of a MoE model
// (docs/moe.md): routed expert e lives on member e % Size, and every MoE
// layer dispatches each token to its experts' members and combines the
// outputs, inside the step. Group is an engine-specific handle (the same
// bridge/native.CPGroup type as Helix's) shared by the Size members; Rank is
// this engine's member rank. Every member must step whenever any does
// (an empty step joins the exchanges with zero tokens).
type ExpertMember struct {
	Group any
	Rank  int
	Size  int
}

// ExchangeKind names an engine's in-step exchange with its group's members.
type ExchangeKind int

const (
	AnyExchange            ExchangeKind = -1
	HelixAttentionExchange ExchangeKind = 0 // Helix CP: attention partials
	MoEDispatchExchange    ExchangeKind = 1 // MoE EP: tokens to their experts' ranks
	MoECombineExchange     ExchangeKind = 2 // MoE EP: expert outputs back
)

// ExchangeStaller is implemented by engines whose steps exchange data with
// other members (Helix, MoE) and can inject a stall for fault tests: the next
// exchange of kind (AnyExchange: any) at layer (-1: any) sleeps for d before
// it starts, as a member that stopped inside it would.
type ExchangeStaller interface {
	StallNextExchange(kind ExchangeKind, layer int, d time.Duration) error
}

// ThreadOwner is implemented by engines that run every call on one OS thread
// of their own (the native engine: a CUDA context and the native side's
// thread-local state live there). A call from any other goroutine is a
// hand-off between two threads, twice per call: on a shared machine each
// costs tens of microseconds of CPU, on the loop's critical path.
// RunOnEngineThread runs fn on the engine's thread; calls that fn makes on
// the engine (on any Engine method, from fn's goroutine) run inline, without
// a hand-off. Calls from other goroutines wait until fn returns. fn must not
// switch coroutines (nccl.CoroGroup members run on their driver's goroutine).
type ThreadOwner interface {
	RunOnEngineThread(fn func() error) error
}

// NativeCPUReporter is implemented by engines that measure the CPU time
// their native calls took on the engine's thread (the compute of the CPU
// engine, the launches of the CUDA one). A loop that runs on the engine's
// thread (ThreadOwner) leaves it out of its own host time.
type NativeCPUReporter interface {
	NativeCPU() time.Duration
}

// SeqStep is one sequence of a step: its new tokens at positions
// StartPos..StartPos+len(Tokens)-1, its block table (page indices covering at
// least StartPos+len(Tokens) tokens), whether its last token is sampled, and
// how (the zero Sampling is greedy). A sampled token is drawn for absolute
// position StartPos+len(Tokens) (SamplePos).
type SeqStep struct {
	Tokens     []int32
	StartPos   int
	BlockTable []int32
	Sample     bool
	Sampling   SamplingParams
	// LogitBias is added to the logits before the pick (SampleSeq).
	LogitBias []TokenBias
	// Allowed, when not nil, is the bitmask of the tokens the pick may
	// return (structured outputs): bit id%32 of word id/32, AllowedWords
	// words, at least one id of the vocabulary set. The others' logits
	// become -inf after the other processors (ApplyProcessors).
	Allowed []uint32
	// PromptTokens and OutputTokens are the sequence's prompt and the
	// tokens it generated so far, read by the penalties (needed only when
	// Sampling.HasPenalties).
	PromptTokens, OutputTokens []int32
	// Logprobs asks a sampled sequence for its token's log-probability and
	// the TopLogprobs (0..MaxLogprobs) most probable tokens' (RowLogprobs:
	// the raw logits' log_softmax, before any logits processor). They never
	// change the sampled token.
	Logprobs    bool
	TopLogprobs int
	// ScoreTargets, when not nil, scores the sequence's rows (the prompt's
	// log-probabilities, vLLM's prompt_logprobs): one id per token of
	// Tokens, −1 where the row is not scored. A scored row's logits (the
	// model's prediction of the position after its token) give the
	// target's log-probability and the ScoreTop (0..MaxLogprobs) most
	// probable tokens' (RowLogprobs), in StepResult.ScoreLogprobs by
	// row, bit-exact with the sampled row of a sequence ending at that
	// token.
	ScoreTargets []int32
	ScoreTop     int
}

// SamplePos is the absolute position of the token this step samples: the
// position of the last input token + 1 (the Philox counter).
func (s *SeqStep) SamplePos() int64 { return int64(s.StartPos) + int64(len(s.Tokens)) }

// StepDesc is one forward step over a batch. Slices are read during the call only.
type StepDesc struct {
	Seqs []SeqStep
	// WantLogits asks for the logits of every sampled row (tests only).
	WantLogits bool
}

// StepResult is what a step returns.
type StepResult struct {
	Sampled []int32   // per sequence; -1 where not sampled
	Logits  []float32 // [num sampled rows × vocab] when WantLogits
	// Log-probabilities, when some sampled sequence sets Logprobs (empty
	// otherwise): per sequence, its token's (0 where it asks for none), and
	// [num_seqs × MaxLogprobs] top ids (highest first, −1 past its
	// TopLogprobs) and their log-probabilities.
	Logprobs      []float32
	TopLogprobIDs []int32
	TopLogprobs   []float32
	// Scored rows (SeqStep.ScoreTargets), when some sequence scores
	// (empty otherwise): per row of the step (the sequences' tokens in
	// order), the target's log-probability (0 where a row is not scored),
	// and [rows × MaxLogprobs] top ids (−1 past its ScoreTop) and
	// log-probabilities, and per row the target's rank (RowRank; 0 where
	// not scored).
	ScoreLogprobs    []float32
	ScoreTopIDs      []int32
	ScoreTopLogprobs []float32
	ScoreRanks       []int32
	DeviceMS         float64 // device (or CPU compute) time of the step
	// MoEWaitMS is the part of DeviceMS spent in MoE exchanges (waiting for
	// the slowest member and moving tokens); 0 without expert parallelism.
	MoEWaitMS float64
}

// MaxInflight is how many submitted steps may be outstanding (ENG_MAX_INFLIGHT).
const MaxInflight = 2

// Tier names a page slab.
type Tier int

// Page tiers.
const (
	TierDevice Tier = 0
	TierHost   Tier = 1
)

// Engine runs the model. Implementations are not safe for concurrent use:
// one goroutine drives one engine (the native one pins its own OS thread).
type Engine interface {
	// Shape is the resolved model shape.
	Shape() ModelShape
	// Step runs one forward step. desc must satisfy the step contract
	// (StepChecker.Check); an invalid step fails with INVALID_ARGUMENT and
	// changes nothing. res is overwritten; its slices are reused when large
	// enough, so a caller that keeps results must copy them.
	Step(desc *StepDesc, res *StepResult) error
	// Submit queues a step and returns without waiting for its compute (the
	// overlap loop); the descriptor is copied, so the caller may reuse it at
	// once. At most MaxInflight steps may be outstanding; Step and CopyPages
	// are ordered after them (Step refuses while any is outstanding).
	Submit(desc *StepDesc) error
	// Wait blocks until the oldest submitted step finished and writes its
	// result into res (same reuse rules as Step).
	Wait(res *StepResult) error
	// CopyPages copies page src[k] of srcTier to page dst[k] of dstTier. An
	// invalid copy (CheckCopy) fails with INVALID_ARGUMENT and copies nothing.
	CopyPages(srcTier Tier, src []int32, dstTier Tier, dst []int32) error
	// Close releases the engine. Further calls fail.
	Close() error
}

// Status is a native eng_status code.
type Status int

// Status codes, identical to eng_status in engine.h.
const (
	StatusOK              Status = 0
	StatusInvalidArgument Status = 1
	StatusOutOfMemory     Status = 2
	StatusUnsupported     Status = 3
	StatusDeviceError     Status = 4
	StatusCommError       Status = 5
	StatusTimeout         Status = 6
	StatusInternal        Status = 7
)

// Sentinel errors, one per non-OK status; match with errors.Is.
var (
	ErrInvalidArgument = errors.New("invalid argument")
	ErrOutOfMemory     = errors.New("out of memory")
	ErrUnsupported     = errors.New("unsupported")
	ErrDeviceError     = errors.New("device error")
	ErrCommError       = errors.New("communication error")
	ErrTimeout         = errors.New("timeout")
	ErrInternal        = errors.New("internal error")
	ErrClosed          = errors.New("engine closed")
)

func (s Status) sentinel() error {
	switch s {
	case StatusInvalidArgument:
		return ErrInvalidArgument
	case StatusOutOfMemory:
		return ErrOutOfMemory
	case StatusUnsupported:
		return ErrUnsupported
	case StatusDeviceError:
		return ErrDeviceError
	case StatusCommError:
		return ErrCommError
	case StatusTimeout:
		return ErrTimeout
	default:
		return ErrInternal
	}
}

// String names the status as engine.h does.
func (s Status) String() string {
	names := [...]string{"OK", "INVALID_ARGUMENT", "OUT_OF_MEMORY", "UNSUPPORTED",
		"DEVICE_ERROR", "COMM_ERROR", "TIMEOUT", "INTERNAL"}
	if s >= 0 && int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("STATUS(%d)", int(s))
}

// Error is a failed engine call: the operation, the native status and the
// engine's message. errors.Is(err, ErrInvalidArgument) etc. match the status.
type Error struct {
	Op     string
	Status Status
	Msg    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("engine %s: %s: %s", e.Op, e.Status, e.Msg)
}

// Is reports whether target is the sentinel of e's status.
func (e *Error) Is(target error) bool { return target == e.Status.sentinel() }

// StatusError builds the error of a native call; nil for StatusOK.
func StatusError(op string, s Status, msg string) error {
	if s == StatusOK {
		return nil
	}
	return &Error{Op: op, Status: s, Msg: msg}
}
