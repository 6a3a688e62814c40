package model

import (
	"fmt"
	"strconv"
	"strings"
)

// SentencePiece vocabularies (GGUF tokenizer.ggml.model "llama": Llama 1/2,
// Mistral 7B, Mixtral 8x7B and the models built on them), encoded as
// llama.cpp encodes them: a space is put before each run of plain text
// (SpacePrefix; the runs lie between special tokens), every space
// becomes "▁", the text is split into UTF-8 characters (by the length
// its lead byte announces), and adjacent symbols whose concatenation is a
// token merge, the token of highest score first (the leftmost on ties),
// until no pair forms a token. A final symbol that is not a token becomes
// its bytes' <0xXX> tokens (byte fallback). Decoding turns "▁" back into
// spaces and a byte token into its byte.
//
// The same vocabularies in a Hugging Face tokenizer.json (a BPE with
// byte_fallback) merge by the rank of their merges instead of by scores,
// and say where the "▁" goes with their normalizer (Prepend: before every
// run) or Metaspace pre-tokenizer (prepend_scheme always / first / never,
// optionally splitting the text into words at each "▁"), as the tokenizers
// library applies them.

// spmPiece is the bytes a SentencePiece token of type typ stands for.
func spmPiece(tok string, typ int32) []byte {
	if typ == TokenByte {
		if b, ok := spmByte(tok); ok {
			return []byte{b}
		}
		return []byte(tok)
	}
	return []byte(strings.ReplaceAll(tok, "▁", " "))
}

// spmByte reads a byte token's text, "<0xXX>".
func spmByte(tok string) (byte, bool) {
	if len(tok) != 6 || !strings.HasPrefix(tok, "<0x") || tok[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(tok[3:5], 16, 8)
	return byte(v), err == nil
}

// spmByteToken is the token of byte b in byte fallback: <0xXX> (upper-case
// hex), else the one-byte text, else -1.
func (t *Tokenizer) spmByteToken(b byte) int32 {
	if id, ok := t.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
		return id
	}
	if id, ok := t.vocab[string([]byte{b})]; ok {
		return id
	}
	return -1
}

// utf8Len is the length of the character a lead byte announces, as
// llama.cpp reads it (a stray continuation byte counts as one).
func utf8Len(b byte) int {
	return [16]int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4}[b>>4]
}

type spmSymbol struct {
	start, n   int // bytes of the escaped text
	prev, next int
}

type spmBigram struct {
	prio        float64 // the token's score, or minus the merge's rank
	left, right int
	size        int // bytes of the pair when it was pushed
}

// spmQueue is a binary max-heap of bigrams (highest priority, then
// leftmost, first), typed to avoid container/heap's boxing.
type spmQueue []spmBigram

func (q spmQueue) before(i, j int) bool {
	if q[i].prio != q[j].prio {
		return q[i].prio > q[j].prio
	}
	return q[i].left < q[j].left
}

func (q *spmQueue) push(b spmBigram) {
	*q = append(*q, b)
	h := *q
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h.before(i, parent) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func (q *spmQueue) pop() spmBigram {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, best := 2*i+1, 2*i+2, i
		if l < len(h) && h.before(l, best) {
			best = l
		}
		if r < len(h) && h.before(r, best) {
			best = r
		}
		if best == i {
			break
		}
		h[i], h[best] = h[best], h[i]
		i = best
	}
	*q = h
	return top
}

// spmEncode appends the tokens of one run of plain text; first says the
// run opens the text.
func (t *Tokenizer) spmEncode(out []int32, text string, first bool) []int32 {
	s := strings.ReplaceAll(text, " ", "▁")
	switch t.spec.SpacePrefix {
	case PrefixEveryRun:
		s = "▁" + s
	case PrefixUnlessSpace:
		if !strings.HasPrefix(s, "▁") {
			s = "▁" + s
		}
	case PrefixFirstRun:
		if first && !strings.HasPrefix(s, "▁") {
			s = "▁" + s
		}
	}
	if !t.spec.SplitWords {
		return t.spmMerge(out, s)
	}
	// Metaspace with split: each word runs up to the next "▁".
	for len(s) > 0 {
		end := strings.Index(s[1:], "▁")
		if end < 0 {
			return t.spmMerge(out, s)
		}
		out = t.spmMerge(out, s[:end+1])
		s = s[end+1:]
	}
	return out
}

// spmMerge appends the tokens of s (spaces already "▁").
func (t *Tokenizer) spmMerge(out []int32, s string) []int32 {
	if s == "" {
		return out
	}
	if t.ignoreMerges {
		// tokenizer.json's ignore_merges: a word that is a token stays whole.
		if id, ok := t.vocab[s]; ok {
			return append(out, id)
		}
	}
	syms := make([]spmSymbol, 0, len(s))
	for off := 0; off < len(s); {
		n := min(utf8Len(s[off]), len(s)-off)
		syms = append(syms, spmSymbol{start: off, n: n, prev: len(syms) - 1, next: len(syms) + 1})
		off += n
	}
	syms[len(syms)-1].next = -1
	q := make(spmQueue, 0, len(syms))
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		a, b := syms[l], syms[r]
		if t.spec.Scores != nil {
			// llama.cpp: any pair that spells a token, by the token's score.
			if id, ok := t.vocab[s[a.start:b.start+b.n]]; ok {
				q.push(spmBigram{prio: float64(t.spec.Scores[id]), left: l, right: r, size: a.n + b.n})
			}
			return
		}
		// tokenizer.json: the pairs of its merges, by rank.
		ia, okA := t.vocab[s[a.start:a.start+a.n]]
		ib, okB := t.vocab[s[b.start:b.start+b.n]]
		if okA && okB {
			if m, ok := t.merges[pairKey(ia, ib)]; ok {
				q.push(spmBigram{prio: -float64(m.rank), left: l, right: r, size: a.n + b.n})
			}
		}
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for len(q) > 0 {
		bg := q.pop()
		l, r := &syms[bg.left], &syms[bg.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != bg.size {
			continue // one of the pair was merged since
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = bg.left
		}
		try(l.prev, bg.left)
		try(bg.left, l.next)
	}
	for i := 0; i >= 0; i = syms[i].next {
		piece := s[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := t.vocab[piece]; ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(piece); j++ {
			if id := t.byteTok[piece[j]]; id >= 0 {
				out = append(out, id)
			} else if t.spec.UNK >= 0 {
				out = append(out, t.spec.UNK)
			}
		}
	}
	return out
}
