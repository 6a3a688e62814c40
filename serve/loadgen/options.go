// Package loadgen replays a Mooncake trace (or a prompts file) against any
// OpenAI-compatible HTTP endpoint — lockstep's `worker serve`, vLLM, SGLang,
// trtllm-serve — at the trace's (scaled) timestamps, streaming, and reports
// TTFT, TPOT, E2E and throughput in the report shape of `worker run`
// (docs/loadgen.md). It speaks the wire structs of serve/openai.
package loadgen

import (
	"strings"
	"time"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/workload"
)

// Options are a replay's settings (`worker loadgen`'s flags, docs/loadgen.md).
type Options struct {
	// URL is the server's base URL; Validate strips a trailing "/" and "/v1".
	URL string
	// Model is sent with each request; "" asks GET /v1/models for the first.
	Model, APIKey string
	// Trace is a Mooncake trace ("" with no PromptsFile: the built-in
	// sample); PromptsFile a prompts file (workload/prompts), sent at once.
	Trace, PromptsFile        string
	Limit                     int
	LengthScale, ArrivalScale float64
	// Arrivals is the arrival process of a trace: workload.ArrivalsTrace or
	// workload.ArrivalsPoisson (as worker run --arrivals).
	Arrivals string
	// MaxConcurrency bounds the requests in flight (0: unbounded).
	MaxConcurrency int
	// Duration stops issuing requests (0: no limit); Grace is how long
	// requests in flight may run past it; Timeout bounds one request.
	Duration, Grace, Timeout time.Duration
	// Endpoint is "completions" or "chat"; Tokens how a trace prompt is
	// sent: "ids" or "text" ("" picks ids, text for chat).
	Endpoint, Tokens       string
	Stream, ReturnTokenIDs bool
	IgnoreEOS              bool
	// MaxTokens is a prompt's max_tokens when it gives none.
	MaxTokens int
	// VocabSize bounds a trace's synthesised ids (0: the preset's, else
	// DefaultVocabSize); Seed seeds them (as worker run --seed).
	VocabSize int
	Seed      uint64
	// InferConversations gives a trace's requests conversation ids from
	// their hash_ids prefix chains (as worker run --infer-conversations);
	// a request's conversation_id and routing fields are sent when it has
	// them.
	InferConversations bool
}

// DefaultVocabSize bounds the synthesised prompt ids of a trace when
// neither Options.VocabSize nor a lockstep preset name says better: every
// common tokenizer (Llama 2: 32000; Llama 3: 128256; Qwen: 151936) has
// at least this many tokens.
const DefaultVocabSize = 32000

// Defaults are the options of a replay with no flags given.
func Defaults() Options {
	return Options{URL: "http://127.0.0.1:8000", LengthScale: 1, ArrivalScale: 1, Arrivals: workload.ArrivalsTrace, Grace: 30 * time.Second,
		Timeout: 10 * time.Minute, Endpoint: "completions", Stream: true, IgnoreEOS: true,
		MaxTokens: 128, Seed: 1}
}

// Validate checks the options before any request is sent and completes
// them (Tokens, URL, APIKey from $OPENAI_API_KEY through getenv). Errors
// are usage errors naming the flag.
func (o *Options) Validate(getenv func(string) string) error {
	if err := usage.OneOf("--endpoint", o.Endpoint, "completions", "chat"); err != nil {
		return err
	}
	if o.Tokens == "" {
		o.Tokens = "ids"
		if o.Endpoint == "chat" {
			o.Tokens = "text"
		}
	}
	if err := usage.OneOf("--tokens", o.Tokens, "ids", "text"); err != nil {
		return err
	}
	if o.Tokens == "ids" && o.Endpoint == "chat" {
		return usage.Errorf("--tokens ids needs --endpoint completions (chat messages are text)")
	}
	if !strings.HasPrefix(o.URL, "http://") && !strings.HasPrefix(o.URL, "https://") {
		return usage.Errorf("--url %q: give an http:// or https:// base URL", o.URL)
	}
	o.URL = strings.TrimSuffix(strings.TrimSuffix(o.URL, "/"), "/v1")
	if o.APIKey == "" {
		o.APIKey = getenv("OPENAI_API_KEY")
	}
	if o.Trace != "" && o.PromptsFile != "" {
		return usage.Errorf("--trace and --prompts are mutually exclusive")
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"--limit", o.Limit}, {"--max-concurrency", o.MaxConcurrency}, {"--vocab-size", o.VocabSize}} {
		if p.v < 0 {
			return usage.Errorf("%s must be non-negative, got %d", p.name, p.v)
		}
	}
	if o.VocabSize == 1 {
		return usage.Errorf("--vocab-size must be at least 2, got 1")
	}
	if o.MaxTokens < 1 {
		return usage.Errorf("--max-tokens must be at least 1, got %d", o.MaxTokens)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--duration", o.Duration}, {"--grace", o.Grace}, {"--timeout", o.Timeout}} {
		if d.v < 0 {
			return usage.Errorf("%s must be non-negative, got %v", d.name, d.v)
		}
	}
	if err := workload.CheckLengthScale(o.LengthScale, "--length-scale"); err != nil {
		return usage.Wrap(err)
	}
	if err := workload.CheckArrivalScale(o.ArrivalScale, "--arrival-scale"); err != nil {
		return usage.Wrap(err)
	}
	if err := workload.CheckArrivals(o.Arrivals, "--arrivals"); err != nil {
		return usage.Wrap(err)
	}
	return nil
}
