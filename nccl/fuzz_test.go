package nccl

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// Fuzz targets for what a peer sends before it is trusted or that a rank
// parses from its peers: the bootstrap store's request frames, the hello of
// the store and the TCP transport, and the checked protocol's collective
// headers. `make fuzz` runs each for a bounded time; crashers found are kept
// under testdata/fuzz/<target> and replayed by every `go test`.

// fuzzStoreLimits are small, so that the fuzzer reaches every cap.
var fuzzStoreLimits = StoreLimits{MaxKeys: 16, MaxKeyBytes: 32, MaxValueBytes: 64, MaxTotalBytes: 512}.withDefaults(4)

const fuzzStoreWorld = 4

// storeRecord renders one record of FuzzStoreFrames's input: the rank the
// connection acts for, the frame's length (u16) and the frame.
func storeRecord(id byte, op byte, args ...[]byte) []byte {
	frame := appendStrings([]byte{op}, args...)
	b := binary.LittleEndian.AppendUint16([]byte{id}, uint16(len(frame)))
	return append(b, frame...)
}

// FuzzStoreFrames feeds a sequence of request frames, each from one of the
// world's ranks, to the store's request handler, and checks it against a
// naive model: no panic; every response has a known status and stays within
// the response limit; the store never holds more than its caps; a Set
// succeeds only for the key's owner and never rewrites a rendezvous key; Get
// answers what the model holds; Wait (the store closed, so it never blocks)
// succeeds exactly when every key is held. The raw input is also read as a
// stream of frames, which must never yield one over the limit.
func FuzzStoreFrames(f *testing.F) {
	cat := func(records ...[]byte) []byte { return bytes.Join(records, nil) }
	f.Add(cat(
		storeRecord(0, storeOpSet, []byte("lockstep/tcp/addr"), []byte("127.0.0.1:1")),
		storeRecord(1, storeOpSet, []byte("lockstep/tcp/addr"), []byte("127.0.0.1:2")),
		storeRecord(1, storeOpSet, []byte("lockstep/watchdog/1"), []byte("3 4 false allgather x")),
		storeRecord(1, storeOpSet, []byte("lockstep/watchdog/1"), []byte("4 4 true allgather x")),
		storeRecord(2, storeOpSet, []byte("lockstep/watchdog/1"), nil),
		storeRecord(3, storeOpGet, []byte("lockstep/tcp/addr"), []byte("lockstep/watchdog/1"), []byte("nope")),
		storeRecord(2, storeOpWait, []byte("0"), []byte("lockstep/tcp/addr")),
		storeRecord(2, storeOpWait, []byte("10"), []byte("never")),
	))
	f.Add(cat(
		storeRecord(0, storeOpSet, []byte("a"), bytes.Repeat([]byte("v"), 64)),
		storeRecord(0, storeOpSet, []byte("b"), bytes.Repeat([]byte("v"), 65)),
		storeRecord(0, storeOpSet, bytes.Repeat([]byte("k"), 33), nil),
		storeRecord(1, storeOpGet, []byte("a"), []byte("a"), []byte("a"), []byte("a"), []byte("a"), []byte("a"), []byte("a"), []byte("a"), []byte("a"), []byte("a")),
		storeRecord(1, storeOpSet, []byte("x/9"), nil),
		storeRecord(1, storeOpSet, []byte("x/01"), nil),
		storeRecord(1, 'Z'),
		storeRecord(1, storeOpWait, []byte("-1")),
	))
	f.Add([]byte{0, 3, 0, 'S', 1, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		limits := fuzzStoreLimits
		if fr, err := readFrame(bytes.NewReader(data), 64); err == nil && len(fr) > 64 {
			t.Fatalf("readFrame returned %d bytes over a 64-byte limit", len(fr))
		}
		st := newStoreState(fuzzStoreWorld, limits)
		close(st.quit) // Wait answers at once
		model := map[string][]byte{}
		for n := 0; len(data) >= 3 && n < 64; n++ {
			id := int(data[0]) % fuzzStoreWorld
			size := int(binary.LittleEndian.Uint16(data[1:]))
			data = data[3:]
			if size > len(data) {
				size = len(data)
			}
			frame := data[:size]
			data = data[size:]
			resp := st.handle(id, frame)
			checkStoreResponse(t, st, id, frame, resp, model)
		}
	})
}

// checkStoreResponse checks one response against the model and updates it.
func checkStoreResponse(t *testing.T, st *storeState, id int, frame, resp []byte, model map[string][]byte) {
	l := st.limits
	if len(resp) == 0 || len(resp) > l.responseFrame() {
		t.Fatalf("response of %d bytes (limit %d)", len(resp), l.responseFrame())
	}
	switch resp[0] {
	case storeOK, storeTimeout, storeBad, storeRefused:
	default:
		t.Fatalf("unknown status %q", resp[0])
	}
	keys, held := st.usage()
	if keys > l.MaxKeys || held > l.MaxTotalBytes {
		t.Fatalf("the store holds %d keys and %d bytes, over its caps", keys, held)
	}
	if len(frame) == 0 {
		return
	}
	args, err := splitStrings(frame[1:])
	if err != nil {
		if resp[0] != storeBad {
			t.Fatalf("malformed frame answered %q", resp[0])
		}
		return
	}
	switch frame[0] {
	case storeOpSet:
		if len(args) != 2 || resp[0] != storeOK {
			return
		}
		key := string(args[0])
		owner, status := keyOwner(key)
		if owner != id || key == "" {
			t.Fatalf("rank %d wrote key %q, owned by rank %d", id, key, owner)
		}
		if _, ok := model[key]; ok && !status {
			t.Fatalf("rendezvous key %q written twice", key)
		}
		model[key] = append([]byte{}, args[1]...)
	case storeOpGet:
		if resp[0] != storeOK {
			return
		}
		got, err := splitStrings(resp[1:])
		if err != nil || len(got) != 2*len(args) {
			t.Fatalf("get of %d keys answered %d strings (%v)", len(args), len(got), err)
		}
		for i, k := range args {
			want, ok := model[string(k)]
			if (string(got[2*i]) == "1") != ok || !bytes.Equal(got[2*i+1], want) {
				t.Fatalf("get %q = %q %q, the model holds %q (%v)", k, got[2*i], got[2*i+1], want, ok)
			}
		}
	case storeOpWait:
		if resp[0] != storeOK && resp[0] != storeTimeout {
			return
		}
		all := true
		for _, k := range args[1:] {
			_, ok := model[string(k)]
			all = all && ok
		}
		if all != (resp[0] == storeOK) {
			t.Fatalf("wait answered %q, every key held: %v", resp[0], all)
		}
	}
}

// Fixed inputs of FuzzTransportHello: the fuzzer plays the peer of a server
// and of a client whose nonces are these.
var (
	fuzzServerNonce = bytes.Repeat([]byte{0x5a}, nonceBytes)
	fuzzClientNonce = bytes.Repeat([]byte{0xa5}, nonceBytes)
	fuzzToken       = NewJobToken("fuzzing token: 0123456789abcdef")
)

// fuzzHelloSides returns the server and client of a world of 4 for the mode
// byte: bit 0 the service (store or TCP), bit 1 the server's token, bit 2
// the client's token.
func fuzzHelloSides(mode byte) (*helloServer, *helloClient) {
	proto := storeHelloProto
	if mode&1 != 0 {
		proto = tcpHelloProto
	}
	var st, ct JobToken
	if mode&2 != 0 {
		st = fuzzToken
	}
	if mode&4 != 0 {
		ct = fuzzToken
	}
	return &helloServer{proto: proto, token: st, size: 4, limit: 1 << 16, nonce: fuzzServerNonce},
		&helloClient{proto: proto, token: ct, rank: 1, size: 4}
}

// FuzzTransportHello feeds one message to each step of the hello, for the
// store and the TCP transport, with and without tokens: the server's check
// of a hello, the client's parse of a challenge and its check of a verdict.
// Beyond not panicking: a hello the server admits claims a rank in [1, 4)
// and the world of 4, and, when the server has a token, is byte for byte the
// hello that a holder of the token renders (no other message gets in); a
// verdict the client accepts with a token is byte for byte the server's
// proof.
func FuzzTransportHello(f *testing.F) {
	for mode := range byte(8) {
		s, c := fuzzHelloSides(mode)
		ch, _ := c.parseChallenge(s.challenge())
		hello, _ := c.hello(ch, fuzzClientNonce)
		f.Add(mode, hello)
		f.Add(mode, s.challenge())
		f.Add(mode, s.accept(helloClaim{rank: 1, size: 4, nonce: fuzzClientNonce}))
		f.Add(mode, rejectVerdict(&authError{"wrong token"}))
		f.Add(mode, hello[:len(hello)-1])
	}
	f.Add(byte(0), []byte("GET / HTTP/1.0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, mode byte, msg []byte) {
		s, c := fuzzHelloSides(mode)
		if claim, err := s.check(msg); err == nil {
			if claim.rank < 1 || claim.rank >= 4 || claim.size != 4 {
				t.Fatalf("admitted rank %d of %d", claim.rank, claim.size)
			}
			if s.token.IsSet() {
				holder := &helloClient{proto: s.proto, token: s.token, rank: claim.rank, size: 4}
				ch, err := holder.parseChallenge(s.challenge())
				if err != nil {
					t.Fatal(err)
				}
				want, _ := holder.hello(ch, claim.nonce)
				if !bytes.Equal(msg, want) {
					t.Fatalf("admitted a hello no token holder rendered: %x", msg)
				}
			}
			if v := s.accept(claim); len(v) != 1+macLen {
				t.Fatalf("accept verdict of %d bytes", len(v))
			}
		} else if v := rejectVerdict(err); len(v) > maxVerdictFrame {
			t.Fatalf("reject verdict of %d bytes", len(v))
		}
		if ch, err := c.parseChallenge(msg); err == nil {
			if len(ch.nonce) != nonceBytes {
				t.Fatalf("challenge nonce of %d bytes", len(ch.nonce))
			}
			if h, _ := c.hello(ch, fuzzClientNonce); len(h) != helloLen {
				t.Fatalf("hello of %d bytes", len(h))
			}
		}
		ch, err := c.parseChallenge(s.challenge())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.checkVerdict(ch, fuzzClientNonce, msg); err == nil && c.token.IsSet() {
			// The proof of a server holding the client's token (whatever
			// the challenge said: a client whose token the challenge does
			// not match never reads a verdict).
			holder := &helloServer{proto: c.proto, token: c.token, size: 4, nonce: fuzzServerNonce}
			if want := holder.accept(helloClaim{rank: 1, size: 4, nonce: fuzzClientNonce}); !bytes.Equal(msg, want) {
				t.Fatalf("accepted a verdict that is not the token holder's proof: %x", msg)
			}
		}
	})
}

// FuzzCollectiveHeader decodes the checked protocol's header from arbitrary
// payloads: no panic; a decoded header re-encodes to the bytes it came from;
// and split among up to four ranks, headers that checkHeaders accepts agree
// with the bodies (an allreduce's bodies hold Len values, a broadcast's root
// is in the group).
func FuzzCollectiveHeader(f *testing.F) {
	enc := func(h header, body []byte) []byte { return append(h.encode(), body...) }
	f.Add(enc(header{Seq: 3, Kind: KindAllGather, Name: "batch_size"}, []byte("xyz")))
	f.Add(enc(header{Seq: 0, Kind: KindBroadcast, Name: "arrivals", Root: 1}, nil))
	f.Add(enc(header{Seq: 9, Kind: KindAllReduce, Name: "init_status", Op: ReduceMax, Len: 2}, make([]byte, 16)))
	two := enc(header{Seq: 1, Kind: KindAllReduce, Name: "r", Op: ReduceSum, Len: 1}, make([]byte, 8))
	f.Add(append([]byte{1}, append(two, two...)...))
	f.Add([]byte{0x53, 0x4c})
	f.Fuzz(func(t *testing.T, data []byte) {
		var h header
		if n, err := h.decode(data); err == nil {
			if n > len(data) || !bytes.Equal(h.encode(), data[:n]) {
				t.Fatalf("header %+v of %d bytes does not re-encode to its input", h, n)
			}
			_ = h.describe(true, true)
		}
		if len(data) == 0 {
			return
		}
		size := 1 + int(data[0])%4
		rest := data[1:]
		part := len(rest) / size
		hdrs, bodies := make([]header, size), make([][]byte, size)
		for r := range size {
			p := rest[r*part : (r+1)*part]
			n, err := hdrs[r].decode(p)
			if err != nil {
				return
			}
			bodies[r] = p[n:]
		}
		if checkHeaders(hdrs, bodies, size) != nil {
			return
		}
		ref := hdrs[0]
		switch ref.Kind {
		case KindAllReduce:
			for r, b := range bodies {
				if ref.Len < 0 || int64(len(b)) != 8*ref.Len {
					t.Fatalf("allreduce of %d values accepted with %d bytes from rank %d", ref.Len, len(b), r)
				}
			}
		case KindBroadcast:
			if ref.Root < 0 || ref.Root >= int64(size) {
				t.Fatalf("broadcast from root %d accepted in a group of %d", ref.Root, size)
			}
		}
	})
}
