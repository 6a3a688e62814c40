package serve

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/lockstep-ai/lockstep/model"
)

// Structured outputs: OpenAI's response_format (json_object, json_schema)
// and vLLM's guided_json, guided_regex, guided_choice and
// structured_outputs {json, regex, choice, json_object} each become one
// regular expression the answer must match (executor.Arrival.Guide; the
// structured package constrains every pick to it). At most one per
// request.

// guideSpec is a request's constraint: the field that gave it and its
// pattern.
type guideSpec struct {
	Param   string
	Pattern string
}

// checkGuide reads the request's structured-output fields into p.Guide.
func (r *rawParams) checkGuide(p *genParams) *apiError {
	var specs []guideSpec
	add := func(param, pattern string) { specs = append(specs, guideSpec{param, pattern}) }
	if notNull(r.ResponseFormat) && !jsonTypeText(r.ResponseFormat) {
		pat, e := responseFormatPattern(r.ResponseFormat)
		if e != nil {
			return e
		}
		add("response_format", pat)
	}
	if notNull(r.GuidedGrammar) {
		return badRequest("guided_grammar", "grammars (EBNF, Lark) are not supported: use guided_regex, guided_choice or guided_json")
	}
	if notNull(r.GuidedJSON) {
		pat, e := jsonSchemaPattern("guided_json", r.GuidedJSON, true)
		if e != nil {
			return e
		}
		add("guided_json", pat)
	}
	if notNull(r.GuidedRegex) {
		pat, e := regexPattern("guided_regex", r.GuidedRegex)
		if e != nil {
			return e
		}
		add("guided_regex", pat)
	}
	if notNull(r.GuidedChoice) {
		pat, e := choicePattern("guided_choice", r.GuidedChoice)
		if e != nil {
			return e
		}
		add("guided_choice", pat)
	}
	if notNull(r.StructuredOutputs) {
		spec, e := structuredOutputsPattern(r.StructuredOutputs)
		if e != nil {
			return e
		}
		if spec.Pattern != "" {
			specs = append(specs, spec)
		}
	}
	switch len(specs) {
	case 0:
		return nil
	case 1:
		p.Guide, p.GuideParam = specs[0].Pattern, specs[0].Param
		return nil
	}
	return badRequest(specs[1].Param, "%s and %s both constrain the output: give one", specs[0].Param, specs[1].Param)
}

// responseFormatPattern is OpenAI's response_format: {"type":
// "json_object"} or {"type": "json_schema", "json_schema": {"name",
// "schema", "strict"?, "description"?}}.
func responseFormatPattern(raw json.RawMessage) (string, *apiError) {
	var f struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return "", badRequest("response_format", `response_format must be {"type": "text" | "json_object" | "json_schema", ...}: %v`, err)
	}
	switch f.Type {
	case "json_object":
		return objectPattern(), nil
	case "json_schema":
		if f.JSONSchema == nil {
			return "", badRequest("response_format", `response_format of type "json_schema" needs "json_schema": {"name": ..., "schema": {...}}`)
		}
		if !notNull(f.JSONSchema.Schema) {
			// OpenAI's schema is optional: any JSON object then.
			return objectPattern(), nil
		}
		return jsonSchemaPattern("response_format", f.JSONSchema.Schema, false)
	}
	return "", badRequest("response_format", `response_format type must be "text", "json_object" or "json_schema", got %q`, f.Type)
}

// objectPattern is json_object's: any JSON object (nested at most
// anyJSONDepth levels).
func objectPattern() string { return objectOf(anyJSON(anyJSONDepth - 1)) }

// jsonSchemaPattern converts a schema given as a JSON object (or, where
// vLLM takes it, a string holding one).
func jsonSchemaPattern(param string, raw json.RawMessage, textOK bool) (string, *apiError) {
	if textOK {
		var text string
		if json.Unmarshal(raw, &text) == nil {
			raw = json.RawMessage(text)
		}
	}
	v, err := model.DecodeOrderedJSON(raw)
	if err != nil {
		return "", badRequest(param, "%s: the JSON schema does not parse: %v", param, err)
	}
	pat, err := schemaPattern(v)
	if err != nil {
		return "", badRequest(param, "%s: %v", param, err)
	}
	return pat, nil
}

func regexPattern(param string, raw json.RawMessage) (string, *apiError) {
	var re string
	if err := json.Unmarshal(raw, &re); err != nil || re == "" {
		return "", badRequest(param, "%s must be a non-empty string (a regular expression)", param)
	}
	return re, nil
}

func choicePattern(param string, raw json.RawMessage) (string, *apiError) {
	var choices []string
	if err := json.Unmarshal(raw, &choices); err != nil || len(choices) == 0 {
		return "", badRequest(param, "%s must be a non-empty list of strings", param)
	}
	alts := make([]string, len(choices))
	for i, c := range choices {
		if c == "" {
			return "", badRequest(param, "%s[%d] is empty", param, i)
		}
		alts[i] = regexp.QuoteMeta(c)
	}
	return "(?:" + strings.Join(alts, "|") + ")", nil
}

// structuredOutputsPattern is vLLM's structured_outputs: one of json,
// regex, choice or json_object (grammar and structural_tag are not
// supported).
func structuredOutputsPattern(raw json.RawMessage) (guideSpec, *apiError) {
	var so map[string]json.RawMessage
	if err := json.Unmarshal(raw, &so); err != nil {
		return guideSpec{}, badRequest("structured_outputs", "structured_outputs must be an object: %v", err)
	}
	var specs []guideSpec
	for _, key := range []string{"json", "regex", "choice", "json_object", "grammar", "structural_tag"} {
		v, ok := so[key]
		if !ok || !notNull(v) {
			continue
		}
		param := "structured_outputs." + key
		var pat string
		var e *apiError
		switch key {
		case "json":
			pat, e = jsonSchemaPattern(param, v, true)
		case "regex":
			pat, e = regexPattern(param, v)
		case "choice":
			pat, e = choicePattern(param, v)
		case "json_object":
			var on bool
			if json.Unmarshal(v, &on) != nil {
				return guideSpec{}, badRequest(param, "%s must be a boolean", param)
			}
			if !on {
				continue
			}
			pat = objectPattern()
		default:
			return guideSpec{}, badRequest(param, "%s is not supported: use json, regex, choice or json_object", param)
		}
		if e != nil {
			return guideSpec{}, e
		}
		specs = append(specs, guideSpec{param, pat})
	}
	for _, key := range slices.Sorted(maps.Keys(so)) { // the first bad field, the same every time
		v, param := so[key], "structured_outputs."+key
		switch key {
		case "json", "regex", "choice", "json_object", "grammar", "structural_tag":
		case "disable_fallback":
			// There is one backend and nothing to fall back to: either
			// value is what lockstep does.
			if v := string(v); v != "true" && v != "false" && v != "null" {
				return guideSpec{}, badRequest(param, "%s must be a boolean", param)
			}
		case "disable_any_whitespace", "disable_additional_properties":
			// What lockstep always does: compact JSON, no properties a
			// schema does not name.
			if v := string(v); v != "true" && v != "null" {
				return guideSpec{}, badRequest(param, "%s: lockstep always writes compact JSON without unnamed properties; only true is accepted", param)
			}
		case "whitespace_pattern", "backend":
			if notNull(v) {
				return guideSpec{}, badRequest(param, "%s is not supported (one backend; compact JSON)", param)
			}
		default:
			return guideSpec{}, badRequest(param, "structured_outputs has no field %q", key)
		}
	}
	switch len(specs) {
	case 0:
		return guideSpec{}, nil
	case 1:
		return specs[0], nil
	}
	return guideSpec{}, badRequest(specs[1].Param, "%s and %s both constrain the output: give one", specs[0].Param, specs[1].Param)
}

// checkGuide compiles p's guide for the model's vocabulary before
// anything is queued, so that a pattern the fleet cannot run is the
// client's 400 naming its field, never a failed request.
func (s *Server) checkGuide(p *genParams) *apiError {
	if p.Guide == "" {
		return nil
	}
	if s.cfg.Guides == nil {
		return badRequest(p.GuideParam, "%s: structured outputs need the model's tokenizer, and %s has none", p.GuideParam, s.cfg.ModelName)
	}
	g, err := s.cfg.Guides.Guide(p.Guide)
	if err != nil {
		return badRequest(p.GuideParam, "%s: the pattern does not compile: %v", p.GuideParam, err)
	}
	if !g.NewMatcher().Live() {
		return badRequest(p.GuideParam, "%s: no token of the model's vocabulary can begin a match", p.GuideParam)
	}
	return nil
}
