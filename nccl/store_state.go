package nccl

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// storeState is the bootstrap store's data and the rules that guard it,
// apart from the network: the server feeds it the requests of authenticated
// connections, and the fuzz target feeds it arbitrary ones.
//
// Ownership rule. Every connection acts for one rank: rank 0 is the server's
// own process (StoreServer.LocalClient, never a TCP connection), the others
// are the ranks proven by the hello. A key's owner is written in the key:
//
//   - a key whose last path segment is a rank in canonical decimal
//     ("lockstep/watchdog/3") is that rank's status key: only that rank may
//     write it, as often as it likes (the watchdog's board posts every
//     collective it enters there);
//   - every other key ("lockstep/tcp/addr") is a rendezvous key: only rank 0
//     may write it, and only once.
//
// So no connection can redirect the TCP rendezvous or overwrite another
// rank's status, and a rendezvous key, once read, cannot change under a
// rank that reads it later. Any connection may read any key.
//
// Caps. StoreLimits bounds the number of keys, each key and value, and the
// total bytes held; a Get whose answer would exceed the response limit is
// refused. A request that breaks a rule or a cap gets the status
// storeRefused and a message naming the key; nothing is stored.
type storeState struct {
	limits StoreLimits
	size   int // the world size: ranks [0, size)

	mu      sync.Mutex
	data    map[string][]byte
	bytes   int           // Σ len(key) + len(value) over data
	changed chan struct{} // closed and replaced on every Set: wakes waiters
	quit    chan struct{} // closed when the server closes: fails waiters
}

func newStoreState(size int, limits StoreLimits) *storeState {
	return &storeState{limits: limits, size: size, data: map[string][]byte{},
		changed: make(chan struct{}), quit: make(chan struct{})}
}

// Store operations and response statuses.
const (
	storeOpSet  = 'S' // key, value → ok | refused
	storeOpGet  = 'G' // keys... → ok, then (found "0"/"1", value) per key
	storeOpWait = 'W' // timeout ms (decimal), keys... → ok | timeout

	storeOK      = 'K'
	storeTimeout = 'T'
	storeBad     = 'E' // malformed request; the message follows
	storeRefused = 'R' // a rule or a cap refused the request; the message follows

	// maxStoreWait bounds the timeout of one Wait request.
	maxStoreWait = 24 * time.Hour
)

// keyOwner applies the ownership rule: the rank that owns key, and whether
// key is a status key (rewritable by its owner) rather than a rendezvous key
// (rank 0's, written once).
func keyOwner(key string) (owner int, status bool) {
	if r, ok := parseRank(key[strings.LastIndexByte(key, '/')+1:]); ok {
		return r, true
	}
	return 0, false
}

// parseRank parses a rank in canonical decimal (no sign, no leading zero, at
// most 9 digits, so that it fits an int everywhere).
func parseRank(s string) (int, bool) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = 10*n + int(c-'0')
	}
	return n, true
}

// handle executes one request frame of a connection acting for rank id and
// returns the response frame.
func (s *storeState) handle(id int, req []byte) []byte {
	if len(req) == 0 {
		return storeStatus(storeBad, "empty request")
	}
	args, err := splitStrings(req[1:])
	if err != nil {
		return storeStatus(storeBad, err.Error())
	}
	switch req[0] {
	case storeOpSet:
		if len(args) != 2 {
			return storeStatus(storeBad, "set wants a key and a value")
		}
		return s.set(id, args[0], args[1])
	case storeOpGet:
		return s.get(args)
	case storeOpWait:
		if len(args) < 1 {
			return storeStatus(storeBad, "wait wants a timeout")
		}
		ms, err := strconv.ParseInt(string(args[0]), 10, 64)
		if err != nil || ms < 0 || ms > maxStoreWait.Milliseconds() {
			arg := args[0][:min(len(args[0]), 32)] // a message bounded whatever was sent
			return storeStatus(storeBad, fmt.Sprintf("bad wait timeout %q (milliseconds in [0, %d])", arg, maxStoreWait.Milliseconds()))
		}
		if s.wait(args[1:], time.Duration(ms)*time.Millisecond) {
			return []byte{storeOK}
		}
		return []byte{storeTimeout}
	}
	return storeStatus(storeBad, fmt.Sprintf("unknown op %q", req[0]))
}

// set applies the ownership rule and the caps, then stores value under key.
func (s *storeState) set(id int, key, value []byte) []byte {
	l := s.limits
	owner, status := keyOwner(string(key))
	refuse := func(format string, args ...any) []byte {
		return storeStatus(storeRefused, fmt.Sprintf(format, args...))
	}
	switch {
	case len(key) == 0:
		return refuse("empty key")
	case len(key) > l.MaxKeyBytes:
		return refuse("key of %d bytes exceeds the store's %d-byte limit", len(key), l.MaxKeyBytes)
	case len(value) > l.MaxValueBytes:
		return refuse("value of %d bytes for key %q exceeds the store's %d-byte limit", len(value), key, l.MaxValueBytes)
	case owner >= s.size:
		return refuse("key %q names rank %d, outside the world of %d ranks", key, owner, s.size)
	case owner != id && status:
		return refuse("key %q is rank %d's status key; rank %d may not write it", key, owner, id)
	case owner != id:
		return refuse("key %q is a rendezvous key, which only rank 0 writes; rank %d may not write it", key, id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, exists := s.data[string(key)]
	total := s.bytes + len(key) + len(value)
	if exists {
		total -= len(key) + len(old)
	}
	switch {
	case exists && !status:
		return refuse("rendezvous key %q is already set; rendezvous keys are written once", key)
	case !exists && len(s.data) >= l.MaxKeys:
		return refuse("the store already holds its limit of %d keys; key %q is not stored", l.MaxKeys, key)
	case total > l.MaxTotalBytes:
		return refuse("storing key %q would bring the store to %d bytes, over its %d-byte limit", key, total, l.MaxTotalBytes)
	}
	// A copy: value aliases the request frame, which must not stay pinned.
	s.data[string(key)] = append(make([]byte, 0, len(value)), value...)
	s.bytes = total
	close(s.changed)
	s.changed = make(chan struct{})
	return []byte{storeOK}
}

// get answers a Get, unless the answer would exceed the response limit.
func (s *storeState) get(keys [][]byte) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 1
	for _, k := range keys {
		n += 4 + 1 + 4 + len(s.data[string(k)])
	}
	if limit := s.limits.responseFrame(); n > limit {
		return storeStatus(storeRefused, fmt.Sprintf("get of %d keys would answer %d bytes, over the store's %d-byte limit: ask for fewer keys at a time", len(keys), n, limit))
	}
	resp := make([]byte, 1, n)
	resp[0] = storeOK
	for _, k := range keys {
		v, ok := s.data[string(k)]
		found := []byte("0")
		if ok {
			found = []byte("1")
		}
		resp = appendStrings(resp, found, v)
	}
	return resp
}

// wait blocks until every key is set (true), the timeout passes or the
// server closes (false).
func (s *storeState) wait(keys [][]byte, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		missing := false
		for _, k := range keys {
			if _, ok := s.data[string(k)]; !ok {
				missing = true
				break
			}
		}
		changed := s.changed
		s.mu.Unlock()
		if !missing {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-s.quit:
			return false
		}
	}
}

// usage returns the number of keys and bytes held (tests and fuzzing).
func (s *storeState) usage() (keys, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.data), s.bytes
}

// storeStatus renders a response with a status and a message.
func storeStatus(status byte, msg string) []byte {
	return appendStrings([]byte{status}, []byte(msg))
}
