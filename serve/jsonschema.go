package serve

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"regexp/syntax"
	"strings"

	"github.com/lockstep-ai/lockstep/model/jinja"
)

// A JSON Schema becomes one regular expression over the JSON text
// (structured outputs; the structured package then constrains generation
// to it). The JSON is compact but for an optional space after ':' and ','
// (a model may write either); object properties come in the schema's
// order. docs/serving.md lists what is supported and what is not enforced.

// The pieces of JSON text.
const (
	jsonString  = `"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"`
	jsonChar    = `(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})`
	jsonInteger = `-?(?:0|[1-9][0-9]*)`
	jsonNumber  = `-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?`
	jsonColon   = `: ?`
	jsonComma   = `, ?`
)

// anyJSONDepth is how deeply a value the schema leaves free (an object
// without properties, json_object) may nest: a regular expression cannot
// count brackets.
const anyJSONDepth = 3

// maxSchemaDepth bounds the nesting of a schema and the expansion of its
// references (a recursive schema is refused when it reaches it).
const maxSchemaDepth = 12

// maxRepeat is the largest bound of a repetition a pattern may carry
// (Go's regexp refuses more); longer bounds are left unbounded.
const maxRepeat = 1000

// formats are the string formats that are enforced.
var formats = map[string]string{
	"date":      `[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])`,
	"time":      `(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?`,
	"date-time": `[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])`,
	"uuid":      `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`,
}

// schemaConv converts one schema (decoded by model.DecodeOrderedJSON).
type schemaConv struct {
	root jinja.Ordered
}

// schemaPattern is the regular expression of the JSON texts schema
// accepts.
func schemaPattern(schema any) (string, error) {
	c := schemaConv{}
	if o, ok := schema.(jinja.Ordered); ok {
		c.root = o
	}
	return c.value(schema, "", 0)
}

// anyJSON is any JSON value nested at most depth levels.
func anyJSON(depth int) string {
	alts := []string{jsonString, jsonNumber, "true", "false", "null"}
	if depth > 0 {
		inner := anyJSON(depth - 1)
		alts = append(alts, arrayOf(inner, 0, -1), objectOf(inner))
	}
	return "(?:" + strings.Join(alts, "|") + ")"
}

// arrayOf is a list of between lo and hi items (hi -1: unbounded).
func arrayOf(item string, lo, hi int) string {
	if !expressible(item, max(lo, hi)) {
		lo, hi = 0, -1 // too large to count: not enforced
	}
	rep := func(lo, hi int) string {
		switch {
		case hi < 0 || hi > maxRepeat:
			if lo == 0 {
				return "*"
			}
			return fmt.Sprintf("{%d,}", min(lo, maxRepeat))
		case lo == hi:
			return fmt.Sprintf("{%d}", lo)
		}
		return fmt.Sprintf("{%d,%d}", lo, hi)
	}
	more := "(?:" + jsonComma + item + ")"
	if lo == 0 {
		if hi == 0 {
			return `\[\]`
		}
		rest := -1
		if hi > 0 {
			rest = hi - 1
		}
		return `\[(?:` + item + more + rep(0, rest) + `)?\]`
	}
	rest := -1
	if hi > 0 {
		rest = hi - 1
	}
	return `\[` + item + more + rep(lo-1, rest) + `\]`
}

// maxCountedSize bounds the size of a counted repetition (its pattern's
// length times the count): past it, Go's regexp parser refuses the
// expression as too large, so the bounds are left unenforced.
const maxCountedSize = 1 << 14

// expressible reports whether n copies of pattern can be counted.
func expressible(pattern string, n int) bool {
	return n <= maxRepeat && n*len(pattern) <= maxCountedSize
}

// objectOf is an object whose keys are any strings and whose values match
// value.
func objectOf(value string) string {
	member := jsonString + jsonColon + value
	return `\{(?:` + member + `(?:` + jsonComma + member + `)*)?\}`
}

// literal is the pattern of one JSON value exactly as json.Marshal writes
// it.
func literal(v any) (string, error) {
	b, err := json.Marshal(plainJSON(v))
	if err != nil {
		return "", err
	}
	return regexp.QuoteMeta(string(b)), nil
}

// plainJSON turns DecodeOrderedJSON's objects back into maps (for a
// literal: key order then follows json.Marshal's sorted keys).
func plainJSON(v any) any {
	switch x := v.(type) {
	case jinja.Ordered:
		m := make(map[string]any, len(x))
		for _, kv := range x {
			m[kv.Key] = plainJSON(kv.Value)
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plainJSON(e)
		}
		return out
	}
	return v
}

func get(o jinja.Ordered, key string) (any, bool) {
	for _, kv := range o {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// at names a schema location in messages ("" is the root).
func at(path string) string {
	if path == "" {
		return "the schema"
	}
	return path
}

func (c *schemaConv) value(s any, path string, depth int) (string, error) {
	if depth > maxSchemaDepth {
		return "", fmt.Errorf("%s: the schema nests (or refers to itself) more than %d levels deep; recursive schemas are not supported", at(path), maxSchemaDepth)
	}
	switch x := s.(type) {
	case bool:
		if !x {
			return "", fmt.Errorf("%s: the schema false accepts nothing", at(path))
		}
		return anyJSON(anyJSONDepth), nil
	case jinja.Ordered:
		return c.object(x, path, depth)
	}
	return "", fmt.Errorf("%s: a schema must be an object or a boolean, got %T", at(path), s)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (c *schemaConv) object(s jinja.Ordered, path string, depth int) (string, error) {
	if ref, ok := get(s, "$ref"); ok {
		target, err := c.resolve(ref, path)
		if err != nil {
			return "", err
		}
		return c.value(target, path, depth+1)
	}
	if v, ok := get(s, "const"); ok {
		return literal(v)
	}
	if v, ok := get(s, "enum"); ok {
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return "", fmt.Errorf("%s: enum must be a non-empty list", at(path))
		}
		alts := make([]string, len(list))
		for i, e := range list {
			var err error
			if alts[i], err = literal(e); err != nil {
				return "", fmt.Errorf("%s.enum[%d]: %v", at(path), i, err)
			}
		}
		return "(?:" + strings.Join(alts, "|") + ")", nil
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		if v, ok := get(s, key); ok {
			return c.alternatives(v, join(path, key), depth)
		}
	}
	if v, ok := get(s, "allOf"); ok {
		list, ok := v.([]any)
		if !ok || len(list) != 1 {
			return "", fmt.Errorf("%s: allOf is supported with one schema only", at(path))
		}
		return c.value(list[0], join(path, "allOf[0]"), depth+1)
	}
	for _, key := range []string{"not", "if", "patternProperties", "prefixItems", "dependentSchemas", "dependentRequired"} {
		if _, ok := get(s, key); ok {
			return "", fmt.Errorf("%s: %q is not supported", at(path), key)
		}
	}
	t, ok := get(s, "type")
	if !ok {
		// No type: what the keywords imply, else any value.
		switch {
		case has(s, "properties"):
			t = "object"
		case has(s, "items"):
			t = "array"
		default:
			return anyJSON(anyJSONDepth), nil
		}
	}
	switch tt := t.(type) {
	case string:
		return c.typed(s, tt, path, depth)
	case []any:
		alts := make([]string, 0, len(tt))
		for _, e := range tt {
			name, ok := e.(string)
			if !ok {
				return "", fmt.Errorf("%s: type must be a string or a list of strings", at(path))
			}
			p, err := c.typed(s, name, path, depth)
			if err != nil {
				return "", err
			}
			alts = append(alts, p)
		}
		if len(alts) == 0 {
			return "", fmt.Errorf("%s: type is an empty list", at(path))
		}
		return "(?:" + strings.Join(alts, "|") + ")", nil
	}
	return "", fmt.Errorf("%s: type must be a string or a list of strings", at(path))
}

func has(s jinja.Ordered, key string) bool { _, ok := get(s, key); return ok }

func (c *schemaConv) alternatives(v any, path string, depth int) (string, error) {
	list, ok := v.([]any)
	if !ok || len(list) == 0 {
		return "", fmt.Errorf("%s must be a non-empty list of schemas", path)
	}
	alts := make([]string, len(list))
	for i, e := range list {
		var err error
		if alts[i], err = c.value(e, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
			return "", err
		}
	}
	return "(?:" + strings.Join(alts, "|") + ")", nil
}

// resolve finds a local reference: "#", "#/$defs/NAME", "#/definitions/NAME".
func (c *schemaConv) resolve(ref any, path string) (any, error) {
	r, _ := ref.(string)
	if r == "#" {
		return c.root, nil
	}
	for _, prefix := range []string{"#/$defs/", "#/definitions/"} {
		if name, ok := strings.CutPrefix(r, prefix); ok {
			defs, _ := get(c.root, strings.Trim(prefix[1:], "/"))
			if d, ok := defs.(jinja.Ordered); ok {
				if target, ok := get(d, name); ok {
					return target, nil
				}
			}
			return nil, fmt.Errorf("%s: $ref %q names no definition of the schema", at(path), r)
		}
	}
	return nil, fmt.Errorf("%s: $ref %q is not supported (only local #/$defs/... and #/definitions/...)", at(path), r)
}

// count reads a non-negative integer keyword (-1 when absent).
func count(s jinja.Ordered, key, path string) (int, error) {
	v, ok := get(s, key)
	if !ok {
		return -1, nil
	}
	n, ok := v.(int64)
	if !ok || n < 0 || n > math.MaxInt32 {
		return 0, fmt.Errorf("%s: %s must be a non-negative integer", at(path), key)
	}
	return int(n), nil
}

func nonNegative(s jinja.Ordered) bool {
	for _, key := range []string{"minimum", "exclusiveMinimum"} {
		switch v := get1(s, key).(type) {
		case int64:
			if v >= 0 {
				return true
			}
		case float64:
			if v >= 0 {
				return true
			}
		}
	}
	return false
}

func get1(s jinja.Ordered, key string) any { v, _ := get(s, key); return v }

func (c *schemaConv) typed(s jinja.Ordered, t, path string, depth int) (string, error) {
	switch t {
	case "string":
		return c.str(s, path)
	case "integer":
		if nonNegative(s) {
			return `(?:0|[1-9][0-9]*)`, nil
		}
		return jsonInteger, nil
	case "number":
		if nonNegative(s) {
			return jsonNumber[2:], nil // without the sign
		}
		return jsonNumber, nil
	case "boolean":
		return "(?:true|false)", nil
	case "null":
		return "null", nil
	case "array":
		lo, err := count(s, "minItems", path)
		if err != nil {
			return "", err
		}
		hi, err := count(s, "maxItems", path)
		if err != nil {
			return "", err
		}
		lo = max(lo, 0)
		if hi >= 0 && hi < lo {
			return "", fmt.Errorf("%s: maxItems %d is below minItems %d", at(path), hi, lo)
		}
		item := anyJSON(anyJSONDepth - 1)
		if it, ok := get(s, "items"); ok {
			if item, err = c.value(it, join(path, "items"), depth+1); err != nil {
				return "", err
			}
		}
		return arrayOf(item, lo, hi), nil
	case "object":
		return c.properties(s, path, depth)
	}
	return "", fmt.Errorf("%s: unknown type %q", at(path), t)
}

// hasWordBoundary reports whether re holds \b or \B, which a guide's
// byte automaton cannot follow (structured.Compile refuses them).
func hasWordBoundary(re *syntax.Regexp) bool {
	if re.Op == syntax.OpWordBoundary || re.Op == syntax.OpNoWordBoundary {
		return true
	}
	for _, sub := range re.Sub {
		if hasWordBoundary(sub) {
			return true
		}
	}
	return false
}

func (c *schemaConv) str(s jinja.Ordered, path string) (string, error) {
	if p, ok := get(s, "pattern"); ok {
		pat, ok := p.(string)
		if !ok {
			return "", fmt.Errorf("%s: pattern must be a string", at(path))
		}
		pat = strings.TrimSuffix(strings.TrimPrefix(pat, "^"), "$")
		re, err := syntax.Parse(pat, syntax.Perl)
		if err != nil {
			return "", fmt.Errorf("%s: pattern: %v", at(path), err)
		}
		if hasWordBoundary(re) {
			return "", fmt.Errorf("%s: pattern: word boundaries (\\b, \\B) are not supported in a guide", at(path))
		}
		// Its parsed form: nothing in it (an unclosed \Q) can reach past
		// the closing quote.
		return `"(?:` + re.String() + `)"`, nil
	}
	if f, ok := get(s, "format"); ok {
		if p, ok := formats[fmt.Sprint(f)]; ok {
			return `"` + p + `"`, nil
		}
	}
	lo, err := count(s, "minLength", path)
	if err != nil {
		return "", err
	}
	hi, err := count(s, "maxLength", path)
	if err != nil {
		return "", err
	}
	switch {
	case lo < 0 && hi < 0:
		return jsonString, nil
	case hi >= 0 && lo > hi:
		return "", fmt.Errorf("%s: maxLength %d is below minLength %d", at(path), hi, lo)
	case !expressible(jsonChar, lo):
		return "", fmt.Errorf("%s: minLength %d is above the %d supported", at(path), lo, maxCountedSize/len(jsonChar))
	case hi < 0 || !expressible(jsonChar, hi):
		return fmt.Sprintf(`"%s{%d,}"`, jsonChar, max(lo, 0)), nil
	}
	return fmt.Sprintf(`"%s{%d,%d}"`, jsonChar, max(lo, 0), hi), nil
}

// properties is an object: its properties in the schema's order, the
// required ones always there, the others optional; no other keys (with
// no properties at all, any keys whose values match additionalProperties).
func (c *schemaConv) properties(s jinja.Ordered, path string, depth int) (string, error) {
	props, _ := get(s, "properties")
	po, _ := props.(jinja.Ordered)
	if props != nil && po == nil {
		return "", fmt.Errorf("%s: properties must be an object", at(path))
	}
	if len(po) == 0 {
		value := anyJSON(anyJSONDepth - 1)
		if ap, ok := get(s, "additionalProperties"); ok {
			if b, isBool := ap.(bool); isBool && !b {
				return `\{\}`, nil
			} else if !isBool {
				var err error
				if value, err = c.value(ap, join(path, "additionalProperties"), depth+1); err != nil {
					return "", err
				}
			}
		}
		return objectOf(value), nil
	}
	required := map[string]bool{}
	if r, ok := get(s, "required"); ok {
		list, ok := r.([]any)
		if !ok {
			return "", fmt.Errorf("%s: required must be a list of names", at(path))
		}
		for _, n := range list {
			name, ok := n.(string)
			if !ok {
				return "", fmt.Errorf("%s: required must be a list of names", at(path))
			}
			if !has(po, name) {
				return "", fmt.Errorf("%s: required names %q, which properties does not define", at(path), name)
			}
			required[name] = true
		}
	}
	members := make([]string, len(po))
	for i, kv := range po {
		v, err := c.value(kv.Value, join(join(path, "properties"), kv.Key), depth+1)
		if err != nil {
			return "", err
		}
		key, _ := json.Marshal(kv.Key)
		members[i] = regexp.QuoteMeta(string(key)) + jsonColon + v
	}
	// rest(k, first): the members from k on; first: none came before, so
	// the next one has no comma. An optional member after another is
	// (, member)?; the first one present chooses between itself and
	// skipping on.
	var rest func(k int, first bool) string
	rest = func(k int, first bool) string {
		if k == len(po) {
			return ""
		}
		m := members[k]
		switch {
		case required[po[k].Key] && first:
			return m + rest(k+1, false)
		case required[po[k].Key]:
			return jsonComma + m + rest(k+1, false)
		case first:
			return "(?:" + m + rest(k+1, false) + "|" + rest(k+1, true) + ")"
		}
		return "(?:" + jsonComma + m + ")?" + rest(k+1, false)
	}
	return `\{` + rest(0, true) + `\}`, nil
}
