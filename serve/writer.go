package serve

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/lockstep-ai/lockstep/serve/openai"
)

// writer renders a completion in the endpoint's shape: server-sent events
// when streaming, one JSON body otherwise.
type writer struct {
	w        http.ResponseWriter
	flusher  http.Flusher
	chat     bool
	p        genParams
	id       string
	object   string
	model    string
	created  int64
	started  bool // streaming: headers and the first chunk are out
	roleSent bool
	echoed   bool // streaming: the echoed prompt is out
}

// id is the request's X-Request-Id (the server's numeric id by default):
// the completion's id is "cmpl-" or "chatcmpl-" and it, as vLLM's.
func newWriter(w http.ResponseWriter, endpoint, model string, id string, created int64, p genParams) *writer {
	wr := &writer{w: w, chat: endpoint == "chat", p: p, model: model, created: created, roleSent: endpoint != "chat"}
	wr.flusher, _ = w.(http.Flusher)
	if wr.chat {
		wr.id, wr.object = "chatcmpl-"+id, "chat.completion"
	} else {
		wr.id, wr.object = "cmpl-"+id, "text_completion"
	}
	return wr
}

func (wr *writer) event(v any) error {
	if !wr.started {
		h := wr.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Connection", "keep-alive")
		wr.w.WriteHeader(http.StatusOK)
		wr.started = true
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(wr.w, "data: %s\n\n", b); err != nil {
		return err
	}
	if wr.flusher != nil {
		wr.flusher.Flush()
	}
	return nil
}

func (wr *writer) chunkObject() string {
	if wr.chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

// choice is one chunk's or body's choice; finish is nil while streaming.
func (wr *writer) choice(text string, ids []int32, finish *string, final bool) openai.Choice {
	c := openai.Choice{FinishReason: finish}
	if wr.chat {
		if final && !wr.p.Stream {
			c.Message = &openai.Message{Role: "assistant", Content: text}
		} else {
			d := &openai.Message{Content: text}
			if !wr.roleSent {
				d.Role = "assistant"
				wr.roleSent = true
			}
			c.Delta = d
		}
	} else {
		c.Text, c.Logprobs = &text, openai.NullLogprobs
	}
	if wr.p.ReturnTokenID {
		if ids == nil {
			ids = []int32{}
		}
		c.TokenIDs = &ids
	}
	return c
}

// chunk is a streamed chunk of choices (and usage).
func (wr *writer) chunk(choices []openai.Choice, u *openai.Usage) openai.Completion {
	return openai.Completion{ID: wr.id, Object: wr.chunkObject(), Created: wr.created, Model: wr.model,
		Choices: choices, Usage: u}
}

// delta streams newly produced text (and ids); a no-op without streaming.
// With stream_options.continuous_usage_stats every chunk carries u, the
// usage so far.
func (wr *writer) delta(text string, ids []int32, u openai.Usage) error {
	if wr.p.Stream && wr.p.EchoText != "" && !wr.echoed {
		// echo: the prompt's text is the stream's first chunk.
		wr.echoed = true
		if err := wr.event(wr.chunk([]openai.Choice{wr.choice(wr.p.EchoText, nil, nil, false)}, wr.continuous(u))); err != nil {
			return err
		}
	}
	if !wr.p.Stream || (text == "" && (len(ids) == 0 || !wr.p.ReturnTokenID) && wr.roleSent) {
		return nil
	}
	return wr.event(wr.chunk([]openai.Choice{wr.choice(text, ids, nil, false)}, wr.continuous(u)))
}

// continuous is u when every chunk carries the usage, nil otherwise.
func (wr *writer) continuous(u openai.Usage) *openai.Usage {
	if !wr.p.ContinuousUsage {
		return nil
	}
	return &u
}

// done ends the completion.
func (wr *writer) done(text string, ids []int32, finish string, u openai.Usage) {
	if !wr.p.Stream {
		text = wr.p.EchoText + text
		body := openai.Completion{ID: wr.id, Object: wr.object, Created: wr.created, Model: wr.model,
			Choices: []openai.Choice{wr.choice(text, ids, &finish, true)}, Usage: &u}
		wr.w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(wr.w).Encode(body) //nolint:errcheck // the client may be gone
		return
	}
	if wr.p.EchoText != "" && !wr.echoed {
		wr.delta("", nil, u) //nolint:errcheck // an answer with no streamed token still echoes first
	}
	wr.event(wr.chunk([]openai.Choice{wr.choice("", nil, &finish, false)}, wr.continuous(u))) //nolint:errcheck
	if wr.p.IncludeUsage {
		wr.event(wr.chunk([]openai.Choice{}, &u)) //nolint:errcheck
	}
	fmt.Fprint(wr.w, "data: [DONE]\n\n") //nolint:errcheck
	if wr.flusher != nil {
		wr.flusher.Flush()
	}
}

// fail ends the completion with an error: a status before anything was
// streamed, an error event after.
func (wr *writer) fail(e *apiError) {
	if !wr.started {
		writeError(wr.w, e)
		return
	}
	wr.event(openai.StreamErrorEvent{Error: openai.StreamError{Code: nullable(e.Code), Message: e.Message, Type: e.Type}}) //nolint:errcheck
	fmt.Fprint(wr.w, "data: [DONE]\n\n")                                                                                   //nolint:errcheck
}
