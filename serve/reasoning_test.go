package serve

import (
	"math/rand"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/structured"
)

func TestReasoningSplit(t *testing.T) {
	r1, err := newReasoningParser("deepseek_r1")
	require.NoError(t, err)
	q3, err := newReasoningParser("qwen3")
	require.NoError(t, err)
	_, err = newReasoningParser("granite")
	require.ErrorContains(t, err, "deepseek_r1, glm45, qwen3")
	for _, c := range []struct {
		text               string
		r1Think, r1Content string
		q3Think, q3Content string
		r1Found, q3Found   bool
	}{
		{"plan</think>answer", "plan", "answer", "", "plan</think>answer", true, false},
		{"<think>plan</think>\n\nanswer", "plan", "\n\nanswer", "plan", "\n\nanswer", true, true},
		{"\n<think>plan</think>answer", "plan", "answer", "plan", "answer", true, true},
		{"still thinking", "still thinking", "", "", "still thinking", true, false},
		{"<think>cut short", "cut short", "", "cut short", "", true, true},
		{"just an answer", "just an answer", "", "", "just an answer", true, false},
		{"", "", "", "", "", true, false},
		{"a</think>b</think>c", "a", "b</think>c", "", "a</think>b</think>c", true, false},
	} {
		th, co, ok := r1.split(c.text)
		require.Equal(t, []any{c.r1Think, c.r1Content, c.r1Found}, []any{th, co, ok}, "deepseek_r1 %q", c.text)
		th, co, ok = q3.split(c.text)
		require.Equal(t, []any{c.q3Think, c.q3Content, c.q3Found}, []any{th, co, ok}, "qwen3 %q", c.text)
	}
}

// A streamed answer, cut into any pieces, gives out the thinking and the
// content the whole answer splits into.
func TestReasoningStreamMatchesSplit(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	texts := []string{"plan</think>answer", "<think>plan</think>\n\nanswer", "  <think>a</think>", "<thi", "  ", "",
		"x</thin", "</think>", "<think></think>", "no markers at all", "<think>cut short", "a</think>b</think>c",
		" <think> spaced </think> out "}
	for i := 0; i < 300; i++ {
		var b strings.Builder
		for k := rng.Intn(8); k > 0; k-- {
			b.WriteString([]string{"<think>", "</think>", "<", "/", "th", "ink>", "a", " ", "\n", "</thi"}[rng.Intn(10)])
		}
		texts = append(texts, b.String())
	}
	for _, name := range ReasoningParsers {
		p, err := newReasoningParser(name)
		require.NoError(t, err)
		for _, text := range texts {
			for cut := 0; cut < 4; cut++ {
				s := &reasoningStream{p: p}
				var think, content strings.Builder
				for rest := text; rest != ""; {
					n := min(len(rest), 1+rng.Intn(4))
					th, co := s.feed(rest[:n])
					think.WriteString(th)
					content.WriteString(co)
					rest = rest[n:]
				}
				th, co := s.end()
				think.WriteString(th)
				content.WriteString(co)
				wantThink, wantContent, _ := p.split(text)
				require.Equal(t, wantThink, think.String(), "%s %q: thinking", name, text)
				require.Equal(t, wantContent, content.String(), "%s %q: content", name, text)
			}
		}
	}
}

// reasoningServer is a fleet server whose chat template renders tools and
// a thinking switch, with --reasoning-parser parser (and hermes calls).
func reasoningServer(t *testing.T, parser string) (*Server, *httptest.Server) {
	spec := byteTokenizer(t).Spec()
	spec.ChatTemplate = `{% if tools %}[tools]{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}` +
		`{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}`
	tok, err := model.NewTokenizer(spec)
	require.NoError(t, err)
	s, _, ts := fleetServer(t, func(c *Config) { c.Tokenizer, c.ReasoningParser, c.ToolCallParser = tok, parser, "hermes" })
	return s, ts
}

// A chat answer's thinking comes back as reasoning_content, whole or
// streamed; the tool parser reads only the content (a call written while
// thinking is not a call).
func TestChatReasoningContent(t *testing.T) {
	s, ts := reasoningServer(t, "deepseek_r1")
	url := ts.URL
	ask := `{"max_tokens": 100, "messages": [{"role": "user", "content": "2+2?"}]`
	answer := "Two and two.<tool_call>{\"name\": \"f\"}</tool_call></think>\n\nIt is 4."
	done := postAsync(t, url+"/v1/chat/completions", ask+`}`)
	deliver(s, takeArrival(t, s), answer)
	ch := choicesOf(t, <-done)[0]
	msg := ch["message"].(map[string]any)
	require.Equal(t, "Two and two.<tool_call>{\"name\": \"f\"}</tool_call>", msg["reasoning_content"])
	require.Equal(t, "\n\nIt is 4.", msg["content"])
	require.Nil(t, msg["tool_calls"])
	require.NotEqual(t, "tool_calls", ch["finish_reason"])

	body := streamBody(t, url+"/v1/chat/completions", ask+`, "stream": true}`)
	a := takeArrival(t, s)
	toks := s.cfg.Tokenizer.Encode(answer, model.EncodeOptions{})
	streamPieces(s, a, toks[:5], toks[5:50], toks[50:62])
	deliverTokens(s, a, toks[62:], true, 0)
	var think, content strings.Builder
	for _, c := range sseChunks(t, <-body) {
		for _, ch := range choicesOf(t, c) {
			d := ch["delta"].(map[string]any)
			content.WriteString(d["content"].(string))
			if r, ok := d["reasoning_content"].(string); ok {
				think.WriteString(r)
			}
		}
	}
	require.Equal(t, msg["reasoning_content"], think.String())
	require.Equal(t, "\n\nIt is 4.", content.String())

	// A call in the content is one, whole and streamed.
	withTool := `{"max_tokens": 100, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "messages": [{"role": "user", "content": "go"}]`
	answer = "I should call f.</think><tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>"
	done = postAsync(t, url+"/v1/chat/completions", withTool+`}`)
	deliver(s, takeArrival(t, s), answer)
	ch = choicesOf(t, <-done)[0]
	msg = ch["message"].(map[string]any)
	require.Equal(t, "tool_calls", ch["finish_reason"])
	require.Equal(t, "I should call f.", msg["reasoning_content"])
	require.Len(t, msg["tool_calls"], 1)
	body = streamBody(t, url+"/v1/chat/completions", withTool+`, "stream": true}`)
	deliver(s, takeArrival(t, s), answer)
	_, calls, finish := streamedAnswer(t, <-body)
	require.Len(t, calls, 1)
	require.Equal(t, "tool_calls", finish[len(finish)-1])
}

// chat_template_kwargs reach the template as variables (Qwen3's
// enable_thinking); a name the server sets, or a value that is not an
// object, is refused naming the field.
func TestChatTemplateKwargs(t *testing.T) {
	s, ts := reasoningServer(t, "qwen3")
	url := ts.URL
	user := `"messages": [{"role": "user", "content": "hi"}]`
	done := postAsync(t, url+"/v1/chat/completions", `{"max_tokens": 5, "chat_template_kwargs": {"enable_thinking": false}, `+user+`}`)
	a := takeArrival(t, s)
	require.Equal(t, "<user>hi<nothink>", s.cfg.Tokenizer.Decode(a.Prompt))
	deliver(s, a, "Hello")
	require.Equal(t, "Hello", choicesOf(t, <-done)[0]["message"].(map[string]any)["content"])
	done = postAsync(t, url+"/v1/chat/completions", `{"max_tokens": 5, `+user+`}`)
	a = takeArrival(t, s)
	require.Equal(t, "<user>hi", s.cfg.Tokenizer.Decode(a.Prompt))
	deliver(s, a, "<think>hm</think>Hello")
	msg := choicesOf(t, <-done)[0]["message"].(map[string]any)
	require.Equal(t, "hm", msg["reasoning_content"])
	require.Equal(t, "Hello", msg["content"])

	status, tk := post(t, ts, "/tokenize", "", `{"chat_template_kwargs": {"enable_thinking": false}, `+user+`}`)
	require.Equal(t, 200, status)
	var ids []int32
	for _, v := range tk["tokens"].([]any) {
		ids = append(ids, int32(v.(float64)))
	}
	require.Contains(t, s.cfg.Tokenizer.Decode(ids), "<nothink>")
	for _, c := range []struct{ kw, msg string }{
		{`{"messages": []}`, `may not set "messages"`},
		{`{"add_generation_prompt": false}`, `may not set "add_generation_prompt"`},
		{`[1]`, "must be an object"},
		{`"x"`, "must be an object"},
	} {
		status, m := post(t, ts, "/v1/chat/completions", "", `{"chat_template_kwargs": `+c.kw+`, `+user+`}`)
		require.Equal(t, 400, status)
		e := m["error"].(map[string]any)
		require.Equal(t, "chat_template_kwargs", e["param"])
		require.Contains(t, e["message"], c.msg)
	}
}

// The Responses API gives the thinking as a reasoning item before the
// message, whole and streamed (reasoning_text events, then the message's
// output_text ones); log-probabilities are refused with a reasoning
// parser there.
func TestResponsesReasoningItem(t *testing.T) {
	s, ts := reasoningServer(t, "deepseek_r1")
	url := ts.URL
	answer := "Two and two.</think>It is 4."
	done := postResponse(t, url, `{"model": "m", "input": "2+2?"}`)
	deliver(s, takeArrival(t, s), answer)
	out := (<-done)["output"].([]any)
	require.Len(t, out, 2)
	rs, msg := out[0].(map[string]any), out[1].(map[string]any)
	require.Equal(t, "reasoning", rs["type"])
	require.Equal(t, []any{}, rs["summary"])
	require.Equal(t, "Two and two.", rs["content"].([]any)[0].(map[string]any)["text"])
	require.Equal(t, "reasoning_text", rs["content"].([]any)[0].(map[string]any)["type"])
	require.Equal(t, "It is 4.", msg["content"].([]any)[0].(map[string]any)["text"])

	b := streamBody(t, url+"/v1/responses", `{"model": "m", "input": "2+2?", "stream": true}`)
	a := takeArrival(t, s)
	toks := s.cfg.Tokenizer.Encode(answer, model.EncodeOptions{})
	streamPieces(s, a, toks[:4], toks[4:16])
	deliverTokens(s, a, toks[16:], true, 0)
	evs := responseEvents(t, <-b)
	var types []string
	thought, text := "", ""
	for i, ev := range evs {
		require.EqualValues(t, i, ev["sequence_number"])
		types = append(types, ev["type"].(string))
		switch ev["type"] {
		case "response.reasoning_text.delta":
			thought += ev["delta"].(string)
		case "response.output_text.delta":
			text += ev["delta"].(string)
		}
	}
	require.Equal(t, "Two and two.", thought)
	require.Equal(t, "It is 4.", text)
	require.Contains(t, types, "response.reasoning_text.done")
	final := evs[len(evs)-1]["response"].(map[string]any)["output"].([]any)
	require.Len(t, final, 2)
	require.Equal(t, "reasoning", final[0].(map[string]any)["type"])
	require.Equal(t, 1.0, evs[len(evs)-2]["output_index"]) // the message's output_item.done

	status, m := post(t, ts, "/v1/responses", "", `{"model": "m", "input": "hi", "top_logprobs": 2}`)
	require.Equal(t, 400, status, "%v", m)
	require.Contains(t, m["error"].(map[string]any)["message"], "--reasoning-parser")
}

// With a reasoning parser, a structured output constrains the content
// only: the thinking before the first </think> is free (vLLM applies the
// grammar once the reasoning ends). The guide the fleet gets accepts a
// thought and then the object, and refuses text or a second </think>
// between them; the answer comes back split.
func TestStructuredOutputAfterThinking(t *testing.T) {
	for _, parser := range ReasoningParsers {
		t.Run(parser, func(t *testing.T) {
			s, ts := reasoningServer(t, parser)
			tok := s.cfg.Tokenizer
			v, err := structured.NewVocab(tok.TextPieces(), tok.StopTokens())
			require.NoError(t, err)
			s.cfg.Guides = structured.NewCache(v, 8)
			done := postAsync(t, ts.URL+"/v1/chat/completions",
				`{"max_tokens": 100, "response_format": {"type": "json_object"}, "messages": [{"role": "user", "content": "go"}]}`)
			a := takeArrival(t, s)
			g, err := s.cfg.Guides.Guide(a.Guide)
			require.NoError(t, err)
			accepts := func(text string) bool {
				m := g.NewMatcher()
				for _, id := range tok.Encode(text, model.EncodeOptions{}) {
					if !m.Advance(id) {
						return false
					}
				}
				return m.Accepting()
			}
			open := map[string]string{"deepseek_r1": "", "qwen3": "<think>", "glm45": "<think>"}[parser]
			for _, c := range []struct {
				text string
				ok   bool
			}{
				{open + "Let me see: <b> and </thin k> are fine.</think>\n\n{\"a\": 1}", true},
				{open + "a < b </think>{}", true},
				{open + "x</think> y {}", false},
				{open + "x</think>{}</think>", false},
				{open + "x</think>\n</think>{}", false},
				{"{\"a\": 1}", parser != "deepseek_r1"}, // qwen3 and glm45 may answer without thinking
			} {
				require.Equal(t, c.ok, accepts(c.text), "%q", c.text)
			}
			deliver(s, a, open+"Plan.</think>\n{\"a\": 1}")
			msg := choicesOf(t, <-done)[0]["message"].(map[string]any)
			require.Equal(t, "Plan.", msg["reasoning_content"])
			require.Equal(t, "\n{\"a\": 1}", msg["content"])
		})
	}
}
