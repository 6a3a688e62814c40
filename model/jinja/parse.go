package jinja

import "fmt"

// Statement nodes of a compiled template.
type (
	node any

	textNode   struct{ s string }
	outputNode struct {
		x    expr
		line int
	}
	ifNode struct {
		conds  []expr
		bodies [][]node
		els    []node
	}
	forNode struct {
		vars      []string
		iter      expr
		cond      expr // the loop's "if" filter, or nil
		body, els []node
		line      int
	}
	// setNode assigns x to names (unpacking when several), or to the
	// attribute attr of the namespace ns.
	setNode struct {
		names    []string
		ns, attr string
		x        expr
		body     []node // a {% set name %}...{% endset %} block: its output
		block    bool
		line     int
	}
	macroNode    struct{ def *macroDef }
	breakNode    struct{ line int }
	continueNode struct{ line int }
)

// macroDef is a {% macro %} definition.
type macroDef struct {
	name     string
	params   []string
	defaults []expr // per param, nil when required
	body     []node
	line     int
}

// maxParseDepth bounds the nesting of blocks and expressions while
// parsing: the parser recurses once per level.
const maxParseDepth = 200

// parser turns segments into nodes.
type parser struct {
	segs  []segment
	pos   int
	depth int
	// the tokens of the tag being parsed
	toks []token
	tp   int
	line int
}

func parseTemplate(segs []segment) ([]node, error) {
	p := &parser{segs: segs}
	nodes, end, err := p.body()
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, fmt.Errorf("line %d: unexpected {%% %s %%}", p.line, end)
	}
	return nodes, nil
}

// body parses nodes until a statement whose keyword is one of the block
// ends (endif, else, ...), which it returns with its tag's tokens loaded;
// "" at the end of the template.
func (p *parser) body() ([]node, string, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxParseDepth {
		return nil, "", fmt.Errorf("line %d: blocks nested more than %d deep", p.line, maxParseDepth)
	}
	var out []node
	for p.pos < len(p.segs) {
		s := p.segs[p.pos]
		p.pos++
		p.toks, p.tp, p.line = s.toks, 0, s.line
		switch s.kind {
		case segText:
			out = append(out, &textNode{s.text})
		case segExpr:
			x, err := p.expr()
			if err != nil {
				return nil, "", err
			}
			if err := p.end(); err != nil {
				return nil, "", err
			}
			out = append(out, &outputNode{x, s.line})
		case segStmt:
			kw := p.next()
			if kw.kind != tName {
				return nil, "", p.errf("a statement must start with a keyword")
			}
			switch kw.s {
			case "endif", "else", "elif", "endfor", "endmacro", "endset", "endgeneration":
				return out, kw.s, nil
			}
			n, err := p.statement(kw.s)
			if err != nil {
				return nil, "", err
			}
			if n != nil {
				out = append(out, n...)
			}
		}
	}
	return out, "", nil
}

func (p *parser) statement(kw string) ([]node, error) {
	switch kw {
	case "if":
		n, err := p.ifStmt()
		return []node{n}, err
	case "for":
		n, err := p.forStmt()
		return []node{n}, err
	case "set":
		n, err := p.setStmt()
		return []node{n}, err
	case "macro":
		n, err := p.macroStmt()
		return []node{n}, err
	case "break", "continue":
		line := p.line
		if err := p.end(); err != nil {
			return nil, err
		}
		if kw == "break" {
			return []node{&breakNode{line}}, nil
		}
		return []node{&continueNode{line}}, nil
	case "generation":
		// HF's {% generation %} marks the assistant's text for masks; a
		// renderer shows its body.
		if err := p.end(); err != nil {
			return nil, err
		}
		body, end, err := p.body()
		if err != nil {
			return nil, err
		}
		if end != "endgeneration" {
			return nil, p.errf("{%% generation %%} is not closed by {%% endgeneration %%}")
		}
		return body, p.end()
	}
	return nil, p.errf("the statement {%% %s %%} is not supported", kw)
}

func (p *parser) ifStmt() (node, error) {
	n := &ifNode{}
	for {
		c, err := p.expr()
		if err != nil {
			return nil, err
		}
		if err := p.end(); err != nil {
			return nil, err
		}
		body, end, err := p.body()
		if err != nil {
			return nil, err
		}
		n.conds, n.bodies = append(n.conds, c), append(n.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			if err := p.end(); err != nil {
				return nil, err
			}
			els, end, err := p.body()
			if err != nil {
				return nil, err
			}
			if end != "endif" {
				return nil, p.errf("{%% else %%} of an if is not closed by {%% endif %%}")
			}
			n.els = els
			return n, p.end()
		case "endif":
			return n, p.end()
		}
		return nil, p.errf("{%% if %%} is not closed by {%% endif %%}")
	}
}

func (p *parser) forStmt() (node, error) {
	n := &forNode{line: p.line}
	for {
		t := p.next()
		if t.kind != tName {
			return nil, p.errf("for needs a loop variable")
		}
		n.vars = append(n.vars, t.s)
		if !p.acceptOp(",") {
			break
		}
	}
	if !p.acceptName("in") {
		return nil, p.errf("for needs 'in'")
	}
	var err error
	// The iterable is parsed without the conditional expression: a
	// trailing "if" is the loop's filter.
	if n.iter, err = p.orExpr(); err != nil {
		return nil, err
	}
	if p.acceptName("if") {
		if n.cond, err = p.expr(); err != nil {
			return nil, err
		}
	}
	if p.acceptName("recursive") {
		return nil, p.errf("recursive loops are not supported")
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	n.body = body
	if end == "else" {
		if err := p.end(); err != nil {
			return nil, err
		}
		if n.els, end, err = p.body(); err != nil {
			return nil, err
		}
	}
	if end != "endfor" {
		return nil, p.errf("{%% for %%} is not closed by {%% endfor %%}")
	}
	return n, p.end()
}

func (p *parser) setStmt() (node, error) {
	n := &setNode{line: p.line}
	t := p.next()
	if t.kind != tName {
		return nil, p.errf("set needs a name")
	}
	if p.acceptOp(".") {
		a := p.next()
		if a.kind != tName {
			return nil, p.errf("set %s. needs an attribute name", t.s)
		}
		n.ns, n.attr = t.s, a.s
	} else {
		n.names = []string{t.s}
		for p.acceptOp(",") {
			t := p.next()
			if t.kind != tName {
				return nil, p.errf("set needs names to unpack into")
			}
			n.names = append(n.names, t.s)
		}
	}
	if p.peek().kind == tEOF {
		// {% set x %}...{% endset %}
		n.block = true
		body, end, err := p.body()
		if err != nil {
			return nil, err
		}
		if end != "endset" {
			return nil, p.errf("{%% set %%} block is not closed by {%% endset %%}")
		}
		n.body = body
		return n, p.end()
	}
	if !p.acceptOp("=") {
		return nil, p.errf("set needs '='")
	}
	x, err := p.tupleExpr()
	if err != nil {
		return nil, err
	}
	n.x = x
	return n, p.end()
}

func (p *parser) macroStmt() (node, error) {
	d := &macroDef{line: p.line}
	t := p.next()
	if t.kind != tName {
		return nil, p.errf("macro needs a name")
	}
	d.name = t.s
	if !p.acceptOp("(") {
		return nil, p.errf("macro %s needs a parameter list", d.name)
	}
	for !p.acceptOp(")") {
		a := p.next()
		if a.kind != tName {
			return nil, p.errf("macro %s: bad parameter", d.name)
		}
		var def expr
		if p.acceptOp("=") {
			var err error
			if def, err = p.expr(); err != nil {
				return nil, err
			}
		}
		d.params, d.defaults = append(d.params, a.s), append(d.defaults, def)
		if !p.acceptOp(",") {
			if !p.acceptOp(")") {
				return nil, p.errf("macro %s: expected ',' or ')'", d.name)
			}
			break
		}
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	if end != "endmacro" {
		return nil, p.errf("{%% macro %s %%} is not closed by {%% endmacro %%}", d.name)
	}
	d.body = body
	return &macroNode{d}, p.end()
}

// Token helpers.

func (p *parser) peek() token {
	if p.tp < len(p.toks) {
		return p.toks[p.tp]
	}
	return token{kind: tEOF, line: p.line}
}

func (p *parser) next() token {
	t := p.peek()
	if p.tp < len(p.toks) {
		p.tp++
	}
	return t
}

func (p *parser) acceptOp(op string) bool {
	if t := p.peek(); t.kind == tOp && t.s == op {
		p.tp++
		return true
	}
	return false
}

func (p *parser) acceptName(n string) bool {
	if t := p.peek(); t.kind == tName && t.s == n {
		p.tp++
		return true
	}
	return false
}

// end requires the tag's tokens to be used up.
func (p *parser) end() error {
	if t := p.peek(); t.kind != tEOF {
		return p.errf("unexpected %s", describe(t))
	}
	return nil
}

func (p *parser) errf(format string, a ...any) error {
	return fmt.Errorf("line %d: %s", p.peek().line, fmt.Sprintf(format, a...))
}

func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "end of tag"
	case tName:
		return fmt.Sprintf("%q", t.s)
	case tString:
		return fmt.Sprintf("string %q", t.s)
	case tInt:
		return fmt.Sprintf("number %d", t.i)
	case tFloat:
		return fmt.Sprintf("number %g", t.f)
	}
	return fmt.Sprintf("'%s'", t.s)
}

// keywords cannot be variable names.
var keywords = map[string]bool{"and": true, "or": true, "not": true, "in": true, "is": true, "if": true, "else": true}
