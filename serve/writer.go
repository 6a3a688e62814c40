package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
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
	// idNames: return_tokens_as_token_ids: "token_id:N" names, tok's text
	// offsets.
	idNames bool
	// promptSent: a chat answer's prompt_logprobs (one per answer) are out.
	promptSent bool
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
			if wr.p.Reasoning != nil && ch.finish != "error" {
				if thought, content, ok := wr.p.Reasoning.split(text); ok {
					c.Message.ReasoningContent, c.Message.Content = &thought, content
				}
			}
			if wr.p.ToolParser != nil && ch.finish != "error" {
				if content, calls, ok := wr.p.ToolParser.parse(c.Message.Content); ok {
					c.Message.Content, c.Message.ToolCalls = content, firstCall(calls, wr.p.ParallelToolCalls)
					toolCalls := "tool_calls"
					c.FinishReason = &toolCalls
				}
			}
		} else {
			d := &openai.Message{Content: text}
			if ch.thought != "" {
				thought := ch.thought
				d.ReasoningContent, ch.thought = &thought, ""
			}
			if !ch.roleSent {
				d.Role = "assistant"
				ch.roleSent = true
			}
			c.Delta = d
		}
	} else {
		c.Text, c.Logprobs = &text, openai.NullLogprobs
	}
	if wr.p.Logprobs && (len(ids) > 0 || (final && !wr.p.Stream) || wr.echoDue(ch)) {
		// A streamed chunk carries its own tokens' entries (the echo's
		// chunk the prompt's); a body all.
		c.Logprobs = wr.logprobs(ch, ids, lps)
	}
	if !wr.chat && wr.promptDue(ch) && (final || len(ids) > 0 || wr.p.Stream) {
		c.PromptLogprobs = wr.promptLogprobs(ch)
		ch.promptSent = true
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
	due := wr.chat && wr.promptDue(ch)
	if !wr.p.Stream || (text == "" && ch.thought == "" && (len(ids) == 0 || !(wr.p.ReturnTokenID || wr.p.Logprobs)) && ch.roleSent && !due) {
		return nil
	}
	c := wr.chunk([]openai.Choice{wr.choice(ch, text, ids, lps, nil, false)}, wr.continuous(u))
	if due {
		c.PromptLogprobs, wr.promptSent = wr.promptLogprobs(ch), true
	}
	return wr.event(c)
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
		if wr.chat && len(runs) > 0 && wr.promptDue(runs[0]) {
			body.PromptLogprobs = wr.promptLogprobs(runs[0])
		}
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
func (wr *writer) tokenText(id int32) (string, []byte) { return tokenText(wr.names(), id) }

// names is the tokenizer that names tokens in the log-probabilities: none
// (so "token_id:N") with return_tokens_as_token_ids.
func (wr *writer) names() *model.Tokenizer {
	if wr.idNames {
		return nil
	}
	return wr.tok
}

func tokenText(tok *model.Tokenizer, id int32) (string, []byte) {
	if tok == nil {
		s := fmt.Sprintf("token_id:%d", id)
		return s, []byte(s)
	}
	b := tok.TokenBytes(id)
	return model.LossyString(b), b
}

// chatLogprobs are the log-probabilities of ids (lps, one each) in chat's
// shape (the Responses API's output_text logprobs are the same): each
// token's text, log-probability and bytes, and its top tokens'.
func chatLogprobs(tok *model.Tokenizer, ids []int32, lps []executor.TokenLogprobs) []openai.ChatTokenLogprob {
	out := make([]openai.ChatTokenLogprob, len(ids))
	for i, id := range ids {
		text, b := tokenText(tok, id)
		e := openai.ChatTokenLogprob{Token: text, Logprob: clampLogprob(lps[i].Logprob), Bytes: byteList(b),
			TopLogprobs: []openai.ChatTopLogprob{}}
		for j, t := range lps[i].TopIDs {
			if t < 0 {
				continue
			}
			tt, tb := tokenText(tok, t)
			e.TopLogprobs = append(e.TopLogprobs, openai.ChatTopLogprob{Token: tt, Logprob: clampLogprob(lps[i].TopLogprobs[j]), Bytes: byteList(tb)})
		}
		out[i] = e
	}
	return out
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
		v = openai.ChatLogprobs{Content: chatLogprobs(wr.names(), ids, lps)}
	} else {
		n := len(ids)
		out := openai.CompletionLogprobs{Tokens: make([]string, 0, n), TokenLogprobs: make([]*float64, 0, n),
			TopLogprobs: make([]map[string]float64, 0, n), TextOffset: make([]int, 0, n)}
		if wr.echoDue(ch) {
			// echo: the prompt's entries first (its first token's null),
			// each with the logprobs count of top tokens.
			ch.echoLps = true
			for i, id := range ch.prompt {
				if i == 0 {
					wr.appendCompletionEntry(&out, ch, id, nil)
					continue
				}
				lp := ch.promptLps[i-1]
				if len(lp.TopIDs) > wr.p.TopLogprobs {
					lp.TopIDs, lp.TopLogprobs = lp.TopIDs[:wr.p.TopLogprobs], lp.TopLogprobs[:wr.p.TopLogprobs]
				}
				wr.appendCompletionEntry(&out, ch, id, &lp)
			}
		}
		for i, id := range ids {
			wr.appendCompletionEntry(&out, ch, id, &lps[i])
		}
		v = out
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("serve: logprobs do not marshal: %v", err)) // finite floats, strings: cannot happen
	}
	return b
}

// echoDue reports that ch's next completions logprobs start with the
// echoed prompt's entries (echo with logprobs, not sent yet).
func (wr *writer) echoDue(ch *choiceRun) bool {
	return !wr.chat && wr.p.EchoLogprobs && !ch.echoLps && ch.hasPrompt
}

// appendCompletionEntry appends token id's entries to out: its text, its
// log-probability and a map of the top tokens' texts (and its own) to
// theirs, all null without lp (a prompt's first token), and its text
// offset, which continues ch's.
func (wr *writer) appendCompletionEntry(out *openai.CompletionLogprobs, ch *choiceRun, id int32, lp *executor.TokenLogprobs) {
	text, _ := wr.tokenText(id)
	out.Tokens = append(out.Tokens, text)
	out.TextOffset = append(out.TextOffset, ch.lpOffset)
	real, _ := tokenText(wr.tok, id) // (the offsets are the text's, however tokens are named)
	ch.lpOffset += utf8.RuneCountInString(real)
	if lp == nil {
		out.TokenLogprobs, out.TopLogprobs = append(out.TokenLogprobs, nil), append(out.TopLogprobs, nil)
		return
	}
	own := clampLogprob(lp.Logprob)
	top := make(map[string]float64, len(lp.TopIDs)+1)
	for j, t := range lp.TopIDs {
		if t < 0 {
			continue
		}
		if tt, _ := wr.tokenText(t); !hasKey(top, tt) {
			top[tt] = clampLogprob(lp.TopLogprobs[j])
		}
	}
	if !hasKey(top, text) {
		top[text] = own
	}
	out.TokenLogprobs, out.TopLogprobs = append(out.TokenLogprobs, &own), append(out.TopLogprobs, top)
}

// promptLogprobs renders ch's prompt log-probabilities as vLLM's
// prompt_logprobs: null, then per prompt token its entry and the
// genParams.PromptLogprobs most probable tokens' (top ones ranked 1, 2, …;
// ids as strings).
func (wr *writer) promptLogprobs(ch *choiceRun) json.RawMessage {
	out := make(openai.PromptLogprobs, len(ch.prompt))
	for i := 1; i < len(ch.prompt); i++ {
		lp := ch.promptLps[i-1]
		m := make(map[string]openai.PromptLogprob, wr.p.PromptLogprobs+1)
		id := ch.prompt[i]
		text, _ := wr.tokenText(id)
		m[strconv.Itoa(int(id))] = openai.PromptLogprob{Logprob: clampLogprob(lp.Logprob), Rank: lp.Rank, DecodedToken: text}
		for j, t := range lp.TopIDs[:min(len(lp.TopIDs), wr.p.PromptLogprobs)] {
			if t < 0 || t == id {
				continue
			}
			tt, _ := wr.tokenText(t)
			m[strconv.Itoa(int(t))] = openai.PromptLogprob{Logprob: clampLogprob(lp.TopLogprobs[j]), Rank: int32(j + 1), DecodedToken: tt}
		}
		out[i] = m
	}
	b, err := json.Marshal(out)
	if err != nil {
		panic(fmt.Sprintf("serve: prompt logprobs do not marshal: %v", err)) // finite floats, strings: cannot happen
	}
	return b
}

// promptDue reports that ch's prompt_logprobs go out now: asked for,
// arrived, not sent (streaming: once; chat: once per answer, with the
// first choice that has them).
func (wr *writer) promptDue(ch *choiceRun) bool {
	if !wr.p.WantPromptLogprobs || !ch.hasPrompt {
		return false
	}
	if wr.chat {
		return !wr.promptSent
	}
	return !ch.promptSent
}

func hasKey(m map[string]float64, k string) bool {
	_, ok := m[k]
	return ok
}
