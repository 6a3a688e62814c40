//go:build native

package native

/*
#include <stdlib.h>
#include <stdint.h>
*/
import "C"

import "unsafe"

// cbuf is a C-allocated array that grows on demand and is reused across
// calls. The native side receives plain C pointers (no Go pointers cross the
// boundary, so cgo's pointer rules hold trivially) and a step copies its
// descriptor into these buffers instead of pinning Go memory.
type cbuf[T int32 | uint8 | uint32 | float32] struct {
	p   unsafe.Pointer // C memory; nil until first use
	cap int            // elements
}

// slice returns the first n elements as a Go slice over the C memory,
// growing the buffer if needed (contents are not preserved on growth).
func (b *cbuf[T]) slice(n int) []T {
	if n > b.cap {
		b.free()
		var zero T
		size := unsafe.Sizeof(zero) * uintptr(n)
		b.p = C.malloc(C.size_t(size))
		if b.p == nil {
			panic("native: C.malloc failed") // cgo's malloc never returns nil; keep the invariant explicit
		}
		b.cap = n
	}
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(b.p), n)
}

// ptr is the buffer as a C int32_t pointer (valid for int32 buffers only).
func (b *cbuf[T]) ptr() *C.int32_t { return (*C.int32_t)(b.p) }

func (b *cbuf[T]) free() {
	if b.p != nil {
		C.free(b.p)
		b.p, b.cap = nil, 0
	}
}

// stepBuffers are the reusable C arrays of Step and CopyPages.
type stepBuffers struct {
	numTokens, startPos, numBlocks, tokens, blocks, sampled cbuf[int32]
	sample                                                  cbuf[uint8]
	logits                                                  cbuf[float32]
	copySrc, copyDst                                        cbuf[int32]
	sampling                                                samplingBuf
	// The token ids (logit bias, prompt, output) and bias values that the
	// sampling array points into.
	samplingIDs cbuf[int32]
	biasValues  cbuf[float32]
	// The allowed-token masks (structured outputs), back to back.
	allowed cbuf[uint32]
	// Log-probabilities of a step: [num_seqs], [num_seqs × MaxLogprobs] ×2.
	logprobs, topLogprobs cbuf[float32]
	topIDs                cbuf[int32]
	// Prompt scoring: the rows' targets and the sequences' top counts, and
	// the results [rows], [rows × MaxLogprobs] ×2.
	scoreTargets, scoreTop, scoreTopIDs, scoreRanks cbuf[int32]
	scoreLogprobs, scoreTopLogprobs                 cbuf[float32]
}

func (s *stepBuffers) free() {
	for _, b := range []*cbuf[int32]{&s.numTokens, &s.startPos, &s.numBlocks, &s.tokens, &s.blocks,
		&s.sampled, &s.copySrc, &s.copyDst, &s.samplingIDs, &s.topIDs, &s.scoreTargets, &s.scoreTop, &s.scoreTopIDs, &s.scoreRanks} {
		b.free()
	}
	s.sample.free()
	s.logits.free()
	s.logprobs.free()
	s.topLogprobs.free()
	s.scoreLogprobs.free()
	s.scoreTopLogprobs.free()
	s.biasValues.free()
	s.allowed.free()
	s.sampling.free()
}
