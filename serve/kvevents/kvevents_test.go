package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

func TestOffsetEndpoint(t *testing.T) {
	for _, c := range []struct {
		ep   string
		rank int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 3, "tcp://*:5560"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"inproc://cache", 2, "inproc://cache_dp2"},
		{"ipc:///tmp/x", 0, "ipc:///tmp/x"},
	} {
		got, err := OffsetEndpoint(c.ep, c.rank)
		require.NoError(t, err, c.ep)
		require.Equal(t, c.want, got, c.ep)
	}
	_, err := OffsetEndpoint("ipc:///tmp/x", 1)
	require.ErrorContains(t, err, "tcp:// or inproc://")
	_, err = OffsetEndpoint("tcp://*:abc", 1)
	require.ErrorContains(t, err, "port")
	require.ErrorContains(t, (&Config{}).Validate(), "endpoint")
	require.ErrorContains(t, (&Config{Endpoint: "tcp://*:1", Encoding: "json"}).Validate(), "encoding")
}

func key(b byte) scheduler.BlockKey {
	var k scheduler.BlockKey
	k[0], k[7], k[31] = b, 0x80, 1
	return k
}

func sampleEvents() []kvpool.Event {
	return []kvpool.Event{
		{Kind: kvpool.EventCreated, BlocksPerLevel: []int{8}},
		{Kind: kvpool.EventStored, Blocks: []kvpool.StoredBlock{{Hash: key(1), Tokens: []int32{1, 2}}, {Hash: key(2), Tokens: []int32{300, 70000}}}},
		{Kind: kvpool.EventStored, HasParent: true, Parent: key(2), Blocks: []kvpool.StoredBlock{{Hash: key(3), Tokens: []int32{5, 6}}}},
		{Kind: kvpool.EventUpdated, Hash: key(3), FromLevel: 0, ToLevel: 1},
		{Kind: kvpool.EventRemoved, Hashes: []scheduler.BlockKey{key(3), key(2)}},
	}
}

// The batch is vLLM's KVEventBatch: [ts, events, data_parallel_rank] with
// array_like tagged events in field order, or tagged maps.
func TestEncodeBatch(t *testing.T) {
	payload, n := EncodeBatch(12.5, sampleEvents(), 1, EncodingArray)
	require.Equal(t, 3, n, "created and updated events are left out")
	var got []any
	require.NoError(t, msgpack.Unmarshal(payload, &got))
	require.Len(t, got, 3)
	require.Equal(t, 12.5, got[0])
	require.EqualValues(t, 1, got[2])
	evs := got[1].([]any)
	h := func(k scheduler.BlockKey) uint64 { return kvpool.BlockHash64(k) }
	norm := func(v any) any { // msgpack's compact ints decode as various widths
		switch x := v.(type) {
		case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
			var out uint64
			b, _ := msgpack.Marshal(x)
			msgpack.Unmarshal(b, &out) //nolint:errcheck
			return out
		}
		return v
	}
	stored := evs[0].([]any)
	require.Equal(t, "BlockStored", stored[0])
	require.Equal(t, []uint64{h(key(1)), h(key(2))}, []uint64{norm(stored[1].([]any)[0]).(uint64), norm(stored[1].([]any)[1]).(uint64)})
	require.Nil(t, stored[2], "a child of the root has no parent")
	require.Len(t, stored[3], 4)
	require.EqualValues(t, 70000, norm(stored[3].([]any)[3]))
	require.EqualValues(t, 2, norm(stored[4]))
	require.Nil(t, stored[5])
	require.Equal(t, "GPU", stored[6])
	require.Nil(t, stored[7])
	require.Len(t, stored, 8)
	require.Equal(t, h(key(2)), norm(evs[1].([]any)[2]))
	removed := evs[2].([]any)
	require.Equal(t, []any{"BlockRemoved"}, removed[:1])
	require.Len(t, removed, 3)
	require.Equal(t, "GPU", removed[2])

	payload, _ = EncodeBatch(1, sampleEvents(), 0, EncodingMap)
	var gotMap []any
	require.NoError(t, msgpack.Unmarshal(payload, &gotMap))
	m := gotMap[1].([]any)[0].(map[string]any)
	require.Equal(t, "BlockStored", m["type"])
	require.Contains(t, m, "lora_name")
	require.Len(t, m, 8)

	_, n = EncodeBatch(1, sampleEvents()[:1], 0, EncodingArray)
	require.Zero(t, n)
}

// A subscriber receives (topic, seq, payload) with sequence numbers from 0;
// a replay from seq 1 returns batches 1.. and the end marker.
func TestPublishAndReplay(t *testing.T) {
	p, err := New(Config{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", Topic: "kv", BufferSteps: 2})
	require.NoError(t, err)
	defer p.Close()
	ctx, first := subscribe(t, p)
	require.Len(t, first.Frames, 3)
	require.Equal(t, "kv", string(first.Frames[0]))
	require.Len(t, first.Frames[1], 8)
	published := p.Sequences()
	require.Positive(t, published)

	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	require.NoError(t, dealer.Dial("tcp://127.0.0.1"+portOf(p.ReplayAddr())))
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], 0)
	require.NoError(t, dealer.Send(zmq4.NewMsgFrom(nil, start[:])))
	var seqs []uint64
	for {
		m, err := dealer.Recv()
		require.NoError(t, err)
		require.Len(t, m.Frames, 3, "(empty, seq, payload)")
		require.Empty(t, m.Frames[0])
		if bytes.Equal(m.Frames[1], endSeq) {
			require.Empty(t, m.Frames[2])
			break
		}
		seqs = append(seqs, binary.BigEndian.Uint64(m.Frames[1]))
	}
	// BufferSteps 2: only the last two batches remain.
	want := []uint64{published - 2, published - 1}
	if published < 2 {
		want = []uint64{0}
	}
	require.Equal(t, want, seqs)
}

// portOf is the ":port" of a bound address.
func portOf(a string) string { return a[strings.LastIndexByte(a, ':'):] }

// subscribe connects a subscriber to p's PUB port and returns the first
// batch it receives (firstBatch), with the context both run under. The
// subscriber is closed after the test's own defers, so p closes with it
// still connected: under -race that once showed zmq4 redialling a bound
// PUB's own address when a connection closed (automatic reconnect is for
// connected endpoints only).
func subscribe(t *testing.T, p *Publisher) (context.Context, zmq4.Msg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { sub.Close() })
	require.NoError(t, sub.Dial("tcp://127.0.0.1"+portOf(p.Addr())))
	return ctx, firstBatch(t, ctx, sub, p)
}

// firstBatch subscribes sub to "kv" and publishes sample events on p until
// a batch arrives (a subscription, and a connection being dialled, travel
// asynchronously), failing when ctx ends first.
func firstBatch(t *testing.T, ctx context.Context, sub zmq4.Socket, p *Publisher) zmq4.Msg {
	t.Helper()
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, "kv"))
	got := make(chan zmq4.Msg, 16)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			got <- m
		}
	}()
	for {
		require.NoError(t, ctx.Err(), "no batch reached the subscriber")
		p.PublishEvents(sampleEvents())
		select {
		case m := <-got:
			return m
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// An endpoint without * is connected to, as vLLM does, and like libzmq's
// connect it does not need the peer to be there yet: a subscriber that binds
// after the publisher started (a KV-aware router starting late, or
// restarting) gets the batches published once it is connected. A connected endpoint
// that is not tcp://host:port is refused at once.
func TestConnectedPublisherReachesALateSubscriber(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nobody listens there now
	p, err := New(Config{Endpoint: "tcp://" + addr, Topic: "kv", BufferSteps: 4})
	require.NoError(t, err, "nothing listens yet: the publisher starts anyway")
	defer p.Close()
	p.PublishEvents(sampleEvents()) // goes nowhere

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	require.NoError(t, sub.Listen("tcp://"+addr))
	first := firstBatch(t, ctx, sub, p)
	require.Len(t, first.Frames, 3)
	require.Equal(t, "kv", string(first.Frames[0]))

	for _, bad := range []string{"tcp://localhost", "tcp://:5557", "tcp://host:99999", "udp://127.0.0.1:5557"} {
		_, err := New(Config{Endpoint: bad})
		require.ErrorContains(t, err, "endpoint", bad)
	}
}

// A partial last block (lockstep's radix tree keeps it) is left out of
// BlockStored, as are its removal and the empty events that leaves.
func TestPartialBlocksAreLeftOut(t *testing.T) {
	partial := map[[32]byte]struct{}{}
	evs := []kvpool.Event{
		{Kind: kvpool.EventStored, Blocks: []kvpool.StoredBlock{{Hash: key(1), Tokens: []int32{1, 2}}, {Hash: key(2), Tokens: []int32{3}}}},
		{Kind: kvpool.EventStored, Blocks: []kvpool.StoredBlock{{Hash: key(4), Tokens: []int32{9}}}},
		{Kind: kvpool.EventRemoved, Hashes: []scheduler.BlockKey{key(2), key(4)}},
		{Kind: kvpool.EventRemoved, Hashes: []scheduler.BlockKey{key(2), key(1)}},
	}
	payload, n := encodeBatch(1, evs, 0, EncodingArray, 2, partial)
	require.Equal(t, 2, n, "one stored event with block 1, one removal of block 1")
	var got []any
	require.NoError(t, msgpack.Unmarshal(payload, &got))
	stored := got[1].([]any)[0].([]any)
	require.Len(t, stored[1], 1)
	require.Len(t, stored[3], 2)
	removed := got[1].([]any)[1].([]any)
	require.Len(t, removed[1], 2, "key(2) was forgotten at its first removal: the second one names it again")
	require.Empty(t, partial)
}

// PublishEvents never waits for the sender (the executor's loop calls it):
// with the sender stuck, live copies beyond the queue are dropped and
// counted, and every batch is numbered and kept in the replay ring, the
// newest BufferSteps of them, oldest first.
func TestPublishNeverWaitsForTheSender(t *testing.T) {
	p := &Publisher{cfg: Config{BufferSteps: 3, Encoding: EncodingArray, Clock: time.Now}, queue: make(chan entry, 2),
		partial: map[[32]byte]struct{}{}}
	done := make(chan struct{})
	go func() {
		for range 6 {
			p.PublishEvents(sampleEvents())
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("PublishEvents waited for a sender that does not send")
	}
	require.Equal(t, uint64(6), p.Sequences())
	require.Equal(t, uint64(4), p.Dropped(), "two live copies queued, four dropped")
	var ring []uint64
	for i := range p.buf {
		ring = append(ring, p.buf[(p.head+i)%len(p.buf)].seq)
	}
	require.Equal(t, []uint64{3, 4, 5}, ring)
	require.Equal(t, uint64(0), (<-p.queue).seq)
	require.Equal(t, uint64(1), (<-p.queue).seq)
}

// A peer of the PUB or replay port that announces a huge frame (here a
// command frame of 2^62 bytes right after a valid greeting, where
// go-zeromq's handshake reads READY) is disconnected; before, the library
// allocated the announced size and panicked the process ("makeslice: len
// out of range"). Subscribers and replay clients keep working, and
// connections that fail their handshake reach stderr sparsely.
func TestPeerAnnouncingAHugeFrameIsDisconnected(t *testing.T) {
	p, err := New(Config{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", Topic: "kv", BufferSteps: 2})
	require.NoError(t, err)
	defer p.Close()
	greeting := make([]byte, zmtpGreeting)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	huge := append(append([]byte{}, greeting...), 0x06, 0x40, 0, 0, 0, 0, 0, 0, 0) // COMMAND|LONG, 2^62
	for _, addr := range []string{p.Addr(), p.ReplayAddr()} {
		for range 3 {
			c, err := net.Dial("tcp", "127.0.0.1"+portOf(addr))
			require.NoError(t, err)
			_, err = c.Write(huge)
			require.NoError(t, err)
			c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
			_, err = io.ReadAll(c)                              // the server's greeting, then the close (or a reset)
			require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the server closed the connection")
			c.Close()
		}
	}
	_, first := subscribe(t, p)
	require.Equal(t, "kv", string(first.Frames[0]))
}

// The guard follows frames split anywhere across reads, and refuses only
// a size over the bound.
func TestZMTPGuardScan(t *testing.T) {
	stream := make([]byte, zmtpGreeting)
	stream = append(stream, 0x04, 3, 'a', 'b', 'c')       // short command of 3 bytes
	stream = append(stream, 0x02, 0, 0, 0, 0, 0, 0, 1, 0) // long frame of 256 bytes
	stream = append(stream, make([]byte, 256)...)         //
	stream = append(stream, 0x01, 0, 0x00, 1, 'x')        // empty MORE frame, then 1 byte
	for split := 1; split <= len(stream); split++ {
		g := &zmtpGuard{greeting: zmtpGreeting}
		for b := stream; len(b) > 0; {
			k := min(split, len(b))
			require.True(t, g.scan(b[:k]), "split %d", split)
			b = b[k:]
		}
		require.Zero(t, g.body+uint64(g.sizeLeft), "split %d: at a frame boundary", split)
	}
	g := &zmtpGuard{greeting: zmtpGreeting}
	over := append(make([]byte, zmtpGreeting), 0x02, 0, 0, 0, 0, 0, 0x10, 0, 1) // 1 MiB + 1
	require.False(t, g.scan(over))
	g = &zmtpGuard{greeting: zmtpGreeting}
	require.True(t, g.scan(append(make([]byte, zmtpGreeting), 0x02, 0, 0, 0, 0, 0, 0x10, 0, 0)), "exactly 1 MiB")
}
