package serve

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lockstep-ai/lockstep/serve/openai"
)

// routes are the API's paths and the methods each takes (a GET route
// answers HEAD too, as net/http's mux does).
var routes = []struct{ method, path string }{
	{"GET", "/health"},
	{"GET", "/v1/models"},
	{"POST", "/v1/completions"},
	{"POST", "/v1/chat/completions"},
	{"GET", "/metrics"},
	{"POST", "/tokenize"},
	{"POST", "/detokenize"},
	{"GET", "/version"},
	{"GET, POST", "/ping"},
}

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /v1/models", s.auth(s.models))
	mux.HandleFunc("POST /v1/completions", s.auth(s.completions))
	mux.HandleFunc("POST /v1/chat/completions", s.auth(s.chat))
	mux.HandleFunc("POST /v1/responses", s.auth(s.responses))
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", s.auth(s.cfg.Metrics.Handler().ServeHTTP))
	}
	mux.HandleFunc("POST /tokenize", s.auth(s.tokenize))
	mux.HandleFunc("POST /detokenize", s.auth(s.detokenize))
	mux.HandleFunc("GET /version", s.auth(s.version))
	// vLLM's /ping (SageMaker's probe) is /health, on GET and POST.
	mux.HandleFunc("GET /ping", s.health)
	mux.HandleFunc("POST /ping", s.health)
	mux.HandleFunc("/", s.noRoute)
	return mux
}

// noRoute answers what no route took: 405 (with Allow) for a known path
// with another method, 404 otherwise, both in OpenAI's error shape.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	for _, rt := range routes {
		if rt.path != r.URL.Path || (rt.path == "/metrics" && s.cfg.Metrics == nil) {
			continue
		}
		allow := rt.method
		if strings.HasPrefix(allow, "GET") {
			allow = strings.Replace(allow, "GET", "GET, HEAD", 1)
		}
		w.Header().Set("Allow", allow)
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
			Message: fmt.Sprintf("%s does not take %s (allowed: %s)", r.URL.Path, r.Method, allow)})
		return
	}
	writeError(w, &apiError{Status: http.StatusNotFound, Type: "not_found_error",
		Message: fmt.Sprintf("no route %s %s (see /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize, /version, /health, /ping, /metrics)", r.Method, r.URL.Path)})
}

// auth requires the API key as a bearer token (RFC 6750: the scheme is
// case-insensitive) when the server has one. Every route but the probes
// (/health, /ping) takes it.
func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	if s.cfg.APIKey == "" {
		return h
	}
	want := []byte(s.cfg.APIKey)
	return func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		if !strings.EqualFold(scheme, "bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), want) != 1 {
			writeError(w, &apiError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key",
				Message: "missing or wrong API key (Authorization: Bearer <key>)"})
			return
		}
		h(w, r)
	}
}

// health is GET /health: 200 once every rank passed init, 503 while
// starting, draining, or after the fleet failed.
func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	switch {
	case s.failed.Load() != nil:
		http.Error(w, "failed: "+(*s.failed.Load()).Error(), http.StatusServiceUnavailable)
	case s.draining.Load():
		http.Error(w, "draining", http.StatusServiceUnavailable)
	case !s.ready.Load():
		http.Error(w, "starting: not every rank has passed init", http.StatusServiceUnavailable)
	case time.Since(time.Unix(0, s.lastIter.Load())) > s.cfg.StallAfter:
		http.Error(w, fmt.Sprintf("stalled: no iteration for %v (a rank is hung or gone)",
			time.Since(time.Unix(0, s.lastIter.Load())).Round(time.Second)), http.StatusServiceUnavailable)
	default:
		w.Write([]byte("ok\n")) //nolint:errcheck
	}
}

// models is GET /v1/models.
func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	m := openai.Model{ID: s.cfg.ModelName, Object: "model", OwnedBy: "lockstep", MaxModelLen: s.cfg.MaxModelLen}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(openai.ModelList{Object: "list", Data: []openai.Model{m}}) //nolint:errcheck
}
