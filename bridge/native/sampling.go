//go:build native

package native

/*
#include <stdlib.h>
#include "engine.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/lockstep-ai/lockstep/bridge"
)

// samplingBuf is a reusable C array of eng_sampling.
type samplingBuf struct {
	p   *C.eng_sampling
	cap int
}

// slice returns a pointer to n elements (contents not preserved on growth).
func (b *samplingBuf) slice(n int) *C.eng_sampling {
	if n > b.cap {
		b.free()
		b.p = (*C.eng_sampling)(C.calloc(C.size_t(n), C.sizeof_eng_sampling))
		b.cap = n
	}
	return b.p
}

func (b *samplingBuf) free() {
	if b.p != nil {
		C.free(unsafe.Pointer(b.p))
		b.p, b.cap = nil, 0
	}
}

// SampleRow samples one logits row with the native engine's procedure
// (eng_sample_row) for the token at absolute position pos: the reference
// that bridge.Sample is checked against.
func SampleRow(logits []float32, p bridge.SamplingParams, pos int64) (int32, error) {
	if err := p.Validate(); err != nil {
		return 0, bridge.StatusError("sample_row", bridge.StatusInvalidArgument, err.Error())
	}
	if len(logits) == 0 || len(logits) > 1<<31-1 {
		return 0, bridge.StatusError("sample_row", bridge.StatusInvalidArgument, fmt.Sprintf("vocab %d out of range", len(logits)))
	}
	n := len(logits)
	buf := (*C.float)(C.malloc(C.size_t(n) * 4))
	defer C.free(unsafe.Pointer(buf))
	copy(unsafe.Slice((*float32)(unsafe.Pointer(buf)), n), logits)
	cp := (*C.eng_sampling)(C.calloc(1, C.sizeof_eng_sampling))
	defer C.free(unsafe.Pointer(cp))
	*cp = C.eng_sampling{temperature: C.float(p.Temperature), top_k: C.int32_t(p.TopK),
		top_p: C.float(p.NativeTopP()), seed: C.uint64_t(p.Seed), min_p: C.float(p.MinP)}
	out := (*C.int32_t)(C.malloc(4))
	defer C.free(unsafe.Pointer(out))
	runtime.LockOSThread() // eng_last_error is thread-local
	defer runtime.UnlockOSThread()
	if st := C.eng_sample_row(buf, C.int32_t(n), cp, C.int64_t(pos), out); st != C.ENG_OK {
		return 0, bridge.StatusError("sample_row", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	return int32(*out), nil
}

// SampleSeqRow samples one logits row as a step samples s (its sampling
// parameters, logit bias, penalties over its prompt and output tokens and
// allowed-token mask) with the native procedure (eng_sample_row): the
// reference that bridge.SampleSeq is checked against.
func SampleSeqRow(logits []float32, s *bridge.SeqStep) (int32, error) {
	if err := s.Sampling.Validate(); err != nil {
		return 0, bridge.StatusError("sample_row", bridge.StatusInvalidArgument, err.Error())
	}
	n := len(logits)
	if n == 0 || n > 1<<31-1 {
		return 0, bridge.StatusError("sample_row", bridge.StatusInvalidArgument, fmt.Sprintf("vocab %d out of range", n))
	}
	var ids cbuf[int32]
	var vals, row cbuf[float32]
	defer ids.free()
	defer vals.free()
	defer row.free()
	copy(row.slice(n), logits)
	nb, np, no := len(s.LogitBias), len(s.PromptTokens), len(s.OutputTokens)
	all := ids.slice(nb + np + no + 1)
	v := vals.slice(nb + 1)
	for j, b := range s.LogitBias {
		all[j], v[j] = b.ID, b.Bias
	}
	copy(all[nb:], s.PromptTokens)
	copy(all[nb+np:], s.OutputTokens)
	ptr := func(k int) *C.int32_t { return (*C.int32_t)(unsafe.Add(ids.p, 4*k)) }
	p := &s.Sampling
	cp := (*C.eng_sampling)(C.calloc(1, C.sizeof_eng_sampling))
	defer C.free(unsafe.Pointer(cp))
	*cp = C.eng_sampling{temperature: C.float(p.Temperature), top_k: C.int32_t(p.TopK),
		top_p: C.float(p.NativeTopP()), seed: C.uint64_t(p.Seed), min_p: C.float(p.MinP),
		presence_penalty: C.float(p.PresencePenalty), frequency_penalty: C.float(p.FrequencyPenalty),
		repetition_penalty: C.float(p.RepetitionPenalty),
		num_bias:           C.int32_t(nb), bias_ids: ptr(0), bias_values: (*C.float)(vals.p),
		num_prompt: C.int32_t(np), prompt_tokens: ptr(nb), num_output: C.int32_t(no), output_tokens: ptr(nb + np)}
	if s.Allowed != nil {
		if len(s.Allowed) != bridge.AllowedWords(n) {
			return 0, bridge.StatusError("sample_row", bridge.StatusInvalidArgument,
				fmt.Sprintf("the allowed-token mask has %d words, a vocabulary of %d ids takes %d", len(s.Allowed), n, bridge.AllowedWords(n)))
		}
		var mask cbuf[uint32]
		defer mask.free()
		copy(mask.slice(len(s.Allowed)), s.Allowed)
		cp.allowed = (*C.uint32_t)(mask.p)
	}
	out := (*C.int32_t)(C.malloc(4))
	defer C.free(unsafe.Pointer(out))
	runtime.LockOSThread() // eng_last_error is thread-local
	defer runtime.UnlockOSThread()
	if st := C.eng_sample_row((*C.float)(row.p), C.int32_t(n), cp, C.int64_t(s.SamplePos()), out); st != C.ENG_OK {
		return 0, bridge.StatusError("sample_row", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	return int32(*out), nil
}

// LogprobsRow computes one logits row's log-probabilities with the native
// procedure (eng_logprobs_row): token's, and the top k (0..MaxLogprobs)
// ids and log-probabilities; the reference that bridge.RowLogprobs is
// checked against.
func LogprobsRow(logits []float32, token int32, k int) (float32, []int32, []float32, error) {
	n := len(logits)
	if n == 0 || n > 1<<31-1 || k < 0 || k > bridge.MaxLogprobs {
		return 0, nil, nil, bridge.StatusError("logprobs_row", bridge.StatusInvalidArgument,
			fmt.Sprintf("vocab %d or k %d out of range", n, k))
	}
	buf := (*C.float)(C.malloc(C.size_t(n) * 4))
	defer C.free(unsafe.Pointer(buf))
	copy(unsafe.Slice((*float32)(unsafe.Pointer(buf)), n), logits)
	ids := (*C.int32_t)(C.malloc(C.size_t(bridge.MaxLogprobs) * 4))
	defer C.free(unsafe.Pointer(ids))
	lps := (*C.float)(C.malloc(C.size_t(bridge.MaxLogprobs) * 4))
	defer C.free(unsafe.Pointer(lps))
	tok := (*C.float)(C.malloc(4))
	defer C.free(unsafe.Pointer(tok))
	runtime.LockOSThread() // eng_last_error is thread-local
	defer runtime.UnlockOSThread()
	if st := C.eng_logprobs_row(buf, C.int32_t(n), C.int32_t(token), C.int32_t(k), tok, ids, lps); st != C.ENG_OK {
		return 0, nil, nil, bridge.StatusError("logprobs_row", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	m := min(k, n)
	return float32(*tok), append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(ids)), m)...),
		append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(lps)), m)...), nil
}
