// Package workload reads request traces (Mooncake JSON Lines) and turns them
// into requests with synthetic, deterministic token ids: equal hash ids carry
// equal tokens, so shared prefixes in the trace are shared prefixes of tokens.
package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// TraceBlockTokens is the block size of Mooncake hash ids, in tokens.
const TraceBlockTokens = 512

// Record is one trace line as written in the file.
type Record struct {
	TimestampMS    int64    `json:"timestamp"`
	InputLength    int      `json:"input_length"`
	OutputLength   int      `json:"output_length"`
	HashIDs        []uint64 `json:"hash_ids"`
	ConversationID string   `json:"conversation_id,omitempty"`
}

// Request is one request ready to be served.
type Request struct {
	Index          int     // position in the trace (0-based); also the request id
	ArrivalMS      int64   // arrival time from the start of the trace
	Prompt         []int32 // synthetic token ids
	MaxNewTokens   int
	ConversationID string
	HashIDs        []uint64 // the trace's block hashes (for conversation inference)
	BlockTokens    int      // tokens per hash block after length scaling
}

// Options controls how records become requests.
type Options struct {
	Limit       int     // at most this many requests (0 = all)
	LengthScale float64 // multiplies input, output and block lengths; > 0
	VocabSize   int     // token ids are in [0, VocabSize)
	Seed        uint64  // token synthesis seed
}

// Validate checks the options; errors name the option.
func (o Options) Validate() error {
	if !(o.LengthScale > 0) || math.IsInf(o.LengthScale, 0) {
		return fmt.Errorf("--length-scale must be a positive number, got %v", o.LengthScale)
	}
	if o.Limit < 0 {
		return fmt.Errorf("--limit must be non-negative, got %d", o.Limit)
	}
	if o.VocabSize < 2 {
		return fmt.Errorf("vocabulary size must be at least 2, got %d", o.VocabSize)
	}
	return nil
}

// ReadFile reads a Mooncake trace file; see Read.
func ReadFile(path string, opt Options) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	return Read(f, path, opt)
}

// Read parses JSON Lines records from r. name labels errors ("file:line: field ...").
// Blank lines are skipped. Reading stops after opt.Limit requests.
func Read(r io.Reader, name string, opt Options) ([]Request, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var out []Request
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		rec, err := parseRecord(text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		out = append(out, Synthesize(len(out), rec, opt))
		if opt.Limit > 0 && len(out) >= opt.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no requests in trace", name)
	}
	return out, nil
}

// parseRecord decodes and validates one line; errors name the field.
func parseRecord(text []byte) (Record, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(text, &raw); err != nil {
		return Record{}, fmt.Errorf("not a JSON object: %v", err)
	}
	var rec Record
	fields := []struct {
		name     string
		dst      any
		required bool
	}{
		{"timestamp", &rec.TimestampMS, true},
		{"input_length", &rec.InputLength, true},
		{"output_length", &rec.OutputLength, true},
		{"hash_ids", &rec.HashIDs, true},
		{"conversation_id", &rec.ConversationID, false},
	}
	for _, f := range fields {
		v, ok := raw[f.name]
		if !ok {
			if f.required {
				return Record{}, fmt.Errorf("field %q is missing", f.name)
			}
			continue
		}
		if err := json.Unmarshal(v, f.dst); err != nil {
			// conversation_id may also be a number in some traces.
			if f.name == "conversation_id" {
				var n json.Number
				if json.Unmarshal(v, &n) == nil {
					rec.ConversationID = n.String()
					continue
				}
			}
			return Record{}, fmt.Errorf("field %q: %v", f.name, typeError(err))
		}
	}
	switch {
	case rec.TimestampMS < 0:
		return Record{}, fmt.Errorf("field \"timestamp\" must be non-negative, got %d", rec.TimestampMS)
	case rec.InputLength < 1:
		return Record{}, fmt.Errorf("field \"input_length\" must be at least 1, got %d", rec.InputLength)
	case rec.OutputLength < 1:
		return Record{}, fmt.Errorf("field \"output_length\" must be at least 1, got %d", rec.OutputLength)
	case len(rec.HashIDs) == 0:
		return Record{}, errors.New("field \"hash_ids\" must not be empty")
	}
	if want := (rec.InputLength + TraceBlockTokens - 1) / TraceBlockTokens; len(rec.HashIDs) != want {
		return Record{}, fmt.Errorf("field \"hash_ids\" has %d blocks but input_length %d needs %d blocks of %d tokens",
			len(rec.HashIDs), rec.InputLength, want, TraceBlockTokens)
	}
	return rec, nil
}

func typeError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("expected %s, got JSON %s", te.Type, te.Value)
	}
	return err.Error()
}
