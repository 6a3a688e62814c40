package serve

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/structured"
)

// Each schema's pattern accepts its examples and refuses its
// counter-examples (Go's regexp, whole text).
func TestSchemaPatterns(t *testing.T) {
	cases := []struct {
		schema   string
		good     []string
		bad      []string
		contains string // part of the pattern (when the examples cannot show it)
	}{
		{`{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}`,
			[]string{`{"name": "Ada", "age": 36}`, `{"name":"Ada","age":-1}`, `{"name": "\"q\" \u00e9", "age": 0}`},
			[]string{`{"age": 36, "name": "Ada"}`, `{"name": "Ada"}`, `{"name": "Ada", "age": 3.5}`, `{"name": "Ada", "age": 36, "x": 1}`, `{"name": "Ada", "age": 01}`}, ""},
		{`{"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "number"}}, "required": ["b"]}`,
			[]string{`{"b": null}`, `{"a": true, "b": null}`, `{"b": null, "c": 1.5e3}`, `{"a": false, "b": null, "c": -0.5}`},
			[]string{`{}`, `{"a": true}`, `{, "b": null}`, `{"b": null,}`, `{"b": null, "a": true}`}, ""},
		{`{"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}`, // nothing required
			[]string{`{}`, `{"x": 1}`, `{"y": 2}`, `{"x": 1, "y": 2}`},
			[]string{`{"y": 2, "x": 1}`, `{"x": 1,}`, `{, "y": 2}`}, ""},
		{`{"type": "array", "items": {"enum": ["red", "green", 3, null]}, "minItems": 1, "maxItems": 3}`,
			[]string{`["red"]`, `["red", 3, null]`, `[null,"green"]`},
			[]string{`[]`, `["red", "red", "red", "red"]`, `["blue"]`}, ""},
		{`{"type": "array", "items": {"type": "integer", "minimum": 0}}`,
			[]string{`[]`, `[0, 12]`}, []string{`[-1]`, `[1,]`}, ""},
		{`{"anyOf": [{"type": "string", "maxLength": 3}, {"const": {"k": [1, 2]}}]}`,
			[]string{`"abc"`, `""`, `{"k":[1,2]}`}, []string{`"abcd"`, `{"k": [1, 2]}`}, ""},
		{`{"type": ["string", "null"], "minLength": 2}`, []string{`"ab"`, `null`}, []string{`"a"`, `1`}, ""},
		{`{"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}, "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}}, "required": ["from", "to"]}`,
			[]string{`{"from": {"x": 1}, "to": {"x": 2.5}}`}, []string{`{"from": {"x": 1}}`, `{"from": {}, "to": {"x": 1}}`}, ""},
		{`{"type": "string", "format": "date"}`, []string{`"2026-12-07"`}, []string{`"2026-13-07"`, `"today"`}, ""},
		{`{"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"}`, []string{`"AB12"`}, []string{`"A12"`, `"AB"`}, ""},
		{`{"type": "object", "additionalProperties": {"type": "integer"}}`,
			[]string{`{}`, `{"a": 1, "b": 2}`}, []string{`{"a": "x"}`}, ""},
		{`{"type": "object", "properties": {}, "additionalProperties": false}`, []string{`{}`}, []string{`{"a": 1}`}, ""},
		{`true`, []string{`1`, `"s"`, `{"a": [1, {"b": null}]}`, `[[[1]]]`}, []string{`[[[[[1]]]]]`, `{`}, ""},
		{`{"allOf": [{"type": "integer"}]}`, []string{`7`}, []string{`7.5`}, ""},
	}
	for _, c := range cases {
		v, err := model.DecodeOrderedJSON([]byte(c.schema))
		require.NoError(t, err, c.schema)
		pat, err := schemaPattern(v)
		require.NoError(t, err, c.schema)
		re := regexp.MustCompile(`^(?:` + pat + `)$`)
		for _, g := range c.good {
			require.True(t, re.MatchString(g), "%s should accept %s", c.schema, g)
		}
		for _, b := range c.bad {
			require.False(t, re.MatchString(b), "%s should refuse %s", c.schema, b)
		}
	}
	for _, c := range []struct{ schema, msg string }{
		{`{"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}`, "recursive schemas are not supported"},
		{`{"$ref": "#/$defs/missing"}`, "names no definition"},
		{`{"$ref": "https://example.com/s.json"}`, "only local"},
		{`{"not": {"type": "string"}}`, `"not" is not supported`},
		{`{"type": "tuple"}`, `unknown type "tuple"`},
		{`{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}`, `required names "b"`},
		{`{"type": "array", "minItems": 3, "maxItems": 2}`, "maxItems 2 is below minItems 3"},
		{`{"type": "object", "properties": {"a": {"type": "strin"}}}`, `properties.a: unknown type "strin"`},
		{`{"enum": []}`, "enum must be a non-empty list"},
		{`false`, "accepts nothing"},
		{`[1]`, "must be an object or a boolean"},
	} {
		v, err := model.DecodeOrderedJSON([]byte(c.schema))
		require.NoError(t, err, c.schema)
		_, err = schemaPattern(v)
		require.ErrorContains(t, err, c.msg, c.schema)
	}
}

// guidedServer is a test fleet server whose model vocabulary is the byte
// tokenizer's, with guides.
func guidedServer(t *testing.T, parser string) (*Server, string) {
	s, url := toolsServer(t, parser)
	tok := s.cfg.Tokenizer
	v, err := structured.NewVocab(tok.TextPieces(), tok.StopTokens())
	require.NoError(t, err)
	s.cfg.Guides = structured.NewCache(v, 8)
	return s, url
}

// The structured-output fields reach the fleet as the guide of every
// choice, and the answers are what the model wrote under it.
func TestStructuredOutputFields(t *testing.T) {
	s, url := guidedServer(t, "")
	person := `{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}`
	for _, c := range []struct {
		body      string
		good, bad string
	}{
		{`"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": ` + person + `}}`, `{"name": "Ada"}`, `{}`},
		{`"response_format": {"type": "json_object"}`, `{"a": [1, {"b": null}]}`, `[1]`},
		{`"guided_json": ` + person, `{"name": "Ada"}`, `{"name": 1}`},
		{`"guided_json": "{\"type\": \"integer\"}"`, `42`, `4.2`},
		{`"guided_regex": "[0-9]{3}-[a-z]+"`, `123-abc`, `12-abc`},
		{`"guided_choice": ["yes", "no (really)"]`, `no (really)`, `no`},
		{`"structured_outputs": {"choice": ["a.b", "c"]}`, `a.b`, `axb`},
		{`"structured_outputs": {"json": ` + person + `}`, `{"name":"x"}`, `{"name":"x",}`},
		{`"structured_outputs": {"regex": "x+", "disable_any_whitespace": true, "disable_fallback": false}`, `xxx`, `xy`},
		{`"structured_outputs": {"json_object": true}`, `{}`, `x`},
	} {
		done := postAsync(t, url+"/v1/completions", `{"prompt": "hi", "max_tokens": 50, "n": 2, `+c.body+`}`)
		as := takeArrivals(t, s, 2)
		require.Equal(t, as[0].Guide, as[1].Guide, c.body)
		re := regexp.MustCompile(`^(?:` + as[0].Guide + `)$`)
		require.True(t, re.MatchString(c.good), "%s: the guide refuses %s", c.body, c.good)
		require.False(t, re.MatchString(c.bad), "%s: the guide accepts %s", c.body, c.bad)
		deliver(s, as[0], c.good)
		deliver(s, as[1], c.good)
		for _, ch := range choicesOf(t, <-done) {
			require.Equal(t, c.good, ch["text"], c.body)
		}
	}
	// Text is no constraint.
	done := postAsync(t, url+"/v1/completions", `{"prompt": "hi", "max_tokens": 5, "response_format": {"type": "text"}}`)
	a := takeArrival(t, s)
	require.Empty(t, a.Guide)
	deliver(s, a, "ok")
	<-done
}

func TestStructuredOutputsRefused(t *testing.T) {
	_, url := guidedServer(t, "")
	for _, c := range []struct{ body, param, msg string }{
		{`"guided_grammar": "root ::= \"a\""`, "guided_grammar", "grammars (EBNF, Lark) are not supported"},
		{`"structured_outputs": {"grammar": "root ::= x"}`, "structured_outputs.grammar", "not supported"},
		{`"structured_outputs": {"regex": "a", "choice": ["b"]}`, "structured_outputs.choice", "both constrain the output"},
		{`"structured_outputs": {"regx": "a"}`, "structured_outputs.regx", `no field "regx"`},
		{`"structured_outputs": {"regex": "a", "disable_any_whitespace": false}`, "structured_outputs.disable_any_whitespace", "only true"},
		{`"structured_outputs": {"regex": "a", "whitespace_pattern": "[ ]*"}`, "structured_outputs.whitespace_pattern", "not supported"},
		{`"structured_outputs": {"regex": "a", "backend": "xgrammar"}`, "structured_outputs.backend", "not supported"},
		{`"structured_outputs": {"regex": "a", "disable_fallback": 3}`, "structured_outputs.disable_fallback", "boolean"},
		{`"guided_regex": "a", "guided_choice": ["b"]`, "guided_choice", "guided_regex and guided_choice both constrain"},
		{`"guided_regex": "(a"`, "guided_regex", "the pattern does not compile"},
		{`"guided_regex": ""`, "guided_regex", "non-empty string"},
		{`"guided_regex": "[^\\x00-\\x{10FFFF}]"`, "guided_regex", "no token of the model's vocabulary can begin a match"},
		{`"guided_choice": []`, "guided_choice", "non-empty list"},
		{`"guided_choice": ["a", ""]`, "guided_choice", "guided_choice[1] is empty"},
		{`"guided_json": {"type": "tuple"}`, "guided_json", `unknown type "tuple"`},
		{`"guided_json": "{oops"`, "guided_json", "does not parse"},
		{`"response_format": {"type": "xml"}`, "response_format", `must be "text", "json_object" or "json_schema"`},
		{`"response_format": {"type": "json_schema"}`, "response_format", `needs "json_schema"`},
		{`"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}`, "response_format", `"not" is not supported`},
	} {
		m := <-postAsync(t, url+"/v1/completions", `{"prompt": "hi", `+c.body+`}`)
		require.Equal(t, 400.0, m["status"], c.body)
		e := m["error"].(map[string]any)
		require.Equal(t, c.param, e["param"], c.body)
		require.Contains(t, e["message"], c.msg, c.body)
	}
	// Without a tokenizer (a preset) there is no vocabulary to guide.
	_, _, plain := fleetServer(t, func(c *Config) { c.Tokenizer = nil })
	m := <-postAsync(t, plain.URL+"/v1/completions", `{"prompt": [1, 2], "guided_regex": "a"}`)
	require.Equal(t, 400.0, m["status"])
	require.Contains(t, m["error"].(map[string]any)["message"], "structured outputs need the model's tokenizer")
}

// tool_choice "required" and a named function guide the answer into calls
// and return them as tool_calls, whole or streamed.
func TestForcedToolCalls(t *testing.T) {
	s, url := guidedServer(t, "")
	user := `"messages": [{"role": "user", "content": "Rome?"}]`
	two := `"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},` +
		` {"type": "function", "function": {"name": "get_time"}}]`
	for _, c := range []struct {
		choice, answer string
		names          []string
		bad            string
	}{
		{`{"type": "function", "function": {"name": "get_weather"}}`, `{"city": "Rome"}`, []string{"get_weather"}, `{"town": "Rome"}`},
		{`"required"`, `[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]`,
			[]string{"get_weather", "get_time"}, `[]`},
	} {
		for _, stream := range []bool{false, true} {
			body := `{"max_tokens": 100, "tool_choice": ` + c.choice + `, ` + two + `, ` + user
			var ch map[string]any
			var calls []any
			if stream {
				out := streamBody(t, url+"/v1/chat/completions", body+`, "stream": true}`)
				a := takeArrival(t, s)
				require.NotEmpty(t, a.Guide)
				deliver(s, a, c.answer)
				content, streamed, finish := streamedAnswer(t, <-out)
				require.Empty(t, content)
				require.Equal(t, "tool_calls", finish[len(finish)-1])
				calls = streamed
			} else {
				done := postAsync(t, url+"/v1/chat/completions", body+`}`)
				a := takeArrival(t, s)
				re := regexp.MustCompile(`^(?:` + a.Guide + `)$`)
				require.True(t, re.MatchString(c.answer), "the guide of %s refuses %s", c.choice, c.answer)
				require.False(t, re.MatchString(c.bad), "the guide of %s accepts %s", c.choice, c.bad)
				deliver(s, a, c.answer)
				ch = choicesOf(t, <-done)[0]
				require.Equal(t, "tool_calls", ch["finish_reason"])
				calls = ch["message"].(map[string]any)["tool_calls"].([]any)
			}
			require.Len(t, calls, len(c.names))
			for i, name := range c.names {
				fn := calls[i].(map[string]any)["function"].(map[string]any)
				require.Equal(t, name, fn["name"])
				require.True(t, strings.HasPrefix(fn["arguments"].(string), "{"), fn["arguments"])
			}
		}
	}
	// parallel_tool_calls false: the guide allows one call.
	done := postAsync(t, url+"/v1/chat/completions", `{"max_tokens": 100, "tool_choice": "required", "parallel_tool_calls": false, `+two+`, `+user+`}`)
	a := takeArrival(t, s)
	re := regexp.MustCompile(`^(?:` + a.Guide + `)$`)
	require.True(t, re.MatchString(`[{"name": "get_time", "parameters": {}}]`))
	require.False(t, re.MatchString(`[{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {}}]`))
	deliver(s, a, `[{"name": "get_time", "parameters": {}}]`)
	<-done
}

// FuzzSchemaPattern: any JSON is refused as a schema with an error, or
// becomes a pattern that compiles as a guide.
func FuzzSchemaPattern(f *testing.F) {
	for _, s := range []string{`{"type": "object", "properties": {"a": {"type": "string", "maxLength": 2000}}, "required": ["a"]}`,
		`{"type": "array", "items": {"enum": [1, "x", null]}, "minItems": 2, "maxItems": 5000}`,
		`{"anyOf": [{"type": "integer", "minimum": 0}, {"$ref": "#/$defs/d"}], "$defs": {"d": {"const": [1]}}}`,
		`{"type": "string", "pattern": "\\Q(", "format": "date"}`, `{"type": ["number", "null"]}`, `true`,
		`{"type": "object", "additionalProperties": {"type": "boolean"}}`} {
		f.Add([]byte(s))
	}
	pieces := make([][]byte, 256)
	for b := range pieces {
		pieces[b] = []byte{byte(b)}
	}
	v, err := structured.NewVocab(pieces, nil)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > 2000 {
			return
		}
		schema, err := model.DecodeOrderedJSON(raw)
		if err != nil {
			return
		}
		pat, err := schemaPattern(schema)
		if err != nil {
			return
		}
		if _, err := structured.Compile(pat, v); err != nil {
			t.Fatalf("schema %s gave a pattern that does not compile: %v", raw, err)
		}
	})
}

// min_tokens reaches every choice's arrival, and stop strings count only
// in the text of the tokens after the first min_tokens (vLLM's rule).
func TestMinTokensAndStopStrings(t *testing.T) {
	s, url := guidedServer(t, "")
	done := postAsync(t, url+"/v1/completions", `{"prompt": "hi", "max_tokens": 20, "min_tokens": 2, "stop": ["b"], "n": 2}`)
	as := takeArrivals(t, s, 2)
	for _, a := range as {
		require.Equal(t, 2, a.MinTokens)
		deliver(s, a, "abXab")
	}
	for _, ch := range choicesOf(t, <-done) {
		require.Equal(t, "abXa", ch["text"])
		require.Equal(t, "stop", ch["finish_reason"])
	}
	// Without min_tokens the first b stops it.
	done = postAsync(t, url+"/v1/completions", `{"prompt": "hi", "max_tokens": 20, "stop": ["b"]}`)
	a := takeArrival(t, s)
	require.Zero(t, a.MinTokens)
	deliver(s, a, "abXab")
	require.Equal(t, "a", choicesOf(t, <-done)[0]["text"])
	// A default max_tokens below min_tokens cuts min_tokens to it.
	done = postAsync(t, url+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "min_tokens": 100000}`)
	a = takeArrival(t, s)
	require.Equal(t, a.MaxNewTokens, a.MinTokens)
	deliver(s, a, "ok")
	<-done
}

// allowed_token_ids reach every choice's arrival, sorted and once each.
func TestAllowedTokenIDsField(t *testing.T) {
	s, url := guidedServer(t, "")
	done := postAsync(t, url+"/v1/completions", `{"prompt": "hi", "max_tokens": 5, "allowed_token_ids": [66, 65, 66], "n": 2}`)
	for _, a := range takeArrivals(t, s, 2) {
		require.Equal(t, []int32{65, 66}, a.AllowedTokenIDs)
		deliver(s, a, "AB")
	}
	<-done
}

// bad_words reach every choice's arrival as token sequences, each word
// as it starts the text and after a space.
func TestBadWordsField(t *testing.T) {
	s, url := guidedServer(t, "")
	tok := s.cfg.Tokenizer
	done := postAsync(t, url+"/v1/completions", `{"prompt": "hi", "max_tokens": 5, "bad_words": ["  no", "ab"], "n": 2}`)
	want := [][]int32{tok.Encode("no", model.EncodeOptions{}), tok.Encode("ab", model.EncodeOptions{})}
	// (With the byte tokenizer a space is a token of its own: " no" is
	// longer than "no", so it is not added.)
	for _, a := range takeArrivals(t, s, 2) {
		require.Equal(t, want, a.BadWords)
		deliver(s, a, "ok")
	}
	<-done
	for _, c := range []struct{ body, msg string }{
		{`"bad_words": [""]`, "bad_words[0] is empty"},
		{`"bad_words": "no"`, "list of strings"},
	} {
		m := <-postAsync(t, url+"/v1/completions", `{"prompt": "hi", `+c.body+`}`)
		require.Equal(t, 400.0, m["status"], c.body)
		require.Contains(t, m["error"].(map[string]any)["message"], c.msg)
	}
	_, _, plain := fleetServer(t, func(c *Config) { c.Tokenizer = nil })
	m := <-postAsync(t, plain.URL+"/v1/completions", `{"prompt": [1], "bad_words": ["x"]}`)
	require.Equal(t, 400.0, m["status"])
	require.Contains(t, m["error"].(map[string]any)["message"], "need the model's tokenizer")
}
