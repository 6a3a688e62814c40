package executor

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/lockstep-ai/lockstep/bridge"
)

// Response is a finished (or rejected) request as rank 0 receives it.
type Response struct {
	ID     uint64  // request id
	Rank   int     // the rank that served it; NoRank if it was rejected before routing
	Output []int32 // generated tokens, in order
	// Logprobs, when the request asked for them (Arrival.Logprobs): one per
	// Output token, in order.
	Logprobs []TokenLogprobs
	// PromptLogprobs, when the request asked for them
	// (Arrival.PromptLogprobs) and its prompt has more than one token:
	// entry j is prompt token j+1's, given the tokens before it. With
	// Config.Stream they ride the first token's delta instead
	// (TokenDelta.PromptLogprobs), so that a client whose answer ends
	// early (a stop string) or streams still gets them.
	PromptLogprobs   []TokenLogprobs
	ArrivalUnixNS    int64
	ScheduledUnixNS  int64 // its first chunk was launched (0 if never): the queue time ends
	FirstTokenUnixNS int64 // 0 if no token was produced
	FinishUnixNS     int64
	Suspended        int // times suspended to make room
	Recomputed       int // times recompute-paused
	// ReusedTokens is the prompt prefix its first admission took from the
	// radix cache (prefill skipped): PromptLen − ReusedTokens is its
	// uncached prompt.
	ReusedTokens int
	// Stopped: generation ended at a stop token (the last of Output) or,
	// for a guided request (Arrival.Guide), where its match ended; not at
	// the length limit.
	Stopped bool
	Error   string // non-empty: rejected with this reason
}

// NoRank is the Rank of a response rejected before routing (rank 0 screens
// arrivals that can never be served before it broadcasts them).
const NoRank = -1

// responseBatch is the payload of the response gathers (C7, C8): the sending
// rank's busy time in this iteration (C8 only) and its responses; with
// Config.Stream, the tokens its requests produced (C7); while serving
// (Config.Stream, on every rank) or with Config.OnIteration, its load (C8).
type responseBatch struct {
	DeviceUS int64
	// Tokens is the real tokens of the batch DeviceUS timed (0 without a
	// forward): the input of the token balance.
	Tokens    int64
	Responses []Response
	Deltas    []TokenDelta
	Load      RankLoad
}

// TokenDelta is one token a request produced in an iteration (streaming).
type TokenDelta struct {
	ID    uint64
	Token int32
	// Logprobs is the token's log-probabilities when the request asked for
	// them (nil otherwise).
	Logprobs *TokenLogprobs
	// PromptLogprobs is on a request's first token's delta when it asked
	// for them (Response.PromptLogprobs; nil otherwise).
	PromptLogprobs []TokenLogprobs
}

// TokenLogprobs is one generated token's log-probabilities
// (bridge.RowLogprobs): its own, and the request's TopLogprobs most
// probable tokens' at its position, highest first (ties: lower id).
type TokenLogprobs struct {
	Logprob     float32
	TopIDs      []int32
	TopLogprobs []float32
	// Rank is a prompt token's rank at its position (bridge.RowRank; the
	// most probable is 1); 0 for a generated token's.
	Rank int32
}

// Response flags of the payload.
const (
	responseStopped  = 1
	responseLogprobs = 2 // one TokenLogprobs per output token follows the output
	// responsePromptLogprobs: the prompt's (count u32, then per entry its
	// TokenLogprobs and rank u32) follow the output's.
	responsePromptLogprobs = 4
)

func appendLogprobs(b []byte, lp *TokenLogprobs) []byte {
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(lp.Logprob))
	b = append(b, byte(len(lp.TopIDs)))
	for j, id := range lp.TopIDs {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(lp.TopLogprobs[j]))
	}
	return b
}

func (d *decoder) logprobs() TokenLogprobs {
	lp := TokenLogprobs{Logprob: math.Float32frombits(d.u32())}
	k := int(d.u8())
	if d.err == nil && k > 0 {
		if k > bridge.MaxLogprobs || k > len(d.b)/8 {
			d.err = errShort
			return lp
		}
		lp.TopIDs, lp.TopLogprobs = make([]int32, k), make([]float32, k)
		for j := range k {
			lp.TopIDs[j], lp.TopLogprobs[j] = int32(d.u32()), math.Float32frombits(d.u32())
		}
	}
	return lp
}

// size is the length of rb's encoding, so that encode allocates once (issue
// 24: regrowing the buffer was a tenth of a 64-rank twin run's CPU).
func (rb responseBatch) size() int {
	n := 16 + 8*len(rb.Load.fields()) + 4 + 12*len(rb.Deltas) + 4
	for _, r := range rb.Responses {
		n += 8 + 4 + 4*8 + 3*4 + 1 + 4 + len(r.Error) + 4 + 4*len(r.Output)
	}
	return n
}

func (rb responseBatch) encode() []byte { return rb.appendTo(nil) }

// appendTo appends the wire form of rb to b.
func (rb responseBatch) appendTo(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(slices.Grow(b, rb.size()), uint64(rb.DeviceUS))
	b = binary.LittleEndian.AppendUint64(b, uint64(rb.Tokens))
	for _, v := range rb.Load.fields() {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rb.Deltas)))
	for _, d := range rb.Deltas {
		b = binary.LittleEndian.AppendUint64(b, d.ID)
		b = binary.LittleEndian.AppendUint32(b, uint32(d.Token))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rb.Responses)))
	for _, r := range rb.Responses {
		b = binary.LittleEndian.AppendUint64(b, r.ID)
		b = binary.LittleEndian.AppendUint32(b, uint32(int32(r.Rank))) // NoRank travels as -1
		for _, t := range []int64{r.ArrivalUnixNS, r.ScheduledUnixNS, r.FirstTokenUnixNS, r.FinishUnixNS} {
			b = binary.LittleEndian.AppendUint64(b, uint64(t))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(r.Suspended))
		b = binary.LittleEndian.AppendUint32(b, uint32(r.Recomputed))
		b = binary.LittleEndian.AppendUint32(b, uint32(r.ReusedTokens))
		var flags byte
		if r.Stopped {
			flags |= responseStopped
		}
		if r.Logprobs != nil {
			flags |= responseLogprobs
		}
		if r.PromptLogprobs != nil {
			flags |= responsePromptLogprobs
		}
		b = append(b, flags)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Error)))
		b = append(b, r.Error...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Output)))
		for _, t := range r.Output {
			b = binary.LittleEndian.AppendUint32(b, uint32(t))
		}
		if r.Logprobs != nil {
			if len(r.Logprobs) != len(r.Output) {
				panic(fmt.Sprintf("executor: response %d has %d log-probabilities for %d tokens", r.ID, len(r.Logprobs), len(r.Output)))
			}
			for j := range r.Logprobs {
				b = appendLogprobs(b, &r.Logprobs[j])
			}
		}
		if r.PromptLogprobs != nil {
			b = appendPromptLogprobs(b, r.PromptLogprobs)
		}
	}
	// The deltas' log-probabilities, when some delta has them, trail the
	// payload (count u32, then per delta: index u32, logprobs), so a
	// payload without any is unchanged; their prompt log-probabilities,
	// when some delta has them, trail that (its count then 0 when no delta
	// has log-probabilities): count u32, then per delta: index u32, n u32,
	// (logprobs, rank u32)×n.
	n, np := 0, 0
	for _, d := range rb.Deltas {
		if d.Logprobs != nil {
			n++
		}
		if d.PromptLogprobs != nil {
			np++
		}
	}
	if n > 0 || np > 0 {
		b = binary.LittleEndian.AppendUint32(b, uint32(n))
		for i, d := range rb.Deltas {
			if d.Logprobs != nil {
				b = binary.LittleEndian.AppendUint32(b, uint32(i))
				b = appendLogprobs(b, d.Logprobs)
			}
		}
	}
	if np > 0 {
		b = binary.LittleEndian.AppendUint32(b, uint32(np))
		for i, d := range rb.Deltas {
			if d.PromptLogprobs != nil {
				b = binary.LittleEndian.AppendUint32(b, uint32(i))
				b = appendPromptLogprobs(b, d.PromptLogprobs)
			}
		}
	}
	return b
}

// appendPromptLogprobs appends a prompt's log-probabilities: n u32, then
// per entry its logprobs and rank u32.
func appendPromptLogprobs(b []byte, lps []TokenLogprobs) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(lps)))
	for j := range lps {
		b = appendLogprobs(b, &lps[j])
		b = binary.LittleEndian.AppendUint32(b, uint32(lps[j].Rank))
	}
	return b
}

// promptLogprobs reads appendPromptLogprobs' form.
func (d *decoder) promptLogprobs() []TokenLogprobs {
	m := int(d.u32())
	if d.err == nil && m > len(d.b)/9 {
		d.err = errShort
		return nil
	}
	lps := make([]TokenLogprobs, m)
	for j := 0; j < m && d.err == nil; j++ {
		lps[j] = d.logprobs()
		lps[j].Rank = int32(d.u32())
	}
	return lps
}

// decodeResponseBatch parses a gathered payload; failure means the gather
// paired with an unrelated collective (executor.md §8, E-14).
func decodeResponseBatch(b []byte) (responseBatch, error) {
	if len(b) == emptyResponseBatch && binary.LittleEndian.Uint64(b[emptyResponseBatch-8:]) == 0 {
		// No deltas, no responses (most ranks, most iterations): the
		// header alone, read directly.
		var rb responseBatch
		rb.DeviceUS = int64(binary.LittleEndian.Uint64(b))
		rb.Tokens = int64(binary.LittleEndian.Uint64(b[8:]))
		var f [6]int64
		for i := range f {
			f[i] = int64(binary.LittleEndian.Uint64(b[16+8*i:]))
		}
		rb.Load.setFields(f)
		return rb, nil
	}
	d := decoder{b: b}
	var rb responseBatch
	rb.DeviceUS = int64(d.u64())
	rb.Tokens = int64(d.u64())
	f := rb.Load.fields()
	for i := range f {
		f[i] = int64(d.u64())
	}
	rb.Load.setFields(f)
	nd := int(d.u32())
	if d.err == nil && nd > len(d.b)/12 {
		d.err = errShort
	}
	for i := 0; i < nd && d.err == nil; i++ {
		rb.Deltas = append(rb.Deltas, TokenDelta{ID: d.u64(), Token: int32(d.u32())})
	}
	n := int(d.u32())
	if d.err == nil && n > len(d.b)/53 {
		d.err = errShort
	}
	for i := 0; i < n && d.err == nil; i++ {
		var r Response
		r.ID = d.u64()
		r.Rank = int(int32(d.u32()))
		r.ArrivalUnixNS = int64(d.u64())
		r.ScheduledUnixNS = int64(d.u64())
		r.FirstTokenUnixNS = int64(d.u64())
		r.FinishUnixNS = int64(d.u64())
		r.Suspended = int(d.u32())
		r.Recomputed = int(d.u32())
		r.ReusedTokens = int(d.u32())
		flags := d.u8()
		r.Stopped = flags&responseStopped != 0
		if d.err == nil && flags&^(responseStopped|responseLogprobs|responsePromptLogprobs) != 0 {
			d.err = fmt.Errorf("response %d: unknown flags %#x", r.ID, flags)
		}
		r.Error = string(d.bytes(int(d.u32())))
		k := int(d.u32())
		if d.err == nil && k > len(d.b)/4 {
			d.err = errShort
			break
		}
		r.Output = make([]int32, k)
		for j := range r.Output {
			r.Output[j] = int32(d.u32())
		}
		if flags&responseLogprobs != 0 {
			if d.err == nil && k > len(d.b)/5 {
				d.err = errShort
				break
			}
			r.Logprobs = make([]TokenLogprobs, k)
			for j := 0; j < k && d.err == nil; j++ {
				r.Logprobs[j] = d.logprobs()
			}
		}
		if flags&responsePromptLogprobs != 0 {
			r.PromptLogprobs = d.promptLogprobs()
		}
		rb.Responses = append(rb.Responses, r)
	}
	if d.err == nil && len(d.b) >= 4 && len(rb.Deltas) > 0 {
		// (A shorter tail, or one after no delta, is trailing bytes.)
		nl := int(d.u32())
		if d.err == nil && (nl == 0 && len(d.b) < 4 || nl > len(rb.Deltas)) {
			d.err = fmt.Errorf("%d delta log-probabilities for %d deltas", nl, len(rb.Deltas))
		}
		for j := 0; j < nl && d.err == nil; j++ {
			i := int(d.u32())
			if d.err == nil && (i >= len(rb.Deltas) || rb.Deltas[i].Logprobs != nil) {
				d.err = fmt.Errorf("delta log-probabilities for delta %d of %d (or twice)", i, len(rb.Deltas))
				break
			}
			lp := d.logprobs()
			rb.Deltas[i].Logprobs = &lp
		}
	}
	if d.err == nil && len(d.b) >= 4 && len(rb.Deltas) > 0 {
		np := int(d.u32())
		if d.err == nil && (np == 0 || np > len(rb.Deltas)) {
			d.err = fmt.Errorf("%d delta prompt log-probabilities for %d deltas", np, len(rb.Deltas))
		}
		for j := 0; j < np && d.err == nil; j++ {
			i := int(d.u32())
			if d.err == nil && (i >= len(rb.Deltas) || rb.Deltas[i].PromptLogprobs != nil) {
				d.err = fmt.Errorf("delta prompt log-probabilities for delta %d of %d (or twice)", i, len(rb.Deltas))
				break
			}
			rb.Deltas[i].PromptLogprobs = d.promptLogprobs()
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return responseBatch{}, fmt.Errorf("collective desync: response payload does not decode: %w", d.err)
	}
	return rb, nil
}

// RankLoad is one rank's state at the end of an iteration, for metrics
// (Config.OnIteration): requests holding a slot, requests waiting for their
// first chunk or suspended to the host tier, device pages that requests hold
// and in all, and the cumulative preemptions of its requests.
type RankLoad struct {
	Running, Waiting     int64
	UsedPages, Pages     int64
	Suspended, Recompute int64
}

func (l RankLoad) fields() [6]int64 {
	return [6]int64{l.Running, l.Waiting, l.UsedPages, l.Pages, l.Suspended, l.Recompute}
}

func (l *RankLoad) setFields(f [6]int64) {
	l.Running, l.Waiting, l.UsedPages, l.Pages, l.Suspended, l.Recompute = f[0], f[1], f[2], f[3], f[4], f[5]
}

// emptyResponseBatch is the wire size of a batch without deltas or
// responses: busy time, tokens, the six load fields and the two counts.
const emptyResponseBatch = 8 + 8 + 6*8 + 4 + 4

// gatherResponses sends this rank's responses to rank 0 (C7/C8). Rank 0
// keeps them; with C8 it also accumulates the lockstep-waste and balance
// metrics (tokens: the real tokens of the batch deviceUS timed).
func (e *Executor) gatherResponses(name string, rs []Response, deviceUS, tokens int64, forward bool) error {
	// The produced tokens ride the "responses" gather (after the step's
	// results were applied), the loads the "pending_responses" one.
	var deltas []TokenDelta
	if name == "responses" {
		deltas, e.deltas = e.deltas, e.deltas[:0]
	}
	var load RankLoad
	if name == "pending_responses" && (e.cfg.Stream || e.cfg.OnIteration != nil) {
		// Every rank of a server sends its load: only rank 0 has the
		// OnIteration hook that reads them.
		load = e.load()
	}
	if !e.adp() {
		// Without attention DP only rank 0 answers; the others hold replicas.
		if e.cfg.Rank == 0 {
			e.deliver(deltas, rs)
			if name == "pending_responses" {
				e.iterLoads = append(e.iterLoads[:0], load)
				e.iterBusy, e.iterTokens = e.iterBusy[:0], e.iterTokens[:0]
				if forward {
					e.iterBusy = append(e.iterBusy, float64(deviceUS)/1000)
					e.iterTokens = append(e.iterTokens, tokens)
				}
			}
		}
		return nil
	}
	if name == "pending_responses" && e.foldPending() {
		// Encoded now, with this point's load; gathered with C7 at step 15.
		e.pendingWire = responseBatch{DeviceUS: deviceUS, Tokens: tokens, Responses: rs, Load: load}.appendTo(e.pendingWire[:0])
		e.pendingFolded, e.pendingForward = true, forward
		return nil
	}
	t := e.waitStart()
	e.wire = responseBatch{DeviceUS: deviceUS, Tokens: tokens, Responses: rs, Deltas: deltas, Load: load}.appendTo(e.wire[:0])
	folded := name == "responses" && e.pendingFolded
	if folded {
		n0 := len(e.wire)
		e.wire = endTrailer(append(e.wire, e.pendingWire...), n0)
		e.pendingFolded = false
	}
	var all [][]byte
	var err error
	if name == "responses" && e.costPlan != nil {
		all, err = e.gatherWithStepCost(name)
	} else {
		all, err = e.d.Comm.AllGather(name, e.wire)
	}
	e.waitEnd(t)
	if err != nil {
		return err
	}
	if folded {
		if e.cfg.Rank != 0 && e.cfg.IterLog == nil {
			return nil // only rank 0 and the iteration log read C7 and C8
		}
		if err := e.splitPending(all); err != nil {
			return err
		}
		if err := e.receiveResponses("pending_responses", e.pendSplit, e.pendingForward); err != nil {
			return err
		}
		return e.receiveResponses("responses", e.respSplit, false)
	}
	return e.receiveResponses(name, all, forward)
}

// foldPending reports that C8 (pending responses) rides this iteration's C7
// (responses) instead of a gather of its own: the overlap loop under
// attention DP, where step 12 encodes the payload and step 15 gathers both
// and rank 0 reads C8's part of every rank before C7's, as it did when C8
// ran first. Between the two only the launch runs, which reads neither
// (rank 0's deliveries and the metrics of the processed batch are read at
// the iteration's end). A deliberate difference from executor.md §7's
// inventory (issue 24 item 8): an overlap-loop iteration takes three
// collectives (C1, C5, C7) instead of four; the sequential loop keeps C8.
func (e *Executor) foldPending() bool { return e.cfg.Overlap && e.adp() && !unfoldPending }

// unfoldPending turns foldPending off (tests compare the two).
var unfoldPending bool

// splitPending cuts each rank's C7 payload into its responses and the C8
// payload appended to it (foldPending), into pendSplit and respSplit.
func (e *Executor) splitPending(all [][]byte) error {
	e.pendSplit, e.respSplit = e.pendSplit[:0], e.respSplit[:0]
	for i, b := range all {
		resp, pend, ok := cutTrailer(b)
		if !ok {
			return fmt.Errorf("collective desync: responses of rank %d (%d bytes) carry no pending responses", i, len(b))
		}
		e.respSplit, e.pendSplit = append(e.respSplit, resp), append(e.pendSplit, pend)
	}
	return nil
}

// endTrailer closes a part appended to a collective's payload at n0 (the
// payload's length before it) with its length, so that the gathered
// payload can be cut in two again (cutTrailer): C8 and the step cost ride
// C7 that way.
func endTrailer(b []byte, n0 int) []byte {
	return binary.LittleEndian.AppendUint32(b, uint32(len(b)-n0))
}

// cutTrailer splits b into the payload and the part endTrailer closed at
// its end; ok is false when b does not end in such a part.
func cutTrailer(b []byte) (head, trailer []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := int(binary.LittleEndian.Uint32(b[len(b)-4:]))
	if n > len(b)-4 {
		return nil, nil, false
	}
	cut, end := len(b)-4-n, len(b)-4
	return b[:cut:cut], b[cut:end:end], true
}

// receiveResponses is what a rank does with a gathered C7 or C8: the fleet's
// busy time for the iteration log (C8), and on rank 0 the deliveries and the
// metrics.
func (e *Executor) receiveResponses(name string, all [][]byte, forward bool) error {
	if name == "pending_responses" {
		e.noteFleetBusy(all, forward)
	}
	if e.cfg.Rank != 0 {
		return nil
	}
	var sum, max float64
	record := e.cfg.RecordBusy && name == "pending_responses" && forward
	var busy []float32
	var toks []int32
	if record {
		busy, toks = make([]float32, len(all)), make([]int32, len(all))
	}
	if name == "pending_responses" {
		e.iterLoads, e.iterBusy, e.iterTokens = e.iterLoads[:0], e.iterBusy[:0], e.iterTokens[:0]
	}
	var tokSum, tokMax int64
	for i, b := range all {
		rb, err := decodeResponseBatch(b)
		if err != nil {
			return err
		}
		e.deliver(rb.Deltas, rb.Responses)
		us := float64(rb.DeviceUS)
		sum += us
		if us > max {
			max = us
		}
		if record {
			busy[i], toks[i] = float32(us/1000), int32(rb.Tokens)
		}
		if name == "pending_responses" {
			e.iterLoads = append(e.iterLoads, rb.Load)
			if forward {
				e.iterBusy = append(e.iterBusy, us/1000)
				e.iterTokens = append(e.iterTokens, rb.Tokens)
				tokSum += rb.Tokens
				if rb.Tokens > tokMax {
					tokMax = rb.Tokens
				}
			}
		}
	}
	if record {
		e.res.Busy, e.res.Tokens = append(e.res.Busy, busy), append(e.res.Tokens, toks)
	}
	if name == "pending_responses" && forward && max > 0 {
		e.wasteSum += 1 - sum/float64(len(all))/max
		e.wasteN++
		e.bal.add(max/1000, tokSum, tokMax, len(all))
	}
	return nil
}

// balance accumulates rank 0's balance metrics over the forward iterations
// (issue 25, the measures of TensorRT-LLM's ADP Balance write-up): the
// token balance ratio of an iteration is mean/max over the ranks of the
// real tokens in their forward (padding dummies count 0), averaged over
// the iterations where some rank had a token; the speed-of-light time is
// Σ time_i × balance_i, time_i the iteration's fleet time (the slowest
// rank's busy time), against forwardMS = Σ time_i.
type balance struct {
	tokenSum  float64 // Σ balance_i
	n         int64   // iterations in tokenSum
	solMS     float64 // Σ time_i × balance_i
	forwardMS float64 // Σ time_i
}

func (b *balance) add(timeMS float64, tokSum, tokMax int64, ranks int) {
	b.forwardMS += timeMS
	if tokMax <= 0 || ranks == 0 {
		return // no real token anywhere: the iteration's time was all padding
	}
	r := float64(tokSum) / float64(ranks) / float64(tokMax)
	b.tokenSum += r
	b.n++
	b.solMS += timeMS * r
}

// tokenBalance is mean/max of tokens (0 when the slice is empty or all 0).
func tokenBalance(tokens []int64) float64 {
	var sum, mx int64
	for _, t := range tokens {
		sum += t
		mx = max(mx, t)
	}
	if mx <= 0 {
		return 0
	}
	return float64(sum) / float64(len(tokens)) / float64(mx)
}

// noteFleetBusy keeps the slowest rank's busy time and the token balance of
// the batch whose pending responses were just gathered, for the iteration
// log's fleet_device_ms and token_balance (every rank reads them: they lead
// each batch's encoding).
func (e *Executor) noteFleetBusy(all [][]byte, forward bool) {
	e.fleetBusyMS, e.fleetTokBal = 0, -1
	if !forward || e.cfg.IterLog == nil {
		return
	}
	var sum, mx int64
	for _, b := range all {
		if len(b) >= 16 {
			e.fleetBusyMS = max(e.fleetBusyMS, float64(int64(binary.LittleEndian.Uint64(b)))/1000)
			t := int64(binary.LittleEndian.Uint64(b[8:]))
			sum += t
			mx = max(mx, t)
		}
	}
	if mx > 0 {
		e.fleetTokBal = float64(sum) / float64(len(all)) / float64(mx)
	}
}

// deliver hands rank 0's gathered tokens and answers over: to the serving
// callbacks, and to Result unless Config.DiscardResponses.
func (e *Executor) deliver(deltas []TokenDelta, rs []Response) {
	if len(deltas) > 0 && e.cfg.OnTokens != nil {
		e.cfg.OnTokens(deltas)
	}
	e.answered += len(rs)
	if !e.cfg.DiscardResponses {
		e.res.Responses = append(e.res.Responses, rs...)
	}
	if e.cfg.OnResponse != nil {
		for _, r := range rs {
			e.cfg.OnResponse(r)
		}
	}
}
