package workload

import "fmt"

// SampleName labels the built-in sample in reports and errors.
const SampleName = "built-in sample"

// SampleRecords is the built-in workload served when no trace is given: 16
// conversations of 4 turns (64 requests). Every prompt starts with one shared
// "system prompt" block (hash id 0); each turn re-sends the previous turn's
// full blocks and adds one, so consecutive turns share long prefixes. The
// conversations start 250 ms apart and their turns follow 2 s apart.
func SampleRecords() []Record {
	const convs, turns = 16, 4
	var recs []Record
	for t := 0; t < turns; t++ {
		for c := 0; c < convs; c++ {
			ids := []uint64{0}
			for i := 0; i < t; i++ {
				ids = append(ids, uint64(1000*(c+1)+i))
			}
			// A partial tail block unique to this turn.
			ids = append(ids, uint64(1000*(c+1)+500+t))
			tail := 64 + 29*((c+3*t)%8)
			recs = append(recs, Record{
				TimestampMS:    int64(250*c + 2000*t),
				InputLength:    TraceBlockTokens*(t+1) + tail,
				OutputLength:   8 + (c*7+t*5)%24,
				HashIDs:        ids,
				ConversationID: "sample-" + itoa(c),
			})
		}
	}
	return recs
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// Sample returns the built-in sample as requests (respecting opt.Limit);
// like Read, it synthesises no token (see Request.Tokens). Errors name the
// option, or SampleName and the request for a scaled value out of range.
func Sample(opt Options) ([]Request, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	var out []Request
	for _, rec := range SampleRecords() {
		r, err := FromRecord(len(out), rec, opt)
		if err != nil {
			return nil, fmt.Errorf("%s, request %d: %w", SampleName, len(out), err)
		}
		out = append(out, r)
		if opt.Limit > 0 && len(out) >= opt.Limit {
			break
		}
	}
	return out, nil
}

// Load reads the trace at path with every value checked, or the built-in
// sample when path is "".
func Load(path string, opt Options) ([]Request, error) {
	if path == "" {
		return Sample(opt)
	}
	return ReadFile(path, opt)
}
