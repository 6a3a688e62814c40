// Package kvevents publishes a rank's KV cache events over ZeroMQ in vLLM's
// wire format (vllm/distributed/kv_events.py, ZmqEventPublisher), so that
// the KV-aware routers written for vLLM (llm-d's KV cache manager, Dynamo's
// KV router) can follow lockstep's prefix caches. docs/kv-events.md has the
// format, the block hashes and what maps to what.
//
// A PUB socket sends multipart messages (topic, 8-byte big-endian sequence
// number, msgpack payload) where the payload is a KVEventBatch
// [ts, events, data_parallel_rank]; a ROUTER socket answers a replay
// request (an 8-byte big-endian start sequence) with (seq, payload) frames
// for every buffered batch from there, then the end marker (−1, empty).
// Each attention-DP rank has its own publisher, its ports offset by its
// rank as vLLM offsets its data-parallel engines'.
package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockstep-ai/lockstep/kvpool"
)

// Defaults of vLLM's KVEventsConfig.
const (
	DefaultEndpoint    = "tcp://*:5557"
	DefaultBufferSteps = 10_000
	DefaultHWM         = 100_000
)

// Encodings of the events inside a batch.
const (
	// EncodingArray: each event is a msgspec array_like tagged struct
	// ["BlockStored", field, ...] (vLLM up to 0.11, and what llm-d and
	// Dynamo decode positionally).
	EncodingArray = "array"
	// EncodingMap: each event is a tagged map {"type": "BlockStored",
	// field: value, ...} (vLLM's later KVCacheEvent, without array_like).
	EncodingMap = "map"
)

// Config is one rank's publisher, named like vLLM's kv_events_config.
type Config struct {
	// Endpoint is the PUB address before the rank's offset: bound when it
	// has "*" or "::" or is ipc:// or inproc://, connected to otherwise
	// (vLLM's rule).
	Endpoint string
	// ReplayEndpoint is the ROUTER address for replays ("" for none),
	// always bound.
	ReplayEndpoint string
	Topic          string
	// BufferSteps is how many past batches a replay can return.
	BufferSteps int
	// HWM is the PUB socket's high-water mark (messages queued per
	// publisher before new ones are dropped).
	HWM int
	// DPRank is the attention-DP rank: the batches' data_parallel_rank and
	// the ports' offset.
	DPRank int
	// Encoding is EncodingArray (default) or EncodingMap.
	Encoding string
	// BlockSize is the pool's tokens per page: BlockStored carries full
	// blocks only, as vLLM's (a partial last block, which lockstep's radix
	// tree keeps, is left out, and so is its later removal). 0: no filter.
	BlockSize int
	// Clock is the batches' ts source (time.Now when nil).
	Clock func() time.Time
}

// Validate checks cfg, naming the field at fault.
func (c *Config) Validate() error {
	switch {
	case c.Endpoint == "":
		return errors.New("kv events: endpoint is empty")
	case c.BufferSteps < 0:
		return fmt.Errorf("kv events: buffer_steps must be >= 0, got %d", c.BufferSteps)
	case c.HWM < 0:
		return fmt.Errorf("kv events: hwm must be >= 0, got %d", c.HWM)
	case c.Encoding != "" && c.Encoding != EncodingArray && c.Encoding != EncodingMap:
		return fmt.Errorf("kv events: encoding must be %s or %s, got %q", EncodingArray, EncodingMap, c.Encoding)
	}
	if _, err := OffsetEndpoint(c.Endpoint, 1); err != nil {
		return err
	}
	if c.ReplayEndpoint != "" {
		if _, err := OffsetEndpoint(c.ReplayEndpoint, 1); err != nil {
			return fmt.Errorf("kv events: replay endpoint: %w", err)
		}
	}
	return nil
}

// OffsetEndpoint is vLLM's offset_endpoint_port: the endpoint of DP rank
// rank: its tcp port + rank, an inproc name + "_dp<rank>"; rank 0's is
// unchanged, and any other transport is refused for rank > 0, as in vLLM.
func OffsetEndpoint(ep string, rank int) (string, error) {
	if ep == "" || rank == 0 {
		return ep, nil
	}
	switch {
	case strings.Contains(ep, "inproc"):
		return fmt.Sprintf("%s_dp%d", ep, rank), nil
	case strings.Contains(ep, "tcp"):
		i := strings.LastIndexByte(ep, ':')
		if i < 0 {
			return ep, nil
		}
		port, err := strconv.Atoi(ep[i+1:])
		if err != nil {
			return "", fmt.Errorf("kv events: endpoint %q: the port is not a number", ep)
		}
		return ep[:i+1] + strconv.Itoa(port+rank), nil
	}
	return "", fmt.Errorf("kv events: endpoint %q must be tcp:// or inproc:// with several ranks", ep)
}

// binds reports whether the PUB endpoint is bound (vLLM's heuristic).
func binds(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") ||
		strings.HasPrefix(ep, "inproc://")
}

// dialable checks an endpoint the PUB socket connects to (binds is false):
// tcp://host:port, the only transport connected to.
func dialable(ep string) error {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return errors.New("an endpoint that is connected to (no * or ::) must be tcp://host:port")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Errorf("an endpoint that is connected to must be tcp://host:port: %q", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("port %q is not in 1..65535", port)
	}
	return nil
}

// entry is one buffered batch.
type entry struct {
	seq     uint64
	payload []byte
}

// Publisher is one rank's publisher. PublishEvents is called from the
// executor's loop; a goroutine sends, another answers replays.
type Publisher struct {
	cfg    Config
	topic  []byte
	pub    zmq4.Socket
	replay zmq4.Socket
	queue  chan entry // live copies for the sender; never waited on
	done   chan struct{}
	wg     sync.WaitGroup
	cancel context.CancelFunc

	// partial holds the keys of the partial blocks left out of BlockStored,
	// so that their removals are left out too (the executor's goroutine only).
	partial map[[32]byte]struct{}

	mu     sync.Mutex
	buf    []entry // ring of the last BufferSteps batches, oldest at head once full
	head   int
	nextSq uint64
	closed bool
	// dropped counts the live copies dropped (the sender was behind).
	dropped uint64
	// Endpoint and ReplayEndpoint are the addresses actually used (after
	// the rank's offset).
	Endpoint, ReplayEndpoint string
}

// New opens rank cfg.DPRank's sockets.
func New(cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Encoding == "" {
		cfg.Encoding = EncodingArray
	}
	ep, err := OffsetEndpoint(cfg.Endpoint, cfg.DPRank)
	if err != nil {
		return nil, err
	}
	rep, err := OffsetEndpoint(cfg.ReplayEndpoint, cfg.DPRank)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, topic: []byte(cfg.Topic), queue: make(chan entry, 1024), done: make(chan struct{}),
		partial: map[[32]byte]struct{}{},
		cancel:  cancel, Endpoint: ep, ReplayEndpoint: rep}
	// A connected PUB socket dials until its peer answers and again when
	// it goes away, as libzmq's connect does for vLLM's publisher: the
	// subscriber that binds (a KV-aware router) may start after lockstep,
	// or restart. Until it is there, batches go nowhere (PUB semantics);
	// the replay endpoint has them. A bound one must not reconnect: zmq4
	// redials the socket's endpoint whenever any connection closes, so a
	// subscriber leaving a bound PUB made it dial its own listening address
	// (and race with Close).
	opts := []zmq4.Option{zmq4.WithLogger(zmqLog)}
	if !binds(ep) {
		opts = append(opts, zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
	}
	p.pub = zmq4.NewPub(ctx, opts...)
	if cfg.HWM > 0 {
		if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
			cancel()
			return nil, fmt.Errorf("kv events: hwm: %w", err)
		}
	}
	gep, err := guarded(ep)
	switch {
	case err != nil:
	case binds(ep):
		err = p.pub.Listen(gep)
	default:
		if err = dialable(ep); err == nil {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.pub.Dial(gep) //nolint:errcheck // returns once connected, or with the socket's end
			}()
		}
	}
	if err != nil {
		p.pub.Close()
		cancel()
		return nil, fmt.Errorf("kv events: endpoint %s (rank %d): %w", ep, cfg.DPRank, err)
	}
	if rep != "" {
		p.replay = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity(fmt.Sprintf("lockstep-kv-replay-%d", cfg.DPRank))),
			zmq4.WithLogger(zmqLog))
		grep, err := guarded(rep)
		if err == nil {
			err = p.replay.Listen(grep)
		}
		if err != nil {
			p.pub.Close()
			p.replay.Close()
			cancel()
			return nil, fmt.Errorf("kv events: replay endpoint %s (rank %d): %w", rep, cfg.DPRank, err)
		}
		p.wg.Add(1)
		go p.serveReplays()
	}
	p.wg.Add(1)
	go p.send()
	return p, nil
}

// Addr is the PUB socket's bound address (tests bind port 0), or nil.
func (p *Publisher) Addr() string {
	if a := p.pub.Addr(); a != nil {
		return a.String()
	}
	return ""
}

// ReplayAddr is the ROUTER socket's bound address, or "".
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil || p.replay.Addr() == nil {
		return ""
	}
	return p.replay.Addr().String()
}

// PublishEvents encodes a flush's events as one batch and queues it (the
// executor.EventPublisher of this rank). Events with nothing to say in
// vLLM's format (the pool's created event, tier moves) are left out; a
// flush with none of the others sends nothing.
func (p *Publisher) PublishEvents(evs []kvpool.Event) {
	ts := float64(p.cfg.Clock().UnixNano()) / 1e9
	payload, n := encodeBatch(ts, evs, p.cfg.DPRank, p.cfg.Encoding, p.cfg.BlockSize, p.partial)
	if n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	e := entry{p.nextSq, payload}
	p.nextSq++
	if n := p.cfg.BufferSteps; n > 0 {
		if len(p.buf) < n {
			p.buf = append(p.buf, e)
		} else {
			p.buf[p.head] = e // the oldest goes
			p.head = (p.head + 1) % n
		}
	}
	// The executor's loop never waits for the network: when the sender is
	// behind (a slow subscriber, a peer being dialled again) the live copy
	// is dropped, as a ZeroMQ PUB socket drops at its high-water mark; the
	// batch stays in the replay buffer and its sequence number shows the
	// gap to subscribers.
	select {
	case p.queue <- e:
	default:
		p.dropped++
	}
}

// send is the PUB goroutine: it sends the numbered batches.
func (p *Publisher) send() {
	defer p.wg.Done()
	for e := range p.queue {
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], e.seq)
		// A send error (no peer, a peer gone) loses this live copy only;
		// the batch stays in the replay buffer.
		p.pub.Send(zmq4.NewMsgFrom(p.topic, sb[:], e.payload)) //nolint:errcheck
	}
}

// Dropped is the number of batches whose live copy was dropped because the
// sender was behind (they stay in the replay buffer).
func (p *Publisher) Dropped() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// endSeq is the replay's end marker: −1 as 8 big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplays answers replay requests until the socket closes: a request
// is (identity, empty, 8-byte start sequence); the answer is, for every
// buffered batch from the start on, (identity, empty, seq, payload), then
// (identity, empty, −1, empty). A malformed request gets the end marker
// only.
func (p *Publisher) serveReplays() {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			if errors.Is(err, context.Canceled) {
				return
			}
			continue
		}
		if len(msg.Frames) < 2 {
			continue
		}
		id := msg.Frames[0]
		start, ok := uint64(0), false
		if f := msg.Frames; len(f) == 3 && len(f[1]) == 0 && len(f[2]) == 8 {
			start, ok = binary.BigEndian.Uint64(f[2]), true
		}
		var out []entry
		if ok {
			p.mu.Lock()
			for i := range p.buf {
				if e := p.buf[(p.head+i)%len(p.buf)]; e.seq >= start {
					out = append(out, e)
				}
			}
			p.mu.Unlock()
		}
		for _, e := range out {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], e.seq)
			if err := p.replay.Send(zmq4.NewMsgFrom(id, nil, sb[:], e.payload)); err != nil {
				break
			}
		}
		p.replay.Send(zmq4.NewMsgFrom(id, nil, endSeq, nil)) //nolint:errcheck
	}
}

// Close sends what is queued, then closes the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.queue)
	close(p.done)
	// Give the last live sends a moment on the wire.
	time.Sleep(50 * time.Millisecond)
	err := p.pub.Close()
	if p.replay != nil {
		p.replay.Close()
	}
	p.cancel()
	p.wg.Wait()
	return err
}

// Sequences is the number of batches published so far (tests).
func (p *Publisher) Sequences() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nextSq
}

// EncodeBatch encodes evs as vLLM's KVEventBatch [ts, events,
// data_parallel_rank] and returns it with the number of events it holds:
// stored events as BlockStored, removed ones as BlockRemoved (docs/kv-events.md).
func EncodeBatch(ts float64, evs []kvpool.Event, dpRank int, encoding string) ([]byte, int) {
	return encodeBatch(ts, evs, dpRank, encoding, 0, nil)
}

// encodeBatch is EncodeBatch leaving out the blocks shorter than
// blockSize (> 0), whose keys it adds to partial, and the removals of the
// keys in partial (which it forgets).
func encodeBatch(ts float64, evs []kvpool.Event, dpRank int, encoding string, blockSize int,
	partial map[[32]byte]struct{}) ([]byte, int) {
	type ev struct {
		kind   string
		hashes []any
		parent any
		tokens []int32
		size   int
	}
	var out []ev
	for i := range evs {
		e := &evs[i]
		switch e.Kind {
		case kvpool.EventStored:
			if len(e.Blocks) == 0 {
				continue
			}
			s := ev{kind: "BlockStored", size: len(e.Blocks[0].Tokens)}
			if blockSize > 0 {
				s.size = blockSize
			}
			if e.HasParent {
				s.parent = blockHash(e.HashAlgo, e.Parent)
			}
			for _, b := range e.Blocks {
				if blockSize > 0 && len(b.Tokens) != blockSize {
					partial[b.Hash] = struct{}{}
					continue
				}
				s.hashes = append(s.hashes, blockHash(e.HashAlgo, b.Hash))
				s.tokens = append(s.tokens, b.Tokens...)
			}
			if len(s.hashes) > 0 {
				out = append(out, s)
			}
		case kvpool.EventRemoved:
			if len(e.Hashes) == 0 {
				continue
			}
			r := ev{kind: "BlockRemoved"}
			for _, h := range e.Hashes {
				if _, ok := partial[h]; ok {
					delete(partial, h)
					continue
				}
				r.hashes = append(r.hashes, blockHash(e.HashAlgo, h))
			}
			if len(r.hashes) > 0 {
				out = append(out, r)
			}
		}
	}
	if len(out) == 0 {
		return nil, 0
	}
	var b strings.Builder
	enc := msgpack.NewEncoder(&b)
	enc.UseCompactInts(true)
	must := func(err error) {
		if err != nil {
			panic("kvevents: msgpack into memory failed: " + err.Error())
		}
	}
	must(enc.EncodeArrayLen(3))
	must(enc.EncodeFloat64(ts))
	must(enc.EncodeArrayLen(len(out)))
	for _, e := range out {
		stored := e.kind == "BlockStored"
		field := func(name string) {
			if encoding == EncodingMap {
				must(enc.EncodeString(name))
			}
		}
		switch {
		case encoding == EncodingMap && stored:
			must(enc.EncodeMapLen(8))
		case encoding == EncodingMap:
			must(enc.EncodeMapLen(3))
		case stored:
			must(enc.EncodeArrayLen(8))
		default:
			must(enc.EncodeArrayLen(3))
		}
		field("type")
		must(enc.EncodeString(e.kind))
		field("block_hashes")
		must(enc.EncodeArrayLen(len(e.hashes)))
		for _, h := range e.hashes {
			must(enc.Encode(h))
		}
		if stored {
			field("parent_block_hash")
			must(enc.Encode(e.parent))
			field("token_ids")
			must(enc.EncodeArrayLen(len(e.tokens)))
			for _, t := range e.tokens {
				must(enc.EncodeInt(int64(t)))
			}
			field("block_size")
			must(enc.EncodeInt(int64(e.size)))
			field("lora_id")
			must(enc.EncodeNil())
		}
		field("medium")
		must(enc.EncodeString(MediumGPU))
		if stored {
			field("lora_name")
			must(enc.EncodeNil())
		}
	}
	must(enc.EncodeInt(int64(dpRank)))
	return []byte(b.String()), len(out)
}

// MediumGPU is the medium of every event: lockstep's radix cache is one
// cache whose blocks stay reusable on either tier (docs/kv-events.md).
const MediumGPU = "GPU"

// blockHash is a block key as an event carries it: sha256_64 (the default)
// as an unsigned 64-bit integer (the key's first 8 bytes, big-endian),
// sha256 as the 32 key bytes (msgpack bin, which vLLM's bytes
// ExternalBlockHash decodes).
func blockHash(algo kvpool.EventHashAlgo, key [32]byte) any {
	if algo == kvpool.HashSHA256 {
		return key[:]
	}
	return kvpool.BlockHash64(key)
}
