package serve

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model"
)

// chatFieldsServer is a fleet server whose template writes each turn as
// <role>content</role> and opens an assistant turn with <assistant>.
func chatFieldsServer(t *testing.T, trust bool) (*Server, string) {
	spec := byteTokenizer(t).Spec()
	spec.ChatTemplate = `{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}` +
		`{% if add_generation_prompt %}<assistant>{% endif %}`
	tok, err := model.NewTokenizer(spec)
	require.NoError(t, err)
	s, _, ts := fleetServer(t, func(c *Config) { c.Tokenizer, c.TrustRequestChatTemplate = tok, trust })
	return s, ts.URL
}

// add_generation_prompt, continue_final_message and chat echo (vLLM's
// chat fields): the prompt the fleet gets, and the answer's text.
func TestChatGenerationPromptAndContinuation(t *testing.T) {
	s, url := chatFieldsServer(t, false)
	user := `{"role": "user", "content": "2+2?"}`
	prefill := `{"role": "assistant", "content": "It is  "}`
	for _, c := range []struct {
		body, prompt, answer string
	}{
		{`"messages": [` + user + `]`, "<user>2+2?</user><assistant>", "4."},
		{`"add_generation_prompt": false, "messages": [` + user + `]`, "<user>2+2?</user>", "4."},
		// The final message left open, its trailing spaces kept (they are
		// in the rendering); add_generation_prompt then defaults to false.
		{`"continue_final_message": true, "messages": [` + user + `, ` + prefill + `]`, "<user>2+2?</user><assistant>It is  ", "4."},
		{`"continue_final_message": true, "add_generation_prompt": false, "echo": true, "messages": [` + user + `, ` + prefill + `]`,
			"<user>2+2?</user><assistant>It is  ", "It is  4."},
		// echo without an assistant message last: nothing to echo.
		{`"echo": true, "messages": [` + user + `]`, "<user>2+2?</user><assistant>", "4."},
	} {
		done := postAsync(t, url+"/v1/chat/completions", `{"max_tokens": 5, `+c.body+`}`)
		a := takeArrival(t, s)
		require.Equal(t, c.prompt, s.cfg.Tokenizer.Decode(a.Prompt), c.body)
		deliver(s, a, "4.")
		require.Equal(t, c.answer, choicesOf(t, <-done)[0]["message"].(map[string]any)["content"], c.body)
	}

	// Streamed, the echo is the first content.
	body := streamBody(t, url+"/v1/chat/completions", `{"max_tokens": 5, "stream": true, "continue_final_message": true, "echo": true, "messages": [`+user+`, `+prefill+`]}`)
	deliver(s, takeArrival(t, s), "4.")
	content, _, _ := streamedAnswer(t, <-body)
	require.Equal(t, "It is  4.", content)

	// /tokenize renders the same way.
	status, tk := postURL(t, url+"/tokenize", `{"continue_final_message": true, "messages": [`+user+`, `+prefill+`]}`)
	require.Equal(t, 200, status)
	var ids []int32
	for _, v := range tk["tokens"].([]any) {
		ids = append(ids, int32(v.(float64)))
	}
	require.Equal(t, "<user>2+2?</user><assistant>It is  ", s.cfg.Tokenizer.Decode(ids))

	for _, c := range []struct{ path, body, param, msg string }{
		{"/v1/chat/completions", `"continue_final_message": true, "add_generation_prompt": true, "messages": [` + user + `, ` + prefill + `]`,
			"continue_final_message", "cannot both be true"},
		{"/v1/chat/completions", `"echo": true, "logprobs": true, "messages": [` + user + `]`, "echo", "echo with logprobs"},
		{"/v1/chat/completions", `"chat_template": "{{ messages }}", "messages": [` + user + `]`, "chat_template", "--trust-request-chat-template"},
		{"/tokenize", `"chat_template": "x", "messages": [` + user + `]`, "chat_template", "--trust-request-chat-template"},
		{"/tokenize", `"prompt": "a", "continue_final_message": true`, "add_generation_prompt", "messages only"},
	} {
		status, m := postURL(t, url+c.path, `{`+c.body+`}`)
		require.Equal(t, 400, status, c.body)
		e := m["error"].(map[string]any)
		require.Equal(t, c.param, e["param"], c.body)
		require.Contains(t, e["message"], c.msg, c.body)
	}
}

// continueFinal cuts after the final message's last appearance, keeps
// trailing white space the template kept, and refuses a template that
// rewrites the message.
func TestContinueFinal(t *testing.T) {
	msg := func(c string) model.ChatMessage { return model.ChatMessage{Role: "assistant", Content: c} }
	for _, c := range []struct{ rendered, content, want, err string }{
		{"<a>Hi</a>", "Hi", "<a>Hi", ""},
		{"<u>Hi</u><a>Hi</a>", "Hi", "<u>Hi</u><a>Hi", ""},
		{"<a>Hi  </a>", "Hi  ", "<a>Hi  ", ""},
		{"<a>Hi</a>", "Hi  ", "<a>Hi", ""},   // the template trimmed the spaces
		{"<a> Hi</a>", "  Hi", "<a> Hi", ""}, // leading space the template changed
		{"<a>HI</a>", "Hi", "", "does not appear"},
	} {
		got, e := continueFinal(c.rendered, msg(c.content))
		if c.err != "" {
			require.NotNil(t, e)
			require.Contains(t, e.Message, c.err)
			continue
		}
		require.Nil(t, e, c.rendered)
		require.Equal(t, c.want, got, c.rendered)
	}
	_, e := continueFinal("<a></a>", model.ChatMessage{Role: "assistant", NullContent: true})
	require.NotNil(t, e)
}

// A request's own chat_template, with --trust-request-chat-template,
// renders its conversation (in chat and /tokenize); one that fails is a
// 400 naming the field the failure came from.
func TestRequestChatTemplate(t *testing.T) {
	s, url := chatFieldsServer(t, true)
	own := `"chat_template": "{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}{% if add_generation_prompt %}[bot:{% endif %}"`
	done := postAsync(t, url+"/v1/chat/completions", `{"max_tokens": 5, `+own+`, "messages": [{"role": "user", "content": "hi"}]}`)
	a := takeArrival(t, s)
	require.Equal(t, "[user: hi][bot:", s.cfg.Tokenizer.Decode(a.Prompt))
	deliver(s, a, "yo")
	require.Equal(t, "yo", choicesOf(t, <-done)[0]["message"].(map[string]any)["content"])
	status, tk := postURL(t, url+"/tokenize", `{`+own+`, "messages": [{"role": "user", "content": "hi"}]}`)
	require.Equal(t, 200, status)
	require.Equal(t, float64(len("[user: hi][bot:")), tk["count"])
	for _, bad := range []string{`"chat_template": "{% for %}"`, `"chat_template": ""`} {
		status, m := postURL(t, url+"/v1/chat/completions", `{`+bad+`, "messages": [{"role": "user", "content": "hi"}]}`)
		require.Equal(t, 400, status, bad)
		require.True(t, strings.Contains(m["error"].(map[string]any)["message"].(string), "template"), bad)
	}
}

// postURL posts body to url and returns the status and the JSON answer.
func postURL(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	m := <-postAsync(t, url, body)
	return int(m["status"].(float64)), m
}
