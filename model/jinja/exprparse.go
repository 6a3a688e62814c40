package jinja

// Expression nodes and their parser (jinja2's precedence, lowest first:
// conditional, or, and, not, comparisons and membership, + -, ~, * / // %,
// **, unary - +, then postfix access, calls, filters and tests).

type expr interface {
	eval(e *evaluator) (any, error)
}

type (
	litExpr  struct{ v any }
	nameExpr struct {
		name string
		line int
	}
	attrExpr struct {
		x    expr
		name string
		line int
	}
	itemExpr struct {
		x, key expr
		line   int
	}
	sliceExpr struct {
		x, lo, hi, step expr // nil when absent
		line            int
	}
	kwArg struct {
		name string
		x    expr
	}
	callExpr struct {
		fn   expr
		args []expr
		kw   []kwArg
		line int
	}
	filterExpr struct {
		x    expr
		name string
		args []expr
		kw   []kwArg
		line int
	}
	testExpr struct {
		x    expr
		name string
		args []expr
		neg  bool
		line int
	}
	unaryExpr struct {
		op   string // "-", "+", "not"
		x    expr
		line int
	}
	binExpr struct {
		op   string
		l, r expr
		line int
	}
	// cmpExpr is a chain a < b <= c (each comparison with its neighbour).
	cmpExpr struct {
		ops  []string
		xs   []expr
		line int
	}
	condExpr struct {
		c, a, b expr // a if c else b; b nil: undefined
		line    int
	}
	listExpr  struct{ xs []expr }
	tupleExpr struct{ xs []expr }
	dictExpr  struct{ keys, vals []expr }
)

func (p *parser) nest() error {
	p.depth++
	if p.depth > maxParseDepth {
		return p.errf("expression nested more than %d deep", maxParseDepth)
	}
	return nil
}

// tupleExpr is an expression, or several separated by commas (a tuple).
func (p *parser) tupleExpr() (expr, error) {
	x, err := p.expr()
	if err != nil {
		return nil, err
	}
	if !p.acceptOp(",") {
		return x, nil
	}
	xs := []expr{x}
	for p.peek().kind != tEOF {
		y, err := p.expr()
		if err != nil {
			return nil, err
		}
		xs = append(xs, y)
		if !p.acceptOp(",") {
			break
		}
	}
	return &tupleExpr{xs}, nil
}

// expr is a full expression, with the conditional.
func (p *parser) expr() (expr, error) {
	if err := p.nest(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	x, err := p.orExpr()
	if err != nil {
		return nil, err
	}
	for p.acceptName("if") {
		line := p.line
		c, err := p.orExpr()
		if err != nil {
			return nil, err
		}
		var b expr
		if p.acceptName("else") {
			if b, err = p.expr(); err != nil {
				return nil, err
			}
		}
		x = &condExpr{c: c, a: x, b: b, line: line}
	}
	return x, nil
}

func (p *parser) orExpr() (expr, error) {
	x, err := p.andExpr()
	for err == nil && p.acceptName("or") {
		var y expr
		y, err = p.andExpr()
		x = &binExpr{op: "or", l: x, r: y, line: p.line}
	}
	return x, err
}

func (p *parser) andExpr() (expr, error) {
	x, err := p.notExpr()
	for err == nil && p.acceptName("and") {
		var y expr
		y, err = p.notExpr()
		x = &binExpr{op: "and", l: x, r: y, line: p.line}
	}
	return x, err
}

func (p *parser) notExpr() (expr, error) {
	if t := p.peek(); t.kind == tName && t.s == "not" {
		p.tp++
		if err := p.nest(); err != nil {
			return nil, err
		}
		defer func() { p.depth-- }()
		x, err := p.notExpr()
		return &unaryExpr{op: "not", x: x, line: t.line}, err
	}
	return p.cmpExpr()
}

var cmpOps = map[string]bool{"==": true, "!=": true, "<": true, ">": true, "<=": true, ">=": true}

func (p *parser) cmpExpr() (expr, error) {
	x, err := p.addExpr()
	if err != nil {
		return nil, err
	}
	c := &cmpExpr{xs: []expr{x}, line: p.line}
	for {
		t := p.peek()
		op := ""
		switch {
		case t.kind == tOp && cmpOps[t.s]:
			op = t.s
			p.tp++
		case t.kind == tName && t.s == "in":
			op = "in"
			p.tp++
		case t.kind == tName && t.s == "not" && p.tp+1 < len(p.toks) && p.toks[p.tp+1].kind == tName && p.toks[p.tp+1].s == "in":
			op = "not in"
			p.tp += 2
		}
		if op == "" {
			break
		}
		y, err := p.addExpr()
		if err != nil {
			return nil, err
		}
		c.ops, c.xs = append(c.ops, op), append(c.xs, y)
	}
	if len(c.ops) == 0 {
		return x, nil
	}
	return c, nil
}

// binary parses one left-associative level of operators over sub.
func (p *parser) binary(sub func() (expr, error), ops ...string) (expr, error) {
	x, err := sub()
	if err != nil {
		return nil, err
	}
	for {
		t := p.peek()
		matched := false
		for _, op := range ops {
			if t.kind == tOp && t.s == op {
				matched = true
			}
		}
		if !matched {
			return x, nil
		}
		p.tp++
		y, err := sub()
		if err != nil {
			return nil, err
		}
		x = &binExpr{op: t.s, l: x, r: y, line: t.line}
	}
}

func (p *parser) addExpr() (expr, error)    { return p.binary(p.concatExpr, "+", "-") }
func (p *parser) concatExpr() (expr, error) { return p.binary(p.mulExpr, "~") }
func (p *parser) mulExpr() (expr, error)    { return p.binary(p.powExpr, "*", "/", "//", "%") }
func (p *parser) powExpr() (expr, error) {
	return p.binary(func() (expr, error) { return p.unary(true) }, "**")
}

func (p *parser) unary(withFilter bool) (expr, error) {
	if err := p.nest(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	t := p.peek()
	var x expr
	var err error
	if t.kind == tOp && (t.s == "-" || t.s == "+") {
		p.tp++
		var y expr
		if y, err = p.unary(false); err != nil {
			return nil, err
		}
		x = &unaryExpr{op: t.s, x: y, line: t.line}
	} else if x, err = p.primary(); err != nil {
		return nil, err
	}
	if x, err = p.postfix(x); err != nil {
		return nil, err
	}
	if withFilter {
		return p.filters(x)
	}
	return x, nil
}

func (p *parser) primary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tName:
		switch t.s {
		case "true", "True":
			return &litExpr{true}, nil
		case "false", "False":
			return &litExpr{false}, nil
		case "none", "None":
			return &litExpr{nil}, nil
		}
		if keywords[t.s] {
			return nil, p.errf("unexpected %q", t.s)
		}
		return &nameExpr{name: t.s, line: t.line}, nil
	case tString:
		s := t.s
		for p.peek().kind == tString { // adjacent literals concatenate
			s += p.next().s
		}
		return &litExpr{s}, nil
	case tInt:
		return &litExpr{t.i}, nil
	case tFloat:
		return &litExpr{t.f}, nil
	case tOp:
		switch t.s {
		case "(":
			return p.parenExpr()
		case "[":
			xs, err := p.exprList("]")
			return &listExpr{xs}, err
		case "{":
			return p.dictLit()
		}
	}
	if t.kind != tEOF {
		p.tp-- // point the error at the token
	}
	return nil, p.errf("expected an expression, got %s", describe(t))
}

// parenExpr is (x), a tuple (x, y) or the empty tuple ().
func (p *parser) parenExpr() (expr, error) {
	if p.acceptOp(")") {
		return &tupleExpr{}, nil
	}
	x, err := p.expr()
	if err != nil {
		return nil, err
	}
	if p.acceptOp(")") {
		return x, nil
	}
	if !p.acceptOp(",") {
		return nil, p.errf("expected ')'")
	}
	rest, err := p.exprList(")")
	return &tupleExpr{append([]expr{x}, rest...)}, err
}

// exprList is expressions separated by commas up to close (a trailing
// comma allowed).
func (p *parser) exprList(close string) ([]expr, error) {
	var xs []expr
	for !p.acceptOp(close) {
		x, err := p.expr()
		if err != nil {
			return nil, err
		}
		xs = append(xs, x)
		if !p.acceptOp(",") {
			if !p.acceptOp(close) {
				return nil, p.errf("expected ',' or '%s'", close)
			}
			break
		}
	}
	return xs, nil
}

func (p *parser) dictLit() (expr, error) {
	d := &dictExpr{}
	for !p.acceptOp("}") {
		k, err := p.expr()
		if err != nil {
			return nil, err
		}
		if !p.acceptOp(":") {
			return nil, p.errf("expected ':' in a dict")
		}
		v, err := p.expr()
		if err != nil {
			return nil, err
		}
		d.keys, d.vals = append(d.keys, k), append(d.vals, v)
		if !p.acceptOp(",") {
			if !p.acceptOp("}") {
				return nil, p.errf("expected ',' or '}' in a dict")
			}
			break
		}
	}
	return d, nil
}

// postfix is attribute access, subscripts, slices and calls.
func (p *parser) postfix(x expr) (expr, error) {
	for {
		t := p.peek()
		if t.kind != tOp {
			return x, nil
		}
		switch t.s {
		case ".":
			p.tp++
			a := p.next()
			switch a.kind {
			case tName:
				x = &attrExpr{x: x, name: a.s, line: a.line}
			case tInt:
				x = &itemExpr{x: x, key: &litExpr{a.i}, line: a.line}
			default:
				return nil, p.errf("expected an attribute name after '.'")
			}
		case "[":
			p.tp++
			var err error
			if x, err = p.subscript(x, t.line); err != nil {
				return nil, err
			}
		case "(":
			p.tp++
			args, kw, err := p.callArgs()
			if err != nil {
				return nil, err
			}
			x = &callExpr{fn: x, args: args, kw: kw, line: t.line}
		default:
			return x, nil
		}
	}
}

func (p *parser) subscript(x expr, line int) (expr, error) {
	var parts [3]expr
	n := 0
	for {
		if t := p.peek(); !(t.kind == tOp && (t.s == ":" || t.s == "]")) {
			e, err := p.expr()
			if err != nil {
				return nil, err
			}
			parts[n] = e
		}
		if p.acceptOp("]") {
			break
		}
		if !p.acceptOp(":") || n == 2 {
			return nil, p.errf("expected ']'")
		}
		n++
	}
	if n == 0 {
		if parts[0] == nil {
			return nil, p.errf("empty subscript")
		}
		return &itemExpr{x: x, key: parts[0], line: line}, nil
	}
	return &sliceExpr{x: x, lo: parts[0], hi: parts[1], step: parts[2], line: line}, nil
}

// callArgs reads arguments after '(' up to ')'.
func (p *parser) callArgs() ([]expr, []kwArg, error) {
	var args []expr
	var kw []kwArg
	for !p.acceptOp(")") {
		t := p.peek()
		if t.kind == tName && p.tp+1 < len(p.toks) && p.toks[p.tp+1].kind == tOp && p.toks[p.tp+1].s == "=" {
			p.tp += 2
			x, err := p.expr()
			if err != nil {
				return nil, nil, err
			}
			kw = append(kw, kwArg{t.s, x})
		} else {
			if t.kind == tOp && (t.s == "*" || t.s == "**") {
				return nil, nil, p.errf("*args and **kwargs are not supported")
			}
			x, err := p.expr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, x)
		}
		if !p.acceptOp(",") {
			if !p.acceptOp(")") {
				return nil, nil, p.errf("expected ',' or ')' in a call")
			}
			break
		}
	}
	return args, kw, nil
}

// filters reads "| name(args)" and "is [not] test args" after x.
func (p *parser) filters(x expr) (expr, error) {
	for {
		switch t := p.peek(); {
		case t.kind == tOp && t.s == "|":
			p.tp++
			n := p.next()
			if n.kind != tName {
				return nil, p.errf("expected a filter name after '|'")
			}
			f := &filterExpr{x: x, name: n.s, line: n.line}
			if p.acceptOp("(") {
				var err error
				if f.args, f.kw, err = p.callArgs(); err != nil {
					return nil, err
				}
			}
			x = f
		case t.kind == tName && t.s == "is":
			p.tp++
			te := &testExpr{x: x, neg: p.acceptName("not"), line: t.line}
			n := p.next()
			if n.kind != tName {
				return nil, p.errf("expected a test name after 'is'")
			}
			te.name = n.s
			if p.acceptOp("(") {
				args, _, err := p.callArgs()
				if err != nil {
					return nil, err
				}
				te.args = args
			} else if a := p.peek(); (a.kind == tString || a.kind == tInt || a.kind == tFloat ||
				a.kind == tName && !keywords[a.s]) || a.kind == tOp && (a.s == "[" || a.s == "{") {
				arg, err := p.primary()
				if err != nil {
					return nil, err
				}
				if arg, err = p.postfix(arg); err != nil {
					return nil, err
				}
				te.args = []expr{arg}
			}
			x = te
		default:
			return x, nil
		}
	}
}
