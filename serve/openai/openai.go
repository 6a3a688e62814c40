// Package openai holds the OpenAI-compatible wire structs of lockstep's HTTP
// API: what `worker serve` writes (serve/writer.go) and what `worker
// loadgen` sends and reads (serve/loadgen), so that the two cannot drift.
//
// Field order is alphabetical within each struct: the server's bytes are
// those of the JSON objects it wrote before it had types (encoding/json
// sorts map keys), so a client that compared them sees no change.
// Fields only other servers send (vLLM's reasoning_content, an error
// inside a stream) are decoded too and never written by lockstep.
package openai

import "encoding/json"

// Usage is a completion's token counts.
type Usage struct {
	Prompt     int `json:"prompt_tokens"`
	Completion int `json:"completion_tokens"`
	Total      int `json:"total_tokens"`
	// PromptTokensDetails is written only when the server is asked to
	// (worker serve --enable-prompt-tokens-details, as vLLM).
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails details a completion's prompt tokens.
type PromptTokensDetails struct {
	// CachedTokens is how many prompt tokens reused cached KV (prefix cache).
	CachedTokens int `json:"cached_tokens"`
}

// Message is a chat message of a response: the whole message of a
// non-streamed chat completion, or the delta of a streamed chunk.
type Message struct {
	Content string `json:"content"`
	// ReasoningContent is a reasoning model's thinking (vLLM, SGLang;
	// worker serve --reasoning-parser).
	ReasoningContent *string `json:"reasoning_content,omitempty"`
	Role             string  `json:"role,omitempty"`
	// ToolCalls are the tools the model called (worker serve
	// --enable-auto-tool-choice; finish_reason "tool_calls").
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is one call of a tool in a chat message or, with Index, in a
// streamed delta (lockstep streams each call whole, in one delta).
type ToolCall struct {
	Function ToolCallFunction `json:"function"`
	ID       string           `json:"id,omitempty"`
	Index    *int             `json:"index,omitempty"`
	Type     string           `json:"type,omitempty"`
}

// ToolCallFunction is a called function: its name and its arguments, a
// JSON object as a string.
type ToolCallFunction struct {
	Arguments string `json:"arguments"`
	Name      string `json:"name,omitempty"`
}

// Choice is one choice of a completion or chunk. A text completion has
// Text and Logprobs (null); a chat completion has Message (whole) or Delta
// (streamed). FinishReason is null until the last chunk.
type Choice struct {
	Delta        *Message        `json:"delta,omitempty"`
	FinishReason *string         `json:"finish_reason"`
	Index        int             `json:"index"`
	Logprobs     json.RawMessage `json:"logprobs,omitempty"`
	Message      *Message        `json:"message,omitempty"`
	Text         *string         `json:"text,omitempty"`
	// TokenIDs are the choice's output token ids (lockstep's and recent
	// vLLM's "return_token_ids"); absent unless asked for.
	TokenIDs *[]int32 `json:"token_ids,omitempty"`
	// PromptLogprobs is a text completion choice's prompt_logprobs
	// (vLLM's: PromptLogprobs); absent unless asked for.
	PromptLogprobs json.RawMessage `json:"prompt_logprobs,omitempty"`
}

// PromptLogprobs is vLLM's prompt_logprobs: null for the first prompt
// token, then per token a map from token ids (as strings) to their
// PromptLogprob: the prompt token's and the requested number of most
// probable tokens'.
type PromptLogprobs []map[string]PromptLogprob

// PromptLogprob is one token's entry at a prompt position: its
// log-probability, its rank (the most probable is 1) and its text.
type PromptLogprob struct {
	Logprob      float64 `json:"logprob"`
	Rank         int32   `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// CompletionLogprobs is a text completion choice's logprobs: per token its
// text, its log-probability, a map of the top tokens' (and its own) texts to
// theirs, and the offset of its text in the choice's text. With echo the
// prompt's tokens come first, the first of them with null entries.
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// ChatLogprobs is a chat choice's logprobs.
type ChatLogprobs struct {
	Content []ChatTokenLogprob `json:"content"`
}

// ChatTokenLogprob is one generated token of a chat choice: its text, its
// log-probability, its UTF-8 bytes and the top tokens at its position.
type ChatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []ChatTopLogprob `json:"top_logprobs"`
}

// ChatTopLogprob is one of the top tokens at a position.
type ChatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// NullLogprobs is the logprobs value of a text completion's choice: null.
var NullLogprobs = json.RawMessage("null")

// Completion is a whole response or one streamed chunk, of either endpoint
// (object "text_completion", "chat.completion" or "chat.completion.chunk").
type Completion struct {
	Choices []Choice `json:"choices"`
	Created int64    `json:"created"`
	// Error is another server's failure reported inside a stream or body
	// (lockstep writes StreamError instead of a chunk).
	Error json.RawMessage `json:"error,omitempty"`
	ID    string          `json:"id"`
	// Message is the text of a vLLM-style {"object": "error", "message": ...}.
	Message string `json:"message,omitempty"`
	Model   string `json:"model"`
	Object  string `json:"object"`
	// PromptLogprobs is a chat completion's prompt_logprobs (vLLM's:
	// PromptLogprobs); absent unless asked for.
	PromptLogprobs json.RawMessage `json:"prompt_logprobs,omitempty"`
	Usage          *Usage          `json:"usage,omitempty"`
}

// ErrorBody is the body of an HTTP error answer.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Error is an OpenAI error object: code is a machine-readable string such
// as "invalid_api_key" or null, as OpenAI sends it (the HTTP status is the
// status line's, not the body's); param is the parameter at fault (null
// for none).
type Error struct {
	Code    *string `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Type    string  `json:"type"`
}

// StreamErrorEvent is the event that ends a stream that failed after its
// first chunk (the status line is already sent).
type StreamErrorEvent struct {
	Error StreamError `json:"error"`
}

// StreamError is the error of a StreamErrorEvent: an Error without param.
type StreamError struct {
	Code    *string `json:"code"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
}

// ModelList is the answer of GET /v1/models.
type ModelList struct {
	Data   []Model `json:"data"`
	Object string  `json:"object"` // "list"
}

// Model is one served model.
type Model struct {
	Created     int64  `json:"created"`
	ID          string `json:"id"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
	Object      string `json:"object"` // "model"
	OwnedBy     string `json:"owned_by"`
}

// CompletionRequest is the body a client sends to /v1/completions or
// /v1/chat/completions. ignore_eos and min_tokens are vLLM / SGLang /
// TensorRT-LLM extensions; return_token_ids is lockstep's (and recent
// vLLM's). The server decodes requests its own way (every field checked);
// this is the client's shape.
type CompletionRequest struct {
	Model          string         `json:"model"`
	Prompt         any            `json:"prompt,omitempty"` // a string or token ids
	Messages       []ChatMessage  `json:"messages,omitempty"`
	MaxTokens      int            `json:"max_tokens"`
	MinTokens      int            `json:"min_tokens,omitempty"`
	IgnoreEOS      bool           `json:"ignore_eos,omitempty"`
	Temperature    float64        `json:"temperature"`
	Stream         bool           `json:"stream"`
	StreamOptions  *StreamOptions `json:"stream_options,omitempty"`
	ReturnTokenIDs bool           `json:"return_token_ids,omitempty"`
	// The routing fields of lockstep's server (docs/serving.md), sent
	// only when a trace request carries them.
	ConversationID   string `json:"conversation_id,omitempty"`
	AffinityID       string `json:"affinity_id,omitempty"`
	AttentionDPRank  *int   `json:"attention_dp_rank,omitempty"`
	AttentionDPRelax *bool  `json:"attention_dp_relax,omitempty"`
}

// ChatMessage is one message of a chat request.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// StreamOptions asks for a final usage chunk.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}
