package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Limits bound a template and each of its renders.
type Limits struct {
	// MaxTemplateBytes bounds the template's source (Compile).
	MaxTemplateBytes int
	// MaxDepth bounds nested macro calls.
	MaxDepth int
	// MaxSteps bounds the work of one render (see the package comment).
	MaxSteps int64
	// MaxBytes bounds the output of one render and every string or list
	// (in items) it builds.
	MaxBytes int64
	// Timeout bounds one render's wall time.
	Timeout time.Duration
}

// DefaultLimits are generous for every chat template seen in the wild
// (the largest are tens of kilobytes and render a conversation in well
// under a millisecond per message) and small enough that no template can
// hurt the process: a megabyte of source, 64 nested macro calls, 5 million
// steps, 64 MiB of output, 2 seconds.
func DefaultLimits() Limits {
	return Limits{MaxTemplateBytes: 1 << 20, MaxDepth: 64, MaxSteps: 5_000_000, MaxBytes: 64 << 20, Timeout: 2 * time.Second}
}

// ErrLimit is matched (errors.Is) by every error of a crossed limit.
var ErrLimit = errors.New("template limit")

// LimitError is a render or compile that crossed one of the Limits.
type LimitError struct {
	Limit  string // "size", "depth", "steps", "bytes" or "time"
	Detail string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("the template exceeded its %s limit: %s", e.Limit, e.Detail)
}

// Is makes errors.Is(err, ErrLimit) true.
func (e *LimitError) Is(target error) bool { return target == ErrLimit }

// Template is a compiled template; it is safe for concurrent renders.
type Template struct {
	nodes []node
	lim   Limits
}

// Compile parses src, refusing a source over lim.MaxTemplateBytes and any
// construct the renderer does not support, with its line.
func Compile(src string, lim Limits) (*Template, error) {
	if lim.MaxTemplateBytes > 0 && len(src) > lim.MaxTemplateBytes {
		return nil, &LimitError{"size", fmt.Sprintf("the template is %d bytes, more than %d", len(src), lim.MaxTemplateBytes)}
	}
	segs, err := scan(src)
	if err != nil {
		return nil, err
	}
	nodes, err := parseTemplate(segs)
	if err != nil {
		return nil, err
	}
	return &Template{nodes: nodes, lim: lim}, nil
}

// Render renders the template with data (strings, numbers, bools, nil,
// []any, map[string]any, Ordered, and funcs of type func(...any) (any,
// error)) over the built-in globals (range, namespace, dict).
func (t *Template) Render(data map[string]any) (string, error) {
	e := &evaluator{lim: t.lim, out: &strings.Builder{}}
	if t.lim.Timeout > 0 {
		e.deadline = time.Now().Add(t.lim.Timeout)
	}
	e.sc = &scope{vars: make(map[string]any, len(data)), parent: globals}
	for k, v := range data {
		e.sc.vars[k] = fromGo(v)
	}
	if err := e.exec(t.nodes); err != nil {
		if errors.Is(err, errBreak) || errors.Is(err, errContinue) {
			return "", errors.New("break or continue outside a loop")
		}
		return "", err
	}
	return e.out.String(), nil
}

// scope is one level of variables: the template's, a loop iteration's, a
// macro call's.
type scope struct {
	vars   map[string]any
	parent *scope
}

func (s *scope) lookup(name string) (any, bool) {
	for ; s != nil; s = s.parent {
		if v, ok := s.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

// evaluator is one render's state.
type evaluator struct {
	lim      Limits
	steps    int64
	deadline time.Time
	depth    int
	out      *strings.Builder
	sc       *scope
}

var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

// step charges n steps and checks the step and time limits.
func (e *evaluator) step(n int64) error {
	e.steps += n
	if e.lim.MaxSteps > 0 && e.steps > e.lim.MaxSteps {
		return &LimitError{"steps", fmt.Sprintf("more than %d steps (a loop or recursion that does not end?)", e.lim.MaxSteps)}
	}
	if !e.deadline.IsZero() && e.steps&1023 == 0 && time.Now().After(e.deadline) {
		return &LimitError{"time", fmt.Sprintf("the render took longer than %v", e.lim.Timeout)}
	}
	return nil
}

// size checks that a value of n bytes (or items) may be built, and
// charges the work of building it.
func (e *evaluator) size(n int64) error {
	if err := e.fits(n); err != nil {
		return err
	}
	return e.step(n / 256)
}

// itemBytes is what one list item costs against the bytes limit.
const itemBytes = 16

// items checks that a list of n items may be built.
func (e *evaluator) items(n int64) error {
	if n > math.MaxInt64/itemBytes {
		return &LimitError{"bytes", fmt.Sprintf("a list of %d items", n)}
	}
	return e.size(n * itemBytes)
}

// fits checks that a value of n bytes (or items) may be built.
func (e *evaluator) fits(n int64) error {
	if e.lim.MaxBytes > 0 && n > e.lim.MaxBytes {
		return &LimitError{"bytes", fmt.Sprintf("a value of %d bytes or items, more than %d", n, e.lim.MaxBytes)}
	}
	return nil
}

func (e *evaluator) write(s string) error {
	if e.lim.MaxBytes > 0 && int64(e.out.Len())+int64(len(s)) > e.lim.MaxBytes {
		return &LimitError{"bytes", fmt.Sprintf("the output grew past %d bytes", e.lim.MaxBytes)}
	}
	e.out.WriteString(s)
	return e.step(int64(len(s)) / 256)
}

// str is str(v) within the bytes limit.
func (e *evaluator) str(v any) (string, error) {
	s, ok := strBounded(v, e.lim.MaxBytes)
	if !ok {
		return "", &LimitError{"bytes", fmt.Sprintf("a value printed longer than %d bytes", e.lim.MaxBytes)}
	}
	return s, e.step(int64(len(s)) / 256)
}

// capture runs nodes into a fresh buffer and returns what they wrote.
func (e *evaluator) capture(nodes []node) (string, error) {
	saved := e.out
	e.out = &strings.Builder{}
	err := e.exec(nodes)
	s := e.out.String()
	e.out = saved
	return s, err
}

func (e *evaluator) exec(nodes []node) error {
	for _, n := range nodes {
		if err := e.step(1); err != nil {
			return err
		}
		if err := e.execOne(n); err != nil {
			return err
		}
	}
	return nil
}

func (e *evaluator) execOne(n node) error {
	switch n := n.(type) {
	case *textNode:
		return e.write(n.s)
	case *outputNode:
		v, err := n.x.eval(e)
		if err != nil {
			return err
		}
		s, err := e.str(v)
		if err != nil {
			return err
		}
		return e.write(s)
	case *ifNode:
		for i, c := range n.conds {
			v, err := c.eval(e)
			if err != nil {
				return err
			}
			if truthy(v) {
				return e.exec(n.bodies[i])
			}
		}
		return e.exec(n.els)
	case *forNode:
		return e.execFor(n)
	case *setNode:
		return e.execSet(n)
	case *macroNode:
		e.sc.vars[n.def.name] = &macro{def: n.def, closure: e.sc}
		return nil
	case *breakNode:
		return errBreak
	case *continueNode:
		return errContinue
	}
	return fmt.Errorf("unknown node %T", n)
}

func (e *evaluator) execFor(n *forNode) error {
	iv, err := n.iter.eval(e)
	if err != nil {
		return err
	}
	all, ok := items(iv)
	if !ok {
		return fmt.Errorf("line %d: '%s' object is not iterable", n.line, typeName(iv))
	}
	var kept []any
	outer := e.sc
	for _, it := range all {
		if n.cond == nil {
			kept = all
			break
		}
		e.sc = &scope{vars: map[string]any{}, parent: outer}
		err := e.bind(n, it)
		var v any
		if err == nil {
			v, err = n.cond.eval(e)
		}
		e.sc = outer
		if err != nil {
			return err
		}
		if truthy(v) {
			kept = append(kept, it)
		}
	}
	if len(kept) == 0 {
		return e.exec(n.els)
	}
	defer func() { e.sc = outer }()
	// One scope for the loop, emptied for each iteration: what an
	// iteration sets is gone at the next, as in jinja2.
	state := &loopState{xs: kept}
	iter := &scope{vars: map[string]any{}, parent: outer}
	for i, it := range kept {
		if err := e.step(1); err != nil {
			return err
		}
		clear(iter.vars)
		state.i = i
		iter.vars["loop"] = state
		e.sc = iter
		if err := e.bind(n, it); err != nil {
			return err
		}
		err := e.exec(n.body)
		switch {
		case errors.Is(err, errBreak):
			return nil
		case errors.Is(err, errContinue):
		case err != nil:
			return err
		}
	}
	return nil
}

// bind sets the loop variables of n to item (unpacking it for several).
func (e *evaluator) bind(n *forNode, item any) error {
	if len(n.vars) == 1 {
		e.sc.vars[n.vars[0]] = item
		return nil
	}
	parts, ok := seq(item)
	if !ok || len(parts) != len(n.vars) {
		return fmt.Errorf("line %d: cannot unpack %s into %d loop variables", n.line, typeName(item), len(n.vars))
	}
	for i, name := range n.vars {
		e.sc.vars[name] = parts[i]
	}
	return nil
}

// loopState is the loop variable: iteration i over xs. It is one value
// per loop, updated in place (its attributes are read when used).
type loopState struct {
	xs []any
	i  int
}

// attr is loop.name.
func (l *loopState) attr(name string) any {
	n, at := int64(len(l.xs)), int64(l.i)
	switch name {
	case "index":
		return at + 1
	case "index0":
		return at
	case "revindex":
		return n - at
	case "revindex0":
		return n - at - 1
	case "first":
		return l.i == 0
	case "last":
		return l.i == len(l.xs)-1
	case "length":
		return n
	case "previtem":
		if l.i > 0 {
			return l.xs[l.i-1]
		}
	case "nextitem":
		if l.i+1 < len(l.xs) {
			return l.xs[l.i+1]
		}
	case "depth":
		return int64(1)
	case "depth0":
		return int64(0)
	case "cycle":
		i := l.i
		return &builtin{name: "loop.cycle", fn: func(_ *evaluator, args []any, _ *dict) (any, error) {
			if len(args) == 0 {
				return nil, errors.New("loop.cycle needs at least one value")
			}
			return args[i%len(args)], nil
		}}
	}
	return undefined{"loop." + name}
}

func (e *evaluator) execSet(n *setNode) error {
	var v any
	if n.block {
		s, err := e.capture(n.body)
		if err != nil {
			return err
		}
		v = s
	} else {
		var err error
		if v, err = n.x.eval(e); err != nil {
			return err
		}
	}
	if n.ns != "" {
		nsv, _ := e.sc.lookup(n.ns)
		ns, ok := nsv.(*namespace)
		if !ok {
			return fmt.Errorf("line %d: set %s.%s: %s is not a namespace()", n.line, n.ns, n.attr, n.ns)
		}
		return ns.attrs.set(n.attr, v)
	}
	if len(n.names) == 1 {
		e.sc.vars[n.names[0]] = v
		return nil
	}
	parts, ok := seq(v)
	if !ok || len(parts) != len(n.names) {
		return fmt.Errorf("line %d: cannot unpack %s into %d names", n.line, typeName(v), len(n.names))
	}
	for i, name := range n.names {
		e.sc.vars[name] = parts[i]
	}
	return nil
}

// macro is a defined macro, closed over the scope it was defined in.
type macro struct {
	def     *macroDef
	closure *scope
}

// builtin is a function of the renderer (a global, a filter, a method
// bound to its receiver); kw is nil without keyword arguments.
type builtin struct {
	name string
	fn   func(e *evaluator, args []any, kw *dict) (any, error)
}

// call calls a macro or builtin.
func (e *evaluator) call(f any, args []any, kw *dict, line int) (any, error) {
	switch f := f.(type) {
	case *builtin:
		v, err := f.fn(e, args, kw)
		if err != nil && !isLimit(err) && !strings.HasPrefix(err.Error(), "line ") {
			err = fmt.Errorf("line %d: %s: %w", line, f.name, err)
		}
		return v, err
	case *macro:
		return e.callMacro(f, args, kw, line)
	case undefined:
		return nil, fmt.Errorf("line %d: '%s' is undefined", line, f.name)
	}
	return nil, fmt.Errorf("line %d: '%s' object is not callable", line, typeName(f))
}

func isLimit(err error) bool { return errors.Is(err, ErrLimit) }

func (e *evaluator) callMacro(m *macro, args []any, kw *dict, line int) (any, error) {
	d := m.def
	if e.depth >= e.lim.MaxDepth && e.lim.MaxDepth > 0 {
		return nil, &LimitError{"depth", fmt.Sprintf("macro %s called more than %d deep (recursion without end?)", d.name, e.lim.MaxDepth)}
	}
	if len(args) > len(d.params) {
		return nil, fmt.Errorf("line %d: macro %s takes %d arguments, got %d", line, d.name, len(d.params), len(args))
	}
	sc := &scope{vars: map[string]any{}, parent: m.closure}
	for i, p := range d.params {
		if i < len(args) {
			sc.vars[p] = args[i]
		}
	}
	if kw != nil {
		for _, k := range kw.keys {
			name, _ := k.(string)
			known := false
			for i, p := range d.params {
				if p == name {
					known = true
					if i < len(args) {
						return nil, fmt.Errorf("line %d: macro %s got %s twice", line, d.name, name)
					}
				}
			}
			if !known {
				return nil, fmt.Errorf("line %d: macro %s has no parameter %s", line, d.name, name)
			}
			sc.vars[name], _ = kw.get(k)
		}
	}
	saved := e.sc
	e.sc = sc
	e.depth++
	defer func() { e.sc, e.depth = saved, e.depth-1 }()
	for i, p := range d.params {
		if _, set := sc.vars[p]; set {
			continue
		}
		if d.defaults[i] == nil {
			sc.vars[p] = undefined{p}
			continue
		}
		v, err := d.defaults[i].eval(e)
		if err != nil {
			return nil, err
		}
		sc.vars[p] = v
	}
	return e.capture(d.body)
}
