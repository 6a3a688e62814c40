package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/serve/openai"
)

// answerWriter renders an answer in its endpoint's shape (writer:
// completions and chat; responsesWriter: the Responses API).
type answerWriter interface {
	// delta streams newly produced text (and ids) of ch.
	delta(ch *choiceRun, text string, ids []int32, lps []executor.TokenLogprobs, u openai.Usage) error
	// toolCalls streams the calls ch's answer made.
	toolCalls(ch *choiceRun, calls []openai.ToolCall, parallel bool, u openai.Usage) error
	// finishChoice streams the end of ch.
	finishChoice(ch *choiceRun, u openai.Usage) error
	// done ends the answer (the whole body, or the stream's end).
	done(runs []*choiceRun, u openai.Usage)
	// fail ends it with an error.
	fail(e *apiError)
}

// responsesWriter renders one answer as a Responses API response: a
// response object, or its stream of events (response.created, the output
// items' added/delta/done events, response.completed or
// response.incomplete).
type responsesWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
	p       genParams
	base    openai.Response // the response's fixed fields
	started bool            // streaming: headers are out
	seq     int             // the next event's sequence_number
	created bool            // response.created and response.in_progress are out
	msgOpen bool            // the message item is open (its text streaming)
	text    strings.Builder // the streamed message text
	// rsOpen: the reasoning item is open (its thinking streaming, with a
	// reasoning parser); rsText is that thinking. hadMessage and hadCalls:
	// a message item, or calls, went out.
	rsOpen               bool
	rsText               strings.Builder
	hadMessage, hadCalls bool
	outputs              []openai.OutputItem
	tok                  *model.Tokenizer // names the tokens of the log-probabilities
	// lps are the streamed message's tokens' log-probabilities (when
	// asked for: genParams.Logprobs).
	lps []openai.ChatTokenLogprob
}

func newResponsesWriter(w http.ResponseWriter, model, id string, created int64, p genParams, req *responsesRequest) *responsesWriter {
	rw := &responsesWriter{w: w, p: p}
	rw.flusher, _ = w.(http.Flusher)
	rw.base = openai.Response{ID: "resp_" + id, Object: "response", CreatedAt: created, Model: model,
		Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens, Temperature: req.Temperature, TopP: req.TopP,
		ParallelToolCalls: p.ParallelToolCalls, ToolChoice: "auto", Tools: []any{}, Output: []openai.OutputItem{}}
	if notNull(req.ToolChoice) {
		var v any
		json.Unmarshal(req.ToolChoice, &v) //nolint:errcheck // checked by the chat rules
		rw.base.ToolChoice = v
	}
	if notNull(req.Tools) {
		json.Unmarshal(req.Tools, &rw.base.Tools) //nolint:errcheck
	}
	rw.base.Metadata = json.RawMessage("{}")
	if notNull(req.Metadata) {
		rw.base.Metadata = req.Metadata // echoed, as OpenAI does
	}
	return rw
}

func (rw *responsesWriter) msgID() string { return "msg_" + strings.TrimPrefix(rw.base.ID, "resp_") }

// rsID is the reasoning item's id.
func (rw *responsesWriter) rsID() string { return "rs_" + strings.TrimPrefix(rw.base.ID, "resp_") }

// reasoningItem is the completed reasoning item of a thinking.
func (rw *responsesWriter) reasoningItem(thought string) openai.OutputItem {
	return openai.OutputItem{Type: "reasoning", ID: rw.rsID(), Status: "completed", Summary: &[]any{},
		Content: []openai.ContentPart{{Type: "reasoning_text", Text: thought}}}
}

// thinking streams a piece of the answer's thinking in the reasoning item
// (opened on the first piece).
func (rw *responsesWriter) thinking(thought string) error {
	idx := len(rw.outputs)
	if !rw.rsOpen {
		rw.rsOpen = true
		item := openai.OutputItem{Type: "reasoning", ID: rw.rsID(), Status: "in_progress", Summary: &[]any{}, Content: []openai.ContentPart{}}
		part := openai.ContentPart{Type: "reasoning_text"}
		if err := rw.events([]openai.ResponseEvent{
			{Type: "response.output_item.added", OutputIndex: intp(idx), Item: &item},
			{Type: "response.content_part.added", ItemID: item.ID, OutputIndex: intp(idx), ContentIndex: intp(0), Part: &part},
		}); err != nil {
			return err
		}
	}
	rw.rsText.WriteString(thought)
	return rw.event(openai.ResponseEvent{Type: "response.reasoning_text.delta", ItemID: rw.rsID(), OutputIndex: intp(idx),
		ContentIndex: intp(0), Delta: strp(thought)})
}

// closeReasoning ends the streamed reasoning item, if one is open.
func (rw *responsesWriter) closeReasoning() error {
	if !rw.rsOpen {
		return nil
	}
	rw.rsOpen = false
	idx, thought := len(rw.outputs), rw.rsText.String()
	item := rw.reasoningItem(thought)
	part := item.Content[0]
	if err := rw.events([]openai.ResponseEvent{
		{Type: "response.reasoning_text.done", ItemID: item.ID, OutputIndex: intp(idx), ContentIndex: intp(0), Text: strp(thought)},
		{Type: "response.content_part.done", ItemID: item.ID, OutputIndex: intp(idx), ContentIndex: intp(0), Part: &part},
		{Type: "response.output_item.done", OutputIndex: intp(idx), Item: &item},
	}); err != nil {
		return err
	}
	rw.outputs = append(rw.outputs, item)
	return nil
}

// event writes one server-sent event named by its type.
func (rw *responsesWriter) event(ev openai.ResponseEvent) error {
	if !rw.started {
		startEvents(rw.w)
		rw.started = true
	}
	ev.SequenceNumber = rw.seq
	rw.seq++
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(rw.w, "event: %s\ndata: %s\n\n", ev.Type, b); err != nil {
		return err
	}
	if rw.flusher != nil {
		rw.flusher.Flush()
	}
	return nil
}

func intp(i int) *int       { return &i }
func strp(s string) *string { return &s }

// events sends evs in order, stopping at the first that fails.
func (rw *responsesWriter) events(evs []openai.ResponseEvent) error {
	for _, ev := range evs {
		if err := rw.event(ev); err != nil {
			return err
		}
	}
	return nil
}

// begin sends response.created and response.in_progress once.
func (rw *responsesWriter) begin() error {
	if rw.created {
		return nil
	}
	rw.created = true
	r := rw.base
	r.Status = "in_progress"
	if err := rw.event(openai.ResponseEvent{Type: "response.created", Response: &r}); err != nil {
		return err
	}
	return rw.event(openai.ResponseEvent{Type: "response.in_progress", Response: &r})
}

func (rw *responsesWriter) delta(ch *choiceRun, text string, ids []int32, lps []executor.TokenLogprobs, _ openai.Usage) error {
	if !rw.p.Stream {
		return nil
	}
	var entries []openai.ChatTokenLogprob
	if rw.p.Logprobs {
		entries = chatLogprobs(rw.tok, ids, lps)
		rw.lps = append(rw.lps, entries...)
	}
	if err := rw.begin(); err != nil {
		return err
	}
	if ch.thought != "" {
		thought := ch.thought
		ch.thought = ""
		if err := rw.thinking(thought); err != nil {
			return err
		}
	}
	if text == "" {
		return nil
	}
	if err := rw.closeReasoning(); err != nil {
		return err
	}
	if err := rw.openMessage(); err != nil {
		return err
	}
	rw.text.WriteString(text)
	return rw.event(openai.ResponseEvent{Type: "response.output_text.delta", ItemID: rw.msgID(), OutputIndex: intp(len(rw.outputs)),
		ContentIndex: intp(0), Delta: strp(text), Logprobs: entries})
}

// openMessage opens the message item (its added events), once.
func (rw *responsesWriter) openMessage() error {
	if rw.msgOpen {
		return nil
	}
	rw.msgOpen, rw.hadMessage = true, true
	idx := len(rw.outputs)
	item := openai.OutputItem{Type: "message", ID: rw.msgID(), Status: "in_progress", Role: "assistant", Content: []openai.ContentPart{}}
	if err := rw.event(openai.ResponseEvent{Type: "response.output_item.added", OutputIndex: intp(idx), Item: &item}); err != nil {
		return err
	}
	part := openai.ContentPart{Type: "output_text", Annotations: &[]any{}}
	return rw.event(openai.ResponseEvent{Type: "response.content_part.added", ItemID: item.ID, OutputIndex: intp(idx),
		ContentIndex: intp(0), Part: &part})
}

// closeMessage ends the streamed message item, if one is open.
func (rw *responsesWriter) closeMessage() error {
	if !rw.msgOpen {
		return nil
	}
	rw.msgOpen = false
	idx, text := len(rw.outputs), rw.text.String()
	part := openai.ContentPart{Type: "output_text", Text: text, Annotations: &[]any{}, Logprobs: rw.lps}
	item := rw.message(text, rw.lps)
	if err := rw.events([]openai.ResponseEvent{
		{Type: "response.output_text.done", ItemID: item.ID, OutputIndex: intp(idx), ContentIndex: intp(0), Text: strp(text), Logprobs: rw.lps},
		{Type: "response.content_part.done", ItemID: item.ID, OutputIndex: intp(idx), ContentIndex: intp(0), Part: &part},
		{Type: "response.output_item.done", OutputIndex: intp(idx), Item: &item},
	}); err != nil {
		return err
	}
	rw.outputs = append(rw.outputs, item)
	return nil
}

// message is the completed message item of text (with its tokens'
// log-probabilities when asked for).
func (rw *responsesWriter) message(text string, lps []openai.ChatTokenLogprob) openai.OutputItem {
	return openai.OutputItem{Type: "message", ID: rw.msgID(), Status: "completed", Role: "assistant",
		Content: []openai.ContentPart{{Type: "output_text", Text: text, Annotations: &[]any{}, Logprobs: lps}}}
}

// callItem is a function call's output item.
func callItem(c openai.ToolCall) openai.OutputItem {
	args := c.Function.Arguments
	return openai.OutputItem{Type: "function_call", ID: "fc_" + strings.TrimPrefix(c.ID, "chatcmpl-tool-"), CallID: c.ID,
		Name: c.Function.Name, Arguments: &args, Status: "completed"}
}

func (rw *responsesWriter) toolCalls(_ *choiceRun, calls []openai.ToolCall, parallel bool, _ openai.Usage) error {
	if err := rw.begin(); err != nil {
		return err
	}
	if err := rw.closeReasoning(); err != nil {
		return err
	}
	if err := rw.closeMessage(); err != nil {
		return err
	}
	rw.hadCalls = true
	for _, c := range firstCall(calls, parallel) {
		idx, item := len(rw.outputs), callItem(c)
		open := item
		open.Status, open.Arguments = "in_progress", strp("")
		if err := rw.events([]openai.ResponseEvent{
			{Type: "response.output_item.added", OutputIndex: intp(idx), Item: &open},
			{Type: "response.function_call_arguments.delta", ItemID: item.ID, OutputIndex: intp(idx), Delta: item.Arguments},
			{Type: "response.function_call_arguments.done", ItemID: item.ID, OutputIndex: intp(idx), Arguments: item.Arguments},
			{Type: "response.output_item.done", OutputIndex: intp(idx), Item: &item},
		}); err != nil {
			return err
		}
		rw.outputs = append(rw.outputs, item)
	}
	return nil
}

func (rw *responsesWriter) finishChoice(_ *choiceRun, _ openai.Usage) error {
	if !rw.p.Stream {
		return nil
	}
	if err := rw.begin(); err != nil {
		return err
	}
	if err := rw.closeReasoning(); err != nil {
		return err
	}
	if !rw.hadMessage && !rw.hadCalls {
		// An answer without text or calls has an empty message, as the
		// non-streamed body has it.
		if err := rw.openMessage(); err != nil {
			return err
		}
	}
	return rw.closeMessage()
}

// final is the finished response: its status from the answer's end.
func (rw *responsesWriter) final(ch *choiceRun, output []openai.OutputItem, u openai.Usage) openai.Response {
	r := rw.base
	r.Output, r.Status = output, "completed"
	if ch.finish == "length" {
		r.Status, r.IncompleteDetails = "incomplete", &openai.IncompleteDetails{Reason: "max_output_tokens"}
	}
	r.Usage = responseUsage(u, ch.reused)
	return r
}

func (rw *responsesWriter) done(runs []*choiceRun, u openai.Usage) {
	ch := runs[0] // the Responses API has one answer
	if rw.p.Stream {
		r := rw.final(ch, rw.outputs, u)
		name := "response.completed"
		if r.Status == "incomplete" {
			name = "response.incomplete"
		}
		rw.event(openai.ResponseEvent{Type: name, Response: &r}) //nolint:errcheck // the client may be gone
		return
	}
	text := ch.text.String()
	var output []openai.OutputItem
	var calls []openai.ToolCall
	if rw.p.Reasoning != nil && ch.finish != "error" {
		if thought, content, ok := rw.p.Reasoning.split(text); ok {
			output = append(output, rw.reasoningItem(thought))
			text = content
		}
	}
	if rw.p.ToolParser != nil && ch.finish != "error" {
		if content, cs, ok := rw.p.ToolParser.parse(text); ok {
			text, calls = content, firstCall(cs, rw.p.ParallelToolCalls)
		}
	}
	if text != "" || len(calls) == 0 {
		var lps []openai.ChatTokenLogprob
		if rw.p.Logprobs {
			lps = chatLogprobs(rw.tok, ch.all, ch.lps)
		}
		output = append(output, rw.message(text, lps))
	}
	for _, c := range calls {
		output = append(output, callItem(c))
	}
	rw.w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(rw.w).Encode(rw.final(ch, output, u)) //nolint:errcheck // the client may be gone
}

func (rw *responsesWriter) fail(e *apiError) {
	if !rw.started {
		writeError(rw.w, e)
		return
	}
	ev := openai.ResponseEvent{Type: "error", Message: e.Message, Code: nullable(e.Code)}
	if e.Param != "" {
		ev.Param = &e.Param
	}
	rw.event(ev) //nolint:errcheck
}
