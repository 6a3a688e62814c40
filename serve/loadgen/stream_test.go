package loadgen

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAccumulatorReadsStreams: text and chat streams of lockstep and of
// other servers (reasoning content, no [DONE], an error mid-stream).
func TestAccumulatorReadsStreams(t *testing.T) {
	stream := func(body string) (*accumulator, error) {
		a := &accumulator{sent: time.Now()}
		return a, a.readStream(strings.NewReader(body))
	}
	a, err := stream("data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"token_ids\":[1]}]}\n\n" +
		": comment\n\ndata: {\"choices\":[{\"index\":0,\"text\":\"b\",\"token_ids\":[2],\"finish_reason\":\"length\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}}\n\ndata: [DONE]\n\n")
	require.NoError(t, err)
	var res Result
	a.finish(&res)
	require.Equal(t, "ab", res.text)
	require.Equal(t, []int32{1, 2}, res.ids)
	require.True(t, res.idsKnown && res.hasTTFT)
	require.Equal(t, 2, res.outputTokens)
	require.Equal(t, 4, res.promptTokens)
	require.Equal(t, "length", res.finishReason)

	a, err = stream("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"reasoning_content\":\"think \"}}]}\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"yes\"},\"finish_reason\":\"stop\"}]}\n")
	require.NoError(t, err, "a final chunk without [DONE] ends the stream")
	a.finish(&res)
	require.Equal(t, "think yes", res.text)
	require.False(t, res.idsKnown, "text without token ids")
	require.Equal(t, 2, res.outputTokens, "no usage: content chunks")

	_, err = stream("data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\ndata: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n")
	require.EqualError(t, err, "server error: overloaded (server_error)")
	_, err = stream("data: {\"object\":\"error\",\"message\":\"bad\"}\n")
	require.EqualError(t, err, "server error: bad")
	_, err = stream("data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n")
	require.EqualError(t, err, "the stream ended before [DONE]")
	_, err = stream("data: {not json\n")
	require.ErrorContains(t, err, "bad stream chunk")
}

func TestHTTPErrorNamesTheServersMessage(t *testing.T) {
	require.Equal(t, "HTTP 429: queue full (rate_limit)", httpError(429, []byte(`{"error":{"message":"queue full","type":"rate_limit"}}`)))
	require.Equal(t, "HTTP 400: bad", httpError(400, []byte(`{"detail":"bad"}`)))
	require.Equal(t, "HTTP 503 Service Unavailable", httpError(503, nil))
	require.Equal(t, "HTTP 500: oops", httpError(500, []byte("oops\n")))
}

// A server that sends an endless SSE line or body fails the request at a
// bound; the load generator's memory does not follow it (issue 23, defect 14).
func TestAccumulatorBoundsWhatItReads(t *testing.T) {
	var reads int64
	endless := readerFunc(func(p []byte) (int, error) {
		for i := range p {
			p[i] = 'x'
		}
		reads += int64(len(p))
		return len(p), nil
	})
	a := &accumulator{sent: time.Now()}
	err := a.readStream(io.MultiReader(strings.NewReader("data: "), endless))
	require.ErrorContains(t, err, "a stream line longer than")
	require.Less(t, reads, int64(maxStreamLine+(1<<20)))
	reads = 0
	defer func(was int) { maxBody = was }(maxBody)
	maxBody = 1 << 20
	err = a.readJSON(endless)
	require.ErrorContains(t, err, "longer than")
	require.LessOrEqual(t, reads, int64(maxBody+(1<<20)))
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
