package serve

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/structured"
)

// answerAll is a fleet that answers every request at once with a few
// tokens, until stop is closed.
func answerAll(s *Server, stop <-chan struct{}) {
	toks := s.cfg.Tokenizer.Encode("ok then", model.EncodeOptions{})
	for {
		select {
		case <-stop:
			return
		case <-time.After(200 * time.Microsecond):
		}
		for _, id := range s.src.Cancelled() {
			s.onResponse(executor.Response{ID: id, Error: executor.CancelledError})
		}
		for _, a := range s.src.Due(time.Now()) {
			n := min(a.MaxNewTokens, len(toks))
			deltas := make([]executor.TokenDelta, n)
			for i := range deltas {
				deltas[i] = executor.TokenDelta{ID: a.ID, Token: toks[i]}
			}
			s.onTokens(deltas)
			s.onResponse(executor.Response{ID: a.ID, Output: toks[:n], ArrivalUnixNS: a.ArrivalUnixNS})
		}
	}
}

// FuzzRequestDecoding: any body on completions, chat or responses gets an answer with a
// known status: 200 with a completion, or an OpenAI-shaped error; nothing
// panics, and nothing stays registered afterwards (issue 23).
func FuzzRequestDecoding(f *testing.F) {
	for _, seed := range []string{
		`{"prompt":"Hi","max_tokens":3}`,
		`{"prompt":[1,2,3],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"hi"}],"stop":["o"],"temperature":0.5,"seed":3}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"top_k":3000000000}`,
		`{"prompt":"Hi","max_tokens":2} garbage}`,
		`{"prompt":"` + string(bytes.Repeat([]byte("x"), 3000)) + `"}`,
		`{"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"1"}],` +
			`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"stream":true}`,
		`{"messages":[{"role":"user","content":"w?"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none","parallel_tool_calls":false}`,
		`{"prompt":"Hi","guided_json":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},"min_tokens":1}`,
		`{"messages":[{"role":"user","content":"w?"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required"}`,
		`{"input":"hi","instructions":"be brief","max_output_tokens":4,"stream":true}`,
		`{"input":[{"role":"user","content":"w?"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"1"}],` +
			`"tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"},"text":{"format":{"type":"json_object"}}}`,
	} {
		for ep := range uint8(3) {
			f.Add(seed, ep)
		}
	}
	tok := byteTokenizer(f)
	spec := tok.Spec()
	spec.ChatTemplate = `{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ m.tool_calls | tojson if m.tool_calls else '' }}{% endfor %}`
	chatTok, err := model.NewTokenizer(spec)
	if err != nil {
		f.Fatal(err)
	}
	v, err := structured.NewVocab(chatTok.TextPieces(), chatTok.StopTokens())
	if err != nil {
		f.Fatal(err)
	}
	s, _, _ := fleetServer(f, func(c *Config) {
		c.Tokenizer, c.MaxBodyBytes, c.ToolCallParser, c.Guides = chatTok, 2048, "hermes", structured.NewCache(v, 8)
	})
	stop := make(chan struct{})
	f.Cleanup(func() { close(stop) })
	go answerAll(s, stop)
	h := s.Handler()
	known := map[int]bool{200: true, 400: true, 404: true, 408: true, 413: true, 429: true, 500: true, 503: true}
	f.Fuzz(func(t *testing.T, body string, endpoint uint8) {
		path := []string{"/v1/completions", "/v1/chat/completions", "/v1/responses"}[endpoint%3]
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader([]byte(body))))
		if !known[rec.Code] {
			t.Fatalf("status %d for %q", rec.Code, body)
		}
		if rec.Code != 200 {
			var e struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" {
				t.Fatalf("status %d without an OpenAI error body: %q", rec.Code, rec.Body.String())
			}
		}
		// A request withdrawn by a stop string leaves once the fleet's
		// answer to the withdrawal is in.
		for deadline := time.Now().Add(5 * time.Second); ; {
			s.mu.Lock()
			left := len(s.calls)
			s.mu.Unlock()
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d calls left registered after %q", left, body)
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// FuzzToolCallText: whatever a model writes and however it is cut into
// streamed pieces, the streamed content and calls are the whole answer's:
// the pieces fed to a toolStream, with what end returns, make the content
// parseHermes finds (or the whole text when it reads no call), and the
// same calls.
func FuzzToolCallText(f *testing.F) {
	for _, seed := range []string{
		"plain text",
		`Let me see.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>`,
		`<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g"}`,
		`So.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]`,
		`[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}`,
		"<tool_call>\n{\"name\": \"g\"}\n</tool_call>\n<tool_call>{\"name\": \"h\", \"arguments\": \"{}\"}",
		"<tool_<tool_call>x</tool_call>",
		"a<tool_cal",
		"Hm.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
		"<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
		`[get_weather(city="Rome", n=[1, 2.5, None]), now()]`,
		`<|python_start|>[f(s='a\'b')]<|python_end|>`,
		"x\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n<arg_key>n</arg_key><arg_value>[1, True]</arg_value>\n</tool_call>",
	} {
		f.Add(seed, uint8(3))
	}
	var parsers []*toolParser
	for _, name := range ToolCallParsers {
		p, err := newToolParser(name)
		if err != nil {
			f.Fatal(err)
		}
		parsers = append(parsers, p)
	}
	f.Fuzz(func(t *testing.T, text string, cut uint8) {
		for _, p := range parsers {
			checkToolStream(t, p, text, cut)
		}
	})
}

// checkToolStream is FuzzToolCallText's property for one parser.
func checkToolStream(t *testing.T, p *toolParser, text string, cut uint8) {
	content, calls, ok := p.parse(text)
	if !ok && (content != text || calls != nil) {
		t.Fatalf("%s: unread %q gave content %q and %d calls", p.name, text, content, len(calls))
	}
	ts := &toolStream{p: p}
	var streamed strings.Builder
	step := int(cut%16) + 1
	for i := 0; i < len(text); i += step {
		streamed.WriteString(ts.feed(text[i:min(len(text), i+step)]))
	}
	rest, got := ts.end()
	streamed.WriteString(rest)
	if streamed.String() != content {
		t.Fatalf("%s: %q in pieces of %d streamed %q, the whole answer's content is %q", p.name, text, step, streamed.String(), content)
	}
	if len(got) != len(calls) {
		t.Fatalf("%s: %q in pieces of %d: %d calls streamed, %d in the whole answer", p.name, text, step, len(got), len(calls))
	}
	for i := range got {
		if got[i].Function != calls[i].Function {
			t.Fatalf("%s: %q: call %d streamed %+v, whole %+v", p.name, text, i, got[i].Function, calls[i].Function)
		}
	}
}
