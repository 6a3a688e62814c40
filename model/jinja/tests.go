package jinja

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// testFn is a test: v is name(args).
type testFn func(v any, args []any) (bool, error)

var tests map[string]testFn

func init() {
	tests = map[string]testFn{
		"defined":   func(v any, _ []any) (bool, error) { _, u := v.(undefined); return !u, nil },
		"undefined": func(v any, _ []any) (bool, error) { _, u := v.(undefined); return u, nil },
		"none":      func(v any, _ []any) (bool, error) { return v == nil, nil },
		"boolean":   func(v any, _ []any) (bool, error) { _, ok := v.(bool); return ok, nil },
		"true":      func(v any, _ []any) (bool, error) { return v == true, nil },
		"false":     func(v any, _ []any) (bool, error) { return v == false, nil },
		"string":    func(v any, _ []any) (bool, error) { _, ok := v.(string); return ok, nil },
		"number": func(v any, _ []any) (bool, error) {
			switch v.(type) {
			case int64, float64:
				return true, nil
			}
			return false, nil
		},
		"integer": func(v any, _ []any) (bool, error) { _, ok := v.(int64); return ok, nil },
		"float":   func(v any, _ []any) (bool, error) { _, ok := v.(float64); return ok, nil },
		"mapping": func(v any, _ []any) (bool, error) {
			switch v.(type) {
			case *dict, *namespace:
				return true, nil
			}
			return false, nil
		},
		"sequence": func(v any, _ []any) (bool, error) {
			switch v.(type) {
			case string, []any, tuple, *dict:
				return true, nil
			}
			return false, nil
		},
		"iterable": func(v any, _ []any) (bool, error) {
			switch v.(type) {
			case string, []any, tuple, *dict:
				return true, nil
			}
			return false, nil
		},
		"callable": func(v any, _ []any) (bool, error) {
			switch v.(type) {
			case *macro, *builtin:
				return true, nil
			}
			return false, nil
		},
		"even":        intTest(func(n, _ int64) bool { return n%2 == 0 }),
		"odd":         intTest(func(n, _ int64) bool { return n%2 != 0 }),
		"divisibleby": intTest(func(n, d int64) bool { return d != 0 && n%d == 0 }),
		"eq":          cmpTest("=="),
		"equalto":     cmpTest("=="),
		"==":          cmpTest("=="),
		"ne":          cmpTest("!="),
		"!=":          cmpTest("!="),
		"lt":          cmpTest("<"),
		"lessthan":    cmpTest("<"),
		"le":          cmpTest("<="),
		"gt":          cmpTest(">"),
		"greaterthan": cmpTest(">"),
		"ge":          cmpTest(">="),
		"in":          cmpTest("in"),
		"sameas": func(v any, args []any) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("sameas takes one argument")
			}
			return equal(v, args[0]) && typeName(v) == typeName(args[0]), nil
		},
		"lower": func(v any, _ []any) (bool, error) { s, ok := v.(string); return ok && strings.ToLower(s) == s, nil },
		"upper": func(v any, _ []any) (bool, error) { s, ok := v.(string); return ok && strings.ToUpper(s) == s, nil },
	}
}

func intTest(f func(n, d int64) bool) testFn {
	return func(v any, args []any) (bool, error) {
		n, ok := toInt(v)
		if !ok {
			return false, fmt.Errorf("needs an integer, not %s", typeName(v))
		}
		var d int64
		if len(args) > 0 {
			if d, ok = toInt(args[0]); !ok {
				return false, fmt.Errorf("needs an integer argument, not %s", typeName(args[0]))
			}
		}
		return f(n, d), nil
	}
}

func cmpTest(op string) testFn {
	return func(v any, args []any) (bool, error) {
		if len(args) != 1 {
			return false, fmt.Errorf("takes one argument")
		}
		return compareOp(op, v, args[0])
	}
}

// toJSON is HF's tojson filter: Python's json.dumps(v, ensure_ascii=False,
// indent=indent, sort_keys=sortKeys), within the bytes limit.
func toJSON(e *evaluator, v any, indent any, sortKeys bool) (any, error) {
	pad := ""
	if indent != nil {
		switch x := indent.(type) {
		case string:
			pad = x
		default:
			n, ok := toInt(x)
			if !ok {
				return nil, fmt.Errorf("indent must be an integer or a string, not %s", typeName(indent))
			}
			if err := e.fits(n); err != nil {
				return nil, err
			}
			pad = strings.Repeat(" ", int(max(n, 0)))
		}
	}
	b := &reprBuf{max: e.lim.MaxBytes}
	if err := writeJSON(b, v, indent != nil, pad, "", sortKeys); err != nil {
		return nil, err
	}
	if b.over {
		return nil, &LimitError{"bytes", fmt.Sprintf("tojson output longer than %d bytes", e.lim.MaxBytes)}
	}
	return b.String(), e.step(int64(b.Len()) / 256)
}

func writeJSON(b *reprBuf, v any, indented bool, pad, cur string, sortKeys bool) error {
	if b.over {
		return nil
	}
	open := func(c byte, n int) (string, string) {
		b.WriteByte(c)
		if !indented || n == 0 {
			return ", ", ""
		}
		inner := cur + pad
		b.WriteString("\n" + inner)
		return ",\n" + inner, "\n" + cur
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(map[bool]string{true: "true", false: "false"}[x])
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch s := formatFloat(x); s {
		case "inf":
			b.WriteString("Infinity")
		case "-inf":
			b.WriteString("-Infinity")
		case "nan":
			b.WriteString("NaN")
		default:
			b.WriteString(s)
		}
	case string:
		writeJSONString(b, x)
	case []any, tuple:
		xs, _ := seq(x)
		sep, end := open('[', len(xs))
		for i, it := range xs {
			if i > 0 {
				b.WriteString(sep)
			}
			if err := writeJSON(b, it, indented, pad, cur+pad, sortKeys); err != nil {
				return err
			}
		}
		b.WriteString(end + "]")
	case *dict, *namespace:
		d, ok := x.(*dict)
		if !ok {
			d = x.(*namespace).attrs
		}
		keys := append([]any(nil), d.keys...)
		if sortKeys {
			sort.SliceStable(keys, func(i, j int) bool { return jsonKey(keys[i]) < jsonKey(keys[j]) })
		}
		sep, end := open('{', len(keys))
		for i, k := range keys {
			if i > 0 {
				b.WriteString(sep)
			}
			writeJSONString(b, jsonKey(k))
			b.WriteString(": ")
			val, _ := d.get(k)
			if err := writeJSON(b, val, indented, pad, cur+pad, sortKeys); err != nil {
				return err
			}
		}
		b.WriteString(end + "}")
	default:
		return fmt.Errorf("Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// jsonKey is a dict key as json.dumps writes it.
func jsonKey(k any) string {
	switch x := k.(type) {
	case string:
		return x
	case nil:
		return "null"
	case bool:
		return map[bool]string{true: "true", false: "false"}[x]
	}
	return str(k)
}

func writeJSONString(b *reprBuf, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				b.WriteString(fmt.Sprintf(`\u%04x`, r))
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
