package workload

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func opts() Options { return Options{LengthScale: 1, VocabSize: 512, Seed: 1} }

func TestReadValidTrace(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}

{"timestamp": 5, "input_length": 1100, "output_length": 2, "hash_ids": [7, 8, 9], "conversation_id": "c1"}
`
	reqs, err := Read(strings.NewReader(in), "t.jsonl", opts())
	require.NoError(t, err)
	require.Len(t, reqs, 2)
	require.Len(t, reqs[0].Prompt, 600)
	require.Len(t, reqs[1].Prompt, 1100)
	require.Equal(t, "c1", reqs[1].ConversationID)
	require.Equal(t, 1, reqs[1].Index)
	// Equal hash ids at equal positions carry equal tokens: the first full
	// block is shared; the second block of request 0 is partial (88 tokens)
	// and is a prefix of request 1's full block 8.
	require.Equal(t, reqs[0].Prompt[:600], reqs[1].Prompt[:600])
	require.NotEqual(t, reqs[1].Prompt[1024:1100], reqs[1].Prompt[512:588])
}

func TestReadErrorsNameLineAndField(t *testing.T) {
	cases := []struct{ line, want string }{
		{`{"timestamp": 0, "input_length": 10, "output_length": 3}`, `t.jsonl:2: field "hash_ids" is missing`},
		{`{"timestamp": 0, "input_length": "x", "output_length": 3, "hash_ids": [1]}`, `t.jsonl:2: field "input_length"`},
		{`{"timestamp": 0, "input_length": 0, "output_length": 3, "hash_ids": [1]}`, `input_length" must be at least 1`},
		{`{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}`, `output_length" must be at least 1`},
		{`{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}`, `timestamp" must be non-negative`},
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
	require.Len(t, reqs[0].Prompt, 78*5+2)
	require.Equal(t, 1, reqs[0].MaxNewTokens)
	require.Equal(t, 6, reqs[1].MaxNewTokens)
	// Request 1's first block (hash 0) equals request 0's first block.
	require.Equal(t, reqs[0].Prompt[:5], reqs[1].Prompt[:5])
	for _, tok := range reqs[0].Prompt {
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
	require.Equal(t, reqs[0].Prompt[:512], reqs[16].Prompt[:512])
	require.Equal(t, reqs[0].Prompt[:512], reqs[1].Prompt[:512]) // shared system block
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

// FuzzRead: the trace parser never panics; a failure names the file and line,
// and a success yields requests whose tokens are in the vocabulary.
func FuzzRead(f *testing.F) {
	f.Add(`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}`)
	f.Add(`{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1], "conversation_id": 7}`)
	f.Add(`{"timestamp": -1}`)
	f.Add("\n\n{}")
	f.Fuzz(func(t *testing.T, in string) {
		o := opts()
		o.LengthScale = 0.01
		reqs, err := Read(strings.NewReader(in), "fuzz.jsonl", o)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.jsonl") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, r := range reqs {
			if len(r.Prompt) == 0 || r.MaxNewTokens < 1 {
				t.Fatalf("request %d: empty prompt or no output", r.Index)
			}
			for _, tok := range r.Prompt {
				if tok < 0 || int(tok) >= o.VocabSize {
					t.Fatalf("token %d out of the vocabulary", tok)
				}
			}
		}
	})
}
