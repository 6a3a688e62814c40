package jinja

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
)

var errOverflow = errors.New("integer overflow (integers are 64-bit here)")

// arith is a binary operator on two values, by Python's rules; every
// value it builds is sized against the limits first.
func (e *evaluator) arith(op string, l, r any) (any, error) {
	if op == "~" {
		ls, err := e.str(l)
		if err != nil {
			return nil, err
		}
		rs, err := e.str(r)
		if err != nil {
			return nil, err
		}
		if err := e.size(int64(len(ls)) + int64(len(rs))); err != nil {
			return nil, err
		}
		return ls + rs, nil
	}
	for _, v := range []any{l, r} {
		if u, ok := v.(undefined); ok {
			return nil, fmt.Errorf("'%s' is undefined", u.name)
		}
	}
	switch op {
	case "+":
		return e.add(l, r)
	case "*":
		return e.mul(l, r)
	case "%":
		if s, ok := l.(string); ok {
			return e.format(s, r)
		}
	}
	li, lInt := toInt(l)
	ri, rInt := toInt(r)
	if lInt && rInt {
		return intOp(op, li, ri)
	}
	lf, lok := toFloat(l)
	rf, rok := toFloat(r)
	if !lok || !rok {
		return nil, fmt.Errorf("unsupported operand types for %s: '%s' and '%s'", op, typeName(l), typeName(r))
	}
	switch op {
	case "-":
		return lf - rf, nil
	case "/":
		if rf == 0 {
			return nil, errors.New("division by zero")
		}
		return lf / rf, nil
	case "//":
		if rf == 0 {
			return nil, errors.New("float floor division by zero")
		}
		return math.Floor(lf / rf), nil
	case "%":
		if rf == 0 {
			return nil, errors.New("float modulo by zero")
		}
		m := math.Mod(lf, rf)
		if m != 0 && (m < 0) != (rf < 0) {
			m += rf
		}
		return m, nil
	case "**":
		return math.Pow(lf, rf), nil
	}
	return nil, fmt.Errorf("unknown operator %s", op)
}

func intOp(op string, a, b int64) (any, error) {
	switch op {
	case "-":
		d := a - b
		if (a >= 0) != (b >= 0) && (d >= 0) != (a >= 0) {
			return nil, errOverflow
		}
		return d, nil
	case "/":
		if b == 0 {
			return nil, errors.New("division by zero")
		}
		return float64(a) / float64(b), nil
	case "//", "%":
		if b == 0 {
			return nil, errors.New("integer division or modulo by zero")
		}
		if a == math.MinInt64 && b == -1 {
			return nil, errOverflow
		}
		q, m := a/b, a%b
		if m != 0 && (m < 0) != (b < 0) {
			q, m = q-1, m+b
		}
		if op == "//" {
			return q, nil
		}
		return m, nil
	case "**":
		if b < 0 {
			return math.Pow(float64(a), float64(b)), nil
		}
		out := int64(1)
		for ; b > 0; b-- {
			hi, lo := bits.Mul64(uint64(abs(out)), uint64(abs(a)))
			if hi != 0 || lo > math.MaxInt64 {
				return nil, errOverflow
			}
			out *= a
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown operator %s", op)
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

func (e *evaluator) add(l, r any) (any, error) {
	if a, ok := toInt(l); ok {
		if b, ok := toInt(r); ok {
			s := a + b
			if (a >= 0) == (b >= 0) && (s >= 0) != (a >= 0) {
				return nil, errOverflow
			}
			return s, nil
		}
	}
	if a, ok := toFloat(l); ok {
		if b, ok := toFloat(r); ok {
			return a + b, nil
		}
	}
	if a, ok := l.(string); ok {
		if b, ok := r.(string); ok {
			if err := e.size(int64(len(a)) + int64(len(b))); err != nil {
				return nil, err
			}
			return a + b, nil
		}
	}
	if a, ok := seq(l); ok {
		if b, ok := seq(r); ok {
			if err := e.items(int64(len(a)) + int64(len(b))); err != nil {
				return nil, err
			}
			out := append(append(make([]any, 0, len(a)+len(b)), a...), b...)
			if _, isTuple := l.(tuple); isTuple {
				return tuple(out), nil
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("unsupported operand types for +: '%s' and '%s'", typeName(l), typeName(r))
}

func (e *evaluator) mul(l, r any) (any, error) {
	if a, ok := toInt(l); ok {
		if b, ok := toInt(r); ok {
			hi, lo := bits.Mul64(uint64(abs(a)), uint64(abs(b)))
			if hi != 0 || lo > math.MaxInt64 {
				return nil, errOverflow
			}
			return a * b, nil
		}
	}
	if a, ok := toFloat(l); ok {
		if b, ok := toFloat(r); ok {
			return a * b, nil
		}
	}
	// Repetition: sequence * n or n * sequence.
	if _, ok := toInt(l); ok {
		l, r = r, l
	}
	n, ok := toInt(r)
	if !ok {
		return nil, fmt.Errorf("unsupported operand types for *: '%s' and '%s'", typeName(l), typeName(r))
	}
	n = max(n, 0)
	switch x := l.(type) {
	case string:
		hi, total := bits.Mul64(uint64(len(x)), uint64(n))
		if hi != 0 || total > math.MaxInt64 {
			return nil, &LimitError{"bytes", fmt.Sprintf("a string repeated %d times", n)}
		}
		if err := e.size(int64(total)); err != nil {
			return nil, err
		}
		return strings.Repeat(x, int(n)), nil
	case []any, tuple:
		xs, _ := seq(x)
		hi, total := bits.Mul64(uint64(len(xs)), uint64(n))
		if hi != 0 || total > math.MaxInt64 {
			return nil, &LimitError{"bytes", fmt.Sprintf("a list repeated %d times", n)}
		}
		if err := e.items(int64(total)); err != nil {
			return nil, err
		}
		out := make([]any, 0, total)
		for range n {
			out = append(out, xs...)
		}
		if _, isTuple := l.(tuple); isTuple {
			return tuple(out), nil
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported operand types for *: '%s' and '%s'", typeName(l), typeName(r))
}

// format is Python's printf-style "fmt % args" for %s, %r, %d, %i, %f and %%.
func (e *evaluator) format(f string, arg any) (any, error) {
	args, ok := arg.(tuple)
	if !ok {
		args = tuple{arg}
	}
	b := &reprBuf{max: e.lim.MaxBytes}
	next := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' {
			b.WriteByte(f[i])
			continue
		}
		if i+1 >= len(f) {
			return nil, errors.New("incomplete format")
		}
		i++
		if f[i] == '%' {
			b.WriteByte('%')
			continue
		}
		if next >= len(args) {
			return nil, errors.New("not enough arguments for format string")
		}
		a := args[next]
		next++
		switch f[i] {
		case 's':
			b.WriteString(str(a))
		case 'r':
			writeRepr(b, a, true)
		case 'd', 'i':
			n, ok := toFloat(a)
			if !ok {
				return nil, fmt.Errorf("%%%c format: a number is required, not %s", f[i], typeName(a))
			}
			b.WriteString(fmt.Sprintf("%d", int64(n)))
		case 'f':
			n, ok := toFloat(a)
			if !ok {
				return nil, fmt.Errorf("%%f format: a number is required, not %s", typeName(a))
			}
			b.WriteString(fmt.Sprintf("%f", n))
		default:
			return nil, fmt.Errorf("unsupported format character %q", f[i])
		}
		if b.over {
			return nil, &LimitError{"bytes", fmt.Sprintf("a formatted string longer than %d bytes", e.lim.MaxBytes)}
		}
	}
	if next < len(args) {
		return nil, errors.New("not all arguments converted during string formatting")
	}
	return b.String(), nil
}
