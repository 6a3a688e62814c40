// Package model holds what a checkpoint says about its text side: the
// byte-level BPE tokenizer (from GGUF metadata or an HF tokenizer.json),
// the SentencePiece tokenizer of llama.cpp's "llama" vocabularies (spm.go),
// a streaming decoder, and chat-template rendering.
//
// Encoding follows llama.cpp / HF tokenizers for byte-level BPE: special
// token texts are cut out first (leftmost, longest match; control and
// unknown tokens only with ParseSpecial, user-defined tokens always), the
// rest is split by the pre-tokeniser named by tokenizer.ggml.pre (hand-written
// scanners equal to the standard split regexes), each piece is spelled in
// the GPT-2 byte alphabet and merged by rank (lowest first, leftmost on
// ties). Chat prompts rendered by RenderChat are encoded with ParseSpecial.
//
// Not modelled: HF added-token options lstrip, rstrip and single_word;
// normalizers (refused); llama.cpp's own "default" pre-tokeniser regexes
// ("default" here is the GPT-2 regex).
package model

import (
	"container/heap"
	"fmt"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
)

// GGUF token types (tokenizer.ggml.token_type).
const (
	TokenNormal      = 1
	TokenUnknown     = 2
	TokenControl     = 3
	TokenUserDefined = 4
	TokenUnused      = 5
	TokenByte        = 6
)

// TokenizerSpec is what a checkpoint says about its tokenizer (filled from
// GGUF metadata or tokenizer.json).
type TokenizerSpec struct {
	Model      string   // "gpt2" = byte-level BPE, "llama" = SentencePiece (spm.go); anything else is refused
	Pre        string   // GGUF tokenizer.ggml.pre; "" = GPT-2 regex
	Tokens     []string // byte-level spelling for normal tokens, raw text for control/user-defined
	TokenTypes []int32  // GGUF types (see Token* constants); nil = all normal
	Merges     []string // "left right", by rank
	// Scores rank the merges of a SentencePiece vocabulary ("llama"): the
	// token with the higher score is formed first. One per token (GGUF);
	// without them the merges rank the pairs (a tokenizer.json BPE with
	// byte fallback).
	Scores []float32
	// SpacePrefix ("llama"): where "▁" is put before plain text.
	SpacePrefix SpacePrefix
	// SplitWords ("llama", tokenizer.json Metaspace with split): the
	// text is merged word by word, each word starting at a "▁".
	SplitWords bool

	BOS, EOS, UNK, PAD, EOT int32 // -1 when absent

	AddBOS, AddEOS bool
	ChatTemplate   string
}

// SpacePrefix says where a SentencePiece vocabulary puts a "▁" before
// plain text (the runs of text between special tokens).
type SpacePrefix uint8

const (
	// PrefixEveryRun: before every run (llama.cpp's add_space_prefix; a
	// tokenizer.json's Prepend normalizer).
	PrefixEveryRun SpacePrefix = iota
	// PrefixUnlessSpace: before every run that does not start with a space
	// (a tokenizer.json's Metaspace, prepend_scheme "always").
	PrefixUnlessSpace
	// PrefixFirstRun: before the run that opens the text, unless it starts
	// with a space (Metaspace "first").
	PrefixFirstRun
	// PrefixNever: nowhere.
	PrefixNever
)

// EncodeOptions controls Encode.
type EncodeOptions struct {
	AddSpecial   bool // prepend BOS if AddBOS, append EOS if AddEOS
	ParseSpecial bool // recognise control/user-defined token texts (e.g. "<|im_start|>") in the text
}

// DecodeOptions controls DecodeWith and NewStreamWith.
type DecodeOptions struct {
	Special bool // render control tokens' text (by default they are skipped)
}

// Tokenizer is a byte-level BPE tokenizer. It is safe for concurrent use.
type Tokenizer struct {
	spec         TokenizerSpec
	spm          bool // a SentencePiece vocabulary (spm.go)
	pre          preKind
	ignoreMerges bool // a pre-token that is itself in the vocabulary is emitted whole (Llama-3)

	vocab    map[string]int32
	types    []int32
	byteTok  [256]int32 // token of each single byte, -1 if missing
	merges   map[uint64]merge
	pieces   [][]byte // decoded bytes of each token (nil for skipped kinds)
	specials []special
	firstSp  [256][]int // index into specials by first byte, longest first
	stops    []int32

	mu    sync.RWMutex
	cache map[string][]int32
}

type merge struct{ rank, id int32 }

type special struct {
	text    string
	id      int32
	control bool // matched only with ParseSpecial
}

const maxCache = 1 << 16

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// NewTokenizer builds a tokenizer from a spec.
func NewTokenizer(spec TokenizerSpec) (*Tokenizer, error) {
	var pre preKind
	switch spec.Model {
	case "gpt2":
		var err error
		if pre, err = lookupPre(spec.Pre); err != nil {
			return nil, err
		}
	case "llama":
		// SentencePiece: no pre-tokeniser; the text is merged whole.
	default:
		return nil, fmt.Errorf("model: unsupported tokenizer model %q (\"gpt2\" byte-level BPE or \"llama\" SentencePiece)", spec.Model)
	}
	n := len(spec.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("model: tokenizer has no tokens")
	}
	if spec.TokenTypes != nil && len(spec.TokenTypes) != n {
		return nil, fmt.Errorf("model: %d token types for %d tokens", len(spec.TokenTypes), n)
	}
	for _, f := range []struct {
		name string
		id   int32
	}{{"BOS", spec.BOS}, {"EOS", spec.EOS}, {"UNK", spec.UNK}, {"PAD", spec.PAD}, {"EOT", spec.EOT}} {
		if f.id < -1 || int(f.id) >= n {
			return nil, fmt.Errorf("model: %s token id %d out of range [0,%d)", f.name, f.id, n)
		}
	}
	if spec.Model == "llama" && len(spec.Scores) != n && (spec.Scores != nil || len(spec.Merges) == 0) {
		return nil, fmt.Errorf("model: a SentencePiece vocabulary needs one score per token (or merges): %d scores for %d tokens", len(spec.Scores), n)
	}
	t := &Tokenizer{
		spec:         spec,
		spm:          spec.Model == "llama",
		pre:          pre,
		ignoreMerges: pre == preLlama3 || pre == preTekken, // as llama.cpp reads them
		vocab:        make(map[string]int32, n),
		types:        make([]int32, n),
		merges:       make(map[uint64]merge, len(spec.Merges)),
		pieces:       make([][]byte, n),
		cache:        make(map[string][]int32),
	}
	for i, tok := range spec.Tokens {
		typ := int32(TokenNormal)
		if spec.TokenTypes != nil {
			typ = spec.TokenTypes[i]
		}
		t.types[i] = typ
		if _, dup := t.vocab[tok]; !dup || t.spm {
			t.vocab[tok] = int32(i) // llama.cpp's SentencePiece lookup keeps the last of duplicates
		}
		switch typ {
		case TokenControl, TokenUserDefined, TokenUnknown:
			t.pieces[i] = []byte(tok)
			if tok != "" {
				// as llama.cpp: control and unknown texts are matched only
				// with ParseSpecial, user-defined ones always
				t.specials = append(t.specials, special{text: tok, id: int32(i), control: typ != TokenUserDefined})
			}
		case TokenUnused:
		default:
			if t.spm {
				t.pieces[i] = spmPiece(tok, typ)
			} else {
				t.pieces[i] = unicodeToBytes(tok)
			}
		}
	}
	for b := 0; b < 256; b++ {
		t.byteTok[b] = -1
		if t.spm {
			t.byteTok[b] = t.spmByteToken(byte(b))
		} else if id, ok := t.vocab[string(byteToRune[b])]; ok {
			t.byteTok[b] = id
		}
	}
	for rank, m := range spec.Merges {
		left, right, ok := strings.Cut(m, " ")
		if !ok {
			return nil, fmt.Errorf("model: merge %d %q is not \"left right\"", rank, m)
		}
		a, okA := t.vocab[left]
		b, okB := t.vocab[right]
		c, okC := t.vocab[left+right]
		if !okA || !okB || !okC {
			continue // a merge whose parts or result are not tokens can never apply
		}
		k := pairKey(a, b)
		if _, dup := t.merges[k]; !dup {
			t.merges[k] = merge{rank: int32(rank), id: c}
		}
	}
	sort.SliceStable(t.specials, func(i, j int) bool { return len(t.specials[i].text) > len(t.specials[j].text) })
	for i, sp := range t.specials {
		t.firstSp[sp.text[0]] = append(t.firstSp[sp.text[0]], i)
	}
	t.stops = t.findStops()
	return t, nil
}

var endOfGeneration = []string{
	"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>", "<end_of_turn>",
	"<|eom_id|>", "<|return|>", "<|call|>", "<｜end▁of▁sentence｜>", "</s>",
}

func (t *Tokenizer) findStops() []int32 {
	var ids []int32
	for _, id := range []int32{t.spec.EOS, t.spec.EOT} {
		if id >= 0 {
			ids = append(ids, id)
		}
	}
	for _, s := range endOfGeneration {
		if id, ok := t.vocab[s]; ok && t.types[id] == TokenControl {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := ids[:0]
	for i, id := range ids {
		if i == 0 || id != ids[i-1] {
			out = append(out, id)
		}
	}
	return out
}

// VocabSize is the number of tokens.
func (t *Tokenizer) VocabSize() int { return len(t.spec.Tokens) }

// BOS is the beginning-of-sequence token, -1 if none.
func (t *Tokenizer) BOS() int32 { return t.spec.BOS }

// EOS is the end-of-sequence token, -1 if none.
func (t *Tokenizer) EOS() int32 { return t.spec.EOS }

// AddBOS reports whether Encode with AddSpecial prepends BOS.
func (t *Tokenizer) AddBOS() bool { return t.spec.AddBOS }

// ChatTemplate is the checkpoint's chat template ("" if none), or the
// one SetChatTemplate put in its place.
func (t *Tokenizer) ChatTemplate() string { return t.spec.ChatTemplate }

// SetChatTemplate replaces the checkpoint's chat template (a server's
// --chat-template). Call it before the tokenizer is shared.
func (t *Tokenizer) SetChatTemplate(src string) { t.spec.ChatTemplate = src }

// Spec returns the spec the tokenizer was built from.
func (t *Tokenizer) Spec() TokenizerSpec { return t.spec }

// StopTokens are EOS, EOT and the end-of-generation control tokens
// (<|im_end|>, <|eot_id|>, <|endoftext|>, ...) present in the vocabulary,
// sorted and deduplicated.
func (t *Tokenizer) StopTokens() []int32 { return append([]int32(nil), t.stops...) }

// TokenText is the vocabulary entry of id as stored (byte-level spelling for
// normal tokens); "" if out of range.
func (t *Tokenizer) TokenText(id int32) string {
	if id < 0 || int(id) >= len(t.spec.Tokens) {
		return ""
	}
	return t.spec.Tokens[id]
}

// TokenID looks up a vocabulary entry as stored.
func (t *Tokenizer) TokenID(text string) (int32, bool) {
	id, ok := t.vocab[text]
	return id, ok
}

// Encode tokenizes text.
func (t *Tokenizer) Encode(text string, opts EncodeOptions) []int32 {
	out := make([]int32, 0, len(text)/3+2)
	if opts.AddSpecial && t.spec.AddBOS && t.spec.BOS >= 0 {
		out = append(out, t.spec.BOS)
	}
	// Plain text lies between special tokens (or at an end of the text):
	// SentencePiece puts a space before every such piece.
	start := 0
	for i := 0; i < len(text); {
		if cands := t.firstSp[text[i]]; cands != nil {
			if sp := t.matchSpecial(text[i:], cands, opts.ParseSpecial); sp != nil {
				out = t.encodeText(out, text[start:i], start == 0)
				out = append(out, sp.id)
				i += len(sp.text)
				start = i
				continue
			}
		}
		i++
	}
	out = t.encodeText(out, text[start:], start == 0)
	if opts.AddSpecial && t.spec.AddEOS && t.spec.EOS >= 0 {
		out = append(out, t.spec.EOS)
	}
	return out
}

func (t *Tokenizer) matchSpecial(s string, cands []int, control bool) *special {
	for _, c := range cands {
		sp := &t.specials[c]
		if sp.control && !control {
			continue
		}
		if strings.HasPrefix(s, sp.text) {
			return sp
		}
	}
	return nil
}

// encodeText encodes the plain text between special tokens; first says it
// opens the text.
func (t *Tokenizer) encodeText(out []int32, text string, first bool) []int32 {
	if text == "" {
		return out
	}
	if t.spm {
		return t.spmEncode(out, text, first)
	}
	return t.encodePlain(out, text)
}

func (t *Tokenizer) encodePlain(out []int32, text string) []int32 {
	if text == "" {
		return out
	}
	t.pre.split(text, func(word string) {
		out = t.encodeWord(out, word)
	})
	return out
}

func (t *Tokenizer) encodeWord(out []int32, word string) []int32 {
	t.mu.RLock()
	ids, ok := t.cache[word]
	t.mu.RUnlock()
	if ok {
		return append(out, ids...)
	}
	ids = t.bpe(word)
	if len(word) <= 256 {
		t.mu.Lock()
		if len(t.cache) >= maxCache {
			clear(t.cache)
		}
		t.cache[word] = ids
		t.mu.Unlock()
	}
	return append(out, ids...)
}

// bpe encodes one pre-token: bytes -> byte tokens, then merges by rank,
// lowest first, leftmost on ties.
func (t *Tokenizer) bpe(word string) []int32 {
	if t.ignoreMerges {
		if id, ok := t.vocab[bytesToUnicode(word)]; ok && t.types[id] == TokenNormal {
			return []int32{id}
		}
	}
	syms := make([]int32, 0, len(word))
	for i := 0; i < len(word); i++ {
		id := t.byteTok[word[i]]
		if id < 0 {
			id = t.spec.UNK
			if id < 0 {
				continue
			}
		}
		syms = append(syms, id)
	}
	if len(syms) < 2 {
		return syms
	}
	if len(syms) <= 48 {
		return t.mergeSmall(syms)
	}
	return t.mergeHeap(syms)
}

// mergeSmall: repeated scans; quadratic but allocation-free, for short words.
func (t *Tokenizer) mergeSmall(syms []int32) []int32 {
	for len(syms) > 1 {
		best, bestRank := -1, int32(1<<31-1)
		var bestID int32
		for i := 0; i+1 < len(syms); i++ {
			if m, ok := t.merges[pairKey(syms[i], syms[i+1])]; ok && m.rank < bestRank {
				best, bestRank, bestID = i, m.rank, m.id
			}
		}
		if best < 0 {
			break
		}
		syms[best] = bestID
		syms = append(syms[:best+1], syms[best+2:]...)
	}
	return syms
}

type bigram struct {
	rank, left, right int32
	a, b              int32 // token ids when pushed
}

type bigramHeap []bigram

func (h bigramHeap) Len() int { return len(h) }
func (h bigramHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].left < h[j].left
}
func (h bigramHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *bigramHeap) Push(x any)   { *h = append(*h, x.(bigram)) }
func (h *bigramHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mergeHeap: linked symbols and a priority queue, O(n log n), for long words.
func (t *Tokenizer) mergeHeap(ids []int32) []int32 {
	n := len(ids)
	prev := make([]int32, n)
	next := make([]int32, n)
	for i := range ids {
		prev[i] = int32(i - 1)
		next[i] = int32(i + 1)
	}
	next[n-1] = -1
	h := make(bigramHeap, 0, n)
	push := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		if m, ok := t.merges[pairKey(ids[l], ids[r])]; ok {
			h = append(h, bigram{rank: m.rank, left: l, right: r, a: ids[l], b: ids[r]})
		}
	}
	for i := 0; i+1 < n; i++ {
		push(int32(i), int32(i+1))
	}
	heap.Init(&h)
	alive := make([]bool, n)
	for i := range alive {
		alive[i] = true
	}
	for h.Len() > 0 {
		bg := heap.Pop(&h).(bigram)
		l, r := bg.left, bg.right
		if !alive[l] || !alive[r] || next[l] != r || ids[l] != bg.a || ids[r] != bg.b {
			continue
		}
		ids[l] = t.merges[pairKey(bg.a, bg.b)].id
		alive[r] = false
		next[l] = next[r]
		if next[r] >= 0 {
			prev[next[r]] = l
		}
		if p := prev[l]; p >= 0 {
			if m, ok := t.merges[pairKey(ids[p], ids[l])]; ok {
				heap.Push(&h, bigram{rank: m.rank, left: p, right: l, a: ids[p], b: ids[l]})
			}
		}
		if nx := next[l]; nx >= 0 {
			if m, ok := t.merges[pairKey(ids[l], ids[nx])]; ok {
				heap.Push(&h, bigram{rank: m.rank, left: l, right: nx, a: ids[l], b: ids[nx]})
			}
		}
	}
	out := ids[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, ids[i])
	}
	return out
}

// Decode renders ids as text, skipping control tokens. Bytes that do not
// form valid UTF-8 come out as U+FFFD, one per byte.
func (t *Tokenizer) Decode(ids []int32) string { return t.DecodeWith(ids, DecodeOptions{}) }

// DecodeWith renders ids as text.
func (t *Tokenizer) DecodeWith(ids []int32, opts DecodeOptions) string {
	var buf []byte
	for _, id := range ids {
		buf = append(buf, t.piece(id, opts.Special)...)
	}
	var sb strings.Builder
	sb.Grow(len(buf))
	writeLossy(&sb, buf)
	return sb.String()
}

// TokenBytes is the bytes token id stands for, control tokens included
// (their text); nil for an id outside the vocabulary. The API's
// log-probabilities name tokens by them.
func (t *Tokenizer) TokenBytes(id int32) []byte { return t.piece(id, true) }

// TextPieces is, per id, the bytes the token stands for in generated
// text: nil for the tokens that are not text (control, unknown and unused
// ones). Structured outputs build their vocabulary from it.
func (t *Tokenizer) TextPieces() [][]byte {
	out := make([][]byte, len(t.pieces))
	for id, p := range t.pieces {
		switch t.types[id] {
		case TokenControl, TokenUnknown, TokenUnused:
		default:
			out[id] = p
		}
	}
	return out
}

// LossyString is b as text, bytes that do not form valid UTF-8 as U+FFFD
// (one per byte), as Decode renders them.
func LossyString(b []byte) string {
	var sb strings.Builder
	sb.Grow(len(b))
	writeLossy(&sb, b)
	return sb.String()
}

// piece is the bytes token id contributes to decoded text.
func (t *Tokenizer) piece(id int32, special bool) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	if (t.types[id] == TokenControl || t.types[id] == TokenUnknown) && !special {
		return nil
	}
	return t.pieces[id]
}

func writeLossy(sb *strings.Builder, b []byte) {
	for len(b) > 0 {
		r, w := utf8.DecodeRune(b)
		if r == utf8.RuneError && w == 1 {
			sb.WriteRune(utf8.RuneError)
		} else {
			sb.Write(b[:w])
		}
		b = b[w:]
	}
}

// StreamDecoder turns generated ids into text incrementally: Next returns
// only complete UTF-8 (a character split across tokens appears once, whole).
type StreamDecoder struct {
	t       *Tokenizer
	special bool
	pending []byte
	sb      strings.Builder
}

// NewStream starts a stream decoder that skips control tokens.
func (t *Tokenizer) NewStream() *StreamDecoder { return t.NewStreamWith(DecodeOptions{}) }

// NewStreamWith starts a stream decoder.
func (t *Tokenizer) NewStreamWith(opts DecodeOptions) *StreamDecoder {
	return &StreamDecoder{t: t, special: opts.Special}
}

// Next adds a token and returns the text it completes (possibly "").
// Bytes that can no longer become valid UTF-8 come out as U+FFFD.
func (d *StreamDecoder) Next(id int32) string {
	d.pending = append(d.pending, d.t.piece(id, d.special)...)
	b := d.pending
	d.sb.Reset()
	for len(b) > 0 {
		r, w := utf8.DecodeRune(b)
		if r == utf8.RuneError && w == 1 {
			if !utf8.FullRune(b) {
				break // an incomplete character: wait for more bytes
			}
			d.sb.WriteRune(utf8.RuneError)
		} else {
			d.sb.Write(b[:w])
		}
		b = b[w:]
	}
	d.pending = append(d.pending[:0], b...)
	return d.sb.String()
}

// Flush returns what is left (an incomplete character as U+FFFD per byte)
// and resets the decoder.
func (d *StreamDecoder) Flush() string {
	d.sb.Reset()
	writeLossy(&d.sb, d.pending)
	d.pending = d.pending[:0]
	return d.sb.String()
}
