package serve

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
)

// postAsync posts body and returns a channel of the answer's status and
// JSON.
func postAsync(t *testing.T, url, body string) chan map[string]any {
	done := make(chan map[string]any, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			done <- map[string]any{"transport": err.Error()}
			return
		}
		defer resp.Body.Close()
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m) //nolint:errcheck // checked by the caller
		if m == nil {
			m = map[string]any{}
		}
		m["status"] = float64(resp.StatusCode)
		done <- m
	}()
	return done
}

func choicesOf(t *testing.T, m map[string]any) []map[string]any {
	t.Helper()
	raw, ok := m["choices"].([]any)
	require.True(t, ok, "no choices in %v", m)
	out := make([]map[string]any, len(raw))
	for i, c := range raw {
		out[i] = c.(map[string]any)
	}
	return out
}

// n > 1 fans a request out into n engine requests with the same prompt:
// with a seed choice 0 keeps it and the others get distinct derived seeds;
// the choices come back indexed 0..n-1 whatever order they finish in, and
// the usage counts the prompt once and every choice's tokens.
func TestNChoicesCompletions(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":4,"temperature":1,"seed":3,"n":3,"best_of":3}`)
	as := takeArrivals(t, s, 3)
	seeds := map[uint64]bool{}
	for i, a := range as {
		require.Equal(t, as[0].Prompt, a.Prompt)
		require.Equal(t, float32(1), a.Sampling.Temperature)
		require.Equal(t, as[0].ID+uint64(i), a.ID, "dense ids")
		seeds[a.Sampling.Seed] = true
	}
	require.Equal(t, uint64(3), as[0].Sampling.Seed, "choice 0 keeps the request's seed")
	require.Equal(t, choiceSeed(3, 2), as[2].Sampling.Seed)
	require.Len(t, seeds, 3, "distinct seeds")
	deliver(s, as[2], "ccc")
	deliver(s, as[0], "a")
	deliver(s, as[1], "bb")
	m := <-done
	require.Equal(t, 200.0, m["status"], m)
	ch := choicesOf(t, m)
	require.Len(t, ch, 3)
	for i, want := range []string{"a", "bb", "ccc"} {
		require.Equal(t, float64(i), ch[i]["index"])
		require.Equal(t, want, ch[i]["text"])
		require.Equal(t, "length", ch[i]["finish_reason"])
	}
	u := m["usage"].(map[string]any)
	require.Equal(t, 2.0, u["prompt_tokens"])
	require.Equal(t, 6.0, u["completion_tokens"])
	require.Equal(t, 8.0, u["total_tokens"])

	// The same request again gets the same seeds; greedy choices all
	// sample alike (the same answer, as vLLM).
	done = postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":4,"temperature":1,"seed":3,"n":3}`)
	again := takeArrivals(t, s, 3)
	for i := range again {
		require.Equal(t, as[i].Sampling.Seed, again[i].Sampling.Seed)
		deliver(s, again[i], "x")
	}
	require.Len(t, choicesOf(t, <-done), 3)
	done = postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":4,"n":2}`)
	greedy := takeArrivals(t, s, 2)
	require.Equal(t, greedy[0].Sampling, greedy[1].Sampling)
	require.Zero(t, greedy[0].Sampling.Temperature)
	for _, a := range greedy {
		deliver(s, a, "g")
	}
	require.Len(t, choicesOf(t, <-done), 2)
}

// Several prompts in one completions request: choices prompt-major (index
// = prompt·n + j), each prompt's tokens counted once, echo per prompt.
func TestSeveralPrompts(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":["Hi","Yow"],"max_tokens":4,"n":2,"echo":true}`)
	as := takeArrivals(t, s, 4)
	hi, yow := s.cfg.Tokenizer.Encode("Hi", modelOpts), s.cfg.Tokenizer.Encode("Yow", modelOpts)
	for i, want := range [][]int32{hi, hi, yow, yow} {
		require.Equal(t, want, as[i].Prompt, "arrival %d", i)
	}
	for i, a := range as {
		deliver(s, a, strings.Repeat("z", i+1))
	}
	m := <-done
	ch := choicesOf(t, m)
	for i, want := range []string{"Hiz", "Hizz", "Yowzzz", "Yowzzzz"} {
		require.Equal(t, float64(i), ch[i]["index"])
		require.Equal(t, want, ch[i]["text"])
	}
	u := m["usage"].(map[string]any)
	require.Equal(t, 5.0, u["prompt_tokens"])
	require.Equal(t, 10.0, u["completion_tokens"])

	// Lists of token-id lists too; one prompt's stop string ends only its choice.
	done = postAsync(t, ts.URL+"/v1/completions", `{"prompt":[[72,105],[89]],"max_tokens":4,"stop":["!"]}`)
	as = takeArrivals(t, s, 2)
	require.Equal(t, []int32{72, 105}, as[0].Prompt)
	require.Equal(t, []int32{89}, as[1].Prompt)
	deliver(s, as[0], "ab!cd")
	deliver(s, as[1], "ef")
	ch = choicesOf(t, <-done)
	require.Equal(t, "ab", ch[0]["text"])
	require.Equal(t, "stop", ch[0]["finish_reason"])
	require.Equal(t, "ef", ch[1]["text"])
	require.Equal(t, "length", ch[1]["finish_reason"])
}

// Streaming chat with n = 2: each choice's chunks carry its index, each
// gets its role first and its own finish chunk; the usage chunk sums them.
func TestNChoicesChatStream(t *testing.T) {
	s, _, ts := fleetServer(t, func(c *Config) { c.Tokenizer = chatTokenizer(t) })
	body := make(chan string, 1)
	go func() {
		resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"n":2,"stream":true,"stream_options":{"include_usage":true}}`))
		if err != nil {
			body <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body <- string(b)
	}()
	as := takeArrivals(t, s, 2)
	deliver(s, as[1], "yo")
	deliver(s, as[0], "hey")
	text := map[int]string{}
	roles := map[int]int{}
	finishes := map[int]string{}
	var usage map[string]any
	events := strings.Split(<-body, "\n")
	require.Contains(t, events, "data: [DONE]")
	for _, line := range events {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &c), data)
		if u, ok := c["usage"].(map[string]any); ok {
			usage = u
		}
		for _, ch := range choicesOf(t, c) {
			i := int(ch["index"].(float64))
			d := ch["delta"].(map[string]any)
			if d["role"] == "assistant" {
				roles[i]++
			}
			text[i] += d["content"].(string)
			if f, ok := ch["finish_reason"].(string); ok {
				finishes[i] = f
			}
		}
	}
	require.Equal(t, map[int]string{0: "hey", 1: "yo"}, text)
	require.Equal(t, map[int]int{0: 1, 1: 1}, roles)
	require.Equal(t, map[int]string{0: "length", 1: "length"}, finishes)
	require.Equal(t, float64(len(as[0].Prompt)), usage["prompt_tokens"])
	require.Equal(t, 5.0, usage["completion_tokens"])
}

// Bad n, best_of, prompt lists and bounds are refused naming the field.
func TestNAndPromptListsRefused(t *testing.T) {
	_, _, ts := fleetServer(t)
	many := "[" + strings.Repeat(`"a",`, 64) + `"a"]`
	for _, c := range []struct{ body, param string }{
		{`{"prompt":"Hi","n":0}`, "n"},
		{`{"prompt":"Hi","n":129}`, "n"},
		{`{"prompt":"Hi","n":2,"best_of":3}`, "best_of"},
		{`{"prompt":"Hi","best_of":2}`, "best_of"},
		{`{"prompt":[]}`, "prompt"},
		{`{"prompt":["Hi",""]}`, "prompt"},
		{`{"prompt":[[1],[]]}`, "prompt"},
		{`{"prompt":[[1],[300]]}`, "prompt"},
		{`{"prompt":` + many + `,"n":2}`, "n"},  // 130 choices
		{`{"prompt":"Hi","n":9}`, "n"},          // more than --max-queue (8)
		{`{"prompt":["a","b","c"],"n":3}`, "n"}, // 9 as well
	} {
		m := <-postAsync(t, ts.URL+"/v1/completions", c.body)
		require.Equal(t, 400.0, m["status"], c.body)
		require.Equal(t, c.param, m["error"].(map[string]any)["param"], c.body)
	}
}

// chatTokenizer is the byte tokenizer with a plain chat template.
func chatTokenizer(t *testing.T) *model.Tokenizer {
	spec := byteTokenizer(t).Spec()
	spec.ChatTemplate = `{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}`
	tok, err := model.NewTokenizer(spec)
	require.NoError(t, err)
	return tok
}

// A failure of one choice ends the answer (500) and withdraws the other
// choices from the ranks; a client that goes away withdraws every choice.
func TestNChoicesFailTogether(t *testing.T) {
	s, _, ts := fleetServer(t)
	done := postAsync(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":4,"n":3}`)
	as := takeArrivals(t, s, 3)
	s.src.finished(as[1].ID)
	s.mu.Lock()
	c := s.calls[as[1].ID]
	s.mu.Unlock()
	c.mu.Lock()
	c.resp = &executor.Response{ID: as[1].ID, Rank: 1, Error: "boom", ArrivalUnixNS: as[1].ArrivalUnixNS}
	c.mu.Unlock()
	c.signal()
	m := <-done
	require.Equal(t, 500.0, m["status"], m)
	require.Contains(t, m["error"].(map[string]any)["message"], "rank 1: boom")
	require.ElementsMatch(t, []uint64{as[0].ID, as[2].ID}, withdrawn(t, s, 2))

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions",
		strings.NewReader(`{"prompt":"Hi","max_tokens":4,"n":2,"stream":true}`))
	require.NoError(t, err)
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	as = takeArrivals(t, s, 2)
	cancel()
	require.ElementsMatch(t, []uint64{as[0].ID, as[1].ID}, withdrawn(t, s, 2))
}

// withdrawn waits for n withdrawals announced to the (test's) fleet.
func withdrawn(t *testing.T, s *Server, n int) []uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var got []uint64
	for len(got) < n {
		s.src.Due(time.Now())
		got = append(got, s.src.Cancelled()...)
		require.True(t, time.Now().Before(deadline), "%d of %d withdrawals", len(got), n)
		time.Sleep(time.Millisecond)
	}
	return got
}
