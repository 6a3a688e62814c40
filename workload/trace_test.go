package workload

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func opts() Options { return Options{LengthScale: 1, VocabSize: 512, Seed: 1} }

func TestReadValidTrace(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}

{"timestamp": 5, "input_length": 1100, "output_length": 2, "hash_ids": [7, 8, 9], "conversation_id": "c1"}
`
	o := opts()
	o.ArrivalScale = 1
	reqs, err := Read(strings.NewReader(in), "t.jsonl", o)
	require.NoError(t, err)
	require.Len(t, reqs, 2)
	p0, p1 := reqs[0].Tokens(), reqs[1].Tokens()
	require.Len(t, p0, 600)
	require.Len(t, p1, 1100)
	require.Equal(t, 600, reqs[0].PromptLen)
	require.Equal(t, "c1", reqs[1].ConversationID)
	require.Equal(t, 1, reqs[1].Index)
	require.Equal(t, 1, reqs[0].Line)
	require.Equal(t, 3, reqs[1].Line, "the blank line counts")
	require.Equal(t, 5*time.Millisecond, reqs[1].Arrival)
	// Equal hash ids at equal positions carry equal tokens: the first full
	// block is shared; the second block of request 0 is partial (88 tokens)
	// and is a prefix of request 1's full block 8.
	require.Equal(t, p0[:600], p1[:600])
	require.NotEqual(t, p1[1024:1100], p1[512:588])
	require.Equal(t, p0, reqs[0].Tokens(), "synthesis is deterministic")
}

func TestReadErrorsNameLineAndField(t *testing.T) {
	cases := []struct{ line, want string }{
		{`{"timestamp": 0, "input_length": 10, "output_length": 3}`, `t.jsonl:2: field "hash_ids" is missing`},
		{`{"timestamp": 0, "input_length": "x", "output_length": 3, "hash_ids": [1]}`, `t.jsonl:2: field "input_length"`},
		{`{"timestamp": 0, "input_length": 0, "output_length": 3, "hash_ids": [1]}`, `t.jsonl:2: field "input_length" must be a whole number in [1, 2147483647], got 0`},
		{`{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}`, `t.jsonl:2: field "output_length" must be a whole number in [1, 2147483647], got 0`},
		{`{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}`, `t.jsonl:2: field "timestamp" must be a whole number in [0, 9223372036854775807], got -1`},
		{`{"timestamp": null, "input_length": 10, "output_length": 1, "hash_ids": [1]}`, `t.jsonl:2: field "timestamp" is missing`},
		{`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}`, `has 2 blocks but input_length 10 needs 1`},
		{`not json`, `t.jsonl:2: not a JSON object`},
	}
	for _, c := range cases {
		in := `{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [1]}` + "\n" + c.line + "\n"
		_, err := Read(strings.NewReader(in), "t.jsonl", opts())
		require.Error(t, err, c.line)
		require.Contains(t, err.Error(), c.want)
	}
}

func TestLengthScaleKeepsPrefixStructure(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [` + seq(0, 79) + `]}
{"timestamp": 0, "input_length": 1000, "output_length": 600, "hash_ids": [0, 1]}`
	o := opts()
	o.LengthScale = 0.01
	reqs, err := Read(strings.NewReader(in), "t", o)
	require.NoError(t, err)
	bt := ScaledBlockTokens(0.01)
	require.Equal(t, 5, bt)
	// 78 full blocks of 5 tokens, and the 224-token tail scaled to 2 tokens.
	p0 := reqs[0].Tokens()
	require.Len(t, p0, 78*5+2)
	require.Equal(t, 78*5+2, reqs[0].PromptLen)
	require.Equal(t, 1, reqs[0].MaxNewTokens)
	require.Equal(t, 6, reqs[1].MaxNewTokens)
	// Request 1's first block (hash 0) equals request 0's first block.
	require.Equal(t, p0[:5], reqs[1].Tokens()[:5])
	for _, tok := range p0 {
		require.True(t, tok >= 0 && tok < 512)
	}
}

func TestBadOptions(t *testing.T) {
	o := opts()
	o.LengthScale = 0
	_, err := Read(strings.NewReader(""), "t", o)
	require.ErrorContains(t, err, "--length-scale")
	_, err = Read(strings.NewReader("\n"), "t", opts())
	require.ErrorContains(t, err, "no requests")
}

func TestSampleHasSharedPrefixes(t *testing.T) {
	reqs, err := Sample(opts())
	require.NoError(t, err)
	require.Len(t, reqs, 64)
	// Turn 2 of conversation 0 (index 16) starts with turn 1's full blocks.
	require.Equal(t, reqs[0].Tokens()[:512], reqs[16].Tokens()[:512])
	require.Equal(t, reqs[0].Tokens()[:512], reqs[1].Tokens()[:512]) // shared system block
	for _, r := range reqs {
		require.Zero(t, r.Arrival, "the zero arrival scale makes everything arrive at once")
	}
}

func seq(a, b int) string {
	var sb strings.Builder
	for i := a; i < b; i++ {
		if i > a {
			sb.WriteString(",")
		}
		sb.WriteString(itoa(i))
	}
	return sb.String()
}

// FuzzRead: the trace parser never panics, whatever the lines and the
// scales; a failure names the file and line (or the scale, when the scale
// itself is bad); a success yields requests whose lengths, arrival and
// routing fields are in range and whose tokens — synthesised when short
// enough to afford — are exactly PromptLen ids of the vocabulary.
func FuzzRead(f *testing.F) {
	lines := []string{
		`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}`,
		`{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1], "conversation_id": 7}`,
		`{"timestamp": -1}`,
		"\n\n{}",
		`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "affinity_id": "P", "attention_dp_rank": 1, "attention_dp_relax": false}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "affinity_id": 12, "attention_dp_rank": 3, "attention_dp_relax": true}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "affinity_id": null, "attention_dp_rank": null, "attention_dp_relax": null}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "attention_dp_rank": -1}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "attention_dp_relax": "no"}`,
		`{"timestamp": 10000000000000, "input_length": 10, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 1e19, "input_length": 10, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 1.5, "input_length": 1e3, "output_length": 2.0, "hash_ids": [1, 2]}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 9223372036854775807, "hash_ids": [1]}`,
		`{"timestamp": 0, "input_length": 2147483647, "output_length": 2147483647, "hash_ids": [1]}`,
	}
	scales := []struct{ length, arrival float64 }{
		{0.01, 1}, {1, 0}, {1e6, 1}, {1e12, 1}, {1e300, 1}, {2147483647, 1e300}, {1, math.Inf(1)}, {math.NaN(), 1},
		{5e-324, 5e-324}, {-1, -1},
	}
	for _, l := range lines {
		for _, sc := range scales {
			f.Add(l, sc.length, sc.arrival, uint8(4))
		}
	}
	f.Fuzz(func(t *testing.T, in string, lengthScale, arrivalScale float64, ranks uint8) {
		o := opts()
		o.LengthScale, o.ArrivalScale, o.Ranks = lengthScale, arrivalScale, int(ranks)
		reqs, err := Read(strings.NewReader(in), "fuzz.jsonl", o)
		if err != nil {
			if optErr := o.Validate(); optErr != nil {
				if err.Error() != optErr.Error() {
					t.Fatalf("bad options %+v: got %v, want %v", o, err, optErr)
				}
				return
			}
			if !strings.HasPrefix(err.Error(), "fuzz.jsonl") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, r := range reqs {
			n := len(r.HashIDs)
			switch {
			case r.Line < 1:
				t.Fatalf("request %d: line %d", r.Index, r.Line)
			case r.PromptLen < 1 || r.MaxNewTokens < 1:
				t.Fatalf("request %d: empty prompt or no output", r.Index)
			case r.LastBlockTokens < 1 || r.LastBlockTokens > r.BlockTokens:
				t.Fatalf("request %d: last block %d of %d", r.Index, r.LastBlockTokens, r.BlockTokens)
			case int64(r.PromptLen) != int64(n-1)*int64(r.BlockTokens)+int64(r.LastBlockTokens):
				t.Fatalf("request %d: prompt %d is not %d blocks of %d + %d", r.Index, r.PromptLen, n-1, r.BlockTokens, r.LastBlockTokens)
			case r.Arrival < 0 || r.Arrival > MaxReplay:
				t.Fatalf("request %d: arrival %v outside [0, %v]", r.Index, r.Arrival, MaxReplay)
			case r.Routing.HasRank && (r.Routing.Rank < 0 || (o.Ranks > 0 && r.Routing.Rank >= o.Ranks)):
				t.Fatalf("request %d: attention_dp_rank %d with %d ranks", r.Index, r.Routing.Rank, o.Ranks)
			}
			if r.PromptLen > 1<<16 {
				continue // too long to afford; its length is what a server checks
			}
			toks := r.Tokens()
			if len(toks) != r.PromptLen {
				t.Fatalf("request %d: %d tokens, PromptLen %d", r.Index, len(toks), r.PromptLen)
			}
			for _, tok := range toks {
				if tok < 0 || int(tok) >= o.VocabSize {
					t.Fatalf("token %d out of the vocabulary", tok)
				}
			}
		}
	})
}
