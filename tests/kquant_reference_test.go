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

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/model"
)

// TestKQuantModelAgainstLlamaCPP: the Q4_K_M file llama.cpp quantised from
// a tiny random Llama (tests/testdata/kquant, Q4_K and Q6_K tensors) loads,
// and the CPU engine, which dequantises its weights to float32 exactly as
// ggml does (TestKQuantDequantization), continues each reference prompt as
// llama.cpp does. llama.cpp's K-quant kernels round the activations to 8
// bits, so its logits are not the float32 ones (as for Q4_1,
// scripts/reference/README.md): the top-5 logits agree within
// kquantLogitTol (absolute), and the greedy tokens until the first step
// whose llama.cpp gap is below kquantTieGap.
func TestKQuantModelAgainstLlamaCPP(t *testing.T) {
	const kquantLogitTol, kquantTieGap = 0.5, 0.5 // twice the largest difference measured (0.24)
	dir := filepath.Join("testdata", "kquant")
	raw, err := os.ReadFile(filepath.Join(dir, "kquant.reference.json"))
	require.NoError(t, err)
	var ref moeReference
	require.NoError(t, json.Unmarshal(raw, &ref))
	m, err := model.Load(filepath.Join(dir, ref.Model))
	require.NoError(t, err)
	defer m.Close()
	types := map[bridge.DType]int{}
	for _, w := range m.Tensors {
		types[w.DType]++
	}
	require.Positive(t, types[bridge.DTypeQ4_K], "Q4_K tensors")
	require.Positive(t, types[bridge.DTypeQ6_K], "Q6_K tensors")
	// The quant kernels convert the K-quant projections to Q8_0 blocks at
	// load and round the activations to 8 bits, as llama.cpp's kernels do:
	// within the same distance of its logits.
	for _, kernels := range []string{"exact", "quant"} {
		logits := runReferenceKernels(t, m, ref, 1, kernels)
		agree, worst := 0, 0.0
		var lines []string
		for i, p := range ref.Prompts {
			require.Equal(t, p.PromptIDs, m.Tokenizer.Encode(p.Text, model.EncodeOptions{}), "%s: prompt ids", p.Name)
			n, maxErr := 0, 0.0
			for step := 0; step < ref.Steps; step++ {
				row := logits[i][step]
				for _, e := range p.Top[step] {
					d := math.Abs(float64(row[int(e[0])]) - e[1])
					maxErr = math.Max(maxErr, d)
					require.LessOrEqual(t, d, kquantLogitTol, "%s %s step %d: logit of token %d is %v, llama.cpp %v", kernels, p.Name, step, int(e[0]), row[int(e[0])], e[1])
				}
				if p.Gap[step] < kquantTieGap {
					break
				}
				require.Equal(t, p.Tokens[step], argmax(row), "%s %s step %d: greedy token (llama.cpp gap %v)", kernels, p.Name, step, p.Gap[step])
				n++
			}
			agree += n
			worst = math.Max(worst, maxErr)
			lines = append(lines, fmt.Sprintf("%-10s %2d/%d greedy tokens before a near tie, max |logit diff| %.4f", p.Name, n, ref.Steps, maxErr))
		}
		t.Logf("%s kernels: %s (%v tensors by type) against llama-cpp-python %s: %d positions agree, max |top-5 logit diff| %.4f:\n%s",
			kernels, ref.Model, types, ref.Tools["llama_cpp_python"], agree, worst, strings.Join(lines, "\n"))
	}
}
