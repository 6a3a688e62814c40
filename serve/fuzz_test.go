package serve

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
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

// FuzzRequestDecoding: any body on either endpoint gets an answer with a
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
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	tok := byteTokenizer(f)
	spec := tok.Spec()
	spec.ChatTemplate = `{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}`
	chatTok, err := model.NewTokenizer(spec)
	if err != nil {
		f.Fatal(err)
	}
	s, _, _ := fleetServer(f, func(c *Config) { c.Tokenizer, c.MaxBodyBytes = chatTok, 2048 })
	stop := make(chan struct{})
	f.Cleanup(func() { close(stop) })
	go answerAll(s, stop)
	h := s.Handler()
	known := map[int]bool{200: true, 400: true, 404: true, 408: true, 413: true, 429: true, 500: true, 503: true}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
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
