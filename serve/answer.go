package serve

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/serve/openai"
)

// Answering an accepted request: its choices' tokens, as the fleet
// produces them, become the endpoint's answer (a body, or a stream), cut at
// stop strings, with the usage.

// choiceRun is one choice of an answer: its call and what it produced.
type choiceRun struct {
	c             *call
	index         int
	echo          string
	firstOfPrompt bool
	prompt        []int32 // the prompt's tokens
	// promptLps: the prompt's log-probabilities once hasPrompt (asked for
	// with prompt_logprobs or echo with logprobs); promptSent once a
	// streamed chunk carried them, echoLps once the echo's entries went.
	promptLps                      []executor.TokenLogprobs
	hasPrompt, promptSent, echoLps bool
	stream                         *model.StreamDecoder
	text                           strings.Builder
	// stopFrom: a stop string must end past this offset of text, which
	// min_tokens' tokens fill (vLLM looks for stop strings only in the
	// text of the tokens after them).
	stopFrom int
	all      []int32
	lps      []executor.TokenLogprobs // with all (genParams.Logprobs)
	lpOffset int                      // completions: text_offset of the next token
	reused   int
	finish   string // "" while it runs
	// Streaming: the echoed prompt and (chat) the role are out.
	echoed, roleSent bool
	// tools holds back a streamed answer's tool calls (tool_choice "auto").
	tools *toolStream
	// thinking splits a streamed chat answer's thinking from its content
	// (--reasoning-parser); thought is the thinking the next delta carries.
	thinking *reasoningStream
	thought  string
}

// answer streams or collects the choices of one request (their calls share
// one wake channel); a failure of any ends them all.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, endpoint, apiID string, runs []*choiceRun, p genParams, req any) {
	var out answerWriter
	if rq, ok := req.(*responsesRequest); ok {
		rw := newResponsesWriter(w, s.cfg.ModelName, apiID, s.cfg.Now().Unix(), p, rq)
		rw.tok = s.cfg.Tokenizer
		out = rw
	} else {
		wr := newWriter(w, endpoint, s.cfg.ModelName, apiID, s.cfg.Now().Unix(), p)
		wr.tok, wr.idNames = s.cfg.Tokenizer, p.TokensAsIDs || s.cfg.TokensAsIDs
		out = wr
	}
	for _, ch := range runs {
		if s.cfg.Tokenizer != nil {
			ch.stream = s.cfg.Tokenizer.NewStreamWith(model.DecodeOptions{Special: p.SpecialTokens})
		}
		ch.roleSent = endpoint != "chat"
		if p.ToolParser != nil && p.Stream {
			ch.tools = &toolStream{p: p.ToolParser}
		}
		if p.Reasoning != nil && p.Stream {
			ch.thinking = &reasoningStream{p: p.Reasoning}
		}
	}
	wake := runs[0].c.wake
	var expired <-chan time.Time
	if s.cfg.RequestTimeout > 0 {
		timer := time.NewTimer(s.cfg.RequestTimeout)
		defer timer.Stop()
		expired = timer.C
	}
	// stopAll detaches every choice still running (but except), as finish.
	stopAll := func(except *choiceRun, finish string) {
		for _, ch := range runs {
			if ch != except && ch.finish == "" {
				s.detach(ch.c, finish)
			}
		}
	}
	left := len(runs)
	for left > 0 {
		select {
		case <-r.Context().Done():
			// The client went away: every rank withdraws the requests.
			stopAll(nil, "cancelled")
			return
		case <-expired:
			// Past --request-timeout: withdrawn the same way, and told.
			stopAll(nil, "cancelled")
			out.fail(&apiError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "timeout",
				Message: fmt.Sprintf("the request did not finish within the server's --request-timeout of %v; it was withdrawn", s.cfg.RequestTimeout)})
			return
		case <-wake:
		}
		for _, ch := range runs {
			if ch.finish != "" {
				continue
			}
			chunk, ids, lps, e := s.step(ch, p)
			if e != nil {
				stopAll(ch, "cancelled")
				out.fail(e)
				return
			}
			var calls []openai.ToolCall
			if ch.thinking != nil {
				// The thinking goes out as reasoning_content; the tool
				// parser reads only the content.
				ch.thought, chunk = ch.thinking.feed(chunk)
				if ch.finish != "" {
					r, c := ch.thinking.end()
					ch.thought, chunk = ch.thought+r, chunk+c
				}
			}
			if ch.tools != nil {
				chunk = ch.tools.feed(chunk)
				if ch.finish != "" {
					var rest string
					rest, calls = ch.tools.end()
					chunk += rest
				}
			}
			if err := out.delta(ch, chunk, ids, lps, s.usageOf(runs)); err != nil {
				stopAll(nil, "cancelled")
				return
			}
			if len(calls) > 0 {
				ch.finish = "tool_calls" // (recorded in the metrics as it ended)
				if err := out.toolCalls(ch, calls, p.ParallelToolCalls, s.usageOf(runs)); err != nil {
					stopAll(nil, "cancelled")
					return
				}
			}
			if ch.finish != "" {
				left--
				if err := out.finishChoice(ch, s.usageOf(runs)); err != nil {
					stopAll(nil, "cancelled")
					return
				}
			}
		}
	}
	out.done(runs, s.usageOf(runs))
}

// step takes what arrived for ch since the last step: the text and ids to
// send, and ch.finish once it is over; an error ends the whole answer.
func (s *Server) step(ch *choiceRun, p genParams) (string, []int32, []executor.TokenLogprobs, *apiError) {
	c := ch.c
	toks, lps, resp, err := c.take()
	if pf := s.failed.Load(); pf != nil && resp == nil {
		// (An answer that arrived whole is still given.)
		s.record(c, nil, "error")
		return "", nil, nil, &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: "the fleet failed: " + (*pf).Error()}
	}
	if err != nil {
		// Drain cancelled it (and withdrew it from the ranks).
		return "", nil, nil, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: err.Error()}
	}
	if p.Logprobs && len(lps) != len(toks) {
		s.record(c, nil, "error")
		return "", nil, nil, &apiError{Status: http.StatusInternalServerError, Type: "server_error",
			Message: fmt.Sprintf("the fleet sent %d tokens with %d log-probabilities", len(toks), len(lps))}
	}
	ch.lps = append(ch.lps, lps...)
	if want, _ := p.scoresPrompt(); want && !ch.hasPrompt {
		ch.promptLps, ch.hasPrompt = c.promptLogprobs()
		if !ch.hasPrompt && resp != nil && resp.Error == "" && len(ch.all)+len(toks) > 0 {
			s.record(c, resp, "error")
			return "", nil, nil, &apiError{Status: http.StatusInternalServerError, Type: "server_error",
				Message: "the fleet answered without the prompt's log-probabilities"}
		}
		if ch.hasPrompt && len(ch.promptLps) != max(len(ch.prompt)-1, 0) {
			s.record(c, nil, "error")
			return "", nil, nil, &apiError{Status: http.StatusInternalServerError, Type: "server_error",
				Message: fmt.Sprintf("the fleet sent %d prompt log-probabilities for a prompt of %d tokens", len(ch.promptLps), len(ch.prompt))}
		}
	}
	var piece strings.Builder
	var pieceIDs []int32
	for _, t := range toks {
		ch.all = append(ch.all, t)
		pieceIDs = append(pieceIDs, t)
		// A stop token ends the answer (it is the last); its text is
		// kept only with include_stop_str_in_output.
		stop := (s.stops[t] && !p.IgnoreEOS) || slices.Contains(p.StopTokenIDs, t)
		if ch.stream == nil || (stop && !p.IncludeStop) {
			continue
		}
		piece.WriteString(ch.stream.Next(t))
		if len(ch.all) == p.MinTokens {
			ch.stopFrom = ch.text.Len() + piece.Len()
		}
	}
	if resp != nil {
		ch.reused = resp.ReusedTokens
	}
	chunk := piece.String()
	if resp != nil && resp.Error == "" && ch.stream != nil {
		// The answer is complete: a stop string may span the decoder's tail.
		chunk += ch.stream.Flush()
	}
	stops := p.Stop
	if len(ch.all) < p.MinTokens {
		stops = nil // vLLM: stop strings count from min_tokens on
	}
	if chunk, ch.finish = cutAtStop(&ch.text, chunk, stops, p.IncludeStop, ch.stopFrom); ch.finish != "" {
		// The ranks withdraw the request (unless it already finished).
		if resp != nil {
			s.record(c, resp, ch.finish)
		} else {
			s.detach(c, ch.finish)
		}
	}
	if resp != nil && ch.finish == "" {
		if resp.Error != "" {
			s.record(c, resp, "error")
			return "", nil, nil, &apiError{Status: http.StatusInternalServerError, Type: "server_error",
				Message: fmt.Sprintf("rank %d: %s", resp.Rank, resp.Error)}
		}
		ch.finish = "length"
		if resp.Stopped {
			ch.finish = "stop"
		}
		s.record(c, resp, ch.finish)
	}
	return chunk, pieceIDs, lps, nil
}

// usageOf is the usage of a request's choices so far: every choice's
// completion tokens, each prompt's tokens once (its first choice's, with
// that choice's cached tokens).
func (s *Server) usageOf(runs []*choiceRun) openai.Usage {
	prompt, completion, cached := 0, 0, 0
	for _, ch := range runs {
		completion += len(ch.all)
		if ch.firstOfPrompt {
			prompt += ch.c.prompt
			cached += ch.reused
		}
	}
	return s.usage(prompt, completion, cached)
}

// usage is a completion's usage; prompt_tokens_details (the prompt tokens
// whose KV was reused from the prefix cache) only with
// Config.PromptTokensDetails, as vLLM does.
func (s *Server) usage(prompt, completion, cached int) openai.Usage {
	u := openai.Usage{Prompt: prompt, Completion: completion, Total: prompt + completion}
	if s.cfg.PromptTokensDetails {
		u.PromptTokensDetails = &openai.PromptTokensDetails{CachedTokens: cached}
	}
	return u
}

// cutAtStop appends chunk to text, cut where the first stop string begins
// ("" of finish when none does): what is left of chunk is returned. A stop
// string that began in text already streamed leaves that text as sent;
// one must end past offset from (min_tokens' text).
func cutAtStop(text *strings.Builder, chunk string, stops []string, include bool, from int) (string, string) {
	before := text.Len()
	text.WriteString(chunk)
	if len(stops) == 0 {
		return chunk, ""
	}
	at, n := firstStop(text.String(), stops, max(before, from))
	if at < 0 {
		return chunk, ""
	}
	if include {
		// include_stop_str_in_output: the text ends after the stop string.
		at += n
	}
	kept := text.String()[:at]
	chunk = ""
	if at > before {
		chunk = kept[before:]
	}
	text.Reset()
	text.WriteString(kept)
	return chunk, "stop"
}

// firstStop is the earliest start of a stop string in text that ends at or
// after from (earlier text was checked already), or -1, and that string's
// length.
func firstStop(text string, stops []string, from int) (int, int) {
	best, n := -1, 0
	for _, st := range stops {
		lo := max(0, from-len(st)+1)
		if i := strings.Index(text[lo:], st); i >= 0 && (best < 0 || lo+i < best) {
			best, n = lo+i, len(st)
		}
	}
	return best, n
}
