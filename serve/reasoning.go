package serve

import (
	"fmt"
	"strings"
)

// Reasoning parsers (vLLM's --reasoning-parser): a reasoning model writes
// its thinking between <think> and </think> before the answer; the parser
// moves it out of the message's content into reasoning_content, whole or
// streamed, and the tool-call parser then reads only the content.
//
//   - deepseek_r1: the thinking runs from the start of the answer (whose
//     template opens <think> in the prompt; a <think> the model writes
//     anyway is dropped) to </think>; an answer without </think> is all
//     thinking (it was cut short). DeepSeek-R1 and its distillations, QwQ.
//   - qwen3: the thinking is there only when the answer opens with
//     <think>, up to </think> (or the end of a cut answer); any other
//     answer is all content (Qwen3 with enable_thinking false).
//   - glm45: as qwen3 (GLM-4.5 to 4.7 write <think> themselves, and their
//     templates close an empty one for enable_thinking false).

// ReasoningParsers are the names --reasoning-parser takes.
var ReasoningParsers = []string{"deepseek_r1", "glm45", "qwen3"}

const (
	thinkStart = "<think>"
	thinkEnd   = "</think>"
)

// reasoningParser is one of ReasoningParsers.
type reasoningParser struct {
	name string
	// fromStart: the thinking starts with the answer (deepseek_r1);
	// otherwise only an answer that opens with <think> has any.
	fromStart bool
}

func newReasoningParser(name string) (*reasoningParser, error) {
	switch name {
	case "deepseek_r1":
		return &reasoningParser{name: name, fromStart: true}, nil
	case "qwen3", "glm45":
		return &reasoningParser{name: name}, nil
	}
	return nil, fmt.Errorf("unknown reasoning parser %q (supported: %s)", name, strings.Join(ReasoningParsers, ", "))
}

// split divides a whole answer into its thinking and its content; ok
// false when it has no thinking (then reasoning is "").
func (r *reasoningParser) split(text string) (reasoning, content string, ok bool) {
	body, opened := strings.CutPrefix(strings.TrimLeft(text, " \t\r\n"), thinkStart)
	if !opened {
		if !r.fromStart {
			return "", text, false
		}
		body = text
	}
	if before, after, found := strings.Cut(body, thinkEnd); found {
		return before, after, true
	}
	return body, "", true
}

// thinkingFree matches any text without </think>: runs without '<', each
// '<' followed by text that neither holds a '<' nor starts with
// "/think>" (the marker's letters are all different, so no other overlap
// can complete it).
const thinkingFree = `[^<]*(?:<(?:[^</][^<]*|/(?:[^<t][^<]*|t(?:[^<h][^<]*|h(?:[^<i][^<]*|i(?:[^<n][^<]*|` +
	`n(?:[^<k][^<]*|k(?:[^<>][^<]*)?)?)?)?)?)?)?)*`

// guidePrefix is what a structured output's pattern is preceded by under
// this parser: the thinking, free text up to the first </think>, then
// white space, so that the grammar applies to the content only, as vLLM
// applies it once the reasoning ends. deepseek_r1 thinks from the start;
// qwen3 may open with <think> or not.
func (r *reasoningParser) guidePrefix() string {
	if r.fromStart {
		return thinkingFree + thinkEnd + `[ \t\r\n]*`
	}
	return `(?:[ \t\r\n]*` + thinkStart + thinkingFree + thinkEnd + `[ \t\r\n]*)?`
}

// reasoningStream is a streamed choice's view of its text under a
// reasoning parser: what may still be the start marker (at the start) or
// the end marker is held back until the next piece decides.
type reasoningStream struct {
	p       *reasoningParser
	held    string
	started bool // past the answer's opening (its leading white space and <think>)
	inside  bool // the text is thinking
}

// feed takes the next piece of text and returns the thinking and the
// content it lets out.
func (s *reasoningStream) feed(piece string) (reasoning, content string) {
	text := s.held + piece
	s.held = ""
	if !s.started {
		trimmed := strings.TrimLeft(text, " \t\r\n")
		switch {
		case strings.HasPrefix(trimmed, thinkStart):
			s.started, s.inside = true, true
			text = trimmed[len(thinkStart):]
		case strings.HasPrefix(thinkStart, trimmed): // "" included: wait
			s.held = text
			return "", ""
		default:
			s.started, s.inside = true, s.p.fromStart
		}
	}
	if !s.inside {
		return "", text
	}
	if before, after, found := strings.Cut(text, thinkEnd); found {
		s.inside = false
		return before, after
	}
	hold := partialSuffix(text, thinkEnd)
	s.held = text[len(text)-hold:]
	return text[:len(text)-hold], ""
}

// end returns what is held once the answer is over.
func (s *reasoningStream) end() (reasoning, content string) {
	rest := s.held
	s.held = ""
	switch {
	case !s.started:
		// The whole answer was white space or part of <think>.
		r, c, _ := s.p.split(rest)
		return r, c
	case s.inside:
		return rest, ""
	}
	return "", rest
}
