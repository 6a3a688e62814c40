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
)

// TestMoECheckpointDigestAcrossRanks: `worker run` on the Qwen3-MoE,
// Mixtral and DeepSeek checkpoints (and the dense Qwen2, Granite and
// Gemma 2/3 ones, whose biases, attention multiplier, soft caps and
// sliding windows Helix must apply on every rank) prints one digest on 1,
// 2 and 4 attention-DP ranks
// (experts dealt over them) and on 2 Helix CP ranks (every expert on each);
// with more than one DP rank the ranks wait in MoE exchanges.
func TestMoECheckpointDigestAcrossRanks(t *testing.T) {
	bin := worker(t)
	prompts := filepath.Join(t.TempDir(), "prompts.jsonl")
	var lines []string
	for _, p := range []string{"Hello", "The capital of France is", "def f(x):\n    return x * 2\n", "1, 2, 3,",
		"A hash table stores key-value pairs in an array of buckets.", "the the the"} {
		b, err := json.Marshal(map[string]any{"prompt": p, "max_tokens": 12})
		require.NoError(t, err)
		lines = append(lines, string(b))
	}
	require.NoError(t, os.WriteFile(prompts, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	dense := []string{"qwen2", "granite", "gemma2", "gemma3", "phi3-longrope"}
	for _, arch := range append([]string{"qwen3moe", "mixtral", "deepseek2", "deepseek2-lite", "glm4moe"}, dense...) {
		t.Run(arch, func(t *testing.T) {
			args := []string{"--engine", "cpu", "--model", filepath.Join("testdata", "moe", arch+".gguf"), "--prompts", prompts}
			one := moeServe(t, bin, append(args, "--ranks", "1")...)
			require.Equal(t, 6, one.Requests.Completed)
			require.Len(t, one.OutputDigest, 64)
			for _, extra := range [][]string{{"--ranks", "2"}, {"--ranks", "4"}, {"--cp", "2"}} {
				rep := moeServe(t, bin, append(args, extra...)...)
				require.Equal(t, one.OutputDigest, rep.OutputDigest, "%v and --ranks 1 print the same digest", extra)
				if extra[0] == "--ranks" && !slices.Contains(dense, arch) { // dense: no exchanges
					require.NotNil(t, rep.MoEWaitMS)
					require.Positive(t, *rep.MoEWaitMS, "%v: the ranks exchange tokens with their experts", extra)
				}
			}
		})
	}
}
