package jinja

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Values are Go values: nil (Python's None), bool, int64, float64, string,
// list ([]any), tuple, *dict, *namespace, undefined, and the callables
// (*macro, *builtin). Integers are 64-bit: an overflow is an error, not a
// big number.

// undefined is a name or attribute that does not exist: it prints as "",
// is false and iterates as empty, and anything else done with it is an
// error naming it (jinja2's default Undefined).
type undefined struct{ name string }

// tuple is a Python tuple: a list that prints with parentheses.
type tuple []any

// dict is an insertion-ordered mapping; keys are strings or numbers.
type dict struct {
	keys []any
	vals map[dictKey]any
}

// dictKey is a key's identity: 1, 1.0 and True are one key, as in Python.
type dictKey struct {
	s    string
	n    float64
	isNo bool // a number (n), else a string (s)
}

func keyOf(k any) (dictKey, error) {
	switch x := k.(type) {
	case string:
		return dictKey{s: x}, nil
	case bool, int64, float64:
		f, _ := toFloat(x)
		return dictKey{n: f, isNo: true}, nil
	case nil:
		return dictKey{s: "\x00None"}, nil
	}
	return dictKey{}, fmt.Errorf("unhashable type: '%s'", typeName(k))
}

func newDict() *dict { return &dict{vals: map[dictKey]any{}} }

func (d *dict) set(k, v any) error {
	key, err := keyOf(k)
	if err != nil {
		return err
	}
	if _, ok := d.vals[key]; !ok {
		d.keys = append(d.keys, k)
	}
	d.vals[key] = v
	return nil
}

func (d *dict) get(k any) (any, bool) {
	key, err := keyOf(k)
	if err != nil {
		return nil, false
	}
	v, ok := d.vals[key]
	return v, ok
}

func (d *dict) len() int { return len(d.keys) }

// namespace is the mutable object of namespace(): `set ns.x = ...`
// assigns its attributes.
type namespace struct{ attrs *dict }

// typeName is the Python type name of v (for error messages).
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []any:
		return "list"
	case tuple:
		return "tuple"
	case *dict:
		return "dict"
	case *namespace:
		return "Namespace"
	case undefined:
		return "Undefined"
	case *macro:
		return "Macro"
	case *builtin:
		return "builtin_function"
	case *loopState:
		return "LoopContext"
	}
	return fmt.Sprintf("%T", v)
}

// truthy is Python's truth value.
func truthy(v any) bool {
	switch x := v.(type) {
	case nil, undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case tuple:
		return len(x) > 0
	case *dict:
		return x.len() > 0
	}
	return true
}

// items is v as a sequence to iterate: a list's items, a dict's keys, a
// string's characters; ok is false for what is not iterable.
func items(v any) ([]any, bool) {
	switch x := v.(type) {
	case []any:
		return x, true
	case tuple:
		return x, true
	case *dict:
		return append([]any(nil), x.keys...), true
	case string:
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, true
	case undefined:
		return nil, true
	}
	return nil, false
}

// toFloat is a number (bools count as 0 and 1, as in Python).
func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// toInt is an integer (a bool counts as 0 or 1).
func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return x, true
	}
	return 0, false
}

// str is Python's str(v); undefined prints as "". Containers are printed
// whole: renders use (*evaluator).str, which bounds them.
func str(v any) string {
	s, _ := strBounded(v, 0)
	return s
}

// strBounded is str(v), or false when it would exceed limit bytes (0: no
// limit); the printing stops at the limit.
func strBounded(v any, limit int64) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, limit == 0 || int64(len(x)) <= limit
	case undefined:
		return "", true
	}
	b := &reprBuf{max: limit}
	writeRepr(b, v, false)
	return b.String(), !b.over
}

// reprBuf is a builder that stops taking text past max bytes (0: never).
type reprBuf struct {
	strings.Builder
	max  int64
	over bool
}

func (b *reprBuf) room(n int) bool {
	if b.over || b.max > 0 && int64(b.Len()+n) > b.max {
		b.over = true
		return false
	}
	return true
}

func (b *reprBuf) WriteString(s string) (int, error) {
	if !b.room(len(s)) {
		return 0, nil
	}
	return b.Builder.WriteString(s)
}

func (b *reprBuf) WriteByte(c byte) error {
	if !b.room(1) {
		return nil
	}
	return b.Builder.WriteByte(c)
}

func (b *reprBuf) WriteRune(r rune) (int, error) {
	if !b.room(utf8.RuneLen(r)) {
		return 0, nil
	}
	return b.Builder.WriteRune(r)
}

// writeRepr writes Python's repr(v) (str(v) at the top level when top).
func writeRepr(b *reprBuf, v any, quote bool) {
	if b.over {
		return
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(formatFloat(x))
	case string:
		if quote {
			if b.room(len(x) + 2) {
				b.WriteString(pyQuote(x))
			}
		} else {
			b.WriteString(x)
		}
	case undefined:
	case []any:
		b.WriteByte('[')
		for i, it := range x {
			if b.over {
				return
			}
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, it, true)
		}
		b.WriteByte(']')
	case tuple:
		b.WriteByte('(')
		for i, it := range x {
			if b.over {
				return
			}
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, it, true)
		}
		if len(x) == 1 {
			b.WriteByte(',')
		}
		b.WriteByte(')')
	case *dict:
		b.WriteByte('{')
		for i, k := range x.keys {
			if b.over {
				return
			}
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, k, true)
			b.WriteString(": ")
			v, _ := x.get(k)
			writeRepr(b, v, true)
		}
		b.WriteByte('}')
	case *namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, x.attrs, true)
		b.WriteByte('>')
	case *loopState:
		b.WriteString("<LoopContext " + strconv.Itoa(x.i+1) + "/" + strconv.Itoa(len(x.xs)) + ">")
	case *macro:
		b.WriteString("<Macro '" + x.def.name + "'>")
	case *builtin:
		b.WriteString("<built-in function " + x.name + ">")
	default:
		b.WriteString(fmt.Sprint(x))
	}
}

// formatFloat is Python's repr of a float: the shortest digits that read
// back, in fixed notation for exponents in [-4, 16), else as 1e+16.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	if exp >= -4 && exp < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if exp < 0 {
		sign, exp = "-", -exp
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, exp)
}

// pyQuote is Python's repr of a string.
func pyQuote(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// equal is Python's ==.
func equal(a, b any) bool {
	if fa, ok := toFloat(a); ok {
		fb, ok := toFloat(b)
		return ok && fa == fb
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		y, ok := b.(string)
		return ok && x == y
	case undefined:
		_, ok := b.(undefined)
		return ok
	case []any:
		y, ok := b.([]any)
		return ok && equalSeq(x, y)
	case tuple:
		y, ok := b.(tuple)
		return ok && equalSeq(x, y)
	case *dict:
		y, ok := b.(*dict)
		if !ok || x.len() != y.len() {
			return false
		}
		for _, k := range x.keys {
			xv, _ := x.get(k)
			yv, ok := y.get(k)
			if !ok || !equal(xv, yv) {
				return false
			}
		}
		return true
	}
	return a == b
}

func equalSeq(x, y []any) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if !equal(x[i], y[i]) {
			return false
		}
	}
	return true
}

// compare is Python's ordering of numbers, strings and sequences; other
// pairs are an error.
func compare(a, b any) (int, error) {
	if fa, ok := toFloat(a); ok {
		if fb, ok := toFloat(b); ok {
			switch {
			case fa < fb:
				return -1, nil
			case fa > fb:
				return 1, nil
			}
			return 0, nil
		}
	}
	if sa, ok := a.(string); ok {
		if sb, ok := b.(string); ok {
			return strings.Compare(sa, sb), nil
		}
	}
	la, aok := seq(a)
	lb, bok := seq(b)
	if aok && bok {
		for i := 0; i < len(la) && i < len(lb); i++ {
			if !equal(la[i], lb[i]) {
				return compare(la[i], lb[i])
			}
		}
		return len(la) - len(lb), nil
	}
	return 0, fmt.Errorf("'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

// seq is a list's or tuple's items.
func seq(v any) ([]any, bool) {
	switch x := v.(type) {
	case []any:
		return x, true
	case tuple:
		return x, true
	}
	return nil, false
}

// sortValues sorts vs in place by key(v) (stable), failing on values that
// do not compare.
func sortValues(vs []any, key func(any) any, reverse bool) error {
	var err error
	sort.SliceStable(vs, func(i, j int) bool {
		c, e := compare(key(vs[i]), key(vs[j]))
		if e != nil && err == nil {
			err = e
		}
		if reverse {
			return c > 0
		}
		return c < 0
	})
	return err
}

// fromGo converts the data a caller renders with (strings, numbers, bools,
// maps, slices of those) into template values.
func fromGo(v any) any {
	switch x := v.(type) {
	case nil, bool, int64, float64, string:
		return x
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case []any:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = fromGo(it)
		}
		return out
	case []string:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = it
		}
		return out
	case []map[string]any:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = fromGo(it)
		}
		return out
	case map[string]any:
		d := newDict()
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys) // a Go map has no order: a stable one
		for _, k := range keys {
			d.set(k, fromGo(x[k])) //nolint:errcheck // string keys
		}
		return d
	case Ordered:
		d := newDict()
		for _, kv := range x {
			d.set(kv.Key, fromGo(kv.Value)) //nolint:errcheck // string keys
		}
		return d
	case func(args ...any) (any, error):
		return &builtin{name: "function", fn: func(_ *evaluator, args []any, _ *dict) (any, error) { return x(args...) }}
	}
	return fmt.Sprint(v)
}

// Ordered is a mapping whose keys keep their order (a chat message:
// role first, then content), for Render's data.
type Ordered []KV

// KV is one entry of an Ordered mapping.
type KV struct {
	Key   string
	Value any
}
