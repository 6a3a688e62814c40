// Package workload reads request traces (Mooncake JSON Lines) and turns them
// into requests with synthetic, deterministic token ids: equal hash ids carry
// equal tokens, so shared prefixes in the trace are shared prefixes of tokens.
//
// Reading checks every value and every scaled value (lengths × length
// scale, timestamps × arrival scale) before anything is allocated for it,
// and names the file, line and field of a bad one. Tokens are synthesised
// only on demand (Request.Tokens), so a request far too long to serve costs
// nothing until someone decides to serve it — which no one should.
package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"strings"
	"time"
)

// TraceBlockTokens is the block size of Mooncake hash ids, in tokens.
const TraceBlockTokens = 512

// MaxTokens is the largest token count a trace length may have, before or
// after scaling, to be served: token ids, positions and lengths cross the
// engine boundary as int32. A raw input_length or output_length above it is
// a bad trace; a scaled length above it is kept, so that the request can be
// rejected with its reason, and never synthesised.
const MaxTokens = math.MaxInt32

// MaxLengthScale is the largest length scale: beyond it even a one-token
// length scales past MaxTokens, so no request could ever be served.
const MaxLengthScale = float64(MaxTokens)

// MaxReplay is the latest a request may arrive after the start of the
// replay (trace timestamp × arrival scale): one year, far beyond any real
// trace and far inside time.Duration (about 292 years), so arrival stamps
// and the latencies derived from them cannot overflow.
const MaxReplay = 365 * 24 * time.Hour

// maxReplayMS is MaxReplay in milliseconds, the unit of trace timestamps.
const maxReplayMS = int64(MaxReplay / time.Millisecond)

// Record is one trace line as written in the file. The optional routing
// fields are nil or empty when absent.
type Record struct {
	TimestampMS    int64    `json:"timestamp"`
	InputLength    int      `json:"input_length"`
	OutputLength   int      `json:"output_length"`
	HashIDs        []uint64 `json:"hash_ids"`
	ConversationID string   `json:"conversation_id,omitempty"`
	// AffinityID is the routing key shared by related conversations (for
	// example the sub-agents of one parent session).
	AffinityID string `json:"affinity_id,omitempty"`
	// AttentionDPRank is the requested attention-DP rank (nil: none).
	AttentionDPRank *int `json:"attention_dp_rank,omitempty"`
	// AttentionDPRelax is false for a strict target (nil: unset = relaxed).
	AttentionDPRelax *bool `json:"attention_dp_relax,omitempty"`
}

// Routing is a request's optional attention-DP routing fields
// (router-and-calibration.md §1.4); the zero value means none.
type Routing struct {
	// AffinityID, when set, replaces the conversation id as the routing key.
	AffinityID string
	// HasRank says whether Rank is set (attention_dp_rank).
	HasRank bool
	// Rank is the requested attention-DP rank.
	Rank int
	// Strict is attention_dp_relax == false: the request waits for Rank
	// instead of going elsewhere when Rank is full. An unset relax flag is
	// relaxed, so the zero value is the unset case.
	Strict bool
}

// Request is one request ready to be served. Lengths are after length
// scaling and may exceed MaxTokens or any KV pool: the server checks them
// (and rejects the request with its reason) before it calls Tokens.
type Request struct {
	Index int // position in the trace (0-based); also the request id
	// Line is the request's line in its trace (1-based); 0 for the built-in
	// sample and for requests built in code.
	Line int
	// Arrival is when the request arrives, from the start of the replay:
	// timestamp × arrival scale, in [0, MaxReplay].
	Arrival        time.Duration
	PromptLen      int // prompt tokens (the length of Tokens())
	MaxNewTokens   int
	ConversationID string
	Routing        Routing
	HashIDs        []uint64 // the trace's block hashes (for conversation inference)
	BlockTokens    int      // tokens per hash block after length scaling
	// LastBlockTokens is the length of the last, possibly partial, block.
	LastBlockTokens int
	// Prompt, when non-nil, is the prompt itself (requests built in code);
	// trace requests leave it nil and Tokens synthesises theirs.
	Prompt []int32
	// StopAtEOS ends the request at the model's stop tokens as well as at
	// MaxNewTokens (text prompts); trace requests keep their lengths.
	StopAtEOS bool
	// Logprobs asks for every generated token's log-probability and the
	// TopLogprobs most probable tokens' at its position (text prompts:
	// worker run --logprobs).
	Logprobs    bool
	TopLogprobs int
	// PromptLogprobs asks for every prompt token's log-probability but
	// the first's, with the PromptTopLogprobs most probable tokens' at its
	// position (text prompts: worker run --prompt-logprobs).
	PromptLogprobs    bool
	PromptTopLogprobs int

	vocab int
	seed  uint64
}

// Len is the prompt length in tokens: len(Prompt) when the prompt is given,
// else PromptLen.
func (r *Request) Len() int {
	if r.Prompt != nil {
		return len(r.Prompt)
	}
	return r.PromptLen
}

// Options controls how records become requests.
type Options struct {
	Limit       int     // at most this many requests (0 = all)
	LengthScale float64 // multiplies input, output and block lengths; in (0, MaxLengthScale]
	// ArrivalScale multiplies timestamps; 0 (the zero value) makes every
	// request arrive at once. Finite and ≥ 0.
	ArrivalScale float64
	VocabSize    int    // token ids are in [0, VocabSize)
	Seed         uint64 // token synthesis seed
	// Ranks is the number of attention-DP ranks of the run: attention_dp_rank
	// must be below it. 0 leaves the rank unchecked.
	Ranks int
	// LengthScaleName and ArrivalScaleName name the scales in errors: the
	// flag or config key they came from ("" = "--length-scale",
	// "--arrival-scale").
	LengthScaleName, ArrivalScaleName string
}

func (o Options) lengthScaleName() string {
	if o.LengthScaleName == "" {
		return "--length-scale"
	}
	return o.LengthScaleName
}

func (o Options) arrivalScaleName() string {
	if o.ArrivalScaleName == "" {
		return "--arrival-scale"
	}
	return o.ArrivalScaleName
}

// CheckLengthScale validates a length scale; source names it in the error
// (a flag such as "--length-scale" or a config key). The scale must be
// finite and in (0, MaxLengthScale].
func CheckLengthScale(f float64, source string) error {
	if !(f > 0 && f <= MaxLengthScale) { // false for NaN
		return fmt.Errorf("%s must be a finite number in (0, %d], got %v", source, MaxTokens, f)
	}
	return nil
}

// CheckArrivalScale validates an arrival scale; source names it in the
// error. The scale must be finite and ≥ 0 (0: everything arrives at once).
// Whether a timestamp × scale stays within MaxReplay is checked per line.
func CheckArrivalScale(f float64, source string) error {
	if !(f >= 0 && f <= math.MaxFloat64) { // false for NaN and +Inf
		return fmt.Errorf("%s must be a finite number ≥ 0, got %v", source, f)
	}
	return nil
}

// Validate checks the options; errors name the option.
func (o Options) Validate() error {
	if err := CheckLengthScale(o.LengthScale, o.lengthScaleName()); err != nil {
		return err
	}
	if err := CheckArrivalScale(o.ArrivalScale, o.arrivalScaleName()); err != nil {
		return err
	}
	if o.Limit < 0 {
		return fmt.Errorf("--limit must be non-negative, got %d", o.Limit)
	}
	if o.VocabSize < 2 {
		return fmt.Errorf("vocabulary size must be at least 2, got %d", o.VocabSize)
	}
	if o.Ranks < 0 {
		return fmt.Errorf("the number of attention-DP ranks must be non-negative, got %d", o.Ranks)
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

// Read parses JSON Lines records from r. name labels errors ("file:line:
// field ..."). Blank lines are skipped. Reading stops after opt.Limit
// requests. No token is synthesised: see Request.Tokens.
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
		rec, err := parseRecord(text, opt.Ranks)
		if err == nil {
			var req Request
			if req, err = FromRecord(len(out), rec, opt); err == nil {
				req.Line = line
				out = append(out, req)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
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

// parseRecord decodes and validates one line; errors name the field. ranks
// > 0 bounds attention_dp_rank. Unknown fields are ignored.
func parseRecord(text []byte, ranks int) (Record, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(text, &raw); err != nil {
		return Record{}, fmt.Errorf("not a JSON object: %v", err)
	}
	var rec Record
	for _, f := range []string{"timestamp", "input_length", "output_length", "hash_ids"} {
		if v, ok := raw[f]; !ok || isNull(v) {
			return Record{}, fmt.Errorf("field %q is missing", f)
		}
	}
	ts, err := wholeNumber(raw, "timestamp", 0, math.MaxInt64)
	if err != nil {
		return Record{}, err
	}
	in, err := wholeNumber(raw, "input_length", 1, MaxTokens)
	if err != nil {
		return Record{}, err
	}
	outLen, err := wholeNumber(raw, "output_length", 1, MaxTokens)
	if err != nil {
		return Record{}, err
	}
	rec.TimestampMS, rec.InputLength, rec.OutputLength = ts, int(in), int(outLen)
	if err := json.Unmarshal(raw["hash_ids"], &rec.HashIDs); err != nil {
		return Record{}, fmt.Errorf("field \"hash_ids\": %v", typeError(err))
	}
	if len(rec.HashIDs) == 0 {
		return Record{}, errors.New("field \"hash_ids\" must not be empty")
	}
	if want := (rec.InputLength + TraceBlockTokens - 1) / TraceBlockTokens; len(rec.HashIDs) != want {
		return Record{}, fmt.Errorf("field \"hash_ids\" has %d blocks but input_length %d needs %d blocks of %d tokens",
			len(rec.HashIDs), rec.InputLength, want, TraceBlockTokens)
	}
	if rec.ConversationID, err = idField(raw, "conversation_id"); err != nil {
		return Record{}, err
	}
	if rec.AffinityID, err = idField(raw, "affinity_id"); err != nil {
		return Record{}, err
	}
	if v, ok := raw["attention_dp_rank"]; ok && !isNull(v) {
		n, err := wholeNumber(raw, "attention_dp_rank", 0, math.MaxInt32)
		if err != nil {
			return Record{}, err
		}
		if ranks > 0 && n >= int64(ranks) {
			return Record{}, fmt.Errorf("field \"attention_dp_rank\": rank %d is out of range: the run has %d attention-DP ranks (allowed: 0 to %d)",
				n, ranks, ranks-1)
		}
		rank := int(n)
		rec.AttentionDPRank = &rank
	}
	if v, ok := raw["attention_dp_relax"]; ok && !isNull(v) {
		var relax bool
		if err := json.Unmarshal(v, &relax); err != nil {
			return Record{}, fmt.Errorf("field \"attention_dp_relax\" must be true or false, got %s", clip(v))
		}
		rec.AttentionDPRelax = &relax
	}
	return rec, nil
}

// isNull reports whether a raw JSON value is the literal null.
func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// wholeNumber reads field as a whole number in [lo, hi]. Any JSON number
// form of a whole number is accepted (1000, 1e3, 1000.0); the check is exact,
// so no value is rounded into range.
func wholeNumber(raw map[string]json.RawMessage, field string, lo, hi int64) (int64, error) {
	v := raw[field]
	bad := func() error {
		return fmt.Errorf("field %q must be a whole number in [%d, %d], got %s", field, lo, hi, clip(v))
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return 0, bad()
	}
	n, ok := x.(json.Number)
	if !ok {
		return 0, bad()
	}
	q, ok := new(big.Rat).SetString(n.String())
	if !ok || !q.IsInt() || !q.Num().IsInt64() {
		return 0, bad()
	}
	i := q.Num().Int64()
	if i < lo || i > hi {
		return 0, bad()
	}
	return i, nil
}

// idField reads an optional identifier: a string, or a number used as
// written ("7" and 7 are the same id). Absent, null and "" mean none.
func idField(raw map[string]json.RawMessage, field string) (string, error) {
	v, ok := raw[field]
	if !ok || isNull(v) {
		return "", nil
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s, nil
	}
	var n json.Number
	if json.Unmarshal(v, &n) == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("field %q must be a string or a number, got %s", field, clip(v))
}

// clip shortens a raw JSON value for an error message.
func clip(v json.RawMessage) string {
	s := strings.TrimSpace(string(v))
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

func typeError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("expected %s, got JSON %s", te.Type, te.Value)
	}
	return err.Error()
}
