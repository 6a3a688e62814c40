package openai

import "encoding/json"

// The Responses API (POST /v1/responses): a response object, its output
// items and the events of a streamed one.

// Response is a response object: the body of a non-streamed answer, and
// the payload of a stream's response.created, response.in_progress and
// final event.
type Response struct {
	CreatedAt         int64              `json:"created_at"`
	Error             *ResponseError     `json:"error"`
	ID                string             `json:"id"`
	IncompleteDetails *IncompleteDetails `json:"incomplete_details"`
	Instructions      *string            `json:"instructions"`
	MaxOutputTokens   *int               `json:"max_output_tokens"`
	Metadata          json.RawMessage    `json:"metadata"`
	Model             string             `json:"model"`
	Object            string             `json:"object"` // "response"
	Output            []OutputItem       `json:"output"`
	ParallelToolCalls bool               `json:"parallel_tool_calls"`
	Status            string             `json:"status"` // in_progress, completed, incomplete, failed
	Store             bool               `json:"store"`
	Temperature       *float64           `json:"temperature"`
	ToolChoice        any                `json:"tool_choice"`
	Tools             []any              `json:"tools"`
	TopP              *float64           `json:"top_p"`
	Usage             *ResponseUsage     `json:"usage"`
}

// ResponseError is a failed response's error.
type ResponseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// IncompleteDetails says why a response is incomplete
// ("max_output_tokens").
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// ResponseUsage is a response's token counts.
type ResponseUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  InputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails OutputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

// InputTokensDetails: the input tokens whose KV came from the prefix cache.
type InputTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// OutputTokensDetails: lockstep's models do not reason apart (0).
type OutputTokensDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// OutputItem is one item of a response's output: an assistant message
// (Type "message": Role, Content) or a function call (Type
// "function_call": CallID, Name, Arguments).
type OutputItem struct {
	Arguments *string       `json:"arguments,omitempty"`
	CallID    string        `json:"call_id,omitempty"`
	Content   []ContentPart `json:"content,omitempty"`
	ID        string        `json:"id"`
	Name      string        `json:"name,omitempty"`
	Role      string        `json:"role,omitempty"`
	Status    string        `json:"status"`
	// Summary is a reasoning item's (always a list, empty here).
	Summary *[]any `json:"summary,omitempty"`
	Type    string `json:"type"`
}

// ContentPart is a part of a message (Type "output_text") or of a
// reasoning item ("reasoning_text").
type ContentPart struct {
	Annotations *[]any `json:"annotations,omitempty"` // output_text: always a list
	// Logprobs are an output_text part's tokens' log-probabilities, when
	// asked for (include "message.output_text.logprobs" or top_logprobs).
	Logprobs []ChatTokenLogprob `json:"logprobs,omitempty"`
	Text     string             `json:"text"`
	Type     string             `json:"type"`
}

// ResponseEvent is one event of a streamed response (its SSE event name is
// Type). Which fields are set depends on Type.
type ResponseEvent struct {
	Arguments      *string            `json:"arguments,omitempty"`
	Code           *string            `json:"code,omitempty"`
	ContentIndex   *int               `json:"content_index,omitempty"`
	Delta          *string            `json:"delta,omitempty"`
	Item           *OutputItem        `json:"item,omitempty"`
	ItemID         string             `json:"item_id,omitempty"`
	Logprobs       []ChatTokenLogprob `json:"logprobs,omitempty"`
	Message        string             `json:"message,omitempty"`
	OutputIndex    *int               `json:"output_index,omitempty"`
	Param          *string            `json:"param,omitempty"`
	Part           *ContentPart       `json:"part,omitempty"`
	Response       *Response          `json:"response,omitempty"`
	SequenceNumber int                `json:"sequence_number"`
	Text           *string            `json:"text,omitempty"`
	Type           string             `json:"type"`
}
