package model

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The tools reach the template with their keys in the client's order, an
// assistant turn of calls has content None, and a tool turn its call id.
func TestRenderChatTools(t *testing.T) {
	tools, err := DecodeOrderedJSON([]byte(`[{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": [true, null, 2.5]}}}]`))
	require.NoError(t, err)
	args, err := DecodeOrderedJSON([]byte(`{"city": "Rome", "days": 2}`))
	require.NoError(t, err)
	call := []any{map[string]any{"function": map[string]any{"name": "f", "arguments": args}}}
	tmpl := `{{ tools | tojson }}|{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.tool_calls[0].function.arguments | tojson if m.tool_calls else '' }}:{{ m.tool_call_id or '' }};{% endfor %}`
	out, err := RenderChatTools(tmpl, []ChatMessage{
		{Role: "user", Content: "hi"},
		{Role: "assistant", NullContent: true, ToolCalls: call},
		{Role: "tool", Content: "18 C", ToolCallID: "c1"},
	}, tools.([]any), false, "", "")
	require.NoError(t, err)
	require.Equal(t, `[{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": [true, null, 2.5]}}}]|`+
		`user:hi::;assistant:None:{"city": "Rome", "days": 2}:;tool:18 C::c1;`, out)
}

func TestDecodeOrderedJSONRefuses(t *testing.T) {
	_, err := DecodeOrderedJSON([]byte(`{"a": 1} {"b": 2}`))
	require.ErrorContains(t, err, "more than one JSON value")
	_, err = DecodeOrderedJSON([]byte(strings.Repeat("[", 70) + strings.Repeat("]", 70)))
	require.ErrorContains(t, err, "nested deeper than 64 levels")
	_, err = DecodeOrderedJSON([]byte(`{"a": }`))
	require.Error(t, err)
}
