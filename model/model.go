// Package model turns checkpoints into what the engines and the worker need:
// the architecture (bridge.ModelShape), the weights (bridge.WeightTensor,
// read straight from a memory-mapped file), the tokenizer and the chat
// template. Two formats: a GGUF file (llama.cpp) and a Hugging Face directory
// (config.json, *.safetensors possibly sharded, tokenizer.json,
// tokenizer_config.json). Only Llama-architecture decoders are accepted;
// anything else is refused with a message naming what is unsupported.
//
// Weights are never copied on the Go side: a tensor's Data aliases the
// mapping, the engine converts it once at creation (dequantising GGUF block
// types into its own weight type), and Close unmaps the file.
package model

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge"
)

// Model is a loaded checkpoint.
type Model struct {
	Path   string // the file or directory given
	Format string // "gguf" or "safetensors"
	Name   string // the checkpoint's own name, else the file's
	Shape  bridge.ModelShape
	// ContextLength is the model's trained context (0 when unknown).
	ContextLength int
	// Tensors alias the mapped files: valid until Close.
	Tensors   []bridge.WeightTensor
	Tokenizer *Tokenizer

	mappings []interface{ Close() error }
}

// Close unmaps the checkpoint's files. Tensors must not be used afterwards;
// engines created from them keep their own converted copy.
func (m *Model) Close() error {
	var errs []error
	for _, c := range m.mappings {
		errs = append(errs, c.Close())
	}
	m.mappings = nil
	m.Tensors = nil
	return errors.Join(errs...)
}

// WeightBytes is the size of the tensors as stored in the checkpoint.
func (m *Model) WeightBytes() int64 {
	var n int64
	for _, t := range m.Tensors {
		n += int64(len(t.Data))
	}
	return n
}

// IsPath reports whether a --model value names a checkpoint rather than a
// preset: it contains a path separator, ends in .gguf, or exists.
func IsPath(s string) bool {
	if strings.ContainsRune(s, '/') || strings.ContainsRune(s, filepath.Separator) || strings.HasSuffix(strings.ToLower(s), ".gguf") {
		return true
	}
	_, err := os.Stat(s)
	return err == nil
}

// Load opens a GGUF file or a Hugging Face directory.
func Load(path string) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", path, err)
	}
	if st.IsDir() {
		return loadHF(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", path, err)
	}
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	f.Close()
	if err != nil || string(magic[:]) != "GGUF" {
		return nil, fmt.Errorf("model %s: not a GGUF file (magic %q) and not a directory; give a .gguf file or a Hugging Face directory with config.json and *.safetensors", path, magic[:])
	}
	return loadGGUF(path)
}

// checkTensors verifies that the tensors cover the shape exactly once with
// the right dimensions and sizes, naming the first offender. The engine
// checks the same; checking here gives the checkpoint's own names before any
// engine is built.
func checkTensors(s bridge.ModelShape, ts []bridge.WeightTensor) error {
	H, qd, kvd := int64(s.HiddenSize), int64(s.NumHeads*s.HeadDim), int64(s.NumKVHeads*s.HeadDim)
	F, V, D := int64(s.IntermediateSize), int64(s.VocabSize), int64(s.HeadDim)
	Fm, Fs := int64(s.MoEIntermediateSize), int64(s.NumSharedExperts*s.MoEIntermediateSize)
	dims := map[bridge.WeightKind][2]int64{
		bridge.WeightEmbedding: {V, H}, bridge.WeightLMHead: {V, H}, bridge.WeightFinalNorm: {1, H},
		bridge.WeightAttnNorm: {1, H}, bridge.WeightMLPNorm: {1, H}, bridge.WeightQ: {qd, H},
		bridge.WeightK: {kvd, H}, bridge.WeightV: {kvd, H}, bridge.WeightO: {H, qd},
		bridge.WeightGate: {F, H}, bridge.WeightUp: {F, H}, bridge.WeightDown: {H, F},
		bridge.WeightRopeFreqs: {1, int64(s.RopeDim()) / 2}, bridge.WeightQNorm: {1, D}, bridge.WeightKNorm: {1, D},
		bridge.WeightRouter: {int64(s.NumExperts), H}, bridge.WeightExpertGate: {Fm, H},
		bridge.WeightExpertUp: {Fm, H}, bridge.WeightExpertDown: {H, Fm},
		bridge.WeightSharedGate: {Fs, H}, bridge.WeightSharedUp: {Fs, H}, bridge.WeightSharedDown: {H, Fs},
		bridge.WeightRouterBias: {1, int64(s.NumExperts)},
		bridge.WeightQBias:      {1, qd}, bridge.WeightKBias: {1, kvd}, bridge.WeightVBias: {1, kvd},
		bridge.WeightAttnPostNorm: {1, H}, bridge.WeightMLPPostNorm: {1, H},
	}
	if s.MLA() {
		heads, QL, KL := int64(s.NumHeads), int64(s.QLoraRank), int64(s.KVLoraRank)
		N, R, Vh := int64(s.QKNopeHeadDim), int64(s.QKRopeHeadDim), int64(s.VHeadDim)
		qIn := H
		if QL > 0 {
			qIn = QL
		}
		dims[bridge.WeightQ] = [2]int64{heads * (N + R), qIn}
		dims[bridge.WeightO] = [2]int64{H, heads * Vh}
		dims[bridge.WeightRopeFreqs] = [2]int64{1, R / 2}
		dims[bridge.WeightQA], dims[bridge.WeightQANorm] = [2]int64{QL, H}, [2]int64{1, QL}
		dims[bridge.WeightKVA], dims[bridge.WeightKVANorm] = [2]int64{KL + R, H}, [2]int64{1, KL}
		dims[bridge.WeightKVB] = [2]int64{heads * (N + Vh), KL}
		dims[bridge.WeightKB], dims[bridge.WeightVB] = [2]int64{heads * KL, N}, [2]int64{heads * Vh, KL}
	}
	type key struct {
		k         bridge.WeightKind
		l, expert int
	}
	seen := map[key]string{}
	for _, t := range ts {
		if err := foreignTensor(s, t); err != nil {
			return err
		}
		d := dims[t.Kind]
		if t.Rows != d[0] || t.Cols != d[1] {
			return fmt.Errorf("tensor %s is [%d][%d] (rows × cols), the architecture needs [%d][%d]", t.Name, t.Rows, t.Cols, d[0], d[1])
		}
		rb, err := t.DType.RowBytes(t.Cols)
		if err != nil {
			return fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		if int64(len(t.Data)) != rb*t.Rows {
			return fmt.Errorf("tensor %s: %d bytes of data, [%d][%d] %s needs %d (truncated file?)", t.Name, len(t.Data), t.Rows, t.Cols, t.DType, rb*t.Rows)
		}
		k := key{t.Kind, t.Layer, t.Expert}
		if prev, dup := seen[k]; dup {
			return fmt.Errorf("tensors %s and %s are the same weight", prev, t.Name)
		}
		seen[k] = t.Name
	}
	for _, k := range []bridge.WeightKind{bridge.WeightEmbedding, bridge.WeightFinalNorm} {
		if _, ok := seen[key{k, -1, 0}]; !ok {
			return fmt.Errorf("missing tensor: %s", kindNames[k])
		}
	}
	if _, ok := seen[key{bridge.WeightLMHead, -1, 0}]; !ok && !s.TiedEmbeddings {
		return fmt.Errorf("missing tensor: %s (and the embeddings are not tied)", kindNames[bridge.WeightLMHead])
	}
	for l := 0; l < s.NumLayers; l++ {
		need := []bridge.WeightKind{bridge.WeightAttnNorm, bridge.WeightQ, bridge.WeightO, bridge.WeightMLPNorm}
		if s.MLA() {
			need = append(need, bridge.WeightKVA, bridge.WeightKVANorm)
			if s.QLoraRank > 0 {
				need = append(need, bridge.WeightQA, bridge.WeightQANorm)
			}
			_, kvb := seen[key{bridge.WeightKVB, l, 0}]
			_, kb := seen[key{bridge.WeightKB, l, 0}]
			_, vb := seen[key{bridge.WeightVB, l, 0}]
			switch {
			case kvb && (kb || vb):
				return fmt.Errorf("layer %d has both attn_kv_b and attn_k_b/attn_v_b; a file has one form", l)
			case !kvb:
				need = append(need, bridge.WeightKB, bridge.WeightVB)
			}
		} else {
			need = append(need, bridge.WeightK, bridge.WeightV)
		}
		if s.QKNorm {
			need = append(need, bridge.WeightQNorm, bridge.WeightKNorm)
		}
		if s.QKVBias {
			need = append(need, bridge.WeightQBias, bridge.WeightKBias, bridge.WeightVBias)
		}
		if s.PostNorms {
			need = append(need, bridge.WeightAttnPostNorm, bridge.WeightMLPPostNorm)
		}
		if !s.MoELayer(l) {
			need = append(need, bridge.WeightGate, bridge.WeightUp, bridge.WeightDown)
		} else {
			need = append(need, bridge.WeightRouter)
			if s.NumSharedExperts > 0 {
				need = append(need, bridge.WeightSharedGate, bridge.WeightSharedUp, bridge.WeightSharedDown)
			}
		}
		for _, k := range need {
			if _, ok := seen[key{k, l, 0}]; !ok {
				return fmt.Errorf("missing tensor: layer %d %s", l, kindNames[k])
			}
		}
		if !s.MoELayer(l) {
			continue
		}
		for e := 0; e < s.NumExperts; e++ {
			for _, k := range []bridge.WeightKind{bridge.WeightExpertGate, bridge.WeightExpertUp, bridge.WeightExpertDown} {
				if _, ok := seen[key{k, l, e}]; !ok {
					return fmt.Errorf("missing tensor: layer %d expert %d %s", l, e, kindNames[k])
				}
			}
		}
	}
	return nil
}

// splitFused splits a fused projection into the engine's kinds by rows:
// q, k, v (heads·head_dim, then kv_heads·head_dim twice) or gate, up
// (intermediate each). The parts alias the tensor's data.
func splitFused(s bridge.ModelShape, t bridge.WeightTensor) ([]bridge.WeightTensor, error) {
	qd, kvd, f := int64(s.NumHeads*s.HeadDim), int64(s.NumKVHeads*s.HeadDim), int64(s.IntermediateSize)
	kinds, rows, what := []bridge.WeightKind{bridge.WeightQ, bridge.WeightK, bridge.WeightV}, []int64{qd, kvd, kvd}, "q, k and v"
	if t.Kind == weightGateUp {
		kinds, rows, what = []bridge.WeightKind{bridge.WeightGate, bridge.WeightUp}, []int64{f, f}, "gate and up"
	}
	var total int64
	for _, r := range rows {
		total += r
	}
	if t.Rows != total {
		return nil, fmt.Errorf("tensor %s (%s fused) has %d rows, the architecture needs %d", t.Name, what, t.Rows, total)
	}
	rb, err := t.DType.RowBytes(t.Cols)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	if int64(len(t.Data)) != rb*t.Rows {
		return nil, fmt.Errorf("tensor %s: %d bytes of data, [%d][%d] %s needs %d (truncated file?)", t.Name, len(t.Data), t.Rows, t.Cols, t.DType, rb*t.Rows)
	}
	parts := make([]bridge.WeightTensor, len(kinds))
	var off int64
	for i, k := range kinds {
		p := t
		p.Kind, p.Rows, p.Name = k, rows[i], fmt.Sprintf("%s[%s]", t.Name, kindNames[k])
		p.Data = t.Data[off*rb : (off+rows[i])*rb : (off+rows[i])*rb]
		parts[i] = p
		off += rows[i]
	}
	return parts, nil
}

// foreignTensor says why a tensor does not belong to the shape (or its
// layer), nil when it does.
func foreignTensor(s bridge.ModelShape, t bridge.WeightTensor) error {
	moe := s.MoELayer(t.Layer)
	switch k := t.Kind; {
	case moe && (k == bridge.WeightGate || k == bridge.WeightUp || k == bridge.WeightDown):
		return fmt.Errorf("tensor %s is a dense MLP weight in a mixture-of-experts layer", t.Name)
	case !moe && (k == bridge.WeightRouter || k == bridge.WeightRouterBias || k.IsExpert() ||
		k >= bridge.WeightSharedGate && k <= bridge.WeightSharedDown):
		if s.MoE() {
			return fmt.Errorf("tensor %s is a mixture-of-experts weight in dense layer %d (the first %d layers are dense)", t.Name, t.Layer, s.FirstDenseLayers)
		}
		return fmt.Errorf("tensor %s is a mixture-of-experts weight in a dense model (no expert count in the metadata)", t.Name)
	case s.NumSharedExperts == 0 && k >= bridge.WeightSharedGate && k <= bridge.WeightSharedDown:
		return fmt.Errorf("tensor %s is a shared expert's, but the model has no shared experts", t.Name)
	case k == bridge.WeightRouterBias && !s.RouterNorm.Sigmoid():
		return fmt.Errorf("tensor %s is a router bias, but the model's router is a softmax one", t.Name)
	case !s.QKNorm && (k == bridge.WeightQNorm || k == bridge.WeightKNorm):
		return fmt.Errorf("tensor %s is a q/k norm gain, which this architecture does not have", t.Name)
	case !s.QKVBias && k >= bridge.WeightQBias && k <= bridge.WeightVBias:
		return fmt.Errorf("tensor %s is a q/k/v projection bias, which this architecture does not have", t.Name)
	case !s.PostNorms && (k == bridge.WeightAttnPostNorm || k == bridge.WeightMLPPostNorm):
		return fmt.Errorf("tensor %s is a post-norm gain (Gemma 2/3), which this architecture does not have", t.Name)
	case s.MLA() && (k == bridge.WeightK || k == bridge.WeightV):
		return fmt.Errorf("tensor %s is a K/V projection, but the model uses latent attention (MLA)", t.Name)
	case !s.MLA() && k >= bridge.WeightQA && k <= bridge.WeightVB:
		return fmt.Errorf("tensor %s is a latent-attention (MLA) weight, but the model has no kv_lora_rank", t.Name)
	case s.QLoraRank == 0 && (k == bridge.WeightQA || k == bridge.WeightQANorm):
		return fmt.Errorf("tensor %s is a q LoRA weight, but the model has no q_lora_rank", t.Name)
	}
	return nil
}

var kindNames = map[bridge.WeightKind]string{
	bridge.WeightEmbedding: "token embedding", bridge.WeightFinalNorm: "final norm", bridge.WeightLMHead: "output (lm_head)",
	bridge.WeightAttnNorm: "attention norm", bridge.WeightQ: "q projection", bridge.WeightK: "k projection",
	bridge.WeightV: "v projection", bridge.WeightO: "output projection", bridge.WeightMLPNorm: "MLP norm",
	bridge.WeightGate: "gate projection", bridge.WeightUp: "up projection", bridge.WeightDown: "down projection",
	bridge.WeightRopeFreqs: "RoPE frequency factors", bridge.WeightQNorm: "q norm", bridge.WeightKNorm: "k norm",
	bridge.WeightRouter: "router (expert gate)", bridge.WeightExpertGate: "expert gate projection",
	bridge.WeightExpertUp: "expert up projection", bridge.WeightExpertDown: "expert down projection",
	bridge.WeightSharedGate: "shared expert gate projection", bridge.WeightSharedUp: "shared expert up projection",
	bridge.WeightSharedDown: "shared expert down projection", bridge.WeightQA: "q LoRA down projection (attn_q_a)",
	bridge.WeightQANorm: "q LoRA norm (attn_q_a_norm)", bridge.WeightKVA: "latent KV projection (attn_kv_a_mqa)",
	bridge.WeightKVANorm: "latent KV norm (attn_kv_a_norm)", bridge.WeightKVB: "latent KV up projection (attn_kv_b)",
	bridge.WeightKB: "latent K up projection (attn_k_b)", bridge.WeightVB: "latent V up projection (attn_v_b)",
	bridge.WeightRouterBias: "router bias (exp_probs_b)", bridge.WeightQBias: "q projection bias",
	bridge.WeightKBias: "k projection bias", bridge.WeightVBias: "v projection bias",
	bridge.WeightAttnPostNorm: "attention post-norm", bridge.WeightMLPPostNorm: "MLP post-norm",
}
