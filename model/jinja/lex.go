package jinja

import (
	"fmt"
	"strconv"
	"strings"
)

// segKind is what a piece of the template is.
type segKind int

const (
	segText segKind = iota
	segExpr         // {{ ... }}
	segStmt         // {% ... %}
)

// segment is one piece of the template: text, or a tag's tokens.
type segment struct {
	kind segKind
	text string
	toks []token
	line int
}

// scan cuts src into text and tags, applying whitespace control as
// HF's environment does: "-" strips all white space on its side, "+"
// keeps it, and otherwise block and comment tags have lstrip_blocks (the
// spaces and tabs before a tag that starts its line are dropped) and
// trim_blocks (the first newline after the tag is dropped).
func scan(src string) ([]segment, error) {
	sc := &scanner{src: src, line: 1, textLine: 1}
	for sc.i < len(src) {
		at := strings.Index(src[sc.i:], "{")
		if at < 0 || sc.i+at+1 >= len(src) {
			sc.emitText(src[sc.i:])
			break
		}
		open := src[sc.i+at+1]
		if open != '{' && open != '%' && open != '#' {
			sc.emitText(src[sc.i : sc.i+at+1])
			sc.i += at + 1
			continue
		}
		if err := sc.tag(at, open); err != nil {
			return nil, err
		}
	}
	sc.flush()
	return sc.segs, nil
}

// scanner is scan's state.
type scanner struct {
	src      string
	i        int // next byte of src
	line     int // line of src[i]
	segs     []segment
	text     strings.Builder // text since the last tag, trimmed
	textLine int
	trimNext int // 0: keep; 1: drop one newline; 2: drop all white space
}

// emitText appends s (the source from i, which it passes) to the text.
func (sc *scanner) emitText(s string) {
	sc.line += strings.Count(s, "\n")
	switch sc.trimNext {
	case 1:
		if strings.HasPrefix(s, "\r\n") {
			s = s[2:]
		} else if strings.HasPrefix(s, "\n") {
			s = s[1:]
		}
	case 2:
		s = strings.TrimLeft(s, " \t\r\n\f\v")
	}
	if s != "" {
		sc.trimNext = 0
	}
	sc.text.WriteString(s)
}

func (sc *scanner) flush() {
	if sc.text.Len() > 0 {
		sc.segs = append(sc.segs, segment{kind: segText, text: sc.text.String(), line: sc.textLine})
		sc.text.Reset()
	}
	sc.textLine = sc.line
}

// tag scans the tag opened at i+at ({{, {% or {#, by open).
func (sc *scanner) tag(at int, open byte) error {
	src := sc.src
	before := src[sc.i : sc.i+at]
	j := sc.i + at + 2
	mod := byte(0)
	if j < len(src) && (src[j] == '-' || src[j] == '+') {
		mod = src[j]
		j++
	}
	block := open == '%' || open == '#'
	emitted := len(before)
	switch {
	case mod == '-':
		before = strings.TrimRight(before, " \t\r\n\f\v")
	case mod != '+' && block:
		// lstrip_blocks: white space from the line's start up to the tag.
		k := strings.LastIndexByte(before, '\n')
		if (k >= 0 || sc.i == 0) && strings.Trim(before[k+1:], " \t") == "" {
			before = before[:k+1]
		}
	}
	tagLine := sc.line + strings.Count(src[sc.i:sc.i+emitted], "\n")
	sc.emitText(before)
	sc.line = tagLine
	closer := map[byte]string{'{': "}}", '%': "%}", '#': "#}"}[open]
	end, rmod, err := findClose(src, j, closer, open == '#')
	if err != nil {
		return fmt.Errorf("line %d: %w", tagLine, err)
	}
	after := end + len(closer)
	if rmod != 0 {
		after++
	}
	sc.line += strings.Count(src[j:after], "\n")
	switch {
	case rmod == '-':
		sc.trimNext = 2
	case rmod != '+' && block:
		sc.trimNext = 1
	default:
		sc.trimNext = 0
	}
	sc.i = after
	if open == '#' {
		return nil
	}
	toks, err := lexExpr(src[j:end], tagLine)
	if err != nil {
		return err
	}
	sc.flush()
	if open == '{' {
		sc.segs = append(sc.segs, segment{kind: segExpr, toks: toks, line: tagLine})
		return nil
	}
	if len(toks) == 1 && toks[0].kind == tName && toks[0].s == "raw" {
		// {% raw %}: verbatim up to {% endraw %}.
		raw, next, err := rawBlock(src, sc.i, tagLine)
		if err != nil {
			return err
		}
		sc.line += strings.Count(src[sc.i:next], "\n")
		sc.text.WriteString(raw)
		sc.i, sc.trimNext = next, 1
		return nil
	}
	sc.segs = append(sc.segs, segment{kind: segStmt, toks: toks, line: tagLine})
	return nil
}

// findClose finds closer from j, outside string literals (not in
// comments); rmod is the '-' or '+' right before it (0 for none), and end
// is where the body ends (before the modifier).
func findClose(src string, j int, closer string, comment bool) (end int, rmod byte, err error) {
	depth := 0 // brackets open: "}}" inside {'a': {}} does not close the tag
	for k := j; k < len(src); k++ {
		c := src[k]
		if !comment {
			switch c {
			case '\'', '"':
				for k++; k < len(src) && src[k] != c; k++ {
					if src[k] == '\\' {
						k++
					}
				}
				continue
			case '(', '[', '{':
				depth++
				continue
			case ')', ']':
				depth = max(depth-1, 0)
				continue
			case '}':
				if depth > 0 {
					depth--
					continue
				}
			}
			if depth > 0 {
				continue
			}
		}
		if strings.HasPrefix(src[k:], closer) {
			return k, 0, nil
		}
		if (c == '-' || c == '+') && strings.HasPrefix(src[k+1:], closer) {
			return k, c, nil
		}
	}
	what := map[string]string{"}}": "{{", "%}": "{%", "#}": "{#"}[closer]
	return 0, 0, fmt.Errorf("%s is never closed by %s", what, closer)
}

// rawBlock is the verbatim text from i to the next {% endraw %}, and the
// position after that tag.
func rawBlock(src string, i, line int) (string, int, error) {
	for k := i; k < len(src); k++ {
		if !strings.HasPrefix(src[k:], "{%") {
			continue
		}
		j := k + 2
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			j++
		}
		end, _, err := findClose(src, j, "%}", false)
		if err != nil {
			break
		}
		if strings.TrimSpace(src[j:end]) == "endraw" {
			after := end + 2
			if src[end] == '-' || src[end] == '+' {
				after++
			}
			raw := src[i:k]
			if src[k+2] == '-' {
				raw = strings.TrimRight(raw, " \t\r\n")
			}
			return raw, after, nil
		}
	}
	return "", 0, fmt.Errorf("line %d: {%% raw %%} is never closed by {%% endraw %%}", line)
}

// tokKind is the kind of an expression token.
type tokKind int

const (
	tEOF tokKind = iota
	tName
	tString
	tInt
	tFloat
	tOp
)

// token is one token of a tag.
type token struct {
	kind tokKind
	s    string // name, operator or the string's value
	i    int64
	f    float64
	line int
}

// operators, longest first.
var operators = []string{"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
	"(", ")", "[", "]", "{", "}", ",", ":", ".", "|"}

// lexExpr splits a tag's body into tokens.
func lexExpr(s string, line int) ([]token, error) {
	var toks []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			toks = append(toks, token{kind: tName, s: s[i:j], line: line})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '_') {
				j++
			}
			isFloat := false
			if j+1 < len(s) && s[j] == '.' && s[j+1] >= '0' && s[j+1] <= '9' {
				isFloat = true
				for j++; j < len(s) && s[j] >= '0' && s[j] <= '9'; j++ {
				}
			}
			if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
				k := j + 1
				if k < len(s) && (s[k] == '+' || s[k] == '-') {
					k++
				}
				if k < len(s) && s[k] >= '0' && s[k] <= '9' {
					isFloat = true
					for j = k; j < len(s) && s[j] >= '0' && s[j] <= '9'; j++ {
					}
				}
			}
			lit := strings.ReplaceAll(s[i:j], "_", "")
			if isFloat {
				f, err := strconv.ParseFloat(lit, 64)
				if err != nil {
					return nil, fmt.Errorf("line %d: bad number %q", line, s[i:j])
				}
				toks = append(toks, token{kind: tFloat, f: f, line: line})
			} else {
				n, err := strconv.ParseInt(lit, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("line %d: integer %s is out of range", line, s[i:j])
				}
				toks = append(toks, token{kind: tInt, i: n, line: line})
			}
			i = j
		case c == '\'' || c == '"':
			v, n, err := unquote(s[i:])
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			toks = append(toks, token{kind: tString, s: v, line: line})
			line += strings.Count(s[i:i+n], "\n")
			i += n
		default:
			op := ""
			for _, o := range operators {
				if strings.HasPrefix(s[i:], o) {
					op = o
					break
				}
			}
			if op == "" {
				return nil, fmt.Errorf("line %d: unexpected character %q", line, c)
			}
			toks = append(toks, token{kind: tOp, s: op, line: line})
			i += len(op)
		}
	}
	return toks, nil
}

// unquote reads a Python string literal at the start of s: its value and
// its length in s.
func unquote(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return b.String(), i + 1, nil
		case c == '\\' && i+1 < len(s):
			i++
			switch e := s[i]; e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '0':
				b.WriteByte(0)
			case '\\', '\'', '"':
				b.WriteByte(e)
			case '\n':
			case 'u', 'x':
				n := 4
				if e == 'x' {
					n = 2
				}
				if i+n >= len(s) {
					return "", 0, fmt.Errorf("bad \\%c escape in a string", e)
				}
				r, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
				if err != nil {
					return "", 0, fmt.Errorf("bad \\%c escape in a string", e)
				}
				b.WriteRune(rune(r))
				i += n
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("a string literal is never closed")
}
