package nccl

import (
	"bufio"
	"crypto/hmac"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// Every connection to the bootstrap store and to rank 0's TCP data port
// opens with the same hello, a challenge–response over the job token:
//
//	server → client  challenge: magic, flags, world size, limit, server nonce
//	client → server  hello:     magic, rank, world size, flags, client nonce,
//	                            HMAC(token, "hello", nonces, rank, size)
//	server → client  verdict:   'K' and HMAC(token, "accept", nonces, rank,
//	                            size), or 'A' (authentication) / 'R' (other)
//	                            and the reason
//
// Both MACs cover both nonces, so neither side can replay an answer it saw
// on another connection: the client proves the token to rank 0, and rank 0
// proves it back (a process that took rank 0's address cannot answer). The
// token itself never crosses the wire. Without a token (flags 0) the MAC
// fields are zero and nothing is proven: rank 0 still checks the rank and the
// world size, and the start-up warning says that any process may connect.
//
// The magic differs per service, so a hello meant for one is refused by the
// other, and the services' MACs are computed under different labels.
//
// All integers are little-endian; every message is one frame (writeFrame).

// helloProto names one service's hello.
type helloProto struct {
	magic string // 8 bytes
	what  string // for messages: "bootstrap store", "tcp transport"
}

var (
	storeHelloProto = helloProto{magic: "LSSTORE2", what: "bootstrap store"}
	tcpHelloProto   = helloProto{magic: "LSTCPTR2", what: "tcp transport"}
)

// Hello wire sizes and flags.
const (
	helloMagicLen   = 8
	challengeLen    = helloMagicLen + 1 + 4 + 4 + nonceBytes
	helloLen        = helloMagicLen + 4 + 4 + 1 + nonceBytes + macLen
	macLen          = 32
	helloFlagToken  = 1 // the sender has a job token
	maxVerdictFrame = 1 + macLen + maxReasonLen
	maxReasonLen    = 400

	verdictOK       = 'K'
	verdictAuth     = 'A' // refused: the job token (missing, unexpected, wrong)
	verdictRefused  = 'R' // refused: anything else (world size, rank)
	helloLabelHello = "hello"
	helloLabelOK    = "accept"
)

// helloServer is the server's side of one connection's hello.
type helloServer struct {
	proto helloProto
	token JobToken
	size  int    // the world size the server serves
	limit uint32 // announced to the client (the store's request frame limit)
	nonce []byte // fresh per connection
}

// helloClaim is what a client's hello states: its rank and world size, and
// its nonce (for the server's proof).
type helloClaim struct {
	rank, size int
	nonce      []byte
}

// challenge renders the server's first message.
func (s *helloServer) challenge() []byte {
	b := append([]byte(s.proto.magic), s.flags())
	b = binary.LittleEndian.AppendUint32(b, uint32(s.size))
	b = binary.LittleEndian.AppendUint32(b, s.limit)
	return append(b, s.nonce...)
}

func (s *helloServer) flags() byte {
	if s.token.IsSet() {
		return helloFlagToken
	}
	return 0
}

// authError is a refusal about the job token (verdict 'A', wraps ErrAuth).
type authError struct{ msg string }

func (e *authError) Error() string { return e.msg }
func (e *authError) Unwrap() error { return ErrAuth }

// check parses and verifies a client's hello. It returns the claim, proven
// when the server has a token, or why the client is refused. The rank range
// is [1, size): rank 0 is the server's own process. It does not know which
// ranks are already connected; the caller checks that.
func (s *helloServer) check(frame []byte) (helloClaim, error) {
	if len(frame) != helloLen || string(frame[:helloMagicLen]) != s.proto.magic {
		return helloClaim{}, fmt.Errorf("not a lockstep %s hello (%d bytes)", s.proto.what, len(frame))
	}
	b := frame[helloMagicLen:]
	rank, size := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
	flags, nonce, mac := b[8], b[9:9+nonceBytes], b[9+nonceBytes:]
	c := helloClaim{rank: int(rank), size: int(size), nonce: nonce}
	hasToken := flags&helloFlagToken != 0
	switch {
	case flags&^helloFlagToken != 0:
		return helloClaim{}, fmt.Errorf("unknown hello flags %#x", flags)
	case s.token.IsSet() && !hasToken:
		return helloClaim{}, &authError{fmt.Sprintf("the peer (claiming rank %d) has no job token and rank 0 requires one: set the same %s on every rank", rank, JobTokenEnv)}
	case !s.token.IsSet() && hasToken:
		return helloClaim{}, &authError{fmt.Sprintf("the peer (claiming rank %d) has a job token and rank 0 has none: set the same %s on every rank, or on none", rank, JobTokenEnv)}
	case s.token.IsSet() && !hmac.Equal(mac, s.mac(helloLabelHello, c)):
		return helloClaim{}, &authError{fmt.Sprintf("the peer (claiming rank %d) does not prove the job token: %s differs from rank 0's, or the peer is not part of this job", rank, JobTokenEnv)}
	case size != uint32(s.size):
		return helloClaim{}, fmt.Errorf("rank %d believes the world has %d ranks, rank 0 believes %d (check WORLD_SIZE)", rank, size, s.size)
	case rank == 0 || rank >= uint32(s.size):
		return helloClaim{}, fmt.Errorf("a peer claimed rank %d, outside [1, %d) (rank 0 is this process; check RANK)", rank, s.size)
	}
	return c, nil
}

// mac is the MAC of one direction of the hello of claim c.
func (s *helloServer) mac(label string, c helloClaim) []byte {
	return s.token.mac(s.proto.magic+" "+label, s.nonce, c.nonce,
		binary.LittleEndian.AppendUint32(nil, uint32(c.rank)), binary.LittleEndian.AppendUint32(nil, uint32(c.size)))
}

// accept renders the verdict that admits claim c, with the server's proof.
func (s *helloServer) accept(c helloClaim) []byte {
	proof := make([]byte, macLen)
	if s.token.IsSet() {
		proof = s.mac(helloLabelOK, c)
	}
	return append([]byte{verdictOK}, proof...)
}

// rejectVerdict renders the verdict that refuses a client for err (its
// message is truncated to maxReasonLen bytes).
func rejectVerdict(err error) []byte {
	code := byte(verdictRefused)
	if errors.Is(err, ErrAuth) {
		code = verdictAuth
	}
	msg := err.Error()
	if len(msg) > maxReasonLen {
		msg = msg[:maxReasonLen]
	}
	return append([]byte{code}, msg...)
}

// serveHello runs the server's side up to the claim: it sends the challenge
// and reads and checks the client's hello; a refused client gets its verdict
// here. The caller has set the connection's deadline, and writes the
// accepting verdict (accept) once it has admitted the claim.
func (s *helloServer) serveHello(conn net.Conn, r *bufio.Reader) (helloClaim, error) {
	if err := writeFrame(conn, s.challenge()); err != nil {
		return helloClaim{}, fmt.Errorf("sending the challenge: %w", err)
	}
	frame, err := readFrame(r, helloLen)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return helloClaim{}, fmt.Errorf("closed before completing the hello (%w)", err)
		}
		return helloClaim{}, fmt.Errorf("reading the hello: %w", err)
	}
	c, err := s.check(frame)
	if err != nil {
		writeFrame(conn, rejectVerdict(err)) // best effort: the peer may be gone
		return helloClaim{}, err
	}
	return c, nil
}

// helloClient is the client's side of one connection's hello.
type helloClient struct {
	proto      helloProto
	token      JobToken
	rank, size int
}

// challengeMsg is a parsed challenge.
type challengeMsg struct {
	hasToken bool
	size     int
	limit    uint32
	nonce    []byte
}

// parseChallenge parses the server's first message.
func (c *helloClient) parseChallenge(frame []byte) (challengeMsg, error) {
	if len(frame) != challengeLen || string(frame[:helloMagicLen]) != c.proto.magic {
		return challengeMsg{}, fmt.Errorf("the server is not a lockstep %s (its first message has %d bytes)", c.proto.what, len(frame))
	}
	b := frame[helloMagicLen:]
	if b[0]&^helloFlagToken != 0 {
		return challengeMsg{}, fmt.Errorf("unknown challenge flags %#x", b[0])
	}
	return challengeMsg{hasToken: b[0]&helloFlagToken != 0, size: int(binary.LittleEndian.Uint32(b[1:])),
		limit: binary.LittleEndian.Uint32(b[5:]), nonce: b[9:]}, nil
}

// hello renders the client's answer to ch with nonce. It returns, as mismatch,
// a disagreement the client can already see (token presence, world size):
// the caller still sends the hello, so that rank 0 logs the mismatch too,
// and then fails with mismatch rather than waiting for a verdict.
func (c *helloClient) hello(ch challengeMsg, nonce []byte) (frame []byte, mismatch error) {
	switch {
	case ch.hasToken && !c.token.IsSet():
		mismatch = &authError{fmt.Sprintf("rank 0's %s requires a job token and %s is not set on rank %d: set the same %s on every rank",
			c.proto.what, JobTokenEnv, c.rank, JobTokenEnv)}
	case !ch.hasToken && c.token.IsSet():
		// Never proceed: a server without the token cannot prove it is rank 0.
		mismatch = &authError{fmt.Sprintf("%s is set on rank %d but rank 0's %s runs without a job token: set the same %s on every rank, or on none",
			JobTokenEnv, c.rank, c.proto.what, JobTokenEnv)}
	case ch.size != c.size:
		mismatch = fmt.Errorf("rank 0 believes the world has %d ranks, rank %d believes %d (check WORLD_SIZE)", ch.size, c.rank, c.size)
	}
	var flags byte
	if c.token.IsSet() {
		flags = helloFlagToken
	}
	b := []byte(c.proto.magic)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(c.size))
	b = append(append(b, flags), nonce...)
	mac := make([]byte, macLen)
	if c.token.IsSet() && ch.hasToken {
		mac = c.serverView(ch).mac(helloLabelHello, helloClaim{rank: c.rank, size: c.size, nonce: nonce})
	}
	return append(b, mac...), mismatch
}

// serverView is the helloServer that sent ch, as far as the MACs go.
func (c *helloClient) serverView(ch challengeMsg) *helloServer {
	return &helloServer{proto: c.proto, token: c.token, size: c.size, nonce: ch.nonce}
}

// checkVerdict parses rank 0's verdict on the hello sent with nonce: nil when
// admitted and, with a token, proven to come from a holder of the token.
func (c *helloClient) checkVerdict(ch challengeMsg, nonce, frame []byte) error {
	if len(frame) == 0 {
		return errors.New("empty verdict")
	}
	switch frame[0] {
	case verdictOK:
		if len(frame) != 1+macLen {
			return fmt.Errorf("malformed verdict (%d bytes)", len(frame))
		}
		if c.token.IsSet() {
			want := c.serverView(ch).mac(helloLabelOK, helloClaim{rank: c.rank, size: c.size, nonce: nonce})
			if !hmac.Equal(frame[1:], want) {
				return &authError{fmt.Sprintf("rank 0's answer does not prove the job token: %s differs between the ranks, or another process answered at rank 0's address", JobTokenEnv)}
			}
		}
		return nil
	case verdictAuth:
		return &authError{fmt.Sprintf("rank 0's %s refused rank %d: %s", c.proto.what, c.rank, printable(frame[1:]))}
	case verdictRefused:
		return fmt.Errorf("rank 0's %s refused rank %d: %s", c.proto.what, c.rank, printable(frame[1:]))
	}
	return fmt.Errorf("unknown verdict %q", frame[0])
}

// printable quotes what a peer sent where it is not plain text, so that a
// reason cannot forge log lines.
func printable(b []byte) string {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return fmt.Sprintf("%q", b)
		}
	}
	return string(b)
}

// runHello runs the client's side on conn (whose deadline the caller set):
// read the challenge, send the hello, read the verdict. It returns the
// challenge (the store reads its request limit from it).
func (c *helloClient) runHello(conn net.Conn, r *bufio.Reader) (challengeMsg, error) {
	frame, err := readFrame(r, challengeLen)
	if err != nil {
		return challengeMsg{}, fmt.Errorf("reading rank 0's challenge: %w", err)
	}
	ch, err := c.parseChallenge(frame)
	if err != nil {
		return challengeMsg{}, err
	}
	nonce := newNonce()
	hello, mismatch := c.hello(ch, nonce)
	if err := writeFrame(conn, hello); err != nil && mismatch == nil {
		return challengeMsg{}, fmt.Errorf("sending the hello: %w", err)
	}
	if mismatch != nil {
		return challengeMsg{}, mismatch
	}
	verdict, err := readFrame(r, maxVerdictFrame)
	if err != nil {
		return challengeMsg{}, fmt.Errorf("waiting for rank 0's verdict: %w", err)
	}
	if err := c.checkVerdict(ch, nonce, verdict); err != nil {
		return challengeMsg{}, err
	}
	return ch, nil
}
