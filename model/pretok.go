package model

import (
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// preKind selects a hand-written pre-tokeniser. Go's regexp has no
// lookahead, so each standard split regex is reproduced as a small scanner
// that follows the regex's alternation order and backtracking exactly.
type preKind int

const (
	// preGPT2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
	preGPT2 preKind = iota
	// preLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
	// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
	preLlama3
	// preQwen2: the Llama-3 regex with \p{N} instead of \p{N}{1,3}.
	preQwen2
	// preDigitsGPT2: every \p{N} is its own piece, then the GPT-2 regex on
	// the text between digits (llama.cpp's smollm/starcoder/refact; HF
	// Digits(individual_digits=True) + ByteLevel).
	preDigitsGPT2
	// preDeepSeek3: DeepSeek-V3/R1's three splits in turn: \p{N}{1,3};
	// runs of CJK ideographs, hiragana and katakana; then
	// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	// | ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
	preDeepSeek3
	// preTekken: Mistral's Tekken (NeMo, Small 3, Pixtral), its
	// tokenizer.json regex: [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
	// |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}
	// | ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+ (llama.cpp runs an
	// ASCII approximation of the letter classes; this is the original).
	preTekken
	// preDBRX: the Llama-3 split without its whole-word lookup
	// (llama.cpp's dbrx and smaug-bpe: Phi-4, DBRX).
	preDBRX
)

// preNames maps tokenizer.ggml.pre values to scanners.
var preNames = map[string]preKind{
	"":          preGPT2,
	"default":   preGPT2,
	"gpt2":      preGPT2,
	"gpt-2":     preGPT2,
	"llama-bpe": preLlama3,
	"llama3":    preLlama3,
	"llama-v3":  preLlama3,
	"smaug-bpe": preDBRX,
	"dbrx":      preDBRX,
	"qwen2":     preQwen2,
	// Aliases llama.cpp reads as the same split.
	"deepseek-r1-qwen": preQwen2,
	"falcon3":          preLlama3,
	"pixtral":          preLlama3,
	"phi-2":            preGPT2,
	"deepseek-v3":      preDeepSeek3,
	// GLM-4.5 and later (glm4, glm5: Llama 3's split and whole-word
	// lookup), GLM-4 (chatglm-bpe: without the lookup); llama.cpp's
	// CHATGLM4 regex spells out in ASCII the contractions preLlama3 folds
	// in ASCII.
	"glm4":        preLlama3,
	"glm5":        preLlama3,
	"chatglm-bpe": preDBRX,
	"tekken":      preTekken,
	"smollm":      preDigitsGPT2,
	"starcoder":   preDigitsGPT2,
	"refact":      preDigitsGPT2,
}

func supportedPre() string {
	names := make([]string, 0, len(preNames))
	for n := range preNames {
		if n != "" {
			names = append(names, fmt.Sprintf("%q", n))
		}
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func lookupPre(name string) (preKind, error) {
	k, ok := preNames[name]
	if !ok {
		return 0, fmt.Errorf("model: unsupported pre-tokenizer %q (supported: %s, or empty for GPT-2)", name, supportedPre())
	}
	return k, nil
}

// invalidRune stands for a byte that is not UTF-8; it is outside Unicode, so
// it is neither letter, number nor space.
const invalidRune rune = -2

// character classes, decided on the decoded rune; an invalid byte is
// neither letter, number nor space.
func isL(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= 0x80 && unicode.IsLetter(r)
}
func isN(r rune) bool  { return r >= '0' && r <= '9' || r >= 0x80 && unicode.IsNumber(r) }
func isS(r rune) bool  { return unicode.IsSpace(r) }
func isCR(r rune) bool { return r == '\r' || r == '\n' }

// at returns the rune at byte offset i of s (limited to end) and its width;
// (-1, 0) at or past end.
func at(s string, i, end int) (rune, int) {
	if i >= end {
		return -1, 0
	}
	c := s[i]
	if c < utf8.RuneSelf {
		return rune(c), 1
	}
	r, w := utf8.DecodeRuneInString(s[i:end])
	if r == utf8.RuneError && w == 1 {
		return invalidRune, 1 // an invalid byte: a class of its own
	}
	return r, w
}

// split calls emit for each pre-token of s in order.
func (k preKind) split(s string, emit func(string)) {
	switch k {
	case preGPT2:
		splitGPT2(s, 0, len(s), emit)
	case preDigitsGPT2:
		start := 0
		for i := 0; i < len(s); {
			r, w := at(s, i, len(s))
			if isN(r) {
				if start < i {
					splitGPT2(s, start, i, emit)
				}
				emit(s[i : i+w])
				start = i + w
			}
			i += w
		}
		if start < len(s) {
			splitGPT2(s, start, len(s), emit)
		}
	case preLlama3, preDBRX:
		splitLlama3(s, 3, emit)
	case preQwen2:
		splitLlama3(s, 1, emit)
	case preDeepSeek3:
		splitDeepSeek3(s, emit)
	case preTekken:
		splitRuns(s, 0, len(s), tekkenMatch, emit, func(i, end int) { emit(s[i:end]) })
	}
}

// Tekken's letter classes: "upper" [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and
// "lower" [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func isTekkenUpper(r rune) bool {
	if r < 0x80 {
		return r >= 'A' && r <= 'Z'
	}
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}
func isTekkenLower(r rune) bool {
	if r < 0x80 {
		return r >= 'a' && r <= 'z'
	}
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

// tekkenMatch is the end of Tekken's regex match at i (every character
// starts one).
func tekkenMatch(s string, i, end int) int {
	r, w := at(s, i, end)
	// The optional [^\r\n\p{L}\p{N}] before a word: tried with it, then without.
	starts := []int{i}
	if !isCR(r) && !isL(r) && !isN(r) {
		starts = []int{i + w, i}
	}
	// upper*lower+: the upper run gives back characters until a lower one
	// can start.
	for _, s0 := range starts {
		u := scan(s, s0, end, isTekkenUpper)
		for k := u; k >= s0; {
			if r2, _ := at(s, k, end); isTekkenLower(r2) {
				return scan(s, k, end, isTekkenLower)
			}
			if k == s0 {
				break
			}
			_, back := utf8.DecodeLastRuneInString(s[s0:k])
			k -= back
		}
	}
	// upper+lower*
	for _, s0 := range starts {
		if u := scan(s, s0, end, isTekkenUpper); u > s0 {
			return scan(s, u, end, isTekkenLower)
		}
	}
	if isN(r) {
		return i + w
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n/]*
	other := func(r rune) bool { return r != -1 && !isS(r) && !isL(r) && !isN(r) }
	j := i
	if r2, _ := at(s, i+w, end); r == ' ' && other(r2) {
		j = i + w
	}
	if r3, _ := at(s, j, end); other(r3) {
		return scan(s, scan(s, j, end, other), end, func(r rune) bool { return isCR(r) || r == '/' })
	}
	lastCR := newlineRun(s, i, end)
	if lastCR > 0 {
		return lastCR
	}
	if isS(r) {
		return spaceRun(s, i, end)
	}
	return i + w
}

func isCJK(r rune) bool {
	return r >= 0x4E00 && r <= 0x9FA5 || r >= 0x3040 && r <= 0x309F || r >= 0x30A0 && r <= 0x30FF
}
func isLM(r rune) bool { return isL(r) || r >= 0x80 && unicode.IsMark(r) }
func isPS(r rune) bool {
	if r < 0x80 {
		return r > ' ' && r < 0x7F && !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}
	return unicode.IsPunct(r) || unicode.IsSymbol(r)
}
func isASCIIPunct(r rune) bool  { return r < 0x80 && isPS(r) }
func isASCIILetter(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }

func splitDeepSeek3(s string, emit func(string)) {
	end := len(s)
	digits := func(s string, i, end int) int {
		j := i
		for k := 0; k < 3; k++ {
			r, w := at(s, j, end)
			if !isN(r) {
				break
			}
			j += w
		}
		return j
	}
	cjk := func(s string, i, end int) int { return scan(s, i, end, isCJK) }
	splitRuns(s, 0, end, digits, emit, func(i, end int) {
		splitRuns(s, i, end, cjk, emit, func(i, end int) { splitDeepSeek3Main(s, i, end, emit) })
	})
}

// splitRuns emits the runs that run matches in [i, end) and hands the
// text between them to inner (a regex split, "isolated" behaviour). run
// returns the end of its run at i, or i when none starts there.
func splitRuns(s string, i, end int, run func(s string, i, end int) int, emit func(string), inner func(i, end int)) {
	start := i
	for i < end {
		if j := run(s, i, end); j > i {
			if start < i {
				inner(start, i)
			}
			emit(s[i:j])
			start, i = j, j
			continue
		}
		_, w := at(s, i, end)
		i += w
	}
	if start < end {
		inner(start, end)
	}
}

// deepSeek3Match is the end of the main DeepSeek-V3 regex's match at i, or
// i when no alternative matches there.
func deepSeek3Match(s string, i, end int) int {
	r, w := at(s, i, end)
	r2, _ := at(s, i+w, end)
	// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
	if isASCIIPunct(r) && isASCIILetter(r2) {
		return scan(s, i+w, end, isASCIILetter)
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if isLM(r) {
		return scan(s, i, end, isLM)
	}
	if !isCR(r) && !isL(r) && !isPS(r) && isLM(r2) {
		return scan(s, i+w, end, isLM)
	}
	//  ?[\p{P}\p{S}]+[\r\n]*
	j := i
	if r == ' ' && isPS(r2) {
		j = i + w
	}
	if r3, _ := at(s, j, end); isPS(r3) {
		return scan(s, scan(s, j, end, isPS), end, isCR)
	}
	if !isS(r) {
		return i
	}
	// \s*[\r\n]+: up to the last \r or \n of the whitespace run.
	lastCR := newlineRun(s, i, end)
	if lastCR > 0 {
		return lastCR
	}
	return spaceRun(s, i, end)
}

// splitDeepSeek3Main splits [i, end) by the main regex; text no
// alternative matches stays together as one piece.
func splitDeepSeek3Main(s string, i, end int, emit func(string)) {
	splitRuns(s, i, end, deepSeek3Match, emit, func(i, end int) { emit(s[i:end]) })
}

// contraction returns the width of 's|'t|'re|'ve|'m|'ll|'d at i (0 if none).
func contraction(s string, i, end int, fold bool) int {
	if i >= end || s[i] != '\'' || i+1 >= end {
		return 0
	}
	lower := func(c byte) byte {
		if fold && c >= 'A' && c <= 'Z' {
			return c + 32
		}
		return c
	}
	c := lower(s[i+1])
	switch c {
	case 's', 't', 'm', 'd':
		return 2
	}
	if i+2 < end {
		c2 := lower(s[i+2])
		if c == 'r' && c2 == 'e' || c == 'v' && c2 == 'e' || c == 'l' && c2 == 'l' {
			return 3
		}
	}
	return 0
}

// newlineRun matches \s*[\r\n]+ at i: the end of the whitespace run's
// last \r or \n, or -1 when the run holds none.
func newlineRun(s string, i, end int) int {
	last := -1
	for k := i; ; {
		r, w := at(s, k, end)
		if w == 0 || !isS(r) {
			return last
		}
		if isCR(r) {
			last = k + w
		}
		k += w
	}
}

// spaceRun matches \s+(?!\S)|\s+ at i, where r (width w) is the whitespace
// rune at i, and returns the end of the match.
func spaceRun(s string, i, end int) int {
	j := i
	last := i // start of the last whitespace rune in the run
	n := 0
	for {
		r, w := at(s, j, end)
		if w == 0 || !isS(r) {
			break
		}
		last = j
		j += w
		n++
	}
	if j >= end || n == 1 {
		// at end: \s+(?!\S) takes the whole run; a single space before
		// non-space: \s+(?!\S) fails, \s+ takes it.
		return j
	}
	return last // leave the last space to prefix the next token
}

func splitGPT2(s string, i, end int, emit func(string)) {
	for i < end {
		start := i
		if n := contraction(s, i, end, false); n > 0 {
			emit(s[i : i+n])
			i += n
			continue
		}
		r, w := at(s, i, end)
		j := i
		if r == ' ' {
			// the optional leading space of the next three alternatives
			if r2, _ := at(s, i+1, end); r2 != -1 && !isS(r2) {
				j = i + 1
				r, w = at(s, j, end)
			}
		}
		switch {
		case isL(r):
			j = scan(s, j, end, isL)
		case isN(r):
			j = scan(s, j, end, isN)
		case !isS(r):
			j = scan(s, j, end, func(r rune) bool { return !isS(r) && !isL(r) && !isN(r) })
		default:
			j = spaceRun(s, i, end)
		}
		_ = w
		emit(s[start:j])
		i = j
	}
}

func scan(s string, i, end int, f func(rune) bool) int {
	for i < end {
		r, w := at(s, i, end)
		if !f(r) {
			break
		}
		i += w
	}
	return i
}

func splitLlama3(s string, maxDigits int, emit func(string)) {
	end := len(s)
	for i := 0; i < end; {
		if n := contraction(s, i, end, true); n > 0 {
			emit(s[i : i+n])
			i += n
			continue
		}
		r, w := at(s, i, end)
		// [^\r\n\p{L}\p{N}]?\p{L}+
		if isL(r) {
			j := scan(s, i, end, isL)
			emit(s[i:j])
			i = j
			continue
		}
		if !isCR(r) && !isN(r) {
			if r2, _ := at(s, i+w, end); isL(r2) {
				j := scan(s, i+w, end, isL)
				emit(s[i:j])
				i = j
				continue
			}
		}
		// \p{N}{1,maxDigits}
		if isN(r) {
			j := i
			for k := 0; k < maxDigits; k++ {
				r2, w2 := at(s, j, end)
				if !isN(r2) {
					break
				}
				j += w2
			}
			emit(s[i:j])
			i = j
			continue
		}
		//  ?[^\s\p{L}\p{N}]+[\r\n]*
		punct := func(r rune) bool { return w != 0 && !isS(r) && !isL(r) && !isN(r) }
		j := i
		if r == ' ' {
			if r2, _ := at(s, i+1, end); r2 != -1 && punct(r2) {
				j = i + 1
			}
		}
		if r3, _ := at(s, j, end); r3 != -1 && punct(r3) {
			j = scan(s, j, end, punct)
			j = scan(s, j, end, isCR)
			emit(s[i:j])
			i = j
			continue
		}
		// here r is whitespace. \s*[\r\n]+: up to the last \r or \n of the run.
		if lastCR := newlineRun(s, i, end); lastCR > 0 {
			emit(s[i:lastCR])
			i = lastCR
			continue
		}
		j = spaceRun(s, i, end)
		emit(s[i:j])
		i = j
	}
}
