package jinja

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// filterFn is a filter: v | name(args).
type filterFn func(e *evaluator, v any, args []any, kw *dict) (any, error)

var filters map[string]filterFn

func init() {
	filters = map[string]filterFn{
		"trim": func(e *evaluator, v any, args []any, kw *dict) (any, error) {
			s, err := e.str(v)
			if err != nil {
				return nil, err
			}
			if c := arg(args, kw, 0, "chars", nil); c != nil {
				return strings.Trim(s, str(c)), nil
			}
			return strings.TrimSpace(s), nil
		},
		"upper":      strFilter(strings.ToUpper),
		"lower":      strFilter(strings.ToLower),
		"title":      strFilter(title),
		"capitalize": strFilter(capitalize),
		"string":     func(e *evaluator, v any, _ []any, _ *dict) (any, error) { return e.str(v) },
		"safe":       func(_ *evaluator, v any, _ []any, _ *dict) (any, error) { return v, nil },
		"length":     lengthFilter,
		"count":      lengthFilter,
		"first": func(_ *evaluator, v any, _ []any, _ *dict) (any, error) {
			xs, ok := items(v)
			if !ok || len(xs) == 0 {
				return undefined{"first"}, nil
			}
			return xs[0], nil
		},
		"last": func(_ *evaluator, v any, _ []any, _ *dict) (any, error) {
			xs, ok := items(v)
			if !ok || len(xs) == 0 {
				return undefined{"last"}, nil
			}
			return xs[len(xs)-1], nil
		},
		"join": func(e *evaluator, v any, args []any, kw *dict) (any, error) {
			sep, err := argStr(args, kw, 0, "d", "")
			if err != nil {
				return nil, err
			}
			var attr *string
			if a := arg(args, kw, 1, "attribute", nil); a != nil {
				s := str(a)
				attr = &s
			}
			return join(e, v, sep, attr)
		},
		"default": defaultFilter,
		"d":       defaultFilter,
		"replace": func(e *evaluator, v any, args []any, kw *dict) (any, error) {
			s, err := e.str(v)
			if err != nil {
				return nil, err
			}
			return replace(e, s, args, kw)
		},
		"list": func(e *evaluator, v any, _ []any, _ *dict) (any, error) {
			xs, ok := items(v)
			if !ok {
				return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
			}
			return append([]any(nil), xs...), e.items(int64(len(xs)))
		},
		"int": func(_ *evaluator, v any, args []any, kw *dict) (any, error) {
			def := arg(args, kw, 0, "default", int64(0))
			switch x := v.(type) {
			case int64:
				return x, nil
			case bool:
				n, _ := toInt(x)
				return n, nil
			case float64:
				if math.IsNaN(x) || math.Abs(x) > 9e18 {
					return def, nil
				}
				return int64(x), nil
			case string:
				if n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64); err == nil {
					return n, nil
				}
				if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil && math.Abs(f) <= 9e18 {
					return int64(f), nil
				}
			}
			return def, nil
		},
		"float": func(_ *evaluator, v any, args []any, kw *dict) (any, error) {
			if f, ok := toFloat(v); ok {
				return f, nil
			}
			if s, ok := v.(string); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
					return f, nil
				}
			}
			return arg(args, kw, 0, "default", 0.0), nil
		},
		"abs": func(_ *evaluator, v any, _ []any, _ *dict) (any, error) {
			switch x := v.(type) {
			case int64:
				if x == math.MinInt64 {
					return nil, errOverflow
				}
				return abs(x), nil
			case float64:
				return math.Abs(x), nil
			}
			return nil, fmt.Errorf("bad operand type for abs(): '%s'", typeName(v))
		},
		"round": func(_ *evaluator, v any, args []any, kw *dict) (any, error) {
			f, ok := toFloat(v)
			if !ok {
				return nil, fmt.Errorf("round needs a number, not %s", typeName(v))
			}
			p, _ := toInt(arg(args, kw, 0, "precision", int64(0)))
			m := math.Pow(10, float64(p))
			return math.RoundToEven(f*m) / m, nil
		},
		"items": func(e *evaluator, v any, _ []any, _ *dict) (any, error) {
			d, ok := v.(*dict)
			if !ok {
				if _, u := v.(undefined); u {
					return []any{}, nil
				}
				return nil, fmt.Errorf("items needs a mapping, not %s", typeName(v))
			}
			return dictMethod(d, "items")(e, nil, nil)
		},
		"dictsort": func(e *evaluator, v any, args []any, kw *dict) (any, error) {
			d, ok := v.(*dict)
			if !ok {
				return nil, fmt.Errorf("dictsort needs a mapping, not %s", typeName(v))
			}
			its, _ := dictMethod(d, "items")(e, nil, nil)
			xs := its.([]any)
			rev := truthy(arg(args, kw, 2, "reverse", false))
			return xs, sortValues(xs, func(x any) any { return x.(tuple)[0] }, rev)
		},
		"reverse": func(e *evaluator, v any, _ []any, _ *dict) (any, error) {
			if s, ok := v.(string); ok {
				r := []rune(s)
				for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
					r[i], r[j] = r[j], r[i]
				}
				return string(r), nil
			}
			xs, ok := items(v)
			if !ok {
				return nil, fmt.Errorf("'%s' object is not reversible", typeName(v))
			}
			out := make([]any, len(xs))
			for i, x := range xs {
				out[len(xs)-1-i] = x
			}
			return out, e.items(int64(len(out)))
		},
		"sort": func(e *evaluator, v any, args []any, kw *dict) (any, error) {
			xs, ok := items(v)
			if !ok {
				return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
			}
			if err := e.size(int64(len(xs)) * 8); err != nil {
				return nil, err
			}
			out := append([]any(nil), xs...)
			rev := truthy(arg(args, kw, 0, "reverse", false))
			attr := arg(args, kw, 2, "attribute", nil)
			key := func(x any) any {
				if attr != nil {
					a, _ := getAttr(x, str(attr), 0)
					return a
				}
				return x
			}
			return out, sortValues(out, key, rev)
		},
		"unique": func(e *evaluator, v any, _ []any, _ *dict) (any, error) {
			xs, ok := items(v)
			if !ok {
				return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
			}
			if err := e.step(int64(len(xs)) * int64(len(xs)) / 64); err != nil {
				return nil, err
			}
			var out []any
			for _, x := range xs {
				seen := false
				for _, y := range out {
					seen = seen || equal(x, y)
				}
				if !seen {
					out = append(out, x)
				}
			}
			return out, nil
		},
		"sum": func(e *evaluator, v any, args []any, kw *dict) (any, error) {
			xs, ok := items(v)
			if !ok {
				return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
			}
			total := arg(args, kw, 1, "start", int64(0))
			for _, x := range xs {
				if a := arg(args, kw, 0, "attribute", nil); a != nil {
					x, _ = getAttr(x, str(a), 0)
				}
				var err error
				if total, err = e.add(total, x); err != nil {
					return nil, err
				}
			}
			return total, nil
		},
		"min": extremum(-1),
		"max": extremum(1),
		"tojson": func(e *evaluator, v any, args []any, kw *dict) (any, error) {
			indent := arg(args, kw, 0, "indent", nil)
			return toJSON(e, v, indent, truthy(arg(args, kw, 1, "sort_keys", false)))
		},
		"indent": func(e *evaluator, v any, args []any, kw *dict) (any, error) {
			s, err := e.str(v)
			if err != nil {
				return nil, err
			}
			w := arg(args, kw, 0, "width", int64(4))
			pad, ok := w.(string)
			if !ok {
				n, _ := toInt(w)
				if err := e.fits(n); err != nil {
					return nil, err
				}
				pad = strings.Repeat(" ", int(max(n, 0)))
			}
			lines := strings.Split(s, "\n")
			if err := e.size(int64(len(s)) + int64(len(lines))*int64(len(pad))); err != nil {
				return nil, err
			}
			first, blank := truthy(arg(args, kw, 1, "first", false)), truthy(arg(args, kw, 2, "blank", false))
			for i := range lines {
				if (i > 0 || first) && (blank || strings.TrimSpace(lines[i]) != "") {
					lines[i] = pad + lines[i]
				}
			}
			return strings.Join(lines, "\n"), nil
		},
		"wordcount": func(e *evaluator, v any, _ []any, _ *dict) (any, error) {
			s, err := e.str(v)
			return int64(len(strings.Fields(s))), err
		},
		"selectattr": selectFilter(true, true),
		"rejectattr": selectFilter(false, true),
		"select":     selectFilter(true, false),
		"reject":     selectFilter(false, false),
		"map":        mapFilter,
	}
}

func strFilter(f func(string) string) filterFn {
	return func(e *evaluator, v any, _ []any, _ *dict) (any, error) {
		s, err := e.str(v)
		if err != nil {
			return nil, err
		}
		return f(s), nil
	}
}

func lengthFilter(_ *evaluator, v any, _ []any, _ *dict) (any, error) {
	switch x := v.(type) {
	case string:
		return int64(utf8.RuneCountInString(x)), nil
	case *dict:
		return int64(x.len()), nil
	case *namespace:
		return int64(x.attrs.len()), nil
	case undefined:
		return int64(0), nil
	}
	if xs, ok := seq(v); ok {
		return int64(len(xs)), nil
	}
	return nil, fmt.Errorf("object of type '%s' has no len()", typeName(v))
}

func defaultFilter(_ *evaluator, v any, args []any, kw *dict) (any, error) {
	def := arg(args, kw, 0, "default_value", "")
	_, undef := v.(undefined)
	if undef || truthy(arg(args, kw, 1, "boolean", false)) && !truthy(v) {
		return def, nil
	}
	return v, nil
}

func extremum(sign int) filterFn {
	return func(_ *evaluator, v any, args []any, kw *dict) (any, error) {
		xs, ok := items(v)
		if !ok || len(xs) == 0 {
			return undefined{"an empty sequence's extremum"}, nil
		}
		attr := arg(args, kw, 1, "attribute", nil)
		key := func(x any) any {
			if attr != nil {
				a, _ := getAttr(x, str(attr), 0)
				return a
			}
			return x
		}
		best := xs[0]
		for _, x := range xs[1:] {
			c, err := compare(key(x), key(best))
			if err != nil {
				return nil, err
			}
			if c*sign > 0 {
				best = x
			}
		}
		return best, nil
	}
}

// selectFilter is select/reject (by a test on the item) and
// selectattr/rejectattr (by a test on an attribute; truthiness without one).
func selectFilter(keep, byAttr bool) filterFn {
	return func(e *evaluator, v any, args []any, _ *dict) (any, error) {
		xs, ok := items(v)
		if !ok {
			return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
		}
		var attr string
		if byAttr {
			if len(args) == 0 {
				return nil, errors.New("needs an attribute name")
			}
			attr, args = str(args[0]), args[1:]
		}
		var test testFn
		if len(args) > 0 {
			if test = tests[str(args[0])]; test == nil {
				return nil, fmt.Errorf("no test named %q", str(args[0]))
			}
			args = args[1:]
		}
		var out []any
		for _, x := range xs {
			if err := e.step(1); err != nil {
				return nil, err
			}
			y := x
			if byAttr {
				var err error
				if y, err = getAttr(x, attr, 0); err != nil {
					y = undefined{attr}
				}
			}
			pass := truthy(y)
			if test != nil {
				var err error
				if pass, err = test(y, args); err != nil {
					return nil, err
				}
			}
			if pass == keep {
				out = append(out, x)
			}
		}
		return out, nil
	}
}

func mapFilter(e *evaluator, v any, args []any, kw *dict) (any, error) {
	xs, ok := items(v)
	if !ok {
		return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
	}
	out := make([]any, len(xs))
	if a := arg(nil, kw, 0, "attribute", nil); a != nil {
		def := arg(nil, kw, 0, "default", nil)
		for i, x := range xs {
			y, err := getAttr(x, str(a), 0)
			if err != nil {
				return nil, err
			}
			if _, u := y.(undefined); u && def != nil {
				y = def
			}
			out[i] = y
		}
		return out, e.items(int64(len(out)))
	}
	if len(args) == 0 {
		return nil, errors.New("map needs a filter name or attribute=")
	}
	f := filters[str(args[0])]
	if f == nil {
		return nil, fmt.Errorf("no filter named %q", str(args[0]))
	}
	for i, x := range xs {
		y, err := f(e, x, args[1:], nil)
		if err != nil {
			return nil, err
		}
		out[i] = y
	}
	return out, e.items(int64(len(out)))
}
