package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxRange bounds range()'s length, as jinja2's sandbox does (MAX_RANGE).
const maxRange = 100_000

// globals are the functions every template sees.
var globals = &scope{vars: map[string]any{
	"range":     &builtin{name: "range", fn: rangeFn},
	"namespace": &builtin{name: "namespace", fn: namespaceFn},
	"dict":      &builtin{name: "dict", fn: dictFn},
}}

func rangeFn(e *evaluator, args []any, _ *dict) (any, error) {
	var lo, hi, step int64 = 0, 0, 1
	ns := make([]int64, len(args))
	for i, a := range args {
		n, ok := toInt(a)
		if !ok {
			return nil, fmt.Errorf("'%s' object cannot be interpreted as an integer", typeName(a))
		}
		ns[i] = n
	}
	switch len(ns) {
	case 1:
		hi = ns[0]
	case 2:
		lo, hi = ns[0], ns[1]
	case 3:
		lo, hi, step = ns[0], ns[1], ns[2]
	default:
		return nil, fmt.Errorf("range expected 1 to 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return nil, errors.New("range() arg 3 must not be zero")
	}
	var n float64
	if step > 0 && hi > lo {
		n = math.Ceil((float64(hi) - float64(lo)) / float64(step))
	} else if step < 0 && hi < lo {
		n = math.Ceil((float64(lo) - float64(hi)) / float64(-step))
	}
	if n > maxRange {
		return nil, &LimitError{"bytes", fmt.Sprintf("range of %.0f items, more than %d", n, maxRange)}
	}
	if err := e.items(int64(n)); err != nil {
		return nil, err
	}
	out := make([]any, 0, int(n))
	for i := lo; (step > 0 && i < hi) || (step < 0 && i > hi); i += step {
		out = append(out, i)
	}
	return out, nil
}

func namespaceFn(_ *evaluator, args []any, kw *dict) (any, error) {
	ns := &namespace{attrs: newDict()}
	for _, a := range args {
		d, ok := a.(*dict)
		if !ok {
			return nil, fmt.Errorf("namespace() takes a dict, not %s", typeName(a))
		}
		for _, k := range d.keys {
			v, _ := d.get(k)
			ns.attrs.set(k, v) //nolint:errcheck // keys of a dict
		}
	}
	if kw != nil {
		for _, k := range kw.keys {
			v, _ := kw.get(k)
			ns.attrs.set(k, v) //nolint:errcheck // string keys
		}
	}
	return ns, nil
}

func dictFn(e *evaluator, args []any, kw *dict) (any, error) {
	ns, err := namespaceFn(e, args, kw)
	if err != nil {
		return nil, err
	}
	return ns.(*namespace).attrs, nil
}

// arg is positional argument i or keyword name, else def.
func arg(args []any, kw *dict, i int, name string, def any) any {
	if i < len(args) {
		return args[i]
	}
	if kw != nil {
		if v, ok := kw.get(name); ok {
			return v
		}
	}
	return def
}

func argStr(args []any, kw *dict, i int, name, def string) (string, error) {
	v := arg(args, kw, i, name, def)
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("argument %s must be a string, not %s", name, typeName(v))
	}
	return s, nil
}

// method is obj.name as a bound method, or nil when its type has none.
func method(obj any, name string) *builtin {
	var fn func(e *evaluator, args []any, kw *dict) (any, error)
	switch o := obj.(type) {
	case string:
		fn = strMethod(o, name)
	case *dict:
		fn = dictMethod(o, name)
	case []any, tuple:
		xs, _ := seq(o)
		fn = listMethod(xs, name)
	}
	if fn == nil {
		return nil
	}
	return &builtin{name: name, fn: fn}
}

func dictMethod(d *dict, name string) func(e *evaluator, args []any, kw *dict) (any, error) {
	switch name {
	case "items":
		return func(e *evaluator, _ []any, _ *dict) (any, error) {
			out := make([]any, len(d.keys))
			for i, k := range d.keys {
				v, _ := d.get(k)
				out[i] = tuple{k, v}
			}
			return out, e.items(int64(len(out)))
		}
	case "keys":
		return func(e *evaluator, _ []any, _ *dict) (any, error) {
			return append([]any(nil), d.keys...), e.items(int64(len(d.keys)))
		}
	case "values":
		return func(e *evaluator, _ []any, _ *dict) (any, error) {
			out := make([]any, len(d.keys))
			for i, k := range d.keys {
				out[i], _ = d.get(k)
			}
			return out, e.items(int64(len(out)))
		}
	case "get":
		return func(_ *evaluator, args []any, kw *dict) (any, error) {
			if len(args) == 0 {
				return nil, errors.New("get expected at least 1 argument")
			}
			if v, ok := d.get(args[0]); ok {
				return v, nil
			}
			return arg(args, kw, 1, "default", nil), nil
		}
	}
	return nil
}

func listMethod(xs []any, name string) func(e *evaluator, args []any, kw *dict) (any, error) {
	switch name {
	case "index":
		return func(_ *evaluator, args []any, _ *dict) (any, error) {
			for i, x := range xs {
				if len(args) > 0 && equal(x, args[0]) {
					return int64(i), nil
				}
			}
			return nil, errors.New("value is not in list")
		}
	case "count":
		return func(_ *evaluator, args []any, _ *dict) (any, error) {
			n := int64(0)
			for _, x := range xs {
				if len(args) > 0 && equal(x, args[0]) {
					n++
				}
			}
			return n, nil
		}
	}
	return nil
}

func strMethod(s, name string) func(e *evaluator, args []any, kw *dict) (any, error) {
	strip := func(f func(string, string) string, g func(string) string) func(*evaluator, []any, *dict) (any, error) {
		return func(_ *evaluator, args []any, kw *dict) (any, error) {
			chars := arg(args, kw, 0, "chars", nil)
			if chars == nil {
				return g(s), nil
			}
			c, ok := chars.(string)
			if !ok {
				return nil, fmt.Errorf("strip arg must be None or str, not %s", typeName(chars))
			}
			return f(s, c), nil
		}
	}
	switch name {
	case "strip":
		return strip(strings.Trim, strings.TrimSpace)
	case "lstrip":
		return strip(strings.TrimLeft, func(x string) string { return strings.TrimLeftFunc(x, unicode.IsSpace) })
	case "rstrip":
		return strip(strings.TrimRight, func(x string) string { return strings.TrimRightFunc(x, unicode.IsSpace) })
	case "upper":
		return func(*evaluator, []any, *dict) (any, error) { return strings.ToUpper(s), nil }
	case "lower":
		return func(*evaluator, []any, *dict) (any, error) { return strings.ToLower(s), nil }
	case "title":
		return func(*evaluator, []any, *dict) (any, error) { return title(s), nil }
	case "capitalize":
		return func(*evaluator, []any, *dict) (any, error) { return capitalize(s), nil }
	case "startswith", "endswith":
		return func(_ *evaluator, args []any, _ *dict) (any, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%s takes a prefix", name)
			}
			cands := []any{args[0]}
			if t, ok := seq(args[0]); ok {
				cands = t
			}
			for _, c := range cands {
				p, ok := c.(string)
				if !ok {
					return nil, fmt.Errorf("%s arg must be str or a tuple of str, not %s", name, typeName(c))
				}
				if name == "startswith" && strings.HasPrefix(s, p) || name == "endswith" && strings.HasSuffix(s, p) {
					return true, nil
				}
			}
			return false, nil
		}
	case "split", "rsplit":
		return func(e *evaluator, args []any, kw *dict) (any, error) { return split(e, s, name == "rsplit", args, kw) }
	case "splitlines":
		return func(e *evaluator, _ []any, _ *dict) (any, error) {
			lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
			return strList(lines), e.items(int64(len(lines)))
		}
	case "replace":
		return func(e *evaluator, args []any, kw *dict) (any, error) { return replace(e, s, args, kw) }
	case "find", "rfind", "count":
		return func(_ *evaluator, args []any, kw *dict) (any, error) {
			sub, err := argStr(args, kw, 0, "sub", "")
			if err != nil {
				return nil, err
			}
			switch name {
			case "find":
				return int64(strings.Index(s, sub)), nil
			case "rfind":
				return int64(strings.LastIndex(s, sub)), nil
			}
			return int64(strings.Count(s, sub)), nil
		}
	case "join":
		return func(e *evaluator, args []any, _ *dict) (any, error) {
			if len(args) == 0 {
				return nil, errors.New("join takes an iterable")
			}
			return join(e, args[0], s, nil)
		}
	case "isdigit", "isspace", "isalpha", "isalnum", "islower", "isupper":
		return func(*evaluator, []any, *dict) (any, error) { return strIs(s, name), nil }
	case "format":
		return nil // str.format is not offered: a template can do without it
	}
	return nil
}

func strList(ss []string) []any {
	out := make([]any, len(ss))
	for i, x := range ss {
		out[i] = x
	}
	return out
}

func split(e *evaluator, s string, fromRight bool, args []any, kw *dict) (any, error) {
	sep := arg(args, kw, 0, "sep", nil)
	maxv, ok := toInt(arg(args, kw, 1, "maxsplit", int64(-1)))
	if !ok {
		return nil, errors.New("maxsplit must be an integer")
	}
	var parts []string
	if sep == nil {
		parts = strings.Fields(s)
		if maxv >= 0 && int64(len(parts)) > maxv+1 {
			// Rejoining keeps the original spacing of the unsplit tail
			// only approximately; templates split on a separator.
			parts = strings.SplitN(strings.TrimSpace(s), " ", int(maxv+1))
		}
	} else {
		sp, ok := sep.(string)
		if !ok || sp == "" {
			return nil, errors.New("split separator must be a non-empty string")
		}
		switch {
		case maxv < 0:
			parts = strings.Split(s, sp)
		case fromRight:
			all := strings.Split(s, sp)
			if int64(len(all)) > maxv+1 {
				cut := int64(len(all)) - maxv
				head := strings.Join(all[:cut], sp)
				parts = append([]string{head}, all[cut:]...)
			} else {
				parts = all
			}
		default:
			parts = strings.SplitN(s, sp, int(maxv+1))
		}
	}
	return strList(parts), e.items(int64(len(parts)))
}

func replace(e *evaluator, s string, args []any, kw *dict) (any, error) {
	old, err := argStr(args, kw, 0, "old", "")
	if err != nil {
		return nil, err
	}
	nw, err := argStr(args, kw, 1, "new", "")
	if err != nil {
		return nil, err
	}
	n, ok := toInt(arg(args, kw, 2, "count", int64(-1)))
	if !ok {
		return nil, errors.New("count must be an integer")
	}
	hits := int64(strings.Count(s, old))
	if n >= 0 {
		hits = min(hits, n)
	}
	if err := e.size(int64(len(s)) + hits*(int64(len(nw))-int64(len(old)))); err != nil {
		return nil, err
	}
	return strings.Replace(s, old, nw, int(n)), nil
}

func strIs(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		var ok bool
		switch name {
		case "isdigit":
			ok = unicode.IsDigit(r)
		case "isspace":
			ok = unicode.IsSpace(r)
		case "isalpha":
			ok = unicode.IsLetter(r)
		case "isalnum":
			ok = unicode.IsLetter(r) || unicode.IsDigit(r)
		case "islower":
			if unicode.IsUpper(r) {
				return false
			}
			cased = cased || unicode.IsLower(r)
			ok = true
		case "isupper":
			if unicode.IsLower(r) {
				return false
			}
			cased = cased || unicode.IsUpper(r)
			ok = true
		}
		if !ok {
			return false
		}
	}
	if name == "islower" || name == "isupper" {
		return cased
	}
	return true
}

func title(s string) string {
	var b strings.Builder
	prev := false
	for _, r := range s {
		if unicode.IsLetter(r) {
			if prev {
				b.WriteRune(unicode.ToLower(r))
			} else {
				b.WriteRune(unicode.ToUpper(r))
			}
			prev = true
		} else {
			b.WriteRune(r)
			prev = false
		}
	}
	return b.String()
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	// The width of the first rune as it is in s: an invalid byte decodes to
	// RuneError, which is one byte wide here but three when re-encoded.
	r, w := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + strings.ToLower(s[w:])
}

// join concatenates the items of v (their attribute attr, if given) with sep.
func join(e *evaluator, v any, sep string, attr *string) (any, error) {
	xs, ok := items(v)
	if !ok {
		return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
	}
	var b strings.Builder
	for i, x := range xs {
		if attr != nil {
			var err error
			if x, err = getAttr(x, *attr, 0); err != nil {
				return nil, err
			}
		}
		if i > 0 {
			b.WriteString(sep)
		}
		xs, err := e.str(x)
		if err != nil {
			return nil, err
		}
		b.WriteString(xs)
		if err := e.fits(int64(b.Len())); err != nil {
			return nil, err
		}
	}
	return b.String(), e.size(int64(b.Len()))
}
