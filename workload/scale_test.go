package workload

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// line is one record with n hash blocks for input tokens; extra is appended.
func line(ts string, input, output int, extra string) string {
	ids := make([]string, (input+TraceBlockTokens-1)/TraceBlockTokens)
	for i := range ids {
		ids[i] = itoa(i + 1)
	}
	return fmt.Sprintf(`{"timestamp": %s, "input_length": %d, "output_length": %d, "hash_ids": [%s]%s}`,
		ts, input, output, strings.Join(ids, ","), extra)
}

// Issue 9 defect 3: scales must be finite and in range; the error names the
// scale by the name it came under (a flag or a config key).
func TestScaleChecksNameTheirSource(t *testing.T) {
	cases := []struct {
		length, arrival float64
		lname           string
		want            string
	}{
		{math.NaN(), 1, "", "--length-scale must be a finite number in (0, 2147483647], got NaN"},
		{math.Inf(1), 1, "", "--length-scale must be a finite number in (0, 2147483647], got +Inf"},
		{1e300, 1, "", "--length-scale must be a finite number in (0, 2147483647], got 1e+300"},
		{2147483648, 1, "", "got 2.147483648e+09"},
		{0, 1, "workload.length_scale (c.yaml)", "workload.length_scale (c.yaml) must be a finite number in (0, 2147483647], got 0"},
		{-1, 1, "", "--length-scale must be a finite number"},
		{1, math.NaN(), "", "--arrival-scale must be a finite number ≥ 0, got NaN"},
		{1, math.Inf(1), "", "--arrival-scale must be a finite number ≥ 0, got +Inf"},
		{1, -1e-9, "", "--arrival-scale must be a finite number ≥ 0, got -1e-09"},
	}
	for _, c := range cases {
		o := opts()
		o.LengthScale, o.ArrivalScale, o.LengthScaleName = c.length, c.arrival, c.lname
		_, err := Read(strings.NewReader(line("0", 10, 1, "")), "t.jsonl", o)
		require.ErrorContains(t, err, c.want, "%+v", c)
		_, err = Sample(o)
		require.ErrorContains(t, err, c.want, "%+v", c)
	}
	// The largest allowed scales are fine.
	o := opts()
	o.LengthScale, o.ArrivalScale = MaxLengthScale, math.MaxFloat64
	reqs, err := Read(strings.NewReader(line("0", 10, 1, "")), "t.jsonl", o)
	require.NoError(t, err)
	require.Equal(t, int64(10*MaxTokens), int64(reqs[0].PromptLen))
	require.Zero(t, reqs[0].Arrival)
}

// Issue 9 defect 3: every scaled value stays in range or the line is an
// error naming the file, line and field; values that once overflowed in
// silence (lengths collapsing to 1, arrivals wrapping negative) are caught.
func TestScaledValuesAreCheckedPerLine(t *testing.T) {
	cases := []struct {
		line          string
		length, arriv float64
		want          string
	}{
		{line("10000000000000", 10, 1, ""), 1, 1,
			`t.jsonl:2: field "timestamp": 10000000000000 ms × --arrival-scale 1 is beyond the longest replay of 31536000000 ms (365 days)`},
		{line("31536000001", 10, 1, ""), 1, 1, `t.jsonl:2: field "timestamp": 31536000001 ms`},
		{line("3", 10, 1, ""), 1, 1e300, `t.jsonl:2: field "timestamp": 3 ms × --arrival-scale 1e+300 is beyond`},
		{line("9223372036854775807", 10, 1, ""), 1, 1e-300, ""}, // 9.2e-282 ms: fine
		{line("1e19", 10, 1, ""), 1, 0, `t.jsonl:2: field "timestamp" must be a whole number in [0, 9223372036854775807], got 1e19`},
		{line("0", 10, 1, "")[:len(line("0", 10, 1, ""))-1] + `, "output_length": 9223372036854775807}`, 1, 1,
			`t.jsonl:2: field "output_length" must be a whole number in [1, 2147483647], got 9223372036854775807`},
		{`{"timestamp": 0, "input_length": 2147483648, "output_length": 1, "hash_ids": [1]}`, 1, 1,
			`t.jsonl:2: field "input_length" must be a whole number in [1, 2147483647], got 2147483648`},
		{`{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": [1]}`, 1, 1,
			`t.jsonl:2: field "input_length" must be a whole number in [1, 2147483647], got 1.5`},
		{`{"timestamp": 0, "input_length": "12", "output_length": 1, "hash_ids": [1]}`, 1, 1,
			`t.jsonl:2: field "input_length" must be a whole number in [1, 2147483647], got "12"`},
		{`{"timestamp": 0, "input_length": 1e1, "output_length": 2.0e0, "hash_ids": [1]}`, 1, 1, ""},
	}
	for _, c := range cases {
		o := opts()
		o.LengthScale, o.ArrivalScale = c.length, c.arriv
		_, err := Read(strings.NewReader(line("0", 10, 1, "")+"\n"+c.line), "t.jsonl", o)
		if c.want == "" {
			require.NoError(t, err, c.line)
			continue
		}
		require.ErrorContains(t, err, c.want, c.line)
	}
}

// Issue 9 defect 3: scaled lengths never wrap or collapse. At the largest
// scale a 1-token length is MaxTokens tokens and a full trace prompt keeps
// its exact scaled length (above MaxTokens: a server rejects it).
func TestScaledLengthsAreExact(t *testing.T) {
	cases := []struct {
		input, output        int
		scale                float64
		prompt, maxNew, bt   int64
		lastBlockTokens      int64
		wantArrival          time.Duration
		timestamp, arrivalSc string
	}{
		{600, 3, 1, 600, 3, 512, 88, 0, "0", "1"},
		{15325, 149, 1e6, 15325e6, 149e6, 512e6, 477e6, 0, "0", "1"},
		{15325, 149, 1e9, 15325e9, 149e9, 512e9, 477e9, 2500 * time.Microsecond, "5", "0.5"},
		{1, 1, 2147483647, 2147483647, 2147483647, 1099511627264, 2147483647, 0, "0", "1"},
		{1, 1, 1e-9, 1, 1, 1, 1, 0, "0", "1"},
	}
	for _, c := range cases {
		o := opts()
		o.LengthScale = c.scale
		fmt.Sscan(c.arrivalSc, &o.ArrivalScale)
		reqs, err := Read(strings.NewReader(line(c.timestamp, c.input, c.output, "")), "t.jsonl", o)
		require.NoError(t, err)
		r := reqs[0]
		require.Equal(t, c.prompt, int64(r.PromptLen), "%+v", c)
		require.Equal(t, c.maxNew, int64(r.MaxNewTokens), "%+v", c)
		require.Equal(t, c.bt, int64(r.BlockTokens), "%+v", c)
		require.Equal(t, c.lastBlockTokens, int64(r.LastBlockTokens), "%+v", c)
		require.Equal(t, c.wantArrival, r.Arrival, "%+v", c)
	}
}

// Issue 9 defect 2: reading a trace synthesises no token, so a request of
// billions of tokens costs its record only; Tokens synthesises on demand.
func TestReadSynthesisesNothing(t *testing.T) {
	o := opts()
	o.LengthScale = 1e6 // 15 325 000 000 tokens per request
	in := strings.Repeat(line("0", 15325, 149, "")+"\n", 50)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	reqs, err := Read(strings.NewReader(in), "t.jsonl", o)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, reqs, 50)
	require.Equal(t, int64(15325e6), int64(reqs[49].PromptLen))
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20))
}

// Issue 9 defect 13: the optional routing fields, their forms and their
// errors (each naming the file, line and field).
func TestReadRoutingFields(t *testing.T) {
	base := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]`
	cases := []struct {
		extra string
		ranks int
		want  Routing
		err   string
	}{
		{``, 4, Routing{}, ""},
		{`, "affinity_id": "P"`, 4, Routing{AffinityID: "P"}, ""},
		{`, "affinity_id": 42`, 4, Routing{AffinityID: "42"}, ""},
		{`, "affinity_id": null, "attention_dp_rank": null, "attention_dp_relax": null`, 4, Routing{}, ""},
		{`, "affinity_id": ""`, 4, Routing{}, ""},
		{`, "attention_dp_rank": 3`, 4, Routing{HasRank: true, Rank: 3}, ""},
		{`, "attention_dp_rank": 0, "attention_dp_relax": false`, 4, Routing{HasRank: true, Strict: true}, ""},
		{`, "attention_dp_rank": 2, "attention_dp_relax": true`, 4, Routing{HasRank: true, Rank: 2}, ""},
		{`, "attention_dp_rank": 7`, 0, Routing{HasRank: true, Rank: 7}, ""}, // ranks unknown: unchecked
		{`, "attention_dp_relax": false`, 4, Routing{Strict: true}, ""},      // strict without a rank: sorts first (spec §1.6)
		{`, "attention_dp_rank": 4`, 4, Routing{},
			`t.jsonl:1: field "attention_dp_rank": rank 4 is out of range: the run has 4 attention-DP ranks (allowed: 0 to 3)`},
		{`, "attention_dp_rank": -1`, 4, Routing{}, `t.jsonl:1: field "attention_dp_rank" must be a whole number in [0, 2147483647], got -1`},
		{`, "attention_dp_rank": "1"`, 4, Routing{}, `t.jsonl:1: field "attention_dp_rank" must be a whole number`},
		{`, "attention_dp_rank": 1.5`, 4, Routing{}, `t.jsonl:1: field "attention_dp_rank" must be a whole number`},
		{`, "attention_dp_relax": "no"`, 4, Routing{}, `t.jsonl:1: field "attention_dp_relax" must be true or false, got "no"`},
		{`, "affinity_id": [1]`, 4, Routing{}, `t.jsonl:1: field "affinity_id" must be a string or a number, got [1]`},
		{`, "conversation_id": {}`, 4, Routing{}, `t.jsonl:1: field "conversation_id" must be a string or a number, got {}`},
	}
	for _, c := range cases {
		o := opts()
		o.Ranks = c.ranks
		reqs, err := Read(strings.NewReader(base+c.extra+"}"), "t.jsonl", o)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.extra)
			continue
		}
		require.NoError(t, err, c.extra)
		require.Equal(t, c.want, reqs[0].Routing, c.extra)
	}
}
