package nccl

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"go.uber.org/zap"
)

// JobTokenEnv is the environment variable that holds the job token
// (DetectLaunch reads it into Launch.JobToken).
const JobTokenEnv = "LOCKSTEP_JOB_TOKEN"

// minJobTokenBytes is the shortest token that does not draw a warning: a
// peer that sees one challenge–response can test guesses offline, so the
// token should be a random secret, not a word.
const minJobTokenBytes = 16

// ErrAuth is wrapped by every failure to authenticate a peer (a missing,
// unexpected or different job token, or an answer that does not prove it).
var ErrAuth = errors.New("peer authentication failed")

// JobToken is the secret that every process of one job shares
// (LOCKSTEP_JOB_TOKEN). The bootstrap store and the TCP transport admit a
// peer only after it proves, by an HMAC-SHA256 over a fresh nonce of the
// server's, that it knows the token; the peer checks rank 0's answer the same
// way. The token never leaves the process: it is never sent, and every
// rendering of a JobToken (String, GoString, Format, MarshalText) says only
// whether it is set, so that logging a Launch cannot leak it.
//
// The zero JobToken is "no token": peers are not authenticated.
type JobToken struct {
	secret []byte
}

// NewJobToken returns the token s (surrounding white space removed, as a
// value pasted into an environment file often has a trailing newline); ""
// gives the zero token.
func NewJobToken(s string) JobToken {
	s = strings.TrimSpace(s)
	if s == "" {
		return JobToken{}
	}
	return JobToken{secret: []byte(s)}
}

// newSessionToken returns a random token (for a job whose launcher carries it
// to every rank, see openMPI).
func newSessionToken() JobToken {
	return JobToken{secret: newNonce()}
}

// IsSet reports whether the token is set.
func (t JobToken) IsSet() bool { return len(t.secret) > 0 }

// String says whether the token is set, never what it is.
func (t JobToken) String() string {
	if t.IsSet() {
		return "[job token set]"
	}
	return "[no job token]"
}

// GoString is String: %#v must not print the secret either.
func (t JobToken) GoString() string { return t.String() }

// Format renders String for every verb (without it, %d or %x of a struct
// holding a JobToken would print the secret's bytes).
func (t JobToken) Format(f fmt.State, _ rune) { io.WriteString(f, t.String()) }

// MarshalText renders String (JSON, zap.Any).
func (t JobToken) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Warning returns what a user should know about the token's strength ("" when
// nothing).
func (t JobToken) Warning() string {
	if t.IsSet() && len(t.secret) < minJobTokenBytes {
		return fmt.Sprintf("%s is %d bytes long; use a random secret of at least %d bytes (e.g. `openssl rand -hex 32`)",
			JobTokenEnv, len(t.secret), minJobTokenBytes)
	}
	return ""
}

// mac is HMAC-SHA256 under the token of label and fields, each field
// length-prefixed so that no two different field lists give the same input.
func (t JobToken) mac(label string, fields ...[]byte) []byte {
	h := hmac.New(sha256.New, t.secret)
	h.Write([]byte(label))
	h.Write([]byte{0})
	for _, f := range fields {
		h.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(f))))
		h.Write(f)
	}
	return h.Sum(nil)
}

// nonceBytes is the length of a challenge nonce (and of a session token).
const nonceBytes = 32

// newNonce returns fresh random bytes. crypto/rand does not fail on the
// platforms Go supports (it crashes the program rather than return weak
// bytes), so there is no error to handle.
func newNonce() []byte {
	b := make([]byte, nonceBytes)
	rand.Read(b)
	return b
}

// noTokenWarning is the start-up warning of a job whose store and TCP data
// port accept any process.
func noTokenWarning(storeAddr string) string {
	return fmt.Sprintf("%s is not set: rank 0's bootstrap store (%s) and TCP data port accept any process that can "+
		"connect to them, which can then impersonate a rank or disturb the rendezvous; set %s to the same "+
		"random secret on every rank (e.g. `export %s=$(openssl rand -hex 32)` before launching)",
		JobTokenEnv, storeAddr, JobTokenEnv, JobTokenEnv)
}

// rejectLog records the connections a listener turned away (a failed hello,
// a wrong token, a frame that never completed). Each is logged, up to a limit
// so that a flood of connections cannot flood the log, and the first few
// reasons are kept for the error a failed rendezvous reports: a rank whose
// token differs is then named in rank 0's timeout error, not only in a log.
type rejectLog struct {
	log  *zap.Logger
	what string // "bootstrap store", "tcp transport"

	mu     sync.Mutex
	count  int
	first  []string
	logged int
}

// Bounds of a rejectLog: reasons kept for the error, lines logged.
const (
	rejectKeep = 4
	rejectLogs = 32
)

func newRejectLog(log *zap.Logger, what string) *rejectLog {
	if log == nil {
		log = zap.NewNop()
	}
	return &rejectLog{log: log, what: what}
}

// add records that the connection from remote was rejected for reason.
func (r *rejectLog) add(remote string, reason error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.count++
	if len(r.first) < rejectKeep {
		r.first = append(r.first, fmt.Sprintf("%s: %v", remote, reason))
	}
	switch {
	case r.logged < rejectLogs:
		r.log.Warn(r.what+": closed a connection that failed the hello",
			zap.String("remote", remote), zap.Error(reason))
	case r.logged == rejectLogs:
		r.log.Warn(r.what + ": more connections failed the hello; they are counted, no longer logged")
	}
	r.logged++
}

// summary describes the rejections for an error message ("" when none).
func (r *rejectLog) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.count == 0 {
		return ""
	}
	s := fmt.Sprintf("%s rejected %d connection(s): %s", r.what, r.count, strings.Join(r.first, "; "))
	if r.count > len(r.first) {
		s += "; ..."
	}
	return s
}
