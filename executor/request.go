package executor

import (
	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/structured"
)

// dummyIDBase is the first padding-dummy id; ids ≥ 2^63 are reserved for dummies.
const dummyIDBase uint64 = 1 << 63

// request is the executor's record of one request on its rank. The embedded
// scheduler.Request is what the scheduler and KV manager see; the rest is
// what the client sees.
type request struct {
	scheduler.Request
	prompt       []int32 // the original prompt
	output       []int32 // every token returned to the client so far
	maxNewTotal  int     // the original generation limit
	arrivalNS    int64
	firstTokenNS int64
	scheduledNS  int64 // when its first chunk was launched (queue time ends)
	suspended    int
	recomputed   int
	reused       int  // prompt prefix the first admission reused (ReusedTokens)
	reusedSet    bool // reused is final
	stopAtEOS    bool // a stop token (Config.StopTokens) ends generation
	stopped      bool // a stop token was sampled, or the request was cancelled: no more tokens
	cancelled    bool // withdrawn by the client (Canceller)
	pending      int  // batches holding this request whose results are not applied yet
	sampling     bridge.SamplingParams
	logitBias    []bridge.TokenBias
	stopIDs      []int32 // the request's own stop token ids (Arrival.StopTokenIDs)
	logprobs     bool    // Arrival.Logprobs: outLogprobs grows with output
	topLogprobs  int
	outLogprobs  []TokenLogprobs
	guide        *structured.Matcher // Arrival.Guide followed through the output; nil without one
	minTokens    int                 // Arrival.MinTokens: stop tokens masked out before this many
	allowIDs     []int32             // Arrival.AllowedTokenIDs
	allowMask    []uint32            // allowIDs as a mask (built once)
	badWords     [][]int32           // Arrival.BadWords
	mask         []uint32            // the pick's mask when it is not the guide's alone (pickMask)
	priority     int32               // Arrival.Priority
	promptLP     bool                // Arrival.PromptLogprobs: promptLogprobs fills as prompt chunks run
	promptTop    int
	// promptLogprobs[j] is prompt token j+1's (len(prompt)−1 entries,
	// made at the first scored chunk); scoreBuf holds a chunk's targets.
	promptLogprobs []TokenLogprobs
	scoreBuf       []int32
}

func newRequest(a Arrival) *request {
	r := &request{prompt: a.Prompt, maxNewTotal: a.MaxNewTokens, arrivalNS: a.ArrivalUnixNS, stopAtEOS: a.StopAtEOS,
		sampling: a.Sampling, logitBias: a.LogitBias, stopIDs: a.StopTokenIDs, logprobs: a.Logprobs,
		topLogprobs: a.TopLogprobs, minTokens: a.MinTokens, allowIDs: a.AllowedTokenIDs,
		badWords: a.BadWords, promptLP: a.PromptLogprobs, promptTop: a.PromptTopLogprobs,
		priority: a.Priority}
	r.Request = scheduler.Request{
		NoReuse:          a.PromptLogprobs,
		ID:               a.ID,
		State:            scheduler.ContextInit,
		Tokens:           a.Prompt,
		PromptLen:        len(a.Prompt),
		MaxNewTokens:     a.MaxNewTokens,
		UncachedEstimate: scheduler.UnsetEstimate,
		ConversationID:   a.ConversationID,
		BatchIndex:       scheduler.NoBatchIndex,
	}
	return r
}

func newDummy(id uint64) *request {
	return resetDummy(&request{}, id)
}

// resetDummy makes r a fresh padding dummy with id, keeping only the
// storage of its one-token slice when it has one (reused spent dummies,
// Executor.takeDummy).
func resetDummy(r *request, id uint64) *request {
	tokens := r.Tokens[:0:min(cap(r.Tokens), 1)]
	if cap(tokens) == 0 {
		tokens = make([]int32, 0, 1)
	}
	*r = request{}
	r.Request = scheduler.Request{
		ID:               id,
		State:            scheduler.GenerationInProgress,
		Tokens:           append(tokens, 0),
		PromptLen:        1,
		MaxNewTokens:     1 << 30,
		UncachedEstimate: scheduler.UnsetEstimate,
		BatchIndex:       scheduler.NoBatchIndex,
		IsDummy:          true,
	}
	return r
}

// resetForRecompute turns a recompute-paused request back into a context
// request whose prompt is the original prompt plus every token generated so
// far (executor.md §11.2). The client keeps receiving tokens from where it
// stopped; positions stay continuous (§11.3).
func (r *request) resetForRecompute() {
	n := len(r.output)
	tokens := make([]int32, 0, len(r.prompt)+n)
	tokens = append(append(tokens, r.prompt...), r.output...)
	r.Tokens = tokens
	r.PromptLen = len(tokens)
	r.MaxNewTokens = r.maxNewTotal - n
	r.Generated = 0
	r.State = scheduler.ContextInit
	r.ContextPosition = 0
	r.ChunkSize = r.PromptLen
	r.BatchIndex = scheduler.NoBatchIndex
	if r.TotalInputLenCP > 0 {
		// Helix: old TotalInputLenCP plus the tokens generated since, in
		// global arithmetic — which is the new prompt length.
		r.TotalInputLenCP = r.PromptLen
	}
	r.HelixDecodeCount = 0
	r.InactiveRank = false
	r.Recomputed = true
	r.recomputed++
}

// lastToken is the input of the next generation step.
func (r *request) lastToken() int32 {
	if r.IsDummy {
		return 0
	}
	return r.output[len(r.output)-1]
}
