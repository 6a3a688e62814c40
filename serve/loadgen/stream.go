package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/lockstep-ai/lockstep/serve/openai"
)

// accumulator gathers one response.
type accumulator struct {
	sent         time.Time
	ttft         time.Duration
	hasTTFT      bool
	text         strings.Builder
	ids          []int32
	sawIDs       bool // some chunk carried token_ids
	missingIDs   bool // some chunk carried text without token_ids
	chunks       int  // chunks with content
	usage        bool
	promptTokens int
	outputTokens int
	finishReason string
	done         bool
}

// Bounds on what a server may send: one SSE line (an event's data; a
// chunk is a few hundred bytes) and one non-streamed body (a long
// completion with its token ids is a few megabytes). Past them the request
// fails instead of the load generator's memory growing with the server's
// output.
const maxStreamLine = 8 << 20

// maxBody is a variable so that a test need not send 256 MiB.
var maxBody = 256 << 20

// readStream reads an SSE stream: "data: {...}" events up to "data: [DONE]".
func (a *accumulator) readStream(body io.Reader) error {
	br := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := readLine(br, maxStreamLine)
		if len(line) > 0 {
			if stop, perr := a.streamLine(line); perr != nil || stop {
				return perr
			}
		}
		if err == io.EOF {
			if a.finishReason != "" || a.usage {
				return nil // the server ended without [DONE], after a final chunk
			}
			return errors.New("the stream ended before [DONE]")
		}
		if err != nil {
			return fmt.Errorf("reading the stream: %w", err)
		}
	}
}

func (a *accumulator) streamLine(line []byte) (stop bool, err error) {
	line = bytes.TrimRight(line, "\r\n")
	payload, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return false, nil // blank line, comment, event:, id:, retry:
	}
	payload = bytes.TrimSpace(payload)
	if string(payload) == "[DONE]" {
		a.done = true
		return true, nil
	}
	if len(payload) == 0 {
		return false, nil
	}
	var c openai.Completion
	if err := json.Unmarshal(payload, &c); err != nil {
		return false, fmt.Errorf("bad stream chunk %.200q: %v", payload, err)
	}
	return false, a.add(&c, time.Since(a.sent))
}

// readLine is the next line (with its newline) of at most limit bytes.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > limit {
			return nil, fmt.Errorf("a stream line longer than %d bytes", limit)
		}
		if err == bufio.ErrBufferFull {
			line = append(line, chunk...)
			continue
		}
		if line == nil {
			return append([]byte(nil), chunk...), err
		}
		return append(line, chunk...), err
	}
}

// readJSON reads a non-streamed response.
func (a *accumulator) readJSON(body io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(body, int64(maxBody)+1))
	if err != nil {
		return fmt.Errorf("reading the response: %w", err)
	}
	if len(b) > maxBody {
		return fmt.Errorf("the response is longer than %d bytes", maxBody)
	}
	var c openai.Completion
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("bad response %.200q: %v", b, err)
	}
	return a.add(&c, -1)
}

// add takes one chunk in; at < 0 is a non-streamed response (no TTFT).
func (a *accumulator) add(c *openai.Completion, at time.Duration) error {
	if len(c.Error) > 0 && string(c.Error) != "null" {
		return fmt.Errorf("server error: %s", errorMessage(c.Error))
	}
	if c.Object == "error" {
		return fmt.Errorf("server error: %s", c.Message)
	}
	if c.Usage != nil {
		a.usage = true
		a.promptTokens, a.outputTokens = c.Usage.Prompt, c.Usage.Completion
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		if ch.Index != 0 {
			continue // n = 1
		}
		var text string
		if ch.Text != nil {
			text = *ch.Text
		}
		for _, m := range []*openai.Message{ch.Delta, ch.Message} {
			if m == nil {
				continue
			}
			if m.ReasoningContent != nil {
				text += *m.ReasoningContent
			}
			text += m.Content
		}
		var ids []int32
		if ch.TokenIDs != nil {
			a.sawIDs = true
			ids = *ch.TokenIDs
		} else if text != "" {
			a.missingIDs = true
		}
		if text != "" || len(ids) > 0 {
			a.chunks++
			if !a.hasTTFT && at >= 0 {
				a.ttft, a.hasTTFT = at, true
			}
		}
		a.text.WriteString(text)
		a.ids = append(a.ids, ids...)
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			a.finishReason = *ch.FinishReason
		}
	}
	return nil
}

// finish fills a completed request's Result.
func (a *accumulator) finish(res *Result) {
	res.state = completed
	res.ttft, res.hasTTFT = a.ttft, a.hasTTFT
	res.text, res.finishReason = a.text.String(), a.finishReason
	res.idsKnown = a.sawIDs && !a.missingIDs
	if res.idsKnown {
		res.ids = a.ids
	}
	switch {
	case a.usage:
		res.outputTokens = a.outputTokens
		if a.promptTokens > 0 {
			res.promptTokens = a.promptTokens
		}
	case res.idsKnown:
		res.outputTokens = len(a.ids)
	default:
		res.outputTokens = a.chunks
	}
}
