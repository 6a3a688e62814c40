package executor

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// The arrival payload: how rank 0's arrivals cross the intake broadcast
// (encodeArrivals, decodeArrivals), and the decoder every payload of the
// executor's collectives reads with.

// Routing flags of the arrival payload.
const (
	arrivalHasRank = 1 << iota
	arrivalStrict
	arrivalStopAtEOS
	arrivalSampling // the sampling fields follow the target rank
	// arrivalProcessors: min_p, the penalties, the logit bias and the stop
	// token ids follow the sampling fields.
	arrivalProcessors
	// arrivalLogprobs: the request wants log-probabilities; its top count
	// (u8) follows the processor fields.
	arrivalLogprobs
	// arrivalGuide: the guide's pattern (u32 length, bytes) follows.
	arrivalGuide
	// arrivalExtra: a second flags byte (extra*) follows the guide, then
	// the fields it names.
	arrivalExtra
)

// The second flags byte's (arrivalExtra).
const (
	extraMinTokens      = 1 << iota // min_tokens u32
	extraAllowedIDs                 // allowed token ids: n u32, ids u32×n
	extraBadWords                   // bad words: n u32, then each: len u32, ids u32×len
	extraPromptLogprobs             // prompt log-probabilities: top count u8
	extraPriority                   // priority i32
)

// validateLogprobs checks the log-probability request (bridge.SeqStep's rule).
func (a *Arrival) validateLogprobs() error {
	s := bridge.SeqStep{Logprobs: a.Logprobs, TopLogprobs: a.TopLogprobs}
	return s.ValidateLogprobs()
}

// validatePromptLogprobs checks the prompt log-probability request (the
// rule of validateLogprobs).
func (a *Arrival) validatePromptLogprobs() error {
	s := bridge.SeqStep{Logprobs: a.PromptLogprobs, TopLogprobs: a.PromptTopLogprobs}
	return s.ValidateLogprobs()
}

// hasProcessors reports whether a needs the arrivalProcessors fields.
func (a *Arrival) hasProcessors() bool {
	s := &a.Sampling
	return s.MinP != 0 || s.PresencePenalty != 0 || s.FrequencyPenalty != 0 || s.RepetitionPenalty != 0 ||
		len(a.LogitBias) > 0 || len(a.StopTokenIDs) > 0
}

// encodeArrivals serialises a broadcast payload (little-endian):
// per item: id u64, arrival i64, max_new u32, conv_len u32, conv bytes,
// affinity_len u32, affinity bytes, flags u8 (arrivalHasRank,
// arrivalStrict, arrivalStopAtEOS, arrivalSampling), target rank u32,
// [with arrivalSampling: temperature f32 bits u32, top_k u32, top_p f32
// bits u32, seed u64], [with arrivalProcessors: min_p, presence,
// frequency and repetition penalty f32 bits u32 each, n_bias u32, (id u32,
// bias f32 bits u32)×n, n_stop u32, stop ids u32×n], [with
// arrivalLogprobs: top_logprobs u8], [with arrivalGuide: pattern_len u32,
// pattern bytes], [with arrivalExtra: extra flags u8, [with
// extraMinTokens: min_tokens u32], [with extraAllowedIDs: n u32, ids
// u32×n], [with extraBadWords: n u32, (len u32, ids u32×len)×n], [with
// extraPromptLogprobs: top count u8], [with extraPriority: priority
// i32]],
// n_tokens u32, tokens u32×n. Rank 0 has screened the
// items (scheduler.Admission, valid sampling parameters), so max_new, top_k and the
// prompt length fit 32 bits; an item that does not is a broken invariant.
func encodeArrivals(items []Arrival) []byte { return appendArrivals(nil, items) }

// appendArrivals appends the wire form of items to b.
func appendArrivals(b []byte, items []Arrival) []byte {
	n := 0
	for _, a := range items {
		n += 8 + 8 + 4 + 4 + len(a.ConversationID) + 4 + len(a.Routing.AffinityID) + 1 + 4 + 20 + 4 + 4*len(a.Prompt)
	}
	b = slices.Grow(b, n)
	for _, a := range items {
		if a.MaxNewTokens < 0 || a.MaxNewTokens > scheduler.MaxSequenceTokens || a.Routing.Rank < 0 || a.Routing.Rank > math.MaxInt32 {
			panic(fmt.Sprintf("executor: arrival %d was not screened: max_new_tokens %d, target rank %d", a.ID, a.MaxNewTokens, a.Routing.Rank))
		}
		if err := a.Sampling.Validate(); err != nil {
			panic(fmt.Sprintf("executor: arrival %d was not screened: %v", a.ID, err))
		}
		b = binary.LittleEndian.AppendUint64(b, a.ID)
		b = binary.LittleEndian.AppendUint64(b, uint64(a.ArrivalUnixNS))
		b = binary.LittleEndian.AppendUint32(b, uint32(a.MaxNewTokens))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(a.ConversationID)))
		b = append(b, a.ConversationID...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(a.Routing.AffinityID)))
		b = append(b, a.Routing.AffinityID...)
		var flags byte
		if a.Routing.HasRank {
			flags |= arrivalHasRank
		}
		if a.Routing.Strict {
			flags |= arrivalStrict
		}
		if a.StopAtEOS {
			flags |= arrivalStopAtEOS
		}
		if a.Sampling != (bridge.SamplingParams{}) {
			flags |= arrivalSampling
		}
		if a.hasProcessors() {
			flags |= arrivalProcessors
		}
		if a.Logprobs {
			flags |= arrivalLogprobs
		}
		if a.Guide != "" {
			flags |= arrivalGuide
		}
		var extra byte
		if a.MinTokens != 0 {
			extra |= extraMinTokens
		}
		if len(a.AllowedTokenIDs) > 0 {
			extra |= extraAllowedIDs
		}
		if len(a.BadWords) > 0 {
			extra |= extraBadWords
		}
		if a.PromptLogprobs {
			extra |= extraPromptLogprobs
		}
		if a.Priority != 0 {
			extra |= extraPriority
		}
		if extra != 0 {
			flags |= arrivalExtra
		}
		b = append(b, flags)
		b = binary.LittleEndian.AppendUint32(b, uint32(a.Routing.Rank))
		if flags&arrivalSampling != 0 {
			s := &a.Sampling
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(s.Temperature))
			b = binary.LittleEndian.AppendUint32(b, uint32(s.TopK))
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(s.TopP))
			b = binary.LittleEndian.AppendUint64(b, s.Seed)
		}
		if flags&arrivalProcessors != 0 {
			s := &a.Sampling
			for _, v := range []float32{s.MinP, s.PresencePenalty, s.FrequencyPenalty, s.RepetitionPenalty} {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
			}
			b = binary.LittleEndian.AppendUint32(b, uint32(len(a.LogitBias)))
			for _, tb := range a.LogitBias {
				b = binary.LittleEndian.AppendUint32(b, uint32(tb.ID))
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(tb.Bias))
			}
			b = binary.LittleEndian.AppendUint32(b, uint32(len(a.StopTokenIDs)))
			for _, t := range a.StopTokenIDs {
				b = binary.LittleEndian.AppendUint32(b, uint32(t))
			}
		}
		if flags&arrivalLogprobs != 0 {
			b = append(b, byte(a.TopLogprobs))
		}
		if flags&arrivalGuide != 0 {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(a.Guide)))
			b = append(b, a.Guide...)
		}
		if extra != 0 {
			b = append(b, extra)
		}
		if extra&extraMinTokens != 0 {
			b = binary.LittleEndian.AppendUint32(b, uint32(a.MinTokens))
		}
		if extra&extraAllowedIDs != 0 {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(a.AllowedTokenIDs)))
			for _, id := range a.AllowedTokenIDs {
				b = binary.LittleEndian.AppendUint32(b, uint32(id))
			}
		}
		if extra&extraBadWords != 0 {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(a.BadWords)))
			for _, w := range a.BadWords {
				b = binary.LittleEndian.AppendUint32(b, uint32(len(w)))
				for _, id := range w {
					b = binary.LittleEndian.AppendUint32(b, uint32(id))
				}
			}
		}
		if extra&extraPromptLogprobs != 0 {
			b = append(b, byte(a.PromptTopLogprobs))
		}
		if extra&extraPriority != 0 {
			b = binary.LittleEndian.AppendUint32(b, uint32(a.Priority))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(a.Prompt)))
		for _, t := range a.Prompt {
			b = binary.LittleEndian.AppendUint32(b, uint32(t))
		}
	}
	return b
}

// decodeArrivals parses want items; a malformed payload means the broadcast
// paired with an unrelated collective.
func decodeArrivals(b []byte, want int) ([]Arrival, error) {
	d := decoder{b: b}
	out := make([]Arrival, 0, want)
	for i := 0; i < want; i++ {
		var a Arrival
		a.ID = d.u64()
		a.ArrivalUnixNS = int64(d.u64())
		a.MaxNewTokens = int(d.u32())
		a.ConversationID = string(d.bytes(int(d.u32())))
		a.Routing.AffinityID = string(d.bytes(int(d.u32())))
		flags := d.u8()
		a.Routing.HasRank, a.Routing.Strict = flags&arrivalHasRank != 0, flags&arrivalStrict != 0
		a.StopAtEOS = flags&arrivalStopAtEOS != 0
		a.Routing.Rank = int(d.u32())
		if d.err == nil && (a.MaxNewTokens > scheduler.MaxSequenceTokens || a.Routing.Rank > math.MaxInt32) {
			// What the sender screens (appendArrivals) never travels.
			d.err = fmt.Errorf("arrival %d: max_new_tokens %d, target rank %d out of range", a.ID, a.MaxNewTokens, a.Routing.Rank)
		}
		if flags&arrivalSampling != 0 {
			s := &a.Sampling
			s.Temperature = math.Float32frombits(d.u32())
			s.TopK = int(d.u32())
			s.TopP = math.Float32frombits(d.u32())
			s.Seed = d.u64()
		}
		if flags&arrivalProcessors != 0 {
			s := &a.Sampling
			s.MinP = math.Float32frombits(d.u32())
			s.PresencePenalty = math.Float32frombits(d.u32())
			s.FrequencyPenalty = math.Float32frombits(d.u32())
			s.RepetitionPenalty = math.Float32frombits(d.u32())
			if nb := int(d.u32()); d.err == nil && nb > len(d.b)/8 {
				d.err = errShort
			} else if d.err == nil && nb > 0 {
				a.LogitBias = make([]bridge.TokenBias, nb)
				for j := range a.LogitBias {
					a.LogitBias[j] = bridge.TokenBias{ID: int32(d.u32()), Bias: math.Float32frombits(d.u32())}
				}
			}
			if ns := int(d.u32()); d.err == nil && ns > len(d.b)/4 {
				d.err = errShort
			} else if d.err == nil && ns > 0 {
				a.StopTokenIDs = make([]int32, ns)
				for j := range a.StopTokenIDs {
					a.StopTokenIDs[j] = int32(d.u32())
				}
			}
		}
		if flags&arrivalLogprobs != 0 {
			a.Logprobs, a.TopLogprobs = true, int(d.u8())
			if err := a.validateLogprobs(); d.err == nil && err != nil {
				d.err = fmt.Errorf("arrival %d: %w", a.ID, err)
			}
		}
		if flags&arrivalGuide != 0 {
			a.Guide = string(d.bytes(int(d.u32())))
		}
		var extra byte
		if flags&arrivalExtra != 0 {
			if extra = d.u8(); d.err == nil && (extra == 0 || extra&^(extraMinTokens|extraAllowedIDs|extraBadWords|extraPromptLogprobs|extraPriority) != 0) {
				d.err = fmt.Errorf("arrival %d: bad extra flags %#x", a.ID, extra)
			}
		}
		if extra&extraMinTokens != 0 {
			if a.MinTokens = int(d.u32()); d.err == nil && a.MinTokens > a.MaxNewTokens {
				d.err = fmt.Errorf("arrival %d: min_tokens %d above max_new_tokens %d", a.ID, a.MinTokens, a.MaxNewTokens)
			}
		}
		if extra&extraAllowedIDs != 0 {
			if n := int(d.u32()); d.err == nil && n > len(d.b)/4 {
				d.err = errShort
			} else if d.err == nil {
				a.AllowedTokenIDs = make([]int32, n)
				for j := range a.AllowedTokenIDs {
					a.AllowedTokenIDs[j] = int32(d.u32())
				}
			}
		}
		if extra&extraBadWords != 0 {
			if n := int(d.u32()); d.err == nil && n > len(d.b)/4 {
				d.err = errShort
			} else if d.err == nil {
				a.BadWords = make([][]int32, n)
				for j := range a.BadWords {
					if m := int(d.u32()); d.err == nil && m > len(d.b)/4 {
						d.err = errShort
						break
					} else if d.err == nil {
						w := make([]int32, m)
						for k := range w {
							w[k] = int32(d.u32())
						}
						a.BadWords[j] = w
					}
				}
			}
		}
		if extra&extraPromptLogprobs != 0 {
			a.PromptLogprobs, a.PromptTopLogprobs = true, int(d.u8())
			if err := a.validatePromptLogprobs(); d.err == nil && err != nil {
				d.err = fmt.Errorf("arrival %d: %w", a.ID, err)
			}
		}
		if extra&extraPriority != 0 {
			a.Priority = int32(d.u32())
		}
		if flags&(arrivalSampling|arrivalProcessors) != 0 {
			if err := a.Sampling.Validate(); d.err == nil && err != nil {
				d.err = fmt.Errorf("arrival %d: %w", a.ID, err)
			}
		}
		if d.err == nil && flags&^(arrivalHasRank|arrivalStrict|arrivalStopAtEOS|arrivalSampling|arrivalProcessors|arrivalLogprobs|arrivalGuide|arrivalExtra) != 0 {
			d.err = fmt.Errorf("arrival %d: unknown flags %#x", a.ID, flags)
		}
		n := int(d.u32())
		if d.err == nil && n > len(d.b)/4 {
			d.err = errShort
		}
		if d.err != nil {
			break
		}
		// The tokens stay encoded until the request is admitted here: under
		// attention DP only the owning rank needs them, so a fleet of R
		// ranks decodes each prompt once instead of R − 1 times. The
		// payload is this rank's (or, in a coroutine group, shared and
		// read-only) and never written, so the closure may keep it.
		raw := d.bytes(4 * n)
		a.PromptLen = n
		a.Synthesize = func() []int32 {
			p := make([]int32, n)
			for k := range p {
				p[k] = int32(binary.LittleEndian.Uint32(raw[4*k:]))
			}
			return p
		}
		out = append(out, a)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("collective desync: arrival payload does not decode: %w", d.err)
	}
	return out, nil
}

// decoder reads little-endian values, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

var errShort = fmt.Errorf("payload too short")

func (d *decoder) need(n int) bool {
	if d.err != nil {
		return false
	}
	if len(d.b) < n {
		d.err = errShort
		return false
	}
	return true
}

func (d *decoder) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u8() byte {
	if !d.need(1) {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bytes(n int) []byte {
	if !d.need(n) {
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}
