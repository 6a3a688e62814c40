package serve

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge"

	"github.com/lockstep-ai/lockstep/serve/openai"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/workload"
)

// apiError is an OpenAI-shaped error answer. Code is OpenAI's
// machine-readable code ("invalid_api_key", "model_not_found", ...), ""
// for null.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, a ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, a...), Type: "invalid_request_error", Param: param}
}

func writeError(w http.ResponseWriter, e *apiError) {
	body := openai.ErrorBody{Error: openai.Error{Code: nullable(e.Code), Message: e.Message, Param: nullable(e.Param), Type: e.Type}}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	json.NewEncoder(w).Encode(body) //nolint:errcheck // the client may be gone
}

// nullable is s, or nil (JSON null) for "".
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// genParams are the generation settings of a request, checked.
type genParams struct {
	MaxTokens    int
	Temperature  float64
	TopP         float64
	TopK         int
	Seed         uint64
	HasSeed      bool
	Stop         []string
	Stream       bool
	IncludeUsage bool
	// ContinuousUsage puts the usage so far on every streamed chunk.
	ContinuousUsage bool
	IgnoreEOS       bool
	ReturnTokenID   bool
	// TokensAsIDs names the tokens of the log-probabilities "token_id:N"
	// (vLLM's return_tokens_as_token_ids), the request's or the server's.
	TokensAsIDs bool
	// HasMaxTokens: the request set max_tokens (or max_completion_tokens);
	// otherwise MaxTokens is the endpoint's default, fixed once the prompt
	// is known (chat: the rest of the context).
	HasMaxTokens bool
	// The logits processors (bridge.SamplingParams, docs/sampling.md).
	MinP, PresencePenalty, FrequencyPenalty, RepetitionPenalty float64
	LogitBias                                                  []bridge.TokenBias
	StopTokenIDs                                               []int32
	// ConversationID and Routing feed the conversation-aware router
	// (conversation_id, affinity_id or OpenAI's prompt_cache_key,
	// attention_dp_rank, attention_dp_relax; docs/serving.md).
	ConversationID string
	Routing        workload.Routing
	// IncludeStop keeps the stop string (or stop token's text) that ended
	// the answer in its text (vLLM's include_stop_str_in_output).
	IncludeStop bool
	// SpecialTokens renders control tokens' text (skip_special_tokens: false).
	SpecialTokens bool
	// Echo puts the prompt's text before the completion's (completions).
	Echo bool
	// Tools are a chat request's tools, decoded for the template
	// (model.DecodeOrderedJSON; nil: none); ToolChoice is "none" or "auto"
	// (chat; "" on completions); ParallelToolCalls false keeps the first
	// call only. ToolParser reads the answer's calls: set by the chat
	// handler for tool_choice "auto" (--enable-auto-tool-choice).
	Tools             []any
	ToolChoice        string
	ParallelToolCalls bool
	ToolParser        *toolParser
	// Reasoning moves a chat answer's thinking to reasoning_content
	// (--reasoning-parser); nil: none.
	Reasoning *reasoningParser
	// N is the number of choices per prompt (n; best_of only equal to it).
	N int
	// Priority orders the request under --scheduling-policy priority
	// (lower first; executor.Arrival.Priority); 0 by default.
	Priority int32
	// TruncatePrompt keeps a prompt's last TruncatePrompt tokens (vLLM's
	// truncate_prompt_tokens; −1: the model's context length); 0: none.
	TruncatePrompt int
	// Logprobs: every generated token's log-probability, with the
	// TopLogprobs most probable tokens' (completions: logprobs k; chat:
	// logprobs true and top_logprobs k).
	Logprobs    bool
	TopLogprobs int
	// WantPromptLogprobs (vLLM's prompt_logprobs k, PromptLogprobs): every
	// prompt token's log-probability but the first's, with the k most
	// probable tokens' at its position. EchoLogprobs (completions' echo
	// with logprobs): the logprobs lists start with the prompt's tokens.
	WantPromptLogprobs bool
	PromptLogprobs     int
	EchoLogprobs       bool
	// Guide is the pattern the answer must match (structured outputs:
	// response_format, guided_*, structured_outputs, or a forced tool
	// call); GuideParam the field that asked for it.
	Guide, GuideParam string
	// MinTokens: stop tokens are masked out, and stop strings not looked
	// for, before this many tokens (vLLM's min_tokens).
	MinTokens int
	// AllowedTokenIDs are the only tokens a pick may return (vLLM's
	// allowed_token_ids; nil: any).
	AllowedTokenIDs []int32
	// BadWords are vLLM's bad_words as given; the server tokenizes them
	// (badWordTokens).
	BadWords []string
	// forced is a forced tool call (tool_choice "required" or a named
	// function): the guided answer is read as calls (forcedCall.parse).
	forced *forcedCall
}

// maxChoices bounds n, and n times the prompts of one completions request
// (OpenAI's bound on n is 128).
const maxChoices = 128

// rawParams is the JSON of the settings shared by both endpoints.
type rawParams struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage         bool `json:"include_usage"`
		ContinuousUsageStats bool `json:"continuous_usage_stats"`
	} `json:"stream_options"`
	// User is OpenAI's end-user identifier: accepted, it changes nothing.
	User string `json:"user"`
	// Routing: lockstep's trace fields (docs/trace-format.md), OpenAI's
	// prompt_cache_key as the affinity id, TensorRT-LLM's scheduling
	// parameters attention_dp_rank and attention_dp_relax.
	ConversationID   json.RawMessage `json:"conversation_id"`
	AffinityID       json.RawMessage `json:"affinity_id"`
	PromptCacheKey   json.RawMessage `json:"prompt_cache_key"`
	AttentionDPRank  json.RawMessage `json:"attention_dp_rank"`
	AttentionDPRelax json.RawMessage `json:"attention_dp_relax"`
	N                *int            `json:"n"`
	BestOf           *int            `json:"best_of"`
	Logprobs         json.RawMessage `json:"logprobs"`
	TopLogprobs      *int            `json:"top_logprobs"`
	Echo             bool            `json:"echo"`
	Suffix           *string         `json:"suffix"`
	IgnoreEOS        bool            `json:"ignore_eos"`
	MinTokens        *int            `json:"min_tokens"`
	ReturnTokenIDs   bool            `json:"return_token_ids"`
	TokensAsIDs      *bool           `json:"return_tokens_as_token_ids"`
	Tools            json.RawMessage `json:"tools"`
	ResponseFormat   json.RawMessage `json:"response_format"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
	// vLLM's sampling extensions.
	RepetitionPenalty      *float64           `json:"repetition_penalty"`
	MinP                   *float64           `json:"min_p"`
	LogitBias              map[string]float64 `json:"logit_bias"`
	StopTokenIDs           []int64            `json:"stop_token_ids"`
	IncludeStopStrInOutput bool               `json:"include_stop_str_in_output"`
	SkipSpecialTokens      *bool              `json:"skip_special_tokens"`
	PromptLogprobs         *int               `json:"prompt_logprobs"`
	Priority               *int               `json:"priority"`
	BadWords               json.RawMessage    `json:"bad_words"`
	AllowedTokenIDs        json.RawMessage    `json:"allowed_token_ids"`
	GuidedJSON             json.RawMessage    `json:"guided_json"`
	GuidedRegex            json.RawMessage    `json:"guided_regex"`
	GuidedChoice           json.RawMessage    `json:"guided_choice"`
	GuidedGrammar          json.RawMessage    `json:"guided_grammar"`
	StructuredOutputs      json.RawMessage    `json:"structured_outputs"`
	ToolChoice             json.RawMessage    `json:"tool_choice"`
	LengthPenalty          *float64           `json:"length_penalty"`
	UseBeamSearch          bool               `json:"use_beam_search"`
	Truncate               *int               `json:"truncate_prompt_tokens"`
	SpacesBetweenSpecial   *bool              `json:"spaces_between_special_tokens"`
	ParallelToolCalls      json.RawMessage    `json:"parallel_tool_calls"`
	Functions              json.RawMessage    `json:"functions"`
}

// notNull reports whether raw is a JSON value other than null (absent
// counts as null).
func notNull(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// restOfContext is the default max_tokens of chat: the rest of the
// context after the prompt (vLLM's), fixed once the prompt is known.
const restOfContext = 0

// check turns the raw settings into genParams, naming the first bad field.
func (r *rawParams) check(defaultMax int) (genParams, *apiError) {
	p := genParams{N: 1, MaxTokens: defaultMax, TopP: 1, Stream: r.Stream, IgnoreEOS: r.IgnoreEOS, ReturnTokenID: r.ReturnTokenIDs,
		TokensAsIDs: r.TokensAsIDs != nil && *r.TokensAsIDs}
	if r.MaxCompletionTokens != nil {
		r.MaxTokens = r.MaxCompletionTokens
	}
	if r.MaxTokens != nil {
		if *r.MaxTokens < 1 {
			return p, badRequest("max_tokens", "max_tokens must be at least 1, got %d", *r.MaxTokens)
		}
		p.MaxTokens, p.HasMaxTokens = *r.MaxTokens, true
	}
	if r.Temperature != nil {
		t := *r.Temperature
		if math.IsNaN(t) || t < 0 || t > 2 {
			return p, badRequest("temperature", "temperature must be in [0, 2], got %v", t)
		}
		p.Temperature = t
	}
	if r.TopP != nil {
		t := *r.TopP
		if math.IsNaN(t) || t <= 0 || t > 1 {
			return p, badRequest("top_p", "top_p must be in (0, 1], got %v", t)
		}
		p.TopP = t
	}
	if r.TopK != nil {
		if *r.TopK < -1 || *r.TopK > math.MaxInt32 {
			return p, badRequest("top_k", "top_k must be -1 or 0 (all tokens) or in [1, %d], got %d", math.MaxInt32, *r.TopK)
		}
		p.TopK = max(*r.TopK, 0)
	}
	if r.MinTokens != nil {
		p.MinTokens = *r.MinTokens
	}
	if r.Seed != nil {
		p.Seed, p.HasSeed = uint64(*r.Seed), true
	}
	if len(r.Stop) > 0 && string(r.Stop) != "null" {
		var one string
		if err := json.Unmarshal(r.Stop, &one); err == nil {
			p.Stop = []string{one}
		} else if err := json.Unmarshal(r.Stop, &p.Stop); err != nil {
			return p, badRequest("stop", "stop must be a string or a list of strings")
		}
		if len(p.Stop) > 4 {
			return p, badRequest("stop", "at most 4 stop sequences, got %d", len(p.Stop))
		}
		for _, s := range p.Stop {
			if s == "" {
				return p, badRequest("stop", "stop sequences must not be empty")
			}
		}
	}
	if r.StreamOptions != nil {
		if !r.Stream {
			return p, badRequest("stream_options", "stream_options needs stream: true")
		}
		p.IncludeUsage = r.StreamOptions.IncludeUsage
		p.ContinuousUsage = r.StreamOptions.ContinuousUsageStats
	}
	if r.N != nil {
		if *r.N < 1 || *r.N > maxChoices {
			return p, badRequest("n", "n must be in [1, %d], got %d", maxChoices, *r.N)
		}
		p.N = *r.N
	}
	if e := r.checkLogprobs(&p, defaultMax == restOfContext); e != nil {
		return p, e
	}
	switch {
	case r.BestOf != nil && *r.BestOf != p.N:
		return p, badRequest("best_of", "best_of is supported only equal to n (%d), got %d", p.N, *r.BestOf)
	case r.Echo && defaultMax == restOfContext && p.Logprobs: // chat (its default is the rest of the context)
		return p, badRequest("echo", "echo with logprobs is supported on /v1/completions only (a chat answer's echo has no log-probabilities)")
	case r.Suffix != nil && *r.Suffix != "":
		return p, badRequest("suffix", "suffix is not supported")
	case r.MinTokens != nil && *r.MinTokens < 0:
		return p, badRequest("min_tokens", "min_tokens must be >= 0, got %d", *r.MinTokens)
	case r.MinTokens != nil && p.HasMaxTokens && *r.MinTokens > p.MaxTokens:
		return p, badRequest("min_tokens", "min_tokens %d must be at most max_tokens %d", *r.MinTokens, p.MaxTokens)
	case r.Priority != nil && (*r.Priority < math.MinInt32 || *r.Priority > math.MaxInt32):
		return p, badRequest("priority", "priority must fit in 32 bits, got %d", *r.Priority)
	case notNull(r.Functions):
		return p, badRequest("functions", "functions are not supported")
	case r.UseBeamSearch:
		return p, badRequest("use_beam_search", "beam search is not supported")
	case r.LengthPenalty != nil && *r.LengthPenalty != 1:
		return p, badRequest("length_penalty", "length_penalty applies to beam search, which is not supported")
	case r.Truncate != nil && *r.Truncate != -1 && *r.Truncate < 1:
		return p, badRequest("truncate_prompt_tokens", "truncate_prompt_tokens must be -1 (the model's context length) or at least 1, got %d", *r.Truncate)
	case r.SpacesBetweenSpecial != nil && !*r.SpacesBetweenSpecial:
		return p, badRequest("spaces_between_special_tokens", "spaces_between_special_tokens: false is not supported")
	}
	if r.Truncate != nil {
		p.TruncatePrompt = *r.Truncate
	}
	if r.Priority != nil {
		p.Priority = int32(*r.Priority)
	}
	if e := r.checkGuide(&p); e != nil {
		return p, e
	}
	if e := r.checkAllowedTokenIDs(&p); e != nil {
		return p, e
	}
	if notNull(r.BadWords) {
		if err := json.Unmarshal(r.BadWords, &p.BadWords); err != nil {
			return p, badRequest("bad_words", "bad_words must be a list of strings")
		}
		if len(p.BadWords) > maxBadWords {
			return p, badRequest("bad_words", "at most %d bad_words, got %d", maxBadWords, len(p.BadWords))
		}
	}
	if e := r.checkTools(&p, defaultMax == restOfContext); e != nil {
		return p, e
	}
	if e := r.checkProcessors(&p); e != nil {
		return p, e
	}
	if e := r.checkRouting(&p); e != nil {
		return p, e
	}
	return p, nil
}

// maxRoutingIDLen bounds conversation_id, affinity_id and prompt_cache_key:
// every rank receives them and the router keeps them as keys.
const maxRoutingIDLen = 256

// routingID reads an id field: a string (empty: unset) or a whole number
// used as written, as a trace gives them, of at most maxRoutingIDLen bytes.
func routingID(raw json.RawMessage, field string) (string, *apiError) {
	if !notNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		var n json.Number
		if json.Unmarshal(raw, &n) != nil {
			return "", badRequest(field, "%s must be a string or a number", field)
		}
		if _, err := n.Int64(); err != nil {
			return "", badRequest(field, "%s must be a string or a whole number, got %s", field, n)
		}
		s = n.String()
	}
	if len(s) > maxRoutingIDLen {
		return "", badRequest(field, "%s is %d bytes, more than %d", field, len(s), maxRoutingIDLen)
	}
	return s, nil
}

// checkRouting reads the routing fields into p. The target rank's upper
// bound (the fleet's attention-DP ranks) is checked by the server.
func (r *rawParams) checkRouting(p *genParams) *apiError {
	var e *apiError
	if p.ConversationID, e = routingID(r.ConversationID, "conversation_id"); e != nil {
		return e
	}
	if p.Routing.AffinityID, e = routingID(r.AffinityID, "affinity_id"); e != nil {
		return e
	}
	key, e := routingID(r.PromptCacheKey, "prompt_cache_key")
	switch {
	case e != nil:
		return e
	case key != "" && p.Routing.AffinityID != "" && key != p.Routing.AffinityID:
		return badRequest("prompt_cache_key", "prompt_cache_key %q and affinity_id %q name different routing keys: give one", key, p.Routing.AffinityID)
	case key != "":
		p.Routing.AffinityID = key
	}
	if notNull(r.AttentionDPRank) {
		var n int64
		if json.Unmarshal(r.AttentionDPRank, &n) != nil || n < 0 || n > math.MaxInt32 {
			return badRequest("attention_dp_rank", "attention_dp_rank must be a whole number in [0, ranks), got %s", r.AttentionDPRank)
		}
		p.Routing.HasRank, p.Routing.Rank = true, int(n)
	}
	if notNull(r.AttentionDPRelax) {
		var relax bool
		if json.Unmarshal(r.AttentionDPRelax, &relax) != nil {
			return badRequest("attention_dp_relax", "attention_dp_relax must be true or false, got %s", r.AttentionDPRelax)
		}
		p.Routing.Strict = !relax
	}
	return nil
}

// checkLogprobs reads the log-probability fields into p: on completions an
// integer logprobs k in [0, bridge.MaxLogprobs] (the sampled token's and the
// top k's; top_logprobs is chat's), on chat logprobs true with top_logprobs
// in [0, bridge.MaxLogprobs] (vLLM's bounds with its default max_logprobs);
// then the prompt's (checkPromptLogprobs).
func (r *rawParams) checkLogprobs(p *genParams, chat bool) *apiError {
	if e := r.checkOutputLogprobs(p, chat); e != nil {
		return e
	}
	return r.checkPromptLogprobs(p)
}

// checkPromptLogprobs reads prompt_logprobs (vLLM's: an integer k in [0,
// bridge.MaxLogprobs]; -1, the whole vocabulary, is refused) and echo with
// logprobs (completions: the prompt's entries first, with the logprobs
// count) into p. Streamed, they come with the choice's first chunk (the
// echo's), or chat's first chunk that has them.
func (r *rawParams) checkPromptLogprobs(p *genParams) *apiError {
	if k := r.PromptLogprobs; k != nil {
		switch {
		case *k == -1:
			return badRequest("prompt_logprobs", "prompt_logprobs -1 (every token of the vocabulary) is not supported: at most %d", bridge.MaxLogprobs)
		case *k < 0 || *k > bridge.MaxLogprobs:
			return badRequest("prompt_logprobs", "prompt_logprobs must be in [0, %d], got %d", bridge.MaxLogprobs, *k)
		}
		p.WantPromptLogprobs, p.PromptLogprobs = true, *k
	}
	p.EchoLogprobs = r.Echo && p.Logprobs
	return nil
}

// scoresPrompt reports whether p needs the prompt's log-probabilities, and
// how many top tokens' at each position.
func (p *genParams) scoresPrompt() (bool, int) {
	top := 0
	if p.WantPromptLogprobs {
		top = p.PromptLogprobs
	}
	if p.EchoLogprobs {
		top = max(top, p.TopLogprobs)
	}
	return p.WantPromptLogprobs || p.EchoLogprobs, top
}

// checkOutputLogprobs reads logprobs and top_logprobs (checkLogprobs).
func (r *rawParams) checkOutputLogprobs(p *genParams, chat bool) *apiError {
	raw := string(r.Logprobs)
	set := notNull(r.Logprobs)
	if chat {
		switch {
		case set && raw != "true" && raw != "false":
			return badRequest("logprobs", "logprobs must be true or false on /v1/chat/completions (the count is top_logprobs), got %s", raw)
		case r.TopLogprobs != nil && (*r.TopLogprobs < 0 || *r.TopLogprobs > bridge.MaxLogprobs):
			return badRequest("top_logprobs", "top_logprobs must be in [0, %d], got %d", bridge.MaxLogprobs, *r.TopLogprobs)
		case r.TopLogprobs != nil && *r.TopLogprobs > 0 && raw != "true":
			return badRequest("top_logprobs", "top_logprobs needs logprobs: true")
		}
		p.Logprobs = raw == "true"
		if p.Logprobs && r.TopLogprobs != nil {
			p.TopLogprobs = *r.TopLogprobs
		}
		return nil
	}
	if r.TopLogprobs != nil {
		return badRequest("top_logprobs", "top_logprobs is a /v1/chat/completions field; on /v1/completions logprobs is the count")
	}
	if !set {
		return nil
	}
	var k int
	if err := json.Unmarshal(r.Logprobs, &k); err != nil {
		return badRequest("logprobs", "logprobs must be an integer in [0, %d] on /v1/completions, got %s", bridge.MaxLogprobs, raw)
	}
	if k < 0 || k > bridge.MaxLogprobs {
		return badRequest("logprobs", "logprobs must be in [0, %d], got %d", bridge.MaxLogprobs, k)
	}
	p.Logprobs, p.TopLogprobs = true, k
	return nil
}

// checkProcessors reads the logits-processor fields (penalties, min_p,
// logit_bias, stop_token_ids) and the output options into p. Ids are
// checked against the vocabulary later (checkIDsIn).
func (r *rawParams) checkProcessors(p *genParams) *apiError {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if v := r.PresencePenalty; v != nil {
		if !finite(*v) || *v < -2 || *v > 2 {
			return badRequest("presence_penalty", "presence_penalty must be in [-2, 2], got %v", *v)
		}
		p.PresencePenalty = *v
	}
	if v := r.FrequencyPenalty; v != nil {
		if !finite(*v) || *v < -2 || *v > 2 {
			return badRequest("frequency_penalty", "frequency_penalty must be in [-2, 2], got %v", *v)
		}
		p.FrequencyPenalty = *v
	}
	if v := r.RepetitionPenalty; v != nil {
		if !finite(*v) || *v <= 0 || *v > 1e6 {
			return badRequest("repetition_penalty", "repetition_penalty must be in (0, 1e6] (1 = off), got %v", *v)
		}
		p.RepetitionPenalty = *v
	}
	if v := r.MinP; v != nil {
		if !finite(*v) || *v < 0 || *v > 1 {
			return badRequest("min_p", "min_p must be in [0, 1], got %v", *v)
		}
		p.MinP = *v
	}
	if len(r.LogitBias) > 0 {
		if len(r.LogitBias) > 1<<16 {
			return badRequest("logit_bias", "at most %d logit_bias entries, got %d", 1<<16, len(r.LogitBias))
		}
		for k, v := range r.LogitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil || id < 0 {
				return badRequest("logit_bias", "logit_bias keys must be token ids, got %q", k)
			}
			if !finite(v) || v < -100 || v > 100 {
				return badRequest("logit_bias", "logit_bias values must be in [-100, 100], got %v for token %d", v, id)
			}
			p.LogitBias = append(p.LogitBias, bridge.TokenBias{ID: int32(id), Bias: float32(v)})
		}
		// Map order is random: the bias is applied in id order, the same on every run.
		slices.SortFunc(p.LogitBias, func(a, b bridge.TokenBias) int { return int(a.ID) - int(b.ID) })
	}
	if len(r.StopTokenIDs) > 0 {
		if len(r.StopTokenIDs) > 1024 {
			return badRequest("stop_token_ids", "at most 1024 stop_token_ids, got %d", len(r.StopTokenIDs))
		}
		for _, id := range r.StopTokenIDs {
			if id < 0 || id > math.MaxInt32 {
				return badRequest("stop_token_ids", "stop_token_ids must be token ids, got %d", id)
			}
			p.StopTokenIDs = append(p.StopTokenIDs, int32(id))
		}
	}
	p.IncludeStop = r.IncludeStopStrInOutput
	p.Echo = r.Echo
	p.SpecialTokens = r.SkipSpecialTokens != nil && !*r.SkipSpecialTokens
	return nil
}

// checkVocab checks the token ids of p (logit_bias, stop_token_ids)
// against the vocabulary.
func (p *genParams) checkVocab(vocab int) *apiError {
	for _, b := range p.LogitBias {
		if int(b.ID) >= vocab {
			return badRequest("logit_bias", "logit_bias token id %d is outside the vocabulary [0, %d)", b.ID, vocab)
		}
	}
	for _, id := range p.StopTokenIDs {
		if int(id) >= vocab {
			return badRequest("stop_token_ids", "stop_token_ids: token id %d is outside the vocabulary [0, %d)", id, vocab)
		}
	}
	for _, id := range p.AllowedTokenIDs {
		if int(id) >= vocab {
			return badRequest("allowed_token_ids", "allowed_token_ids: token id %d is outside the vocabulary [0, %d)", id, vocab)
		}
	}
	return nil
}

// maxBadWords bounds bad_words (each is checked against the output before
// every pick).
const maxBadWords = 256

// badWordTokens tokenizes bad_words as vLLM does: each word (its leading
// white space dropped) as it would start the text, and again after a
// space when that makes other tokens of the same count (the word in the
// middle of the text). Empty words are refused.
func badWordTokens(words []string, tok *model.Tokenizer) ([][]int32, *apiError) {
	if len(words) == 0 {
		return nil, nil
	}
	if tok == nil {
		return nil, badRequest("bad_words", "bad_words need the model's tokenizer, and this model has none")
	}
	var out [][]int32
	for i, w := range words {
		w = strings.TrimLeft(w, " \t\n\r")
		if w == "" {
			return nil, badRequest("bad_words", "bad_words[%d] is empty", i)
		}
		bare := tok.Encode(w, model.EncodeOptions{})
		out = append(out, bare)
		spaced := tok.Encode(" "+w, model.EncodeOptions{})
		if len(spaced) == len(bare) && len(spaced) > 0 && spaced[0] != bare[0] {
			out = append(out, spaced)
		}
	}
	return out, nil
}

// maxAllowedTokenIDs bounds allowed_token_ids (a list longer than any
// vocabulary restricts nothing).
const maxAllowedTokenIDs = 1 << 20

// checkAllowedTokenIDs reads vLLM's allowed_token_ids: a non-empty list of
// token ids, the only ones a pick may return (sorted, once each).
func (r *rawParams) checkAllowedTokenIDs(p *genParams) *apiError {
	if !notNull(r.AllowedTokenIDs) {
		return nil
	}
	var ids []int64
	if err := json.Unmarshal(r.AllowedTokenIDs, &ids); err != nil {
		return badRequest("allowed_token_ids", "allowed_token_ids must be a list of token ids")
	}
	switch {
	case len(ids) == 0:
		return badRequest("allowed_token_ids", "allowed_token_ids must not be empty")
	case len(ids) > maxAllowedTokenIDs:
		return badRequest("allowed_token_ids", "at most %d allowed_token_ids, got %d", maxAllowedTokenIDs, len(ids))
	}
	out := make([]int32, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return badRequest("allowed_token_ids", "allowed_token_ids: token id %d is outside the vocabulary", id)
		}
		out = append(out, int32(id))
	}
	slices.Sort(out)
	p.AllowedTokenIDs = slices.Compact(out)
	return nil
}

func jsonTypeText(raw json.RawMessage) bool {
	var f struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(raw, &f) == nil && f.Type == "text"
}

// completionRequest is POST /v1/completions.
type completionRequest struct {
	rawParams
	Prompt json.RawMessage `json:"prompt"`
}

// promptIn is one prompt of a request: its token ids, and its text when it
// was sent (or rendered) as text.
type promptIn struct {
	ids  []int32
	text string
	// echo, when set, is what echo puts first instead of the prompt's
	// text (chat: the final assistant message).
	echo *string
}

// maxPrompts bounds the prompts of one completions request.
const maxPrompts = maxChoices

// prompts returns the prompts' token ids: a string is tokenised (special
// tokens not parsed), a list of ids is taken as is; a list of strings or of
// lists of ids is several prompts (their choices indexed prompt-major).
func (r *completionRequest) prompts(tok *model.Tokenizer, vocab int) ([]promptIn, *apiError) {
	raw := r.Prompt
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	one := func(ids []int32, text string, e *apiError) ([]promptIn, *apiError) {
		if e != nil {
			return nil, e
		}
		return []promptIn{{ids: ids, text: text}}, nil
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return one(encodeText(tok, text))
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return one(checkIDs(ids, vocab))
	}
	many := func(n int, get func(i int) ([]int32, string, *apiError)) ([]promptIn, *apiError) {
		if n == 0 {
			return nil, badRequest("prompt", "the list of prompts is empty")
		}
		if n > maxPrompts {
			return nil, badRequest("prompt", "at most %d prompts per request, got %d", maxPrompts, n)
		}
		out := make([]promptIn, n)
		for i := range out {
			ids, text, e := get(i)
			if e != nil {
				e.Message = fmt.Sprintf("prompt %d: %s", i, e.Message)
				return nil, e
			}
			out[i] = promptIn{ids: ids, text: text}
		}
		return out, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		return many(len(texts), func(i int) ([]int32, string, *apiError) { return encodeText(tok, texts[i]) })
	}
	var lists [][]int64
	if json.Unmarshal(raw, &lists) == nil {
		return many(len(lists), func(i int) ([]int32, string, *apiError) { return checkIDs(lists[i], vocab) })
	}
	return nil, badRequest("prompt", "prompt must be a string, a list of token ids, or a list of strings or of lists of token ids")
}

func encodeText(tok *model.Tokenizer, text string) ([]int32, string, *apiError) {
	if tok == nil {
		return nil, "", badRequest("prompt", "this model has no tokenizer (a synthetic preset): send the prompt as token ids")
	}
	ids := tok.Encode(text, model.EncodeOptions{AddSpecial: true})
	if len(ids) == 0 {
		return nil, "", badRequest("prompt", "the prompt is empty")
	}
	return ids, text, nil
}

func checkIDs(ids []int64, vocab int) ([]int32, string, *apiError) {
	if len(ids) == 0 {
		return nil, "", badRequest("prompt", "the prompt is empty")
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= int64(vocab) {
			return nil, "", badRequest("prompt", "token id %d at position %d is outside the vocabulary [0, %d)", id, i, vocab)
		}
		out[i] = int32(id)
	}
	return out, "", nil
}
