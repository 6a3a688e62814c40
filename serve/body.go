package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Request-body bounds. A body is read and parsed before --max-queue counts
// its request, so these are what keep hostile or merely large bodies from
// growing the process without limit.
const (
	// DefaultMaxBodyBytes bounds one body (vLLM's and OpenAI's prompts of a
	// long context fit many times over).
	DefaultMaxBodyBytes = 64 << 20
	// DefaultBodyBytesInFlight bounds the bytes of all bodies being read or
	// parsed at once.
	DefaultBodyBytesInFlight = 256 << 20
	// DefaultBodyTimeout bounds the time to receive one body.
	DefaultBodyTimeout = 30 * time.Second
)

// bodyBudget is a semaphore over body bytes: a request reserves its
// Content-Length (or the per-body bound, when it sends none) before it
// reads, and gives it back once its prompt is tokenised. After large bodies
// the memory goes back to the OS, so that a burst leaves no lasting RSS.
type bodyBudget struct {
	sem *semaphore.Weighted

	mu       sync.Mutex
	held     int64 // reserved now
	released int64 // given back since memory was last returned
	lastFree time.Time
}

// freeAfter is the volume of released body bytes after which the memory is
// handed back to the OS (when no body is in flight), at most once a second.
const freeAfter = 32 << 20

func newBodyBudget(n int64) *bodyBudget { return &bodyBudget{sem: semaphore.NewWeighted(n)} }

func (b *bodyBudget) acquire(ctx context.Context, n int64) error {
	if err := b.sem.Acquire(ctx, n); err != nil {
		return err
	}
	b.mu.Lock()
	b.held += n
	b.mu.Unlock()
	return nil
}

func (b *bodyBudget) release(n int64) {
	b.sem.Release(n)
	b.mu.Lock()
	b.held -= n
	b.released += n
	free := b.held == 0 && b.released >= freeAfter && time.Since(b.lastFree) > time.Second
	if free {
		b.released, b.lastFree = 0, time.Now()
	}
	b.mu.Unlock()
	if free {
		go debug.FreeOSMemory()
	}
}

// decodeBody reads r's body as one JSON value into req within the body
// bounds; release gives its bytes back to the budget (call it once the
// request's own copy of what it needs is made).
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, req any) (release func(), e *apiError) {
	limit := s.cfg.MaxBodyBytes
	tooLarge := &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Message: fmt.Sprintf("the request body is larger than the server's bound of %d bytes", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	n := limit // a body of unknown length may use up to the bound
	if r.ContentLength >= 0 {
		n = r.ContentLength
	}
	deadline := time.Now().Add(s.cfg.BodyTimeout)
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	if err := s.bodies.acquire(ctx, n); err != nil {
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error",
			Message: fmt.Sprintf("the server is busy reading other request bodies (%d bytes at once); retry later", s.cfg.BodyBytesInFlight)}
	}
	release = func() { s.bodies.release(n) }
	// A slow body holds its connection only until the deadline; the
	// deadline is lifted once the body is in, so a long streamed answer is
	// not cut.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(deadline) //nolint:errcheck // not every writer supports it (tests)
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	// A field the server does not know is refused, never ignored.
	dec.DisallowUnknownFields()
	err := dec.Decode(req)
	if err == nil {
		// One JSON value and nothing after it but white space.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errTrailing
			if terr != nil && !isSyntaxError(terr) {
				err = terr
			}
		}
	}
	if err == nil {
		rc.SetReadDeadline(time.Time{}) //nolint:errcheck
		return release, nil
	}
	release()
	// What is left of the body is not read: the connection closes after
	// the answer (instead of waiting for the rest of a slow body).
	w.Header().Set("Connection", "close")
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, tooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error",
			Message: fmt.Sprintf("the request body did not arrive within %v", s.cfg.BodyTimeout)}
	case errors.Is(err, errTrailing):
		return nil, badRequest("", "the body is not a valid JSON request: unexpected data after the JSON value")
	}
	if name, ok := unknownField(err); ok {
		return nil, badRequest(name, "the field %q is not supported (docs/serving.md lists the fields)", name)
	}
	return nil, badRequest("", "the body is not a valid JSON request: %v", err)
}

var errTrailing = errors.New("unexpected data after the JSON value")

func isSyntaxError(err error) bool {
	var se *json.SyntaxError
	return errors.As(err, &se)
}

// unknownField is the name in encoding/json's error for a field that
// DisallowUnknownFields refused.
func unknownField(err error) (string, bool) {
	name, ok := strings.CutPrefix(err.Error(), "json: unknown field ")
	if !ok {
		return "", false
	}
	if u, err := strconv.Unquote(name); err == nil {
		name = u
	}
	return name, true
}
