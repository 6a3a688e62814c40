package structured

import (
	"math/rand/v2"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// toyVocab: id 0 is EOS, ids 1..256 the single bytes 0..255, then the
// multi-byte pieces.
func toyVocab(t testing.TB, extra ...string) *Vocab {
	t.Helper()
	pieces := make([][]byte, 0, 257+len(extra))
	pieces = append(pieces, []byte("<eos>"))
	for b := range 256 {
		pieces = append(pieces, []byte{byte(b)})
	}
	for _, e := range extra {
		pieces = append(pieces, []byte(e))
	}
	v, err := NewVocab(pieces, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var toyExtra = []string{"ye", "yes", "es", "no", "may", "be", "maybe", "né", "\xc3", "\xa9", "é", "\"", "\":", "{\"", "\"}", "12", "-0", "00", ", ", "true", "tr", "ue,", " "}

func allowed(mask []uint32, id int32) bool { return mask[id/32]>>(id%32)&1 == 1 }

// allowedIDs lists the ids mask allows.
func allowedIDs(mask []uint32, v *Vocab) []int32 {
	var ok []int32
	for id := range int32(v.Size()) {
		if allowed(mask, id) {
			ok = append(ok, id)
		}
	}
	return ok
}

// The masks of finite languages agree with the set of their words'
// prefixes at every step of random walks, and the walks end on their
// words: alternatives, and a counted repetition longer than a token (whose
// positions share masks, horizonKey).
func TestMasksOfAFiniteLanguage(t *testing.T) {
	counted := []string{}
	var grow func(prefix string, reps int)
	grow = func(prefix string, reps int) {
		counted = append(counted, prefix+"d")
		if reps < 10 {
			grow(prefix+"ab", reps+1)
			grow(prefix+"c", reps+1)
		}
	}
	grow("", 0)
	for _, c := range []struct {
		pattern string
		words   []string
		share   bool
	}{
		{`(?:yes|no|maybe|né|nébé)`, []string{"yes", "no", "maybe", "né", "nébé"}, false},
		{`(?:ab|c){0,10}d`, counted, true},
	} {
		checkFiniteLanguage(t, c.pattern, c.words, c.share)
	}
}

func checkFiniteLanguage(t *testing.T, pattern string, words []string, share bool) {
	t.Helper()
	v := toyVocab(t, append(toyExtra, "abab", "cab", "abc")...)
	g, err := Compile(pattern, v)
	if err != nil {
		t.Fatal(err)
	}
	prefixes := map[string]bool{}
	lang := map[string]bool{}
	for _, w := range words {
		lang[w] = true
		for i := 0; i <= len(w); i++ {
			prefixes[w[:i]] = true
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ended := map[string]bool{}
	for walk := range 200 {
		m := g.NewMatcher()
		out := ""
		for steps := 0; !m.Done(); steps++ {
			if steps > 40 {
				t.Fatalf("%s walk %d: no end after %q", pattern, walk, out)
			}
			mask := m.Allowed()
			var ok []int32
			for id := range int32(v.Size()) {
				want := id != 0 && prefixes[out+string(v.pieces[id])] || id == 0 && lang[out]
				if id != 0 && v.pieces[id] == nil {
					want = false
				}
				if got := allowed(mask, id); got != want {
					t.Fatalf("%s walk %d after %q: token %d (%q) allowed %v, want %v", pattern, walk, out, id, v.pieces[id], got, want)
				}
				if want {
					ok = append(ok, id)
				}
			}
			tok := ok[rng.IntN(len(ok))]
			if !m.Advance(tok) {
				t.Fatalf("%s walk %d after %q: an allowed token %d was refused", pattern, walk, out, tok)
			}
			if tok != 0 {
				out += string(v.pieces[tok])
			}
		}
		if !lang[out] {
			t.Fatalf("%s walk %d ended on %q, not a word", pattern, walk, out)
		}
		ended[out] = true
	}
	if share {
		masked := 0
		for _, st := range g.index {
			if st.mask != nil {
				masked++
			}
		}
		if len(g.byHorizon) >= masked {
			t.Errorf("%s: %d masks for %d states with one: none shared", pattern, len(g.byHorizon), masked)
		}
	}
	if want := min(len(words), 40); len(ended) < want {
		t.Errorf("%s: the walks reached %d words, want at least %d", pattern, len(ended), want)
	}
}

// Random walks through infinite languages end on matches (as Go's regexp
// checks them) and every example of the language can be generated token
// by token.
func TestWalksEndOnMatches(t *testing.T) {
	v := toyVocab(t, toyExtra...)
	cases := []struct {
		re       string
		examples []string
	}{
		{`-?(?:0|[1-9][0-9]*)`, []string{"0", "-0", "12", "-1200", "9"}},
		{`\{"a":(?:true|false|null)(?:, "b":[0-9]{1,3})?\}`, []string{`{"a":true}`, `{"a":null, "b":120}`}},
		{`"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])*"`, []string{`""`, `"né é\n"`, `"\"quoted\""`, `"日本"`}},
		{`^[a-c]+x$`, []string{"ax", "abcx"}},
		{`(?i)Hi`, []string{"hi", "HI"}},
		{`.{1,4}`, []string{"a", "日本語", "é\x7f"}},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range cases {
		g, err := Compile(c.re, v)
		if err != nil {
			t.Fatalf("%s: %v", c.re, err)
		}
		full := regexp.MustCompile(`^(?:` + c.re + `)$`)
		for _, ex := range c.examples {
			if !full.MatchString(ex) {
				t.Fatalf("bad example %q of %s", ex, c.re)
			}
			m := g.NewMatcher()
			for i := 0; i < len(ex); i++ {
				tok := int32(ex[i]) + 1
				if !allowed(m.Allowed(), tok) || !m.Advance(tok) {
					t.Fatalf("%s: example %q refused at byte %d", c.re, ex, i)
				}
			}
			if !m.Accepting() || !allowed(m.Allowed(), 0) {
				t.Fatalf("%s: example %q is not accepted", c.re, ex)
			}
		}
		for walk := range 100 {
			m := g.NewMatcher()
			var out []byte
			for steps := 0; !m.Done(); steps++ {
				mask := m.Allowed()
				ok := allowedIDs(mask, v)
				if len(ok) == 0 {
					t.Fatalf("%s walk %d: nothing allowed after %q", c.re, walk, out)
				}
				tok := ok[rng.IntN(len(ok))]
				if steps > 30 && allowed(mask, 0) {
					tok = 0 // end long walks
				}
				if !m.Advance(tok) {
					t.Fatalf("%s walk %d: allowed token %d refused after %q", c.re, walk, tok, out)
				}
				if tok != 0 {
					out = append(out, v.pieces[tok]...)
				}
				if steps > 3000 {
					t.Fatalf("%s walk %d: no end", c.re, walk)
				}
			}
			if !utf8.Valid(out) || !full.Match(out) {
				t.Fatalf("%s walk %d ended on %q: not a match", c.re, walk, out)
			}
		}
	}
}

// A partial character is allowed only where a character it can begin is.
func TestPartialCharacters(t *testing.T) {
	v := toyVocab(t, toyExtra...)
	g, err := Compile(`[a-z]é`, v)
	if err != nil {
		t.Fatal(err)
	}
	m := g.NewMatcher()
	if allowed(m.Allowed(), 0xc3+1) {
		t.Fatal("a lead byte of é is allowed where only [a-z] can come")
	}
	m.Advance('a' + 1)
	if !allowed(m.Allowed(), 0xc3+1) || allowed(m.Allowed(), 0xc4+1) || allowed(m.Allowed(), 0x80+1) {
		t.Fatal("after a: 0xc3 must be allowed, 0xc4 and a lone continuation byte must not")
	}
	m.Advance(0xc3 + 1)
	if !allowed(m.Allowed(), 0xa9+1) || allowed(m.Allowed(), 0xa8+1) {
		t.Fatal("after a\\xc3: only \\xa9 completes é")
	}
	if !m.Advance(0xa9+1) || !m.Done() {
		t.Fatal("aé must be a finished match")
	}
}

func TestCompileRefusals(t *testing.T) {
	v := toyVocab(t)
	for _, c := range []struct{ re, want string }{
		{`a(`, "missing closing )"},
		{`\bword`, "word boundaries"},
		{strings.Repeat("a", MaxPatternLen+1), "at most"},
	} {
		if _, err := Compile(c.re, v); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%.20q) = %v, want an error with %q", c.re, err, c.want)
		}
	}
	if _, err := NewVocab(nil, nil); err == nil {
		t.Error("an empty vocabulary was accepted")
	}
	if _, err := NewVocab([][]byte{[]byte("a")}, []int32{3}); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Errorf("an out-of-range EOS: %v", err)
	}
}

// The cache bound starts the automaton over without disturbing matchers.
func TestStateCacheBound(t *testing.T) {
	v := toyVocab(t)
	g, err := Compile(`[0-9a-f]{0,1000}[0-9a-f]{0,1000}[0-9a-f]{0,1000}`, v) // a state per position
	if err != nil {
		t.Fatal(err)
	}
	m := g.NewMatcher()
	for i := range 2500 {
		tok := int32("0123456789abcdef"[i%16]) + 1
		if !allowed(m.Allowed(), tok) || !m.Advance(tok) {
			t.Fatalf("refused at %d", i)
		}
	}
	g.mu.Lock()
	n := len(g.index)
	g.mu.Unlock()
	if n > maxStates+1 {
		t.Fatalf("%d states cached, bound %d", n, maxStates)
	}
	if !m.Accepting() || m.Done() {
		t.Fatal("2500 hex digits must match and be extendable")
	}
}

func BenchmarkMaskOfAFreshState(b *testing.B) {
	pieces := make([][]byte, 0, 50000)
	rng := rand.New(rand.NewPCG(5, 6))
	const alpha = "abcdefghijklmnopqrstuvwxyz \"{}:,0123456789"
	for len(pieces) < 50000 {
		n := 1 + rng.IntN(8)
		var sb strings.Builder
		for range n {
			sb.WriteByte(alpha[rng.IntN(len(alpha))])
		}
		pieces = append(pieces, []byte(sb.String()))
	}
	v, err := NewVocab(pieces, nil)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		g, _ := Compile(`\{"name": "(?:[^"\\]|\\.)*", "age": [0-9]+\}`, v)
		m := g.NewMatcher()
		m.Allowed()
	}
}

// FuzzGuide: any pattern either fails to compile or gives a guide whose
// walks never panic, only take allowed tokens, and end on a match of the
// pattern when they end accepting.
func FuzzGuide(f *testing.F) {
	for _, s := range []string{`[0-9]+`, `(?:yes|no)`, `"(?:[^"\\]|\\.)*"`, `.{0,3}é`, `(?i)ab|c*`, `^x$`, `a{2,5}b?`, `[^a]`, `(?:ab|c){0,9}d`, `"[a-fé]{3,12}"`} {
		f.Add(s, uint64(1))
	}
	v := toyVocab(f, toyExtra...)
	f.Fuzz(func(t *testing.T, pattern string, seed uint64) {
		if len(pattern) > 200 {
			return
		}
		g, err := Compile(pattern, v)
		if err != nil {
			return
		}
		re, err := syntax.Parse(pattern, syntax.Perl)
		if err != nil {
			t.Fatalf("%q compiled as a guide but does not parse: %v", pattern, err)
		}
		full, err := regexp.Compile(`^(?:` + re.String() + `)$`)
		if err != nil {
			t.Fatalf("%q compiled as a guide but not as a regexp: %v", pattern, err)
		}
		alone, _ := Compile(pattern, v) // its masks shared by no state
		alone.noShare = true
		rng := rand.New(rand.NewPCG(seed, 7))
		m, ref := g.NewMatcher(), alone.NewMatcher()
		var out []byte
		for steps := 0; steps < 60 && !m.Done(); steps++ {
			mask := m.Allowed()
			if !slices.Equal(mask, ref.Allowed()) {
				t.Fatalf("%q after %q: the shared mask differs from the state's own", pattern, out)
			}
			ok := allowedIDs(mask, v)
			if len(ok) == 0 {
				break
			}
			tok := ok[rng.IntN(len(ok))]
			if !m.Advance(tok) || !ref.Advance(tok) {
				t.Fatalf("%q: an allowed token %d was refused after %q", pattern, tok, out)
			}
			if tok != 0 {
				out = append(out, v.pieces[tok]...)
			}
		}
		if m.Accepting() && !full.Match(out) {
			t.Fatalf("%q: the guide accepts %q, which does not match", pattern, out)
		}
	})
}

// A pattern whose automaton has more states than one mask's walk may
// keep: the walk stays within the hard bound and its masks are right.
func TestHardStateBound(t *testing.T) {
	const letters = "abcdefghijkl"
	var words []string
	var pieces [][]byte
	for _, a := range letters {
		for _, b := range letters {
			for _, c := range letters {
				for _, d := range letters {
					w := string([]rune{a, b, c, d})
					pieces = append(pieces, []byte(w))
					words = append(words, w+"z")
				}
			}
		}
	}
	z := int32(len(pieces))
	v, err := NewVocab(append(pieces, []byte("z")), nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Compile(`(?:`+strings.Join(words, "|")+`)`, v)
	if err != nil {
		t.Fatal(err)
	}
	m := g.NewMatcher()
	mask := m.Allowed()
	g.mu.Lock()
	n := g.peak
	g.mu.Unlock()
	if n != hardStates {
		t.Fatalf("at most %d states interned during the walk, want the hard bound %d reached, not passed", n, hardStates)
	}
	for id := range z {
		if !allowed(mask, id) {
			t.Fatalf("token %q refused at the start", pieces[id])
		}
	}
	if allowed(mask, z) {
		t.Fatal("z allowed at the start")
	}
	for _, id := range []int32{0, z / 2, z - 1} {
		m := g.NewMatcher()
		if !m.Advance(id) {
			t.Fatalf("token %q refused", pieces[id])
		}
		after := m.Allowed()
		if !allowed(after, z) || allowed(after, 0) || !m.Advance(z) || !m.Done() {
			t.Fatalf("after %q only z may come, and then the match is finished", pieces[id])
		}
	}
}
