//go:build native

package tests

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model"
)

// gemmaF64RelTol: our float32 logits against the float64 forward of
// scripts/reference/make_moe_reference.py (Hugging Face's Gemma
// semantics, exact tanh GELU), relative to max(|ref|, 1).
const gemmaF64RelTol = 1e-5

// gemmaLlamaRelTol: against llama.cpp, whose CPU GELU rounds its input to
// half precision and reads a half-precision table (ggml-cpu's
// GGML_GELU_FP16), which moves these logits by up to ~3e-4 relative from
// the exact activation (the float64 forward's own distance to llama.cpp).
const gemmaLlamaRelTol = 1e-3

// TestGemmaAgainstReferences: the random-weight Gemma, Gemma 2 and Gemma 3
// checkpoints of tests/testdata/moe on the CPU engine (one engine, and
// four engines each with a quarter of the prompts, bit-identical), against
// llama.cpp's greedy continuations (top-5 logits within gemmaLlamaRelTol,
// the same greedy token at every position before a near tie) and against
// a float64 forward of the same weights on llama.cpp's token path (its
// top-5 within gemmaF64RelTol). The checkpoints exercise what Gemma adds:
// the GELU MLP, the embedding multiplier, heads that do not tile the hidden
// size, post norms, soft-capped scores and logits (caps small enough to
// bite), sliding windows of 8 positions on alternate layers (Gemma 2) and
// on five layers of six with their own RoPE base beside a linearly scaled
// global layer (Gemma 3), and q/k norms.
func TestGemmaAgainstReferences(t *testing.T) {
	for _, arch := range []string{"gemma", "gemma2", "gemma3"} {
		t.Run(arch, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "moe", arch+".reference.json"))
			require.NoError(t, err)
			var ref struct {
				moeReference
				Prompts []struct {
					moeRefPrompt
					F64Top [][][2]float64 `json:"f64_top"`
				} `json:"prompts"`
			}
			require.NoError(t, json.Unmarshal(raw, &ref))
			m, err := model.Load(filepath.Join("testdata", "moe", ref.Model))
			require.NoError(t, err)
			defer m.Close()
			s := m.Shape
			require.True(t, s.MLPGelu, "GELU MLP")
			require.Equal(t, float32(math.Sqrt(32)), s.EmbeddingScale, "embedding times sqrt(hidden)")
			require.Equal(t, arch != "gemma", s.PostNorms, "post norms")
			require.Equal(t, arch == "gemma3", s.QKNorm, "q/k norms")
			switch arch {
			case "gemma":
				require.Zero(t, s.SlidingWindow)
				require.Equal(t, 16, s.HeadDim, "head_dim from key_length (heads × head_dim 64 ≠ hidden 32)")
			case "gemma2":
				require.Equal(t, [4]float32{3, 8, 8, 2}, [4]float32{s.AttnSoftcap, s.FinalSoftcap, float32(s.SlidingWindow), float32(s.SlidingWindowPattern)})
				require.Zero(t, s.RopeLocalTheta)
			case "gemma3":
				require.Zero(t, s.AttnSoftcap+s.FinalSoftcap, "Gemma 3 caps nothing")
				require.Equal(t, [4]float32{8, 6, 10000, 8}, [4]float32{float32(s.SlidingWindow), float32(s.SlidingWindowPattern), s.RopeLocalTheta, s.RopeLinearFactor})
			}
			base := ref.moeReference
			base.Prompts = nil
			for _, p := range ref.Prompts {
				require.Equal(t, p.PromptIDs, m.Tokenizer.Encode(p.Text, model.EncodeOptions{}), "%s: prompt token ids", p.Name)
				base.Prompts = append(base.Prompts, p.moeRefPrompt)
			}
			one := runMoEReference(t, m, base, 1)
			four := runMoEReference(t, m, base, 4)
			require.Equal(t, one, four, "four engines give one engine's logits")

			var lines []string
			agree, steps, worstLlama, worstF64 := 0, 0, 0.0, 0.0
			for i, p := range ref.Prompts {
				n, relL, relF := 0, 0.0, 0.0
				for step := 0; step < base.Steps; step++ {
					row := one[i][step]
					for _, e := range p.F64Top[step] {
						rel := math.Abs(float64(row[int(e[0])])-e[1]) / math.Max(math.Abs(e[1]), 1)
						relF = math.Max(relF, rel)
						require.LessOrEqual(t, rel, gemmaF64RelTol, "%s step %d: logit of %d is %v, float64 forward %v", p.Name, step, int(e[0]), row[int(e[0])], e[1])
					}
					for _, e := range p.Top[step] {
						rel := math.Abs(float64(row[int(e[0])])-e[1]) / math.Max(math.Abs(e[1]), 1)
						relL = math.Max(relL, rel)
						require.LessOrEqual(t, rel, gemmaLlamaRelTol, "%s step %d: logit of %d is %v, llama.cpp %v", p.Name, step, int(e[0]), row[int(e[0])], e[1])
					}
					if p.Gap[step] < moeRefTieGap {
						break
					}
					require.Equal(t, p.Tokens[step], argmax(row), "%s step %d: greedy token", p.Name, step)
					n++
				}
				agree, steps = agree+n, steps+base.Steps
				worstLlama, worstF64 = math.Max(worstLlama, relL), math.Max(worstF64, relF)
				lines = append(lines, fmt.Sprintf("%-8s prompt %3d tokens: %2d/%d greedy tokens as llama.cpp, max rel. error %.1e (llama.cpp) %.1e (float64)",
					p.Name, len(p.PromptIDs), n, base.Steps, relL, relF))
			}
			t.Logf("%s: %d/%d positions agree with llama-cpp-python %s; max rel. top-5 logit error %.2e against llama.cpp, %.2e against the float64 forward:\n%s",
				ref.Model, agree, steps, ref.Tools["llama_cpp_python"], worstLlama, worstF64, strings.Join(lines, "\n"))
		})
	}
}
