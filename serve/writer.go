package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
)

type usage struct {
	Prompt     int `json:"prompt_tokens"`
	Completion int `json:"completion_tokens"`
	Total      int `json:"total_tokens"`
}

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
}

func newWriter(w http.ResponseWriter, endpoint, model string, id uint64, created int64, p genParams) *writer {
	wr := &writer{w: w, chat: endpoint == "chat", p: p, model: model, created: created, roleSent: endpoint != "chat"}
	wr.flusher, _ = w.(http.Flusher)
	if wr.chat {
		wr.id, wr.object = fmt.Sprintf("chatcmpl-%d", id), "chat.completion"
	} else {
		wr.id, wr.object = fmt.Sprintf("cmpl-%d", id), "text_completion"
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

// choice is one chunk's or body's choice.
func (wr *writer) choice(text string, ids []int32, finish any, final bool) map[string]any {
	c := map[string]any{"index": 0, "finish_reason": finish}
	if wr.chat {
		if final && !wr.p.Stream {
			c["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			d := map[string]any{"content": text}
			if !wr.roleSent {
				d["role"] = "assistant"
				wr.roleSent = true
			}
			c["delta"] = d
		}
	} else {
		c["text"] = text
		c["logprobs"] = nil
	}
	if wr.p.ReturnTokenID {
		if ids == nil {
			ids = []int32{}
		}
		c["token_ids"] = ids
	}
	return c
}

// delta streams newly produced text (and ids); a no-op without streaming.
func (wr *writer) delta(text string, ids []int32) error {
	if !wr.p.Stream || (text == "" && (len(ids) == 0 || !wr.p.ReturnTokenID) && wr.roleSent) {
		return nil
	}
	return wr.event(map[string]any{"id": wr.id, "object": wr.chunkObject(), "created": wr.created, "model": wr.model,
		"choices": []any{wr.choice(text, ids, nil, false)}})
}

// done ends the completion.
func (wr *writer) done(text string, ids []int32, finish string, u usage) {
	if !wr.p.Stream {
		body := map[string]any{"id": wr.id, "object": wr.object, "created": wr.created, "model": wr.model,
			"choices": []any{wr.choice(text, ids, finish, true)}, "usage": u}
		wr.w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(wr.w).Encode(body) //nolint:errcheck // the client may be gone
		return
	}
	wr.event(map[string]any{"id": wr.id, "object": wr.chunkObject(), "created": wr.created, "model": wr.model, //nolint:errcheck
		"choices": []any{wr.choice("", nil, finish, false)}})
	if wr.p.IncludeUsage {
		wr.event(map[string]any{"id": wr.id, "object": wr.chunkObject(), "created": wr.created, "model": wr.model, //nolint:errcheck
			"choices": []any{}, "usage": u})
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
	wr.event(map[string]any{"error": map[string]any{"message": e.Message, "type": e.Type, "code": e.Status}}) //nolint:errcheck
	fmt.Fprint(wr.w, "data: [DONE]\n\n")                                                                      //nolint:errcheck
}
