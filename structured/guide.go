package structured

import (
	"encoding/binary"
	"fmt"
	"regexp/syntax"
	"sync"
	"unicode"
	"unicode/utf8"
)

// MaxPatternLen bounds a guide's expression (the server's schema
// conversion stays far below it).
const MaxPatternLen = 1 << 20

// maxStates bounds the DFA states a guide caches (each holds 256
// transitions and a mask); past it the cache starts over. Matchers keep
// their own state, so nothing they hold is invalidated.
const maxStates = 2048

// hardStates bounds the states interned at all: a mask's walk may pass
// maxStates (the cache starts over after it), and past hardStates its new
// states are not kept, so that no pattern can make a guide's automaton
// grow without bound (each state holds 2 KiB of transitions).
const hardStates = 8 * maxStates

// Guide is a regular expression compiled for a vocabulary. Safe for
// concurrent use: its lazily built automaton is guarded by a mutex.
type Guide struct {
	pattern string
	vocab   *Vocab
	prog    *syntax.Prog

	mu     sync.Mutex
	index  map[string]*dstate
	start  *dstate
	closer closure  // scratch of the automaton's construction (under mu)
	none   []uint32 // the empty mask
	// byHorizon shares masks between states that no token can tell apart
	// (horizonKey): the positions of a long counted repetition.
	byHorizon map[string][]uint32
	noShare   bool // every state walks its own mask (tests)
	// Per instruction (under mu): the closure of a rune instruction's Out,
	// computed once (outOf), and horizonKey's numbering by generation.
	outs     [][]uint32
	outMatch []bool
	outDone  []bool
	hzStamp  []uint32
	hzID     []uint32
	hzGen    uint32
	peak     int // the most states interned at once (tests)
}

// dstate is a DFA state: the program's rune-consuming instructions that
// are live, whether the program matches here, and the bytes of a character
// begun but not finished.
type dstate struct {
	pcs     []uint32
	match   bool
	pending []byte
	key     string
	next    [256]*dstate // nil: not computed yet; dead: no match can follow
	mask    []uint32     // nil until computed
	// interned: in the guide's index (transitions into it are cached).
	interned bool
}

// dead is the state after a byte no match can follow.
var dead = &dstate{key: "dead"}

// Compile compiles pattern (Go's RE2 syntax, Perl flags) for vocab. The
// whole output must match it. Word boundaries (\b, \B) are refused: they
// look at a character not yet generated.
func Compile(pattern string, vocab *Vocab) (*Guide, error) {
	if vocab == nil {
		return nil, fmt.Errorf("structured: no vocabulary")
	}
	if len(pattern) > MaxPatternLen {
		return nil, fmt.Errorf("the pattern is %d bytes long; at most %d are accepted", len(pattern), MaxPatternLen)
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, err
	}
	for _, in := range prog.Inst {
		if in.Op == syntax.InstEmptyWidth && syntax.EmptyOp(in.Arg)&(syntax.EmptyWordBoundary|syntax.EmptyNoWordBoundary) != 0 {
			return nil, fmt.Errorf("word boundaries (\\b, \\B) are not supported in a guide's pattern")
		}
	}
	g := &Guide{pattern: pattern, vocab: vocab, prog: prog}
	n := len(prog.Inst)
	g.outs, g.outMatch, g.outDone = make([][]uint32, n), make([]bool, n), make([]bool, n)
	g.hzStamp, g.hzID = make([]uint32, n), make([]uint32, n)
	g.reset()
	return g, nil
}

// Pattern is the expression the guide was compiled from.
func (g *Guide) Pattern() string { return g.pattern }

// Vocab is the vocabulary the guide was compiled for.
func (g *Guide) Vocab() *Vocab { return g.vocab }

// reset drops the cached automaton (under mu, or before g is shared).
func (g *Guide) reset() {
	g.index = make(map[string]*dstate)
	g.closer.init(g.prog)
	g.none = make([]uint32, g.vocab.Words())
	g.byHorizon = make(map[string][]uint32)
	g.closer.add(uint32(g.prog.Start), true)
	pcs, m := g.closer.take()
	g.start = g.intern(pcs, m, nil)
}

// closure collects the instructions reachable without consuming input.
type closure struct {
	prog  *syntax.Prog
	seen  []uint32 // generation stamps per instruction
	ended []uint32 // the same, past an end-of-text assertion
	gen   uint32
	pcs   []uint32
	match bool
}

func (c *closure) init(p *syntax.Prog) {
	c.prog, c.seen, c.ended, c.gen = p, make([]uint32, len(p.Inst)), make([]uint32, len(p.Inst)), 1
	c.pcs, c.match = c.pcs[:0], false
}

// add follows pc's empty transitions; atStart: nothing consumed yet (^
// holds). An end-of-text assertion lets only a match through.
func (c *closure) add(pc uint32, atStart bool) { c.follow(pc, atStart, false) }

func (c *closure) follow(pc uint32, atStart, ended bool) {
	for {
		seen := c.seen
		if ended {
			seen = c.ended
		}
		if seen[pc] == c.gen {
			return
		}
		seen[pc] = c.gen
		in := &c.prog.Inst[pc]
		switch in.Op {
		case syntax.InstMatch:
			c.match = true
			return
		case syntax.InstFail:
			return
		case syntax.InstAlt, syntax.InstAltMatch:
			c.follow(in.Arg, atStart, ended)
			pc = in.Out
		case syntax.InstCapture, syntax.InstNop:
			pc = in.Out
		case syntax.InstEmptyWidth:
			op := syntax.EmptyOp(in.Arg)
			if op&(syntax.EmptyBeginLine|syntax.EmptyBeginText) != 0 && !atStart {
				return
			}
			if op&(syntax.EmptyEndLine|syntax.EmptyEndText) != 0 {
				ended = true
			}
			pc = in.Out
		default: // rune-consuming
			if !ended {
				c.pcs = append(c.pcs, pc)
			}
			return
		}
	}
}

// take returns the collected set (sorted) and starts a new one.
func (c *closure) take() ([]uint32, bool) {
	pcs := append([]uint32(nil), c.pcs...)
	sortPCs(pcs)
	m := c.match
	c.pcs, c.match = c.pcs[:0], false
	c.gen++
	if c.gen == 0 {
		clear(c.seen)
		clear(c.ended)
		c.gen = 1
	}
	return pcs, m
}

func sortPCs(p []uint32) {
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && p[j] < p[j-1]; j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
}

// intern returns the state (pcs, match, pending), creating it (under mu).
func (g *Guide) intern(pcs []uint32, match bool, pending []byte) *dstate {
	if len(pcs) == 0 && !match {
		return dead
	}
	kb := make([]byte, 0, 4*len(pcs)+2+len(pending))
	for _, pc := range pcs {
		kb = binary.LittleEndian.AppendUint32(kb, pc)
	}
	if match {
		kb = append(kb, 1)
	} else {
		kb = append(kb, 0)
	}
	kb = append(kb, pending...)
	key := string(kb)
	if s, ok := g.index[key]; ok {
		return s
	}
	s := &dstate{pcs: pcs, match: match, pending: append([]byte(nil), pending...), key: key}
	if len(g.index) >= hardStates {
		// Past the hard bound (a mask's walk through a pattern with very
		// many states): a state of its own, garbage once the walk is past
		// it, never cached (cacheable).
		return s
	}
	s.interned = true
	g.index[key] = s
	g.peak = max(g.peak, len(g.index))
	return s
}

// cacheable reports whether a transition into n may be kept: n is interned
// (or dead), so the cached automaton stays within hardStates.
func cacheable(n *dstate) bool { return n.interned || n == dead }

// matchRune reports whether instruction pc accepts r.
func (g *Guide) matchRune(pc uint32, r rune) bool {
	in := &g.prog.Inst[pc]
	switch in.Op {
	case syntax.InstRune1:
		return r == in.Rune[0]
	case syntax.InstRune:
		return in.MatchRune(r)
	case syntax.InstRuneAny:
		return true
	case syntax.InstRuneAnyNotNL:
		return r != '\n'
	}
	return false
}

// acceptsIn reports whether instruction pc accepts some rune in [lo, hi].
func (g *Guide) acceptsIn(pc uint32, lo, hi rune) bool {
	in := &g.prog.Inst[pc]
	switch in.Op {
	case syntax.InstRune1:
		return in.Rune[0] >= lo && in.Rune[0] <= hi
	case syntax.InstRune:
		if syntax.Flags(in.Arg)&syntax.FoldCase != 0 {
			if len(in.Rune) != 1 {
				return true // not what the compiler emits: stay permissive
			}
			// A case-folded literal: its fold orbit.
			r0 := in.Rune[0]
			for r := r0; ; {
				if r >= lo && r <= hi {
					return true
				}
				if r = unicode.SimpleFold(r); r == r0 {
					return false
				}
			}
		}
		for i := 0; i+1 < len(in.Rune); i += 2 {
			if in.Rune[i] <= hi && in.Rune[i+1] >= lo {
				return true
			}
		}
		return false
	case syntax.InstRuneAny:
		return true
	case syntax.InstRuneAnyNotNL:
		return true // lo > 0x7f here: never '\n' alone
	}
	return false
}

// step is the state after byte b (under mu).
func (g *Guide) step(s *dstate, b byte) *dstate {
	if s == dead {
		return dead
	}
	if n := s.next[b]; n != nil {
		return n
	}
	n := g.computeStep(s, b)
	if len(g.index) > maxStates {
		// Start over: s and n stay valid for whoever holds them.
		g.reset()
		return n
	}
	if cacheable(n) {
		s.next[b] = n
	}
	return n
}

func (g *Guide) computeStep(s *dstate, b byte) *dstate {
	if len(s.pending) == 0 && b < utf8.RuneSelf {
		return g.stepRune(s, rune(b))
	}
	p := append(append(make([]byte, 0, 4), s.pending...), b)
	if !utf8.FullRune(p) {
		lo, hi, ok := prefixRange(p)
		if !ok {
			return dead
		}
		for _, pc := range s.pcs {
			if g.acceptsIn(pc, lo, hi) {
				return g.intern(s.pcs, false, p)
			}
		}
		return dead
	}
	r, w := utf8.DecodeRune(p)
	if r == utf8.RuneError && w <= 1 || w != len(p) {
		return dead // not UTF-8: a guided output is text
	}
	return g.stepRune(s, r)
}

func (g *Guide) stepRune(s *dstate, r rune) *dstate {
	for _, pc := range s.pcs {
		if g.matchRune(pc, r) {
			g.closer.add(g.prog.Inst[pc].Out, false)
		}
	}
	pcs, m := g.closer.take()
	return g.intern(pcs, m, nil)
}

// prefixRange is the range of runes whose UTF-8 encoding starts with the
// incomplete sequence p, and whether p can start a valid encoding.
func prefixRange(p []byte) (lo, hi rune, ok bool) {
	var n int
	switch b := p[0]; {
	case b >= 0xC2 && b <= 0xDF:
		n = 2
	case b >= 0xE0 && b <= 0xEF:
		n = 3
	case b >= 0xF0 && b <= 0xF4:
		n = 4
	default:
		return 0, 0, false
	}
	lob := append(append(make([]byte, 0, 4), p...), 0x80, 0x80, 0x80)[:n]
	hib := append(append(make([]byte, 0, 4), p...), 0xBF, 0xBF, 0xBF)[:n]
	// The smallest and largest valid completions (surrogates and the
	// overlong forms excluded by DecodeRune).
	for _, c := range p[1:] {
		if c < 0x80 || c > 0xBF {
			return 0, 0, false
		}
	}
	lo, hi = decodeLoose(lob), decodeLoose(hib)
	if lo > hi || hi < 0x80 || lo > utf8.MaxRune {
		return 0, 0, false
	}
	lo, hi = max(lo, minRuneOfLen(n)), min(hi, utf8.MaxRune)
	return lo, hi, lo <= hi
}

func minRuneOfLen(n int) rune {
	switch n {
	case 2:
		return 0x80
	case 3:
		return 0x800
	}
	return 0x10000
}

// decodeLoose decodes a 2..4-byte sequence arithmetically (no checks).
func decodeLoose(b []byte) rune {
	switch len(b) {
	case 2:
		return rune(b[0]&0x1F)<<6 | rune(b[1]&0x3F)
	case 3:
		return rune(b[0]&0x0F)<<12 | rune(b[1]&0x3F)<<6 | rune(b[2]&0x3F)
	}
	return rune(b[0]&0x07)<<18 | rune(b[1]&0x3F)<<12 | rune(b[2]&0x3F)<<6 | rune(b[3]&0x3F)
}

// accepting: the output so far is a complete match.
func (s *dstate) accepting() bool { return s.match && len(s.pending) == 0 }

// finished: a complete match that nothing can extend.
func (s *dstate) finished() bool { return s.accepting() && len(s.pcs) == 0 }

// maskOf is s's token mask (under mu), computed once: every token whose
// bytes lead from s to a live state, and the end-of-generation tokens
// when s is a complete match.
func (g *Guide) maskOf(s *dstate) []uint32 {
	if s == dead {
		return g.none
	}
	if s.mask != nil {
		return s.mask
	}
	if !g.noShare {
		key := g.horizonKey(s)
		if m, ok := g.byHorizon[key]; ok {
			s.mask = m
			return m
		}
		defer func() { g.byHorizon[key] = s.mask }()
	}
	v := g.vocab
	mask := make([]uint32, v.Words())
	if len(s.pcs) > 0 {
		// Walk the tokens in byte order: path[d] is the state after the
		// first d bytes of the current token; a token sharing a dead
		// prefix with the previous one is dead too.
		path := make([]*dstate, 1, 16)
		path[0] = s
		deadAt := int32(-1) // length of the previous token's shortest dead prefix; -1 none
		for i, id := range v.order {
			l := v.lcp[i]
			if deadAt >= 0 && l >= deadAt {
				continue
			}
			deadAt = -1
			piece := v.pieces[id]
			path = path[:l+1]
			cur := path[l]
			for d := int(l); d < len(piece); d++ {
				cur = g.stepNoReset(cur, piece[d])
				if cur == dead {
					deadAt = int32(d + 1)
					break
				}
				path = append(path, cur)
			}
			if deadAt < 0 {
				mask[id/32] |= 1 << (id % 32)
			}
		}
	}
	if s.accepting() {
		for _, id := range v.eos {
			mask[id/32] |= 1 << (id % 32)
		}
	}
	s.mask = mask
	return mask
}

// horizonKey describes what s can do within one token: the program's
// instructions reachable from it in at most Vocab.maxLen characters (a
// token's bytes are at most that many characters), renumbered in the
// order a breadth-first walk meets them, each with what it matches and
// where it leads, and s's match flag and pending bytes. States with the
// same key accept the same tokens, so they share a mask: the positions
// of X{0,200} that are more than a token away from the end are one mask,
// not one walk each. (Instructions past the horizon are only marked
// present: a token cannot reach what they match.)
func (g *Guide) horizonKey(s *dstate) string {
	if g.hzGen++; g.hzGen == 0 {
		clear(g.hzStamp)
		g.hzGen = 1
	}
	queue := make([]uint32, 0, 64)
	depth := make([]int, 0, 64)
	key := make([]byte, 0, 256)
	key = append(key, boolByte(s.match), byte(len(s.pending)))
	key = append(key, s.pending...)
	id := func(pc uint32, d int) uint32 {
		if g.hzStamp[pc] == g.hzGen {
			return g.hzID[pc]
		}
		g.hzStamp[pc], g.hzID[pc] = g.hzGen, uint32(len(queue))
		queue, depth = append(queue, pc), append(depth, d)
		return uint32(len(queue) - 1)
	}
	key = binary.LittleEndian.AppendUint32(key, uint32(len(s.pcs)))
	for _, pc := range s.pcs {
		key = binary.LittleEndian.AppendUint32(key, id(pc, 0))
	}
	for k := 0; k < len(queue); k++ {
		in := &g.prog.Inst[queue[k]]
		key = binary.LittleEndian.AppendUint32(append(key, byte(in.Op), byte(syntax.Flags(in.Arg)&syntax.FoldCase)), uint32(len(in.Rune)))
		for _, r := range in.Rune {
			key = binary.LittleEndian.AppendUint32(key, uint32(r))
		}
		if depth[k] >= g.vocab.maxLen {
			key = append(key, '|')
			continue
		}
		next, m := g.outOf(queue[k])
		key = binary.LittleEndian.AppendUint32(append(key, boolByte(m)), uint32(len(next)))
		for _, pc := range next {
			key = binary.LittleEndian.AppendUint32(key, id(pc, depth[k]+1))
		}
	}
	return string(key)
}

// outOf is the closure of rune instruction pc's Out (the instructions
// after it matched), computed once (under mu).
func (g *Guide) outOf(pc uint32) ([]uint32, bool) {
	if !g.outDone[pc] {
		g.closer.add(g.prog.Inst[pc].Out, false)
		g.outs[pc], g.outMatch[pc] = g.closer.take()
		g.outDone[pc] = true
	}
	return g.outs[pc], g.outMatch[pc]
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// stepNoReset is step without the cache bound (a mask's walk must not
// start the cache over halfway); the bound is applied after the walk.
func (g *Guide) stepNoReset(s *dstate, b byte) *dstate {
	if n := s.next[b]; n != nil {
		return n
	}
	n := g.computeStep(s, b)
	if cacheable(n) {
		s.next[b] = n
	}
	return n
}

// Matcher follows one output through a guide. Not safe for concurrent use
// (the guide it shares is).
type Matcher struct {
	g     *Guide
	s     *dstate
	ended bool // an end-of-generation token was taken
}

// NewMatcher starts a matcher at the empty output.
func (g *Guide) NewMatcher() *Matcher {
	g.mu.Lock()
	defer g.mu.Unlock()
	return &Matcher{g: g, s: g.start}
}

// Allowed is the mask of the tokens that may come next (Vocab.Words
// words; shared and read-only). Empty once an end-of-generation token was
// taken or the output can no longer match.
func (m *Matcher) Allowed() []uint32 {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if m.ended {
		return g.none
	}
	mask := g.maskOf(m.s)
	if len(g.index) > maxStates {
		g.reset()
	}
	return mask
}

// Advance takes token tok. It reports false when tok may not come here
// (the output can then no longer match).
func (m *Matcher) Advance(tok int32) bool {
	g := m.g
	if m.ended || m.s == dead {
		return false
	}
	if g.vocab.IsEOS(tok) {
		m.ended = true
		return m.s.accepting()
	}
	if tok < 0 || int(tok) >= len(g.vocab.pieces) || g.vocab.pieces[tok] == nil {
		m.s = dead
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, b := range g.vocab.pieces[tok] {
		if m.s = g.step(m.s, b); m.s == dead {
			return false
		}
	}
	return true
}

// Live reports whether some token may come next (Allowed is not empty).
func (m *Matcher) Live() bool {
	for _, w := range m.Allowed() {
		if w != 0 {
			return true
		}
	}
	return false
}

// Accepting reports whether the output so far is a complete match.
func (m *Matcher) Accepting() bool { return !m.ended && m.s.accepting() }

// Done reports whether generation must end here: an end-of-generation
// token was taken, the output is a match nothing can extend, or it can no
// longer match.
func (m *Matcher) Done() bool { return m.ended || m.s == dead || m.s.finished() }
