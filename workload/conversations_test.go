package workload

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reqsOf builds requests from hash-id lists; ids[i] is the given
// conversation id ("" for none).
func reqsOf(hashes [][]uint64, ids ...string) []Request {
	out := make([]Request, len(hashes))
	for i, h := range hashes {
		out[i] = Request{Index: i, HashIDs: h}
		if i < len(ids) {
			out[i].ConversationID = ids[i]
		}
	}
	return out
}

func convIDs(reqs []Request) []string {
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = r.ConversationID
	}
	return out
}

func TestInferConversationsChains(t *testing.T) {
	reqs := reqsOf([][]uint64{
		{0, 1, 2, 3},       // 0: A turn 1 (chain 0,1,2)
		{0, 10, 11},        // 1: B turn 1 (chain 0,10)
		{0, 1, 2, 4, 5},    // 2: A turn 2
		{0, 1, 2, 4, 6, 7}, // 3: A turn 3 (continues turn 2, the longest chain)
		{0, 10, 12, 13},    // 4: B turn 2
		{0, 20},            // 5: C: its chain is the preamble only
		{0, 21, 22},        // 6: D: new (C's chain is not evidence)
		{0, 1, 30, 31},     // 7: shares A's first block but not A's chain: new
	})
	st := InferConversations(reqs)
	assert.Equal(t, []string{"conv-0", "conv-1", "conv-0", "conv-0", "conv-1", "conv-5", "conv-6", "conv-7"}, convIDs(reqs))
	assert.Equal(t, ConversationStats{PreambleBlocks: 1, Continued: 3, Started: 5}, st)
}

func TestInferConversationsKeepsGivenIDs(t *testing.T) {
	reqs := reqsOf([][]uint64{
		{9, 1, 2, 3},    // given "x"
		{9, 1, 2, 4, 5}, // continues x
		{9, 50, 51, 60}, // given "r1"
		{9, 50, 51, 61}, // given "r2": same chain as r1
		{9, 50, 51, 62, 63},
		{9, 1, 2, 4, 7}, // given "y": keeps it although it continues x
		{9, 1, 2, 4, 7, 8},
	}, "x", "", "r1", "r2", "", "y")
	InferConversations(reqs)
	assert.Equal(t, []string{"x", "x", "r1", "r2", "r2", "y", "y"}, convIDs(reqs),
		"given ids kept and inherited; equal chains: the latest request wins")
}

func TestInferConversationsSingleConversationLimitation(t *testing.T) {
	reqs := reqsOf([][]uint64{{5, 6, 7}, {5, 6, 8, 9}, {5, 6, 8, 10, 11}})
	st := InferConversations(reqs)
	assert.Equal(t, 2, st.PreambleBlocks)
	assert.Equal(t, []string{"conv-0", "conv-1", "conv-1"}, convIDs(reqs))
	one := reqsOf([][]uint64{{5, 6, 7}})
	InferConversations(one)
	assert.Equal(t, []string{"conv-0"}, convIDs(one))
	InferConversations(nil)
}

// Length scaling can make a partial last block full; inference reads only
// hash ids, so it is the same at every scale.
func TestInferConversationsIgnoresLengthScale(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1500, "output_length": 3, "hash_ids": [0, 1, 2]}
{"timestamp": 1, "input_length": 600, "output_length": 3, "hash_ids": [0, 7]}
{"timestamp": 2, "input_length": 1800, "output_length": 3, "hash_ids": [0, 1, 3, 4]}
`
	var got [][]string
	for _, scale := range []float64{1, 0.01} {
		o := opts()
		o.LengthScale = scale
		reqs, err := Read(strings.NewReader(in), "t.jsonl", o)
		require.NoError(t, err)
		InferConversations(reqs)
		got = append(got, convIDs(reqs))
	}
	assert.Equal(t, []string{"conv-0", "conv-1", "conv-0"}, got[0])
	assert.Equal(t, got[0], got[1])
}

// turnsHistogram maps turns per conversation → number of conversations.
func turnsHistogram(reqs []Request) map[int]int {
	per := map[string]int{}
	for _, r := range reqs {
		per[r.ConversationID]++
	}
	h := map[int]int{}
	for _, n := range per {
		h[n]++
	}
	return h
}

// The first 300 requests of the Mooncake conversation trace (every prompt
// starts with block 0): 281 conversations, 18 of them with several turns.
func TestInferConversationsMooncakeSample(t *testing.T) {
	const path = "../../shared/data/mooncake/conversation_trace.jsonl"
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the Mooncake traces are expected in ../shared/data/mooncake beside the repository: %v", err)
	}
	o := opts()
	o.Limit = 300
	reqs, err := ReadFile(path, o)
	require.NoError(t, err)
	st := InferConversations(reqs)
	h := turnsHistogram(reqs)
	keys := make([]int, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t.Logf("%d turn(s): %d conversation(s)", k, h[k])
	}
	t.Logf("stats: %+v", st)
	assert.Equal(t, ConversationStats{PreambleBlocks: 1, Continued: 19, Started: 281}, st)
	assert.Equal(t, map[int]int{1: 263, 2: 17, 3: 1}, h)
}
