//go:build native

package tests

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/native"
)

// TestPromptScoresAgainstReference: the prompt's log-probabilities
// (prompt_logprobs, echo with logprobs) of SmolLM2-135M on the CPU engine
// against Hugging Face transformers' stored logits
// (tests/testdata/smollm2/reference.json). Each reference prompt followed
// by the reference's greedy tokens runs in 48-token chunks, its generated
// positions and the 16 before them scored; at every position where the reference generated (until its
// first near tie), the scored token is the reference's greedy token with
// rank 1, the top 5 are the reference's top 5 in order wherever their
// logits are apart by more than the tolerance, and log-probability
// differences equal the reference's logit differences (a softmax shifts
// every logit by the same amount) within twice referenceLogitTol.
func TestPromptScoresAgainstReference(t *testing.T) {
	ref, m := loadReference(t)

	const P, chunk, K = 16, 48, 5
	tables, pages := referenceTables(ref, P)
	eng, err := native.Open(bridge.Config{Shape: m.Shape, Tensors: m.Tensors, NumPages: pages, TokensPerPage: P})
	require.NoError(t, err)
	defer eng.Close()

	prompts := make([][]int32, len(ref.Prompts))
	checked := make([]int, len(ref.Prompts)) // generated positions compared
	for i, p := range ref.Prompts {
		n := 0
		for n < ref.Steps && p.HF.Gap[n] >= referenceLogitTol {
			n++
		}
		checked[i] = n
		prompts[i] = append(append([]int32(nil), p.PromptIDs...), p.HF.Tokens[:n]...)
	}
	scores := make([][]float32, len(ref.Prompts)) // [prompt][position]
	ids := make([][][]int32, len(ref.Prompts))
	tops := make([][][]float32, len(ref.Prompts))
	ranks := make([][]int32, len(ref.Prompts))
	var desc bridge.StepDesc
	var res bridge.StepResult
	for pos := 0; ; pos += chunk {
		desc.Seqs = desc.Seqs[:0]
		var who []int
		for i, pr := range prompts {
			if pos >= len(pr) {
				continue
			}
			end := min(pos+chunk, len(pr))
			targets := make([]int32, end-pos)
			for k := range targets {
				// The generated positions and the 16 before them are scored
				// (the LM head rows of every position of the long prompts
				// would be most of the test's time).
				targets[k] = -1
				if p := pos + k; p+1 < len(pr) && p >= len(ref.Prompts[i].PromptIDs)-17 {
					targets[k] = pr[p+1]
				}
			}
			desc.Seqs = append(desc.Seqs, bridge.SeqStep{Tokens: pr[pos:end], StartPos: pos, BlockTable: tables[i],
				Sample: end == len(pr), ScoreTargets: targets, ScoreTop: K})
			who = append(who, i)
		}
		if len(who) == 0 {
			break
		}
		require.NoError(t, eng.Step(&desc, &res))
		if len(res.ScoreLogprobs) == 0 { // a step that scores nothing has no score rows
			bridge.ResizeScores(&res, rowsOf(desc.Seqs), true)
		}
		row := 0
		for j, i := range who {
			for k := range desc.Seqs[j].Tokens {
				r := row + k
				scores[i] = append(scores[i], res.ScoreLogprobs[r])
				ids[i] = append(ids[i], append([]int32(nil), res.ScoreTopIDs[r*bridge.MaxLogprobs:r*bridge.MaxLogprobs+K]...))
				tops[i] = append(tops[i], append([]float32(nil), res.ScoreTopLogprobs[r*bridge.MaxLogprobs:r*bridge.MaxLogprobs+K]...))
				ranks[i] = append(ranks[i], res.ScoreRanks[r])
			}
			row += len(desc.Seqs[j].Tokens)
		}
	}

	worst, positions := 0.0, 0
	for i, p := range ref.Prompts {
		for s := 0; s < checked[i]; s++ {
			at := len(p.PromptIDs) - 1 + s // the position whose logits chose HF token s
			top := p.HF.Top[s]
			require.Equal(t, p.HF.Tokens[s], ids[i][at][0], "%s step %d: top token", p.Name, s)
			require.Equal(t, int32(1), ranks[i][at], "%s step %d: rank of the greedy token", p.Name, s)
			require.Equal(t, tops[i][at][0], scores[i][at], "%s step %d: the greedy token's is the top one", p.Name, s)
			for j, e := range top {
				if j > 0 && top[j-1][1]-e[1] > 2*referenceLogitTol && (j+1 == len(top) || e[1]-top[j+1][1] > 2*referenceLogitTol) {
					require.Equal(t, int32(e[0]), ids[i][at][j], "%s step %d: top %d", p.Name, s, j+1)
				}
				k := -1
				for x, id := range ids[i][at] {
					if id == int32(e[0]) {
						k = x
					}
				}
				if k < 0 {
					continue // a near tie at the 5th place: the other one is ours
				}
				d := math.Abs((float64(tops[i][at][k]) - float64(tops[i][at][0])) - (e[1] - top[0][1]))
				worst = math.Max(worst, d)
				require.LessOrEqual(t, d, 2*referenceLogitTol, "%s step %d: log-probability gap of token %d", p.Name, s, int(e[0]))
			}
			positions++
		}
		// Every scored position has a valid rank; the others none.
		require.Len(t, ranks[i], len(prompts[i]))
		for at := 0; at+1 < len(prompts[i]); at++ {
			if at < len(p.PromptIDs)-17 {
				require.Zero(t, ranks[i][at], "%s position %d", p.Name, at)
				continue
			}
			require.Positive(t, ranks[i][at], "%s position %d", p.Name, at)
			require.LessOrEqual(t, float64(scores[i][at]), 0.0)
		}
		require.Zero(t, ranks[i][len(prompts[i])-1])
	}
	t.Logf("%d generated positions of %d prompts scored against Hugging Face: max |Δ(logprob gap) − Δ(logit gap)| %.2e",
		positions, len(ref.Prompts), worst)
}

// rowsOf is the rows of a step's sequences.
func rowsOf(seqs []bridge.SeqStep) int {
	n := 0
	for _, s := range seqs {
		n += len(s.Tokens)
	}
	return n
}
