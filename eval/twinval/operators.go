package twinval

import (
	"fmt"
	"math"

	"github.com/lockstep-ai/lockstep/bridge/twin"
)

// Result is one published figure and the twin's figure for the same
// configuration.
type Result struct {
	Group     string  // the table's group (see Groups)
	Source    string  // the published table's file
	Config    string  // the row's configuration, as the report prints it
	Published float64 // the published figure
	Twin      float64 // the twin's figure for the same configuration
	Unit      string  // the unit of both
}

// Ratio is twin / published.
func (r Result) Ratio() float64 { return r.Twin / r.Published }

// Group is one kind of published figure and its accuracy target.
type Group struct {
	Name   string
	Title  string
	Target float64 // the largest |twin/published − 1| a row may have (0: reported, no target)
}

// Groups are the validation's groups in report order. The targets are the
// ones the twin is held to (issue 26): throughput rows ±15 %, single-stream
// latency rows ±20 %, Vidur's GEMMs ±15 %; the other operator tables are
// reported for what they say about the model.
var Groups = []Group{
	{"trtllm-throughput", "TensorRT-LLM v1.0 perf-overview: total output throughput (tokens/s)", 0.15},
	{"latency", "single-stream latency: TTFT and inter-token latency (ms)", 0.20},
	{"vidur-gemm", "Vidur H100: one layer's GEMMs (QKV, O, gate+up, down), FP16 (ms)", 0.15},
	{"vidur-elementwise", "Vidur H100: one layer's element-wise kernels (2 norms, RoPE, SiLU-mul, add) (ms)", 0},
	{"deepgemm-fp8", "DeepGEMM H800: one FP8 GEMM (ms)", 0},
	{"nvfp4-gemm", "vLLM CUTLASS and torchao cuBLASLt on B200: one NVFP4 GEMM (ms)", 0},
	{"ort-decode", "ONNX Runtime H100: paged decode attention, one layer (ms)", 0},
	{"vidur-allreduce", "Vidur DGX H100: NCCL all-reduce (ms)", 0},
}

// profileFor is a built-in profile with the row's deployment.
func profileFor(gpu, model string, tp int, weight, kv twin.DType) (*twin.Profile, error) {
	p, err := twin.BuiltinProfile(gpu, model, twin.Parallelism{TP: tp})
	if err != nil {
		return nil, err
	}
	return p.WithDTypes(weight, kv)
}

// operatorRows runs the twin's operator model on every operator table with
// the coefficients of rc (nil: the built-in ones).
func operatorRows(rc *twin.RooflineCoefficients) ([]Result, error) {
	var out []Result
	for _, f := range []func(*twin.RooflineCoefficients) ([]Result, error){vidurRows, deepGEMMRows, nvfp4Rows, ortRows, allReduceRows} {
		rs, err := f(rc)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// withCoefficients is p with rc's coefficients (nil: p itself).
func withCoefficients(p *twin.Profile, rc *twin.RooflineCoefficients) (*twin.Profile, error) {
	if rc == nil {
		return p, nil
	}
	q := *p
	r := *rc
	q.Roofline = &r
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return &q, nil
}

// profiles caches the profiles of one coefficient set by key.
type profiles struct {
	rc *twin.RooflineCoefficients
	m  map[string]*twin.Profile
}

func (c *profiles) get(gpu, model string, tp int, weight, kv twin.DType) (*twin.Profile, error) {
	key := fmt.Sprintf("%s/%s/%d/%s/%s", gpu, model, tp, weight, kv)
	if p, ok := c.m[key]; ok {
		return p, nil
	}
	p, err := profileFor(gpu, model, tp, weight, kv)
	if err == nil {
		p, err = withCoefficients(p, c.rc)
	}
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[string]*twin.Profile{}
	}
	c.m[key] = p
	return p, nil
}

// vidurRows are the GEMM and element-wise rows of Vidur's H100 profiles:
// one layer of a context chunk of `tokens` tokens at depth 0 on one GPU of
// a TP group (FP16 there, BF16 here: the same tensor-core rate and bytes).
func vidurRows(rc *twin.RooflineCoefficients) ([]Result, error) {
	t, err := readTable(fileVidurMLP)
	if err != nil {
		return nil, err
	}
	c := profiles{rc: rc}
	var out []Result
	for i := range t.rows {
		r := t.row(i)
		model, tp, tokens := r.str("model"), r.int("tp"), r.int("tokens")
		gemm := r.num("qkv_ms") + r.num("o_ms") + r.num("up_ms") + r.num("down_ms")
		elem := r.num("input_norm_ms") + r.num("post_norm_ms") + r.num("rope_ms") + r.num("act_ms") + r.num("add_ms")
		if r.err != nil {
			return nil, r.err
		}
		p, err := c.get("h100", model, tp, twin.BF16, twin.BF16)
		if err != nil {
			return nil, fmt.Errorf("%s row %d: %w", t.name, i+1, err)
		}
		lc, err := p.LayerCosts([]twin.Work{{NewTokens: tokens}})
		if err != nil {
			return nil, err
		}
		cfg := fmt.Sprintf("%s tp%d %d tokens", model, tp, tokens)
		out = append(out, Result{"vidur-gemm", t.name, cfg, gemm, lc.GEMMMS, "ms"},
			Result{"vidur-elementwise", t.name, cfg, elem, lc.ElementwiseMS, "ms"})
	}
	return out, nil
}

// deepGEMMRows are DeepGEMM's FP8 GEMMs on H800 (H100 SXM's compute and
// HBM): M tokens through an N×K weight.
func deepGEMMRows(rc *twin.RooflineCoefficients) ([]Result, error) {
	t, err := readTable(fileDeepGEMM)
	if err != nil {
		return nil, err
	}
	c := profiles{rc: rc}
	p, err := c.get("h100", "llama-8b", 1, twin.FP8, twin.BF16)
	if err != nil {
		return nil, err
	}
	var out []Result
	for i := range t.rows {
		r := t.row(i)
		m, n, k, tf := r.int("m"), r.int("n"), r.int("k"), r.num("tflops")
		if r.err != nil {
			return nil, r.err
		}
		ms := 2 * float64(m) * float64(n) * float64(k) / (tf * 1e12) * 1e3
		out = append(out, Result{"deepgemm-fp8", t.name, fmt.Sprintf("M %d, N %d, K %d", m, n, k), ms,
			p.GEMMMS(m, k, n, twin.FP8), "ms"})
	}
	return out, nil
}

// nvfp4Rows are the published NVFP4 GEMMs on B200: vLLM's CUTLASS kernel on
// Llama-3.1-8B's QKV shape over 1-16 384 tokens, and torchao's square
// problems through cuBLASLt; M tokens through an N×K weight.
func nvfp4Rows(rc *twin.RooflineCoefficients) ([]Result, error) {
	c := profiles{rc: rc}
	p, err := c.get("b200", "llama-8b", 1, twin.NVFP4, twin.BF16)
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, f := range []struct{ file, col, src string }{
		{fileVLLMNVFP4, "tflops", "vLLM CUTLASS"}, {fileTorchAONVFP4, "us", "torchao cuBLASLt"}} {
		t, err := readTable(f.file)
		if err != nil {
			return nil, err
		}
		for i := range t.rows {
			r := t.row(i)
			m, n, k, v := r.int("m"), r.int("n"), r.int("k"), r.num(f.col)
			if r.err != nil {
				return nil, r.err
			}
			ms := v / 1e3 // us
			if f.col == "tflops" {
				ms = 2 * float64(m) * float64(n) * float64(k) / (v * 1e12) * 1e3
			}
			out = append(out, Result{"nvfp4-gemm", t.name, fmt.Sprintf("%s: M %d, N %d, K %d", f.src, m, n, k), ms,
				p.GEMMMS(m, k, n, twin.NVFP4), "ms"})
		}
	}
	return out, nil
}

// ortRows are the paged decode table: num_seqs decodes at seq_len tokens
// of context, Llama-3-70B's heads at TP 1 (64 over 8, head 128, BF16 KV).
func ortRows(rc *twin.RooflineCoefficients) ([]Result, error) {
	t, err := readTable(fileORTDecode)
	if err != nil {
		return nil, err
	}
	c := profiles{rc: rc}
	p, err := c.get("h100", "llama-70b", 1, twin.BF16, twin.BF16)
	if err != nil {
		return nil, err
	}
	if p.Model.Heads != 64 || p.Model.KVHeads != 8 || p.Model.HeadDim != 128 {
		return nil, fmt.Errorf("%s: llama-70b's heads changed (%d/%d/%d); the table is 64/8/128", t.name, p.Model.Heads, p.Model.KVHeads, p.Model.HeadDim)
	}
	var out []Result
	for i := range t.rows {
		r := t.row(i)
		seqs, seqLen, us := r.int("num_seqs"), r.int("seq_len"), r.num("gpu_time_us")
		if r.err != nil {
			return nil, r.err
		}
		w := make([]twin.Work, seqs)
		for j := range w {
			w[j] = twin.Work{NewTokens: 1, KVBefore: seqLen - 1}
		}
		lc, err := p.LayerCosts(w)
		if err != nil {
			return nil, err
		}
		out = append(out, Result{"ort-decode", t.name, fmt.Sprintf("%d seqs x %d tokens", seqs, seqLen), us / 1e3, lc.AttentionMS, "ms"})
	}
	return out, nil
}

// allReduceRows are NCCL all-reduces on one DGX H100.
func allReduceRows(rc *twin.RooflineCoefficients) ([]Result, error) {
	t, err := readTable(fileVidurAR)
	if err != nil {
		return nil, err
	}
	c := profiles{rc: rc}
	p, err := c.get("h100", "llama-8b", 1, twin.BF16, twin.BF16)
	if err != nil {
		return nil, err
	}
	var out []Result
	for i := range t.rows {
		r := t.row(i)
		gpus, bytes, ms := r.int("gpus"), r.num("bytes"), r.num("ms")
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, Result{"vidur-allreduce", t.name, fmt.Sprintf("%d GPUs, %s", gpus, humanBytes(bytes)), ms,
			p.AllReduceMS(bytes, gpus), "ms"})
	}
	return out, nil
}

// humanBytes prints a size in KB or MB (decimal).
func humanBytes(b float64) string {
	if b >= 1e6 {
		return fmt.Sprintf("%.1f MB", b/1e6)
	}
	return fmt.Sprintf("%.0f KB", math.Round(b/1e3))
}
