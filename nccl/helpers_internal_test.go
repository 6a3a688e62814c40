package nccl

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The internal tests play the attacker: they speak the wire protocols by
// hand. These are their helpers.

// checkNoLeaks checks, after every cleanup of the test, that no goroutine
// outlives it (the internal twin of noLeaks).
func checkNoLeaks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// logLines is a zap core that hands every entry (message and fields) to a
// channel, so that a test can wait for a line instead of sleeping.
type logLines struct {
	ch     chan string
	fields []zapcore.Field
}

// newLogLines returns a logger and the channel of its lines (buffered; a
// test reads what it waits for).
func newLogLines() (*zap.Logger, chan string) {
	ch := make(chan string, 1024)
	return zap.New(&logLines{ch: ch}), ch
}

func (l *logLines) Enabled(zapcore.Level) bool { return true }
func (l *logLines) With(f []zapcore.Field) zapcore.Core {
	return &logLines{ch: l.ch, fields: append(append([]zapcore.Field(nil), l.fields...), f...)}
}
func (l *logLines) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return ce.AddCore(e, l)
}
func (l *logLines) Sync() error { return nil }
func (l *logLines) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(append([]zapcore.Field(nil), l.fields...), fields...) {
		f.AddTo(enc)
	}
	select {
	case l.ch <- fmt.Sprintf("%s %s %v", e.Level, e.Message, enc.Fields):
	default: // a test that floods the log does not read every line
	}
	return nil
}

// nextLine waits for the next log line.
func nextLine(t *testing.T, ch chan string) string {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(5 * time.Second):
		t.Fatal("no log line within 5s")
		return ""
	}
}

// rawConn is an attacker's connection with a buffered reader.
type rawConn struct {
	net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{Conn: c, r: bufio.NewReader(c)}
}

// challenge reads the server's challenge.
func (c *rawConn) challenge(t *testing.T, proto helloProto) challengeMsg {
	t.Helper()
	frame, err := readFrame(c.r, challengeLen)
	require.NoError(t, err)
	hc := helloClient{proto: proto}
	ch, err := hc.parseChallenge(frame)
	require.NoError(t, err)
	return ch
}

// verdict reads a verdict frame and returns its code and the rest.
func (c *rawConn) verdict(t *testing.T) (byte, string) {
	t.Helper()
	frame, err := readFrame(c.r, maxVerdictFrame)
	require.NoError(t, err)
	require.NotEmpty(t, frame)
	return frame[0], string(frame[1:])
}

// waitClosed reads until the server closes the connection; it fails the
// test when the server keeps it open past the deadline.
func (c *rawConn) waitClosed(t *testing.T, within time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c.r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %v", within)
	}
}

// helloAs runs a client's hello on a raw connection the way a real rank
// does (with whatever token the attacker has), and returns the error.
func (c *rawConn) helloAs(proto helloProto, token JobToken, rank, size int) error {
	hc := helloClient{proto: proto, token: token, rank: rank, size: size}
	_, err := hc.runHello(c.Conn, c.r)
	return err
}

// forgedHello renders a hello that claims a token it does not have: the
// right format and flags, a MAC of random bytes.
func forgedHello(proto helloProto, rank, size int) []byte {
	b := []byte(proto.magic)
	b = binary.LittleEndian.AppendUint32(b, uint32(rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(size))
	b = append(b, helloFlagToken)
	b = append(b, newNonce()...)
	return append(b, newNonce()...)
}

// request sends one store request frame and returns the response frame.
func (c *rawConn) request(t *testing.T, op byte, args ...[]byte) []byte {
	t.Helper()
	require.NoError(t, writeFrame(c.Conn, appendStrings([]byte{op}, args...)))
	resp, err := readFrame(c.r, maxStoreResponse)
	require.NoError(t, err)
	require.NotEmpty(t, resp)
	return resp
}

// responseMessage is the message of a refused store response.
func responseMessage(t *testing.T, resp []byte) string {
	t.Helper()
	strs, err := splitStrings(resp[1:])
	require.NoError(t, err)
	require.Len(t, strs, 1)
	return string(strs[0])
}
