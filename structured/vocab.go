// Package structured constrains generation to a regular language
// (structured outputs: vLLM's guided_regex, guided_choice, guided_json and
// response_format, which the server turns into one regular expression).
// A Guide is the expression compiled for one vocabulary; a Matcher follows
// one request's generated tokens through it and gives, before every pick,
// the bitmask of the tokens that keep the output a prefix of a match
// (bridge.SeqStep.Allowed).
//
// The expression is matched over the bytes the tokens stand for, as valid
// UTF-8, against the whole output (implicitly anchored at both ends). Its
// automaton is built lazily as a DFA over bytes whose states are sets of
// instructions of Go's regexp/syntax program; a state's mask is computed
// once by walking the vocabulary in byte order, so that tokens sharing a
// dead prefix are skipped together, and cached. The package is pure: no
// I/O, no clock, deterministic (every rank computes the same masks).
package structured

import (
	"bytes"
	"fmt"
	"slices"
)

// Vocab is a model's vocabulary as guides see it: the bytes each token
// stands for and the end-of-generation tokens. Immutable once built; one is
// shared by every guide of a process.
type Vocab struct {
	pieces [][]byte // per id; nil: never allowed (control tokens, empty pieces)
	eos    []int32  // allowed exactly where the output is a complete match
	order  []int32  // the ids with a piece, in byte order of their pieces
	maxLen int      // the longest piece, in bytes
	lcp    []int32  // lcp[i]: common prefix length of order[i-1] and order[i]
}

// NewVocab builds a Vocab. pieces[id] is the bytes token id contributes to
// the output; nil (or empty) for a token a guided output never contains
// (control and unused tokens). eos are the tokens that end generation
// (allowed once the output matches); they must be in range.
func NewVocab(pieces [][]byte, eos []int32) (*Vocab, error) {
	if len(pieces) == 0 {
		return nil, fmt.Errorf("structured: empty vocabulary")
	}
	v := &Vocab{pieces: make([][]byte, len(pieces))}
	for id, p := range pieces {
		if len(p) > 0 {
			v.pieces[id] = p
			v.order = append(v.order, int32(id))
		}
	}
	for _, id := range eos {
		if id < 0 || int(id) >= len(pieces) {
			return nil, fmt.Errorf("structured: end-of-generation token %d is outside the vocabulary [0, %d)", id, len(pieces))
		}
		v.pieces[id] = nil // never as text
		if !slices.Contains(v.eos, id) {
			v.eos = append(v.eos, id)
		}
	}
	v.order = slices.DeleteFunc(v.order, func(id int32) bool { return v.pieces[id] == nil })
	slices.SortStableFunc(v.order, func(a, b int32) int { return bytes.Compare(v.pieces[a], v.pieces[b]) })
	for _, id := range v.order {
		v.maxLen = max(v.maxLen, len(v.pieces[id]))
	}
	v.lcp = make([]int32, len(v.order))
	for i := 1; i < len(v.order); i++ {
		a, b := v.pieces[v.order[i-1]], v.pieces[v.order[i]]
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		v.lcp[i] = int32(n)
	}
	if len(v.order) == 0 {
		return nil, fmt.Errorf("structured: no token of the vocabulary stands for text")
	}
	return v, nil
}

// Size is the number of token ids.
func (v *Vocab) Size() int { return len(v.pieces) }

// Words is the length of a mask in 32-bit words: bit id%32 of word id/32
// is token id.
func (v *Vocab) Words() int { return (len(v.pieces) + 31) / 32 }

// IsEOS reports whether id ends generation.
func (v *Vocab) IsEOS(id int32) bool { return slices.Contains(v.eos, id) }
