package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

func (x *litExpr) eval(e *evaluator) (any, error) { return x.v, e.step(1) }

func (x *nameExpr) eval(e *evaluator) (any, error) {
	if v, ok := e.sc.lookup(x.name); ok {
		return v, e.step(1)
	}
	return undefined{x.name}, e.step(1)
}

// undefinedErr is the error of using an undefined value.
func undefinedErr(line int, v any) error {
	return fmt.Errorf("line %d: '%s' is undefined", line, v.(undefined).name)
}

func (x *attrExpr) eval(e *evaluator) (any, error) {
	obj, err := x.x.eval(e)
	if err != nil {
		return nil, err
	}
	if err := e.step(1); err != nil {
		return nil, err
	}
	return getAttr(obj, x.name, x.line)
}

// getAttr is obj.name: a method of the value's type first (as Python's
// getattr), then a dict's key or a namespace's attribute.
func getAttr(obj any, name string, line int) (any, error) {
	switch o := obj.(type) {
	case undefined:
		return nil, undefinedErr(line, o)
	case *loopState:
		return o.attr(name), nil
	case *namespace:
		if v, ok := o.attrs.get(name); ok {
			return v, nil
		}
		return undefined{name}, nil
	case *dict:
		if m := method(o, name); m != nil {
			return m, nil
		}
		if v, ok := o.get(name); ok {
			return v, nil
		}
		return undefined{name}, nil
	}
	if m := method(obj, name); m != nil {
		return m, nil
	}
	return undefined{name}, nil
}

func (x *itemExpr) eval(e *evaluator) (any, error) {
	obj, err := x.x.eval(e)
	if err != nil {
		return nil, err
	}
	key, err := x.key.eval(e)
	if err != nil {
		return nil, err
	}
	if err := e.step(1); err != nil {
		return nil, err
	}
	switch o := obj.(type) {
	case undefined:
		return nil, undefinedErr(x.line, o)
	case *dict:
		if v, ok := o.get(key); ok {
			return v, nil
		}
		if s, ok := key.(string); ok {
			if m := method(o, s); m != nil {
				return m, nil
			}
		}
		return undefined{str(key)}, nil
	case *namespace:
		if v, ok := o.attrs.get(key); ok {
			return v, nil
		}
		return undefined{str(key)}, nil
	case string:
		i, ok := toInt(key)
		if !ok {
			return undefined{str(key)}, nil
		}
		r := []rune(o)
		if i < 0 {
			i += int64(len(r))
		}
		if i < 0 || i >= int64(len(r)) {
			return undefined{fmt.Sprint(i)}, nil
		}
		return string(r[i]), nil
	}
	if xs, ok := seq(obj); ok {
		i, ok := toInt(key)
		if !ok {
			return nil, fmt.Errorf("line %d: list indices must be integers, not %s", x.line, typeName(key))
		}
		if i < 0 {
			i += int64(len(xs))
		}
		if i < 0 || i >= int64(len(xs)) {
			return undefined{fmt.Sprint(i)}, nil
		}
		return xs[i], nil
	}
	if s, ok := key.(string); ok {
		return getAttr(obj, s, x.line)
	}
	return undefined{str(key)}, nil
}

func (x *sliceExpr) eval(e *evaluator) (any, error) {
	obj, err := x.x.eval(e)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, b := range []expr{x.lo, x.hi, x.step} {
		if b == nil {
			continue
		}
		v, err := b.eval(e)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := toInt(v)
		if !ok {
			return nil, fmt.Errorf("line %d: slice indices must be integers, not %s", x.line, typeName(v))
		}
		bounds[i] = &n
	}
	var xs []any
	var runes []rune
	switch o := obj.(type) {
	case string:
		runes = []rune(o)
	case []any:
		xs = o
	case tuple:
		xs = o
	case undefined:
		return nil, undefinedErr(x.line, o)
	default:
		return nil, fmt.Errorf("line %d: '%s' object is not subscriptable", x.line, typeName(obj))
	}
	n := int64(len(xs))
	if runes != nil {
		n = int64(len(runes))
	}
	idx, err := sliceIndices(n, bounds)
	if err != nil {
		return nil, fmt.Errorf("line %d: %w", x.line, err)
	}
	if err := e.items(int64(len(idx))); err != nil {
		return nil, err
	}
	if runes != nil {
		out := make([]rune, len(idx))
		for i, j := range idx {
			out[i] = runes[j]
		}
		return string(out), nil
	}
	out := make([]any, len(idx))
	for i, j := range idx {
		out[i] = xs[j]
	}
	if _, isTuple := obj.(tuple); isTuple {
		return tuple(out), nil
	}
	return out, nil
}

// sliceIndices is Python's slice(lo, hi, step).indices(n), listed.
func sliceIndices(n int64, b [3]*int64) ([]int64, error) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return nil, errors.New("slice step cannot be zero")
	}
	clamp := func(v *int64, def, lo, hi int64) int64 {
		if v == nil {
			return def
		}
		x := *v
		if x < 0 {
			x += n
		}
		return max(lo, min(x, hi))
	}
	var out []int64
	if step > 0 {
		lo, hi := clamp(b[0], 0, 0, n), clamp(b[1], n, 0, n)
		for i := lo; i < hi; i += step {
			out = append(out, i)
		}
	} else {
		lo, hi := clamp(b[0], n-1, -1, n-1), clamp(b[1], -1, -1, n-1)
		if b[1] != nil && *b[1] < 0 && *b[1]+n < 0 {
			hi = -1
		}
		for i := lo; i > hi; i += step {
			out = append(out, i)
		}
	}
	return out, nil
}

// evalArgs evaluates positional and keyword arguments.
func (e *evaluator) evalArgs(args []expr, kw []kwArg) ([]any, *dict, error) {
	vals := make([]any, len(args))
	for i, a := range args {
		v, err := a.eval(e)
		if err != nil {
			return nil, nil, err
		}
		vals[i] = v
	}
	if len(kw) == 0 {
		return vals, nil, nil
	}
	d := newDict()
	for _, k := range kw {
		v, err := k.x.eval(e)
		if err != nil {
			return nil, nil, err
		}
		d.set(k.name, v) //nolint:errcheck // string keys
	}
	return vals, d, nil
}

func (x *callExpr) eval(e *evaluator) (any, error) {
	f, err := x.fn.eval(e)
	if err != nil {
		return nil, err
	}
	args, kw, err := e.evalArgs(x.args, x.kw)
	if err != nil {
		return nil, err
	}
	if err := e.step(1); err != nil {
		return nil, err
	}
	if u, ok := f.(undefined); ok {
		if n, isName := x.fn.(*nameExpr); isName {
			return nil, fmt.Errorf("line %d: '%s' is undefined (no such function)", x.line, n.name)
		}
		return nil, undefinedErr(x.line, u)
	}
	return e.call(f, args, kw, x.line)
}

func (x *filterExpr) eval(e *evaluator) (any, error) {
	v, err := x.x.eval(e)
	if err != nil {
		return nil, err
	}
	f := filters[x.name]
	if f == nil {
		return nil, fmt.Errorf("line %d: no filter named %q", x.line, x.name)
	}
	args, kw, err := e.evalArgs(x.args, x.kw)
	if err != nil {
		return nil, err
	}
	if err := e.step(1); err != nil {
		return nil, err
	}
	out, err := f(e, v, args, kw)
	if err != nil && !isLimit(err) {
		err = fmt.Errorf("line %d: filter %s: %w", x.line, x.name, err)
	}
	return out, err
}

func (x *testExpr) eval(e *evaluator) (any, error) {
	v, err := x.x.eval(e)
	if err != nil {
		return nil, err
	}
	t := tests[x.name]
	if t == nil {
		return nil, fmt.Errorf("line %d: no test named %q", x.line, x.name)
	}
	args, _, err := e.evalArgs(x.args, nil)
	if err != nil {
		return nil, err
	}
	ok, err := t(v, args)
	if err != nil {
		return nil, fmt.Errorf("line %d: test %s: %w", x.line, x.name, err)
	}
	return ok != x.neg, e.step(1)
}

func (x *unaryExpr) eval(e *evaluator) (any, error) {
	v, err := x.x.eval(e)
	if err != nil {
		return nil, err
	}
	switch x.op {
	case "not":
		return !truthy(v), nil
	case "-":
		switch n := v.(type) {
		case int64:
			if n == math.MinInt64 {
				return nil, fmt.Errorf("line %d: integer overflow", x.line)
			}
			return -n, nil
		case float64:
			return -n, nil
		case bool:
			i, _ := toInt(n)
			return -i, nil
		}
	case "+":
		if _, ok := toFloat(v); ok {
			return v, nil
		}
	}
	if _, ok := v.(undefined); ok {
		return nil, undefinedErr(x.line, v)
	}
	return nil, fmt.Errorf("line %d: bad operand type for unary %s: '%s'", x.line, x.op, typeName(v))
}

func (x *condExpr) eval(e *evaluator) (any, error) {
	c, err := x.c.eval(e)
	if err != nil {
		return nil, err
	}
	if truthy(c) {
		return x.a.eval(e)
	}
	if x.b == nil {
		return undefined{"the else branch"}, nil
	}
	return x.b.eval(e)
}

func (x *listExpr) eval(e *evaluator) (any, error) {
	out := make([]any, len(x.xs))
	for i, it := range x.xs {
		v, err := it.eval(e)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (x *tupleExpr) eval(e *evaluator) (any, error) {
	l, err := (&listExpr{x.xs}).eval(e)
	if err != nil {
		return nil, err
	}
	return tuple(l.([]any)), nil
}

func (x *dictExpr) eval(e *evaluator) (any, error) {
	d := newDict()
	for i := range x.keys {
		k, err := x.keys[i].eval(e)
		if err != nil {
			return nil, err
		}
		v, err := x.vals[i].eval(e)
		if err != nil {
			return nil, err
		}
		if err := d.set(k, v); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func (x *cmpExpr) eval(e *evaluator) (any, error) {
	left, err := x.xs[0].eval(e)
	if err != nil {
		return nil, err
	}
	for i, op := range x.ops {
		right, err := x.xs[i+1].eval(e)
		if err != nil {
			return nil, err
		}
		ok, err := compareOp(op, left, right)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", x.line, err)
		}
		if !ok {
			return false, nil
		}
		left = right
	}
	return true, e.step(1)
}

func compareOp(op string, a, b any) (bool, error) {
	switch op {
	case "==":
		return equal(a, b), nil
	case "!=":
		return !equal(a, b), nil
	case "in":
		return contains(b, a)
	case "not in":
		ok, err := contains(b, a)
		return !ok, err
	}
	for _, v := range []any{a, b} {
		if u, ok := v.(undefined); ok {
			return false, fmt.Errorf("'%s' is undefined", u.name)
		}
	}
	c, err := compare(a, b)
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case ">":
		return c > 0, nil
	case "<=":
		return c <= 0, nil
	}
	return c >= 0, nil
}

// contains is Python's "x in container".
func contains(container, x any) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := x.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(x))
		}
		return strings.Contains(c, s), nil
	case *dict:
		_, ok := c.get(x)
		return ok, nil
	case *namespace:
		_, ok := c.attrs.get(x)
		return ok, nil
	case undefined:
		return false, fmt.Errorf("'%s' is undefined", c.name)
	}
	if xs, ok := seq(container); ok {
		for _, it := range xs {
			if equal(it, x) {
				return true, nil
			}
		}
		return false, nil
	}
	return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(container))
}

func (x *binExpr) eval(e *evaluator) (any, error) {
	l, err := x.l.eval(e)
	if err != nil {
		return nil, err
	}
	switch x.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return x.r.eval(e)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return x.r.eval(e)
	}
	r, err := x.r.eval(e)
	if err != nil {
		return nil, err
	}
	if err := e.step(1); err != nil {
		return nil, err
	}
	v, err := e.arith(x.op, l, r)
	if err != nil && !isLimit(err) {
		err = fmt.Errorf("line %d: %w", x.line, err)
	}
	return v, err
}
