//go:build native

package tests

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/model"
)

// moeRefRelTol is the agreement target with llama.cpp on the random-weight
// MoE checkpoints (float32 on both sides, F32 KV cache): every top-5 logit
// within this relative distance, |ours − ref| ≤ tol · max(|ref|, 1) (the
// floor keeps logits near zero from demanding more than 1e-3 absolute).
const moeRefRelTol = 1e-3

// moeRefTieGap: a step whose reference top-1/top-2 gap is below this is a
// near tie that summation order may break either way; greedy tokens are
// compared up to it.
const moeRefTieGap = 1e-3

type moeRefPrompt struct {
	Name      string         `json:"name"`
	Text      string         `json:"text"`
	PromptIDs []int32        `json:"prompt_ids"`
	Tokens    []int32        `json:"tokens"`
	Top       [][][2]float64 `json:"top"`
	Gap       []float64      `json:"gap"`
}

type moeReference struct {
	Model        string            `json:"model"`
	Architecture string            `json:"architecture"`
	Steps        int               `json:"steps"`
	Tools        map[string]string `json:"tools"`
	Prompts      []moeRefPrompt    `json:"prompts"`
}

// TestMoEAgainstLlamaCPP: the Qwen3-MoE, Mixtral, DeepSeek and (dense) Qwen3,
// Qwen2, Phi-3 (and its Phi-4-mini form: partial RoPE, LongRoPE) and
// Granite checkpoints of
// tests/testdata/moe (random weights, scripts/reference/make_moe_reference.py)
// on the CPU engine against llama.cpp's stored greedy continuations, with the
// experts on one engine and dealt over four expert-parallel members (prompt
// i on member i mod 4). Per prompt, while the greedy tokens agree: the
// reference's top-5 logits within moeRefRelTol relative, and the same greedy
// token until the first near tie. Four members also give bit-identical
// logits to one engine (for the dense Qwen3: four engines, each with a
// quarter of the prompts).
func TestMoEAgainstLlamaCPP(t *testing.T) {
	for _, arch := range []string{"qwen3moe", "mixtral", "qwen3", "qwen2", "phi3", "phi3-longrope", "granite", "deepseek2", "deepseek2-lite", "deepseek2-yarn", "glm4moe"} {
		t.Run(arch, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "moe", arch+".reference.json"))
			require.NoError(t, err)
			var ref moeReference
			require.NoError(t, json.Unmarshal(raw, &ref))
			require.NotEmpty(t, ref.Prompts)
			m, err := model.Load(filepath.Join("testdata", "moe", ref.Model))
			require.NoError(t, err)
			defer m.Close()
			require.Equal(t, !slices.Contains([]string{"qwen3", "qwen2", "phi3", "phi3-longrope", "granite"}, arch), m.Shape.MoE(), "%s: mixture of experts", ref.Model)
			require.Equal(t, arch == "phi3-longrope", m.Shape.PartialRotaryDim == 12 && m.Shape.RopeAttnFactor > 1.2, "%s: partial RoPE and LongRoPE %+v", ref.Model, m.Shape)
			require.Equal(t, arch == "granite", m.Shape.LogitScale == 16 && m.Shape.EmbeddingScale == 12 && m.Shape.ResidualScale == 0.22 && m.Shape.AttentionScale == 0.125,
				"%s: Granite's multipliers %+v", ref.Model, m.Shape)
			require.True(t, m.Shape.QKNorm == strings.HasPrefix(arch, "qwen3"), "%s: q/k norms", ref.Model)
			require.True(t, m.Shape.QKVBias == (arch == "qwen2" || arch == "glm4moe"), "%s: q/k/v biases", ref.Model)
			for _, p := range ref.Prompts {
				require.Equal(t, p.PromptIDs, m.Tokenizer.Encode(p.Text, model.EncodeOptions{}), "%s: prompt token ids", p.Name)
			}

			one := runMoEReference(t, m, ref, 1)
			four := runMoEReference(t, m, ref, 4)
			for i := range one {
				for s := range one[i] {
					require.Equal(t, one[i][s], four[i][s], "%s step %d: 4 EP members differ from one engine", ref.Prompts[i].Name, s)
				}
			}

			totalAgree, totalSteps, worst, summary := compareWithReference(t, ref, one)
			t.Logf("%s (%s, %d experts top-%d) against llama-cpp-python %s: %d/%d positions agree, max rel. top-5 logit error %.2e (EP 1 and 4 bit-identical):\n%s",
				ref.Model, ref.Architecture, m.Shape.NumExperts, m.Shape.NumExpertsPerTok, ref.Tools["llama_cpp_python"],
				totalAgree, totalSteps, worst, strings.Join(summary, "\n"))
		})
	}
}

// compareWithReference checks logits [prompt][step][vocab] against the
// reference: per prompt, while the greedy tokens agree, the top-5 logits
// within moeRefRelTol relative and the same greedy token until the first
// near tie. It returns the positions that agree, the positions, the worst
// relative error and a line per prompt.
func compareWithReference(t *testing.T, ref moeReference, logits [][][]float32) (int, int, float64, []string) {
	t.Helper()
	var summary []string
	totalAgree, totalSteps, worst := 0, 0, 0.0
	for i, p := range ref.Prompts {
		agree, maxRel := 0, 0.0
		for step := 0; step < ref.Steps; step++ {
			row := logits[i][step]
			for _, e := range p.Top[step] {
				got := float64(row[int(e[0])])
				rel := math.Abs(got-e[1]) / math.Max(math.Abs(e[1]), 1)
				maxRel = math.Max(maxRel, rel)
				require.LessOrEqual(t, rel, moeRefRelTol, "%s step %d: logit of token %d is %v, llama.cpp %v",
					p.Name, step, int(e[0]), got, e[1])
			}
			if p.Gap[step] < moeRefTieGap {
				break // near tie: either token is right, the continuations may part here
			}
			require.Equal(t, p.Tokens[step], argmax(row), "%s step %d: greedy token (llama.cpp gap %v)", p.Name, step, p.Gap[step])
			agree++
		}
		totalAgree += agree
		totalSteps += ref.Steps
		worst = math.Max(worst, maxRel)
		summary = append(summary, fmt.Sprintf("%-10s prompt %3d tokens: %2d/%d greedy tokens identical, max rel. logit error %.2e",
			p.Name, len(p.PromptIDs), agree, ref.Steps, maxRel))
	}
	return totalAgree, totalSteps, worst, summary
}

// runMoEReference runs every prompt of ref for ref.Steps greedy steps with
// the experts dealt over ep members (prompt i on member i mod ep; the
// members step together, as expert parallelism needs; a dense model's
// members are independent engines) and returns the
// logits [prompt][step][vocab]. The step feeds our own greedy token.
func runMoEReference(t *testing.T, m *model.Model, ref moeReference, ep int) [][][]float32 {
	t.Helper()
	return runReferenceKernels(t, m, ref, ep, "")
}

// runReferenceKernels is runMoEReference on the CPU engine's kernels
// (bridge.Config.CPUKernels).
func runReferenceKernels(t *testing.T, m *model.Model, ref moeReference, ep int, kernels string) [][][]float32 {
	t.Helper()
	const P = 16
	var group *native.CPGroup
	if ep > 1 && m.Shape.MoE() {
		g, err := native.NewCPGroup(ep, 60*time.Second)
		require.NoError(t, err)
		defer g.Close()
		group = g
	}
	type member struct {
		eng     bridge.Engine
		prompts []int
		tables  [][]int32
	}
	members := make([]member, ep)
	for i, p := range ref.Prompts {
		mb := &members[i%ep]
		pages := 0
		for _, tb := range mb.tables {
			pages += len(tb)
		}
		n := (len(p.PromptIDs) + ref.Steps + P - 1) / P
		var table []int32
		for k := 0; k < n; k++ {
			table = append(table, int32(pages+k))
		}
		mb.prompts = append(mb.prompts, i)
		mb.tables = append(mb.tables, table)
	}
	for r := range members {
		pages := 1
		for _, tb := range members[r].tables {
			pages += len(tb)
		}
		cfg := bridge.Config{Shape: m.Shape, Tensors: m.Tensors, NumPages: pages, TokensPerPage: P, CPUKernels: kernels}
		if group != nil {
			cfg.Expert = &bridge.ExpertMember{Group: group, Rank: r, Size: ep}
		}
		eng, err := native.Open(cfg)
		require.NoError(t, err)
		defer eng.Close()
		members[r].eng = eng
	}

	V := m.Shape.VocabSize
	logits := make([][][]float32, len(ref.Prompts))
	last := make([]int32, len(ref.Prompts))
	for step := 0; step < ref.Steps; step++ {
		errs := make([]error, ep)
		var wg sync.WaitGroup
		for r := range members {
			wg.Add(1)
			go func(mb *member, r int) {
				defer wg.Done()
				desc := bridge.StepDesc{WantLogits: true}
				for j, i := range mb.prompts {
					p := ref.Prompts[i]
					s := bridge.SeqStep{BlockTable: mb.tables[j], Sample: true}
					if step == 0 {
						s.Tokens = p.PromptIDs
					} else {
						s.Tokens = []int32{last[i]}
						s.StartPos = len(p.PromptIDs) + step - 1
					}
					desc.Seqs = append(desc.Seqs, s)
				}
				var res bridge.StepResult
				if errs[r] = mb.eng.Step(&desc, &res); errs[r] != nil {
					return
				}
				for j, i := range mb.prompts {
					last[i] = res.Sampled[j]
					logits[i] = append(logits[i], append([]float32(nil), res.Logits[j*V:(j+1)*V]...))
				}
			}(&members[r], r)
		}
		wg.Wait()
		for r, err := range errs {
			require.NoError(t, err, "EP %d member %d step %d", ep, r, step)
		}
	}
	return logits
}

// workerContinues runs `worker run --ranks ranks` on modelPath with the
// reference's prompts (those keep accepts; nil: all) and requires each
// report text to be the decoding of the reference's greedy tokens up to
// its first near tie or stop token; it returns how many prompts ran.
func workerContinues(t *testing.T, bin, modelPath string, m *model.Model, ref moeReference, ranks int, keep func(moeRefPrompt) bool) int {
	t.Helper()
	stops := map[int32]bool{}
	for _, s := range m.Tokenizer.StopTokens() {
		stops[s] = true
	}
	var lines, want []string
	for _, p := range ref.Prompts {
		if keep != nil && !keep(p) {
			continue
		}
		n := 0
		for n < ref.Steps && p.Gap[n] >= moeRefTieGap && !stops[p.Tokens[n]] {
			n++
		}
		if n == 0 {
			continue
		}
		b, err := json.Marshal(map[string]any{"prompt": p.Text, "max_tokens": n})
		require.NoError(t, err)
		lines = append(lines, string(b))
		// The text as the report's JSON carries it.
		enc, err := json.Marshal(m.Tokenizer.Decode(p.Tokens[:n]))
		require.NoError(t, err)
		var s string
		require.NoError(t, json.Unmarshal(enc, &s))
		want = append(want, s)
	}
	require.NotEmpty(t, lines)
	prompts := filepath.Join(t.TempDir(), "prompts.jsonl")
	require.NoError(t, os.WriteFile(prompts, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	var rep struct {
		Outputs []struct {
			Index int    `json:"index"`
			Text  string `json:"text"`
		} `json:"outputs"`
	}
	out := serveRaw(t, bin, "--engine", "cpu", "--model", modelPath, "--ranks", strconv.Itoa(ranks), "--prompts", prompts)
	require.NoError(t, json.Unmarshal(out, &rep), string(out))
	require.Len(t, rep.Outputs, len(want))
	for _, o := range rep.Outputs {
		require.Equal(t, want[o.Index], o.Text, "prompt %d: worker text vs llama.cpp's tokens", o.Index)
	}
	return len(want)
}

func argmax(row []float32) int32 {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return int32(best)
}

// TestMoEWorkerMatchesLlamaCPP: `worker run --ranks 4` on each checkpoint
// continues every reference prompt with llama.cpp's greedy tokens: the
// report's text is the decoding of llama.cpp's tokens, up to the first near
// tie or end-of-text token of the reference.
func TestMoEWorkerMatchesLlamaCPP(t *testing.T) {
	bin := worker(t)
	for _, arch := range []string{"qwen3moe", "mixtral", "qwen3", "qwen2", "phi3", "granite", "deepseek2", "deepseek2-lite", "deepseek2-yarn"} {
		t.Run(arch, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "moe", arch+".reference.json"))
			require.NoError(t, err)
			var ref moeReference
			require.NoError(t, json.Unmarshal(raw, &ref))
			m, err := model.Load(filepath.Join("testdata", "moe", ref.Model))
			require.NoError(t, err)
			defer m.Close()
			workerContinues(t, bin, filepath.Join("testdata", "moe", ref.Model), m, ref, 4, nil)
		})
	}
}
