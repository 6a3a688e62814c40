package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/serve/openai"
)

// writer renders a completion in the endpoint's shape: server-sent events
// when streaming, one JSON body otherwise.
type writer struct {
	w       http.ResponseWriter
	flusher http.Flusher
	chat    bool
	p       genParams
	id      string
	object  string
	model   string
	created int64
	started bool             // streaming: headers and the first chunk are out
	tok     *model.Tokenizer // names the tokens of the log-probabilities (nil: "token_id:N")
}

// id is the request's X-Request-Id (the server's numeric id by default):
// the completion's id is "cmpl-" or "chatcmpl-" and it, as vLLM's.
func newWriter(w http.ResponseWriter, endpoint, model string, id string, created int64, p genParams) *writer {
	wr := &writer{w: w, chat: endpoint == "chat", p: p, model: model, created: created}
	wr.flusher, _ = w.(http.Flusher)
	if wr.chat {
		wr.id, wr.object = "chatcmpl-"+id, "chat.completion"
	} else {
		wr.id, wr.object = "cmpl-"+id, "text_completion"
	}
	return wr
}

// startEvents sends the headers of a server-sent event stream.
func startEvents(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
}

func (wr *writer) event(v any) error {
	if !wr.started {
		startEvents(wr.w)
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

// choice is one chunk's or body's choice of ch; finish is nil while
// streaming.
func (wr *writer) choice(ch *choiceRun, text string, ids []int32, lps []executor.TokenLogprobs, finish *string, final bool) openai.Choice {
	c := openai.Choice{Index: ch.index, FinishReason: finish}
	if wr.chat {
		if final && !wr.p.Stream {
			c.Message = &openai.Message{Role: "assistant", Content: text}
			if wr.p.ToolParser != nil && ch.finish != "error" {
				if content, calls, ok := wr.p.ToolParser.parse(text); ok {
					c.Message.Content, c.Message.ToolCalls = content, firstCall(calls, wr.p.ParallelToolCalls)
					toolCalls := "tool_calls"
					c.FinishReason = &toolCalls
				}
			}
		} else {
			d := &openai.Message{Content: text}
			if !ch.roleSent {
				d.Role = "assistant"
				ch.roleSent = true
			}
			c.Delta = d
		}
	} else {
		c.Text, c.Logprobs = &text, openai.NullLogprobs
	}
	if wr.p.Logprobs && (len(ids) > 0 || (final && !wr.p.Stream)) {
		// A streamed chunk carries its own tokens' entries; a body all.
		c.Logprobs = wr.logprobs(ch, ids, lps)
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

// delta streams newly produced text (and ids) of ch; a no-op without
// streaming. With stream_options.continuous_usage_stats every chunk
// carries u, the usage so far.
func (wr *writer) delta(ch *choiceRun, text string, ids []int32, lps []executor.TokenLogprobs, u openai.Usage) error {
	if wr.p.Stream && ch.echo != "" && !ch.echoed {
		// echo: the prompt's text is the choice's first chunk.
		ch.echoed = true
		if err := wr.event(wr.chunk([]openai.Choice{wr.choice(ch, ch.echo, nil, nil, nil, false)}, wr.continuous(u))); err != nil {
			return err
		}
	}
	if !wr.p.Stream || (text == "" && (len(ids) == 0 || !(wr.p.ReturnTokenID || wr.p.Logprobs)) && ch.roleSent) {
		return nil
	}
	return wr.event(wr.chunk([]openai.Choice{wr.choice(ch, text, ids, lps, nil, false)}, wr.continuous(u)))
}

// toolCalls streams the calls ch's answer made, in one delta (each call
// whole, with its index); the choice's last chunk follows.
func (wr *writer) toolCalls(ch *choiceRun, calls []openai.ToolCall, parallel bool, u openai.Usage) error {
	calls = firstCall(calls, parallel)
	for k := range calls {
		calls[k].Index = &k
	}
	c := wr.choice(ch, "", nil, nil, nil, false)
	c.Delta.ToolCalls = calls
	return wr.event(wr.chunk([]openai.Choice{c}, wr.continuous(u)))
}

// firstCall is calls, or its first alone when the request said
// parallel_tool_calls: false.
func firstCall(calls []openai.ToolCall, parallel bool) []openai.ToolCall {
	if !parallel && len(calls) > 1 {
		return calls[:1]
	}
	return calls
}

// continuous is u when every chunk carries the usage, nil otherwise.
func (wr *writer) continuous(u openai.Usage) *openai.Usage {
	if !wr.p.ContinuousUsage {
		return nil
	}
	return &u
}

// finishChoice streams ch's last chunk (its finish_reason); a no-op
// without streaming.
func (wr *writer) finishChoice(ch *choiceRun, u openai.Usage) error {
	if !wr.p.Stream {
		return nil
	}
	if ch.echo != "" && !ch.echoed {
		// An answer with no streamed token still echoes first.
		if err := wr.delta(ch, "", nil, nil, u); err != nil {
			return err
		}
	}
	return wr.event(wr.chunk([]openai.Choice{wr.choice(ch, "", nil, nil, &ch.finish, false)}, wr.continuous(u)))
}

// done ends the completion: the body of every choice, or the stream's
// usage and end.
func (wr *writer) done(runs []*choiceRun, u openai.Usage) {
	if !wr.p.Stream {
		choices := make([]openai.Choice, len(runs))
		for i, ch := range runs {
			choices[i] = wr.choice(ch, ch.echo+ch.text.String(), ch.all, ch.lps, &ch.finish, true)
		}
		body := openai.Completion{ID: wr.id, Object: wr.object, Created: wr.created, Model: wr.model,
			Choices: choices, Usage: &u}
		wr.w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(wr.w).Encode(body) //nolint:errcheck // the client may be gone
		return
	}
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

// minLogprob is the floor of a reported log-probability (vLLM's: JSON has
// no −Inf).
const minLogprob = -9999.0

func clampLogprob(v float32) float64 {
	f := float64(v)
	if !(f >= minLogprob) {
		return minLogprob
	}
	return f
}

// tokenText names a token in the log-probabilities: its text (invalid
// UTF-8 as U+FFFD) and bytes, or "token_id:N" without a tokenizer (vLLM's
// return_tokens_as_token_ids form).
func (wr *writer) tokenText(id int32) (string, []byte) {
	if wr.tok == nil {
		s := fmt.Sprintf("token_id:%d", id)
		return s, []byte(s)
	}
	b := wr.tok.TokenBytes(id)
	return model.LossyString(b), b
}

func byteList(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// logprobs renders the log-probabilities of ids (lps, one each) in the
// endpoint's shape: chat's content list, or the completions' four lists
// (whose top_logprobs maps hold the sampled token too, as vLLM's do, and
// whose text offsets continue ch's).
func (wr *writer) logprobs(ch *choiceRun, ids []int32, lps []executor.TokenLogprobs) json.RawMessage {
	if len(lps) != len(ids) {
		panic(fmt.Sprintf("serve: %d log-probabilities for %d tokens", len(lps), len(ids)))
	}
	var v any
	if wr.chat {
		out := openai.ChatLogprobs{Content: make([]openai.ChatTokenLogprob, len(ids))}
		for i, id := range ids {
			text, b := wr.tokenText(id)
			e := openai.ChatTokenLogprob{Token: text, Logprob: clampLogprob(lps[i].Logprob), Bytes: byteList(b),
				TopLogprobs: []openai.ChatTopLogprob{}}
			for j, t := range lps[i].TopIDs {
				if t < 0 {
					continue
				}
				tt, tb := wr.tokenText(t)
				e.TopLogprobs = append(e.TopLogprobs, openai.ChatTopLogprob{Token: tt, Logprob: clampLogprob(lps[i].TopLogprobs[j]), Bytes: byteList(tb)})
			}
			out.Content[i] = e
		}
		v = out
	} else {
		n := len(ids)
		out := openai.CompletionLogprobs{Tokens: make([]string, n), TokenLogprobs: make([]float64, n),
			TopLogprobs: make([]map[string]float64, n), TextOffset: make([]int, n)}
		for i, id := range ids {
			text, _ := wr.tokenText(id)
			out.Tokens[i], out.TokenLogprobs[i] = text, clampLogprob(lps[i].Logprob)
			top := make(map[string]float64, len(lps[i].TopIDs)+1)
			for j, t := range lps[i].TopIDs {
				if t < 0 {
					continue
				}
				if tt, _ := wr.tokenText(t); !hasKey(top, tt) {
					top[tt] = clampLogprob(lps[i].TopLogprobs[j])
				}
			}
			if !hasKey(top, text) {
				top[text] = out.TokenLogprobs[i]
			}
			out.TopLogprobs[i] = top
			out.TextOffset[i] = ch.lpOffset
			ch.lpOffset += utf8.RuneCountInString(text)
		}
		v = out
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("serve: logprobs do not marshal: %v", err)) // finite floats, strings: cannot happen
	}
	return b
}

func hasKey(m map[string]float64, k string) bool {
	_, ok := m[k]
	return ok
}
