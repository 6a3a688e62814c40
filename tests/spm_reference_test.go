//go:build native

package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model"
)

// TestSPMModelAgainstLlamaCPP: the tiny Llama with a SentencePiece
// vocabulary of tests/testdata/spm (scripts/reference/make_spm_reference.py)
// tokenizes each reference prompt as llama.cpp does (BOS added, control
// tokens parsed) and, on the CPU engine, continues it with llama.cpp's
// greedy tokens and top-5 logits; `worker run --ranks 2` prints the same
// continuations for the prompts a completion tokenizes the same way (BOS,
// no control tokens).
func TestSPMModelAgainstLlamaCPP(t *testing.T) {
	dir := filepath.Join("testdata", "spm")
	raw, err := os.ReadFile(filepath.Join(dir, "spm.reference.json"))
	require.NoError(t, err)
	var ref moeReference
	require.NoError(t, json.Unmarshal(raw, &ref))
	require.NotEmpty(t, ref.Prompts)
	m, err := model.Load(filepath.Join(dir, ref.Model))
	require.NoError(t, err)
	defer m.Close()
	for _, p := range ref.Prompts {
		require.Equal(t, p.PromptIDs, m.Tokenizer.Encode(p.Text, model.EncodeOptions{AddSpecial: true, ParseSpecial: true}), "%s: prompt token ids", p.Name)
	}
	agree, steps, worst, summary := compareWithReference(t, ref, runMoEReference(t, m, ref, 1))
	t.Logf("%s (SentencePiece vocabulary of %d tokens) against llama-cpp-python %s: %d/%d positions agree, max rel. top-5 logit error %.2e:\n%s",
		ref.Model, m.Tokenizer.VocabSize(), ref.Tools["llama_cpp_python"], agree, steps, worst, strings.Join(summary, "\n"))

	// (A completion's text does not parse control tokens: prompts with them
	// tokenize otherwise there.)
	n := workerContinues(t, worker(t), filepath.Join(dir, ref.Model), m, ref, 2, func(p moeRefPrompt) bool {
		return slices.Equal(p.PromptIDs, m.Tokenizer.Encode(p.Text, model.EncodeOptions{AddSpecial: true}))
	})
	require.GreaterOrEqual(t, n, 3)
}
