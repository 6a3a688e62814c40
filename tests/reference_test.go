//go:build native

package tests

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/model/modeltest"
)

// referenceLogitTol is the agreement stated for SmolLM2-135M against Hugging
// Face transformers in float32 on the same dequantised weights: every
// compared logit within this absolute distance. Both compute in float32 and
// differ only in summation order (observed maximum: see the test's log).
const referenceLogitTol = 1e-3

type refRun struct {
	Tokens   []int32        `json:"tokens"`
	Top      [][][2]float64 `json:"top"`
	Gap      []float64      `json:"gap"`
	FirstEOS *int           `json:"first_eos"`
}

type refPrompt struct {
	Name      string              `json:"name"`
	Text      string              `json:"text"`
	Chat      bool                `json:"chat"`
	Messages  []model.ChatMessage `json:"messages"`
	PromptIDs []int32             `json:"prompt_ids"`
	HF        refRun              `json:"hf"`
	LlamaCPP  *refRun             `json:"llama_cpp"`
}

type reference struct {
	Model   string            `json:"model"`
	SHA256  string            `json:"sha256"`
	Tools   map[string]string `json:"tools"`
	Steps   int               `json:"steps"`
	Prompts []refPrompt       `json:"prompts"`
}

// TestAgainstReferenceImplementation: SmolLM2-135M on the CPU engine against
// the committed continuations of an implementation nobody here wrote
// (tests/testdata/smollm2/reference.json, scripts/reference): our tokenizer
// gives the reference's prompt ids; at every step while the greedy tokens
// agree, the logits of the reference's top 5 are within referenceLogitTol;
// the greedy tokens are equal until the first step where the reference's
// top-2 logits are closer than that tolerance (a tie that summation order
// may break either way). All prompts run in one batch: prefill together,
// then decode together.
func TestAgainstReferenceImplementation(t *testing.T) {
	path := modeltest.SmolLM2(t)
	raw, err := os.ReadFile("testdata/smollm2/reference.json")
	require.NoError(t, err)
	var ref reference
	require.NoError(t, json.Unmarshal(raw, &ref))
	require.GreaterOrEqual(t, len(ref.Prompts), 20)
	require.Equal(t, modeltest.SmolLM2Name, ref.Model)

	m, err := model.Load(path)
	require.NoError(t, err)
	defer m.Close()
	tok := m.Tokenizer

	// Tokenisation: plain prompts as text, chat prompts rendered with the
	// model's template, special tokens parsed.
	for _, p := range ref.Prompts {
		var ids []int32
		if p.Chat {
			text, err := model.RenderChat(tok.ChatTemplate(), p.Messages, true, tok.TokenText(tok.BOS()), tok.TokenText(tok.EOS()))
			require.NoError(t, err)
			require.Equal(t, p.Text, text, "%s: rendered chat template", p.Name)
			ids = tok.Encode(text, model.EncodeOptions{ParseSpecial: true})
		} else {
			ids = tok.Encode(p.Text, model.EncodeOptions{AddSpecial: true})
		}
		require.Equal(t, p.PromptIDs, ids, "%s: prompt token ids", p.Name)
	}

	const P = 16
	steps := ref.Steps
	pages := 0
	tables := make([][]int32, len(ref.Prompts))
	for i, p := range ref.Prompts {
		n := (len(p.PromptIDs) + steps + P - 1) / P
		for k := 0; k < n; k++ {
			tables[i] = append(tables[i], int32(pages+k))
		}
		pages += n
	}
	eng, err := native.Open(bridge.Config{Shape: m.Shape, Tensors: m.Tensors, NumPages: pages, TokensPerPage: P})
	require.NoError(t, err)
	defer eng.Close()

	V := m.Shape.VocabSize
	ours := make([][]int32, len(ref.Prompts))
	logits := make([][][]float32, len(ref.Prompts)) // [prompt][step][vocab]
	desc := bridge.StepDesc{WantLogits: true}
	var res bridge.StepResult
	for step := 0; step < steps; step++ {
		desc.Seqs = desc.Seqs[:0]
		for i, p := range ref.Prompts {
			s := bridge.SeqStep{BlockTable: tables[i], Sample: true, Logprobs: true, TopLogprobs: 5}
			if step == 0 {
				s.Tokens = p.PromptIDs
			} else {
				s.Tokens = ours[i][step-1:]
				s.StartPos = len(p.PromptIDs) + step - 1
			}
			desc.Seqs = append(desc.Seqs, s)
		}
		require.NoError(t, eng.Step(&desc, &res))
		for i := range ref.Prompts {
			ours[i] = append(ours[i], res.Sampled[i])
			logits[i] = append(logits[i], append([]float32(nil), res.Logits[i*V:(i+1)*V]...))
			// The log-probabilities the API reports, against a log_softmax
			// of the whole row with the standard library.
			requireLogprobsOfRow(t, res.Logits[i*V:(i+1)*V], res.Sampled[i], res.Logprobs[i],
				res.TopLogprobIDs[i*bridge.MaxLogprobs:i*bridge.MaxLogprobs+5], res.TopLogprobs[i*bridge.MaxLogprobs:i*bridge.MaxLogprobs+5])
			require.Equal(t, res.Sampled[i], res.TopLogprobIDs[i*bridge.MaxLogprobs], "%s step %d: the greedy token is the top one", ref.Prompts[i].Name, step)
		}
	}

	var summary []string
	worst := 0.0
	for i, p := range ref.Prompts {
		agree, compared, maxDiff := 0, 0, 0.0
		for step := 0; step < steps; step++ {
			for _, e := range p.HF.Top[step] {
				d := math.Abs(float64(logits[i][step][int(e[0])]) - e[1])
				maxDiff = math.Max(maxDiff, d)
				require.LessOrEqual(t, d, referenceLogitTol, "%s step %d: logit of token %d is %v, reference %v",
					p.Name, step, int(e[0]), logits[i][step][int(e[0])], e[1])
			}
			compared++
			if p.HF.Gap[step] < referenceLogitTol {
				break // a near tie: either token is right; the sequences may part here
			}
			require.Equal(t, p.HF.Tokens[step], ours[i][step], "%s step %d: greedy token (reference gap %v)", p.Name, step, p.HF.Gap[step])
			agree++
		}
		// The whole continuation, for the log.
		same := 0
		for same < steps && ours[i][same] == p.HF.Tokens[same] {
			same++
		}
		worst = math.Max(worst, maxDiff)
		summary = append(summary, fmt.Sprintf("%-24s prompt %4d tokens: %2d/%d steps checked, %2d/%d greedy tokens identical, max |Δlogit| %.2e",
			p.Name, len(p.PromptIDs), compared, steps, same, steps, maxDiff))
	}
	t.Logf("against %s (tolerance %g, max |Δlogit| over all compared logits %.2e):\n%s",
		toolList(ref.Tools), referenceLogitTol, worst, strings.Join(summary, "\n"))
}

func toolList(tools map[string]string) string {
	var s []string
	for _, k := range []string{"transformers", "torch", "gguf"} {
		if v, ok := tools[k]; ok {
			s = append(s, k+" "+v)
		}
	}
	return strings.Join(s, ", ")
}
