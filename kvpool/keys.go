package kvpool

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/bits"
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Block hashes (kvcache.md §6.1) are a SHA-256 hash chain over a canonical
// byte encoding, so they are identical across processes, runs and ranks
// (never maphash or a random seed):
//
//	scope bytes = mask byte, then one little-endian uint64 per present field
//	              (bit 1 = cache salt: first 8 bytes of SHA-256(salt), LE)
//	root key    = SHA-256(scope bytes)
//	block key   = SHA-256(parent key ‖ token₀ ‖ … ‖ tokenₖ₋₁), tokens as LE uint32
//
// They are what KV cache events carry (node.hash; docs/kv-events.md).
//
// The radix tree is looked up by a cheaper chain key (lookup keys,
// LookupKeyOf): SHA-256 of 8 192 blocks was 3–5 ms of a 128k-token prompt's
// admission at 16 tokens per page, the key of a block the tree already holds
// need not be cryptographic (issue 24, item 6). Deliberate difference from
// §6.1's "no token re-check on a key hit": a lookup key hit counts only when
// the block's parent is the node the walk came from and its tokens are the
// prompt's (lookupChild), so a collision of lookup keys costs a miss (or a
// block not inserted), never a wrong match. Lookup keys are deterministic
// too (fixed constants), so runs stay reproducible.
// scopeMaskSalt is bit 1 of the scope mask: a cache salt is present. Bit 0
// is reserved and always 0.
const scopeMaskSalt = 0x02

// ScopeBytes is the canonical encoding of a reuse scope (§6.1): "00"
// without a salt, "02" ‖ LE uint64 of SHA-256(salt)[0:8] with one.
func ScopeBytes(salt string) []byte {
	if salt == "" {
		return []byte{0}
	}
	sum := sha256.Sum256([]byte(salt))
	out := make([]byte, 9)
	out[0] = scopeMaskSalt
	// The field is the first 8 digest bytes read little-endian, then written
	// little-endian: the same 8 bytes.
	binary.LittleEndian.PutUint64(out[1:], binary.LittleEndian.Uint64(sum[:8]))
	return out
}

// RootKey is the hash of the radix root of a scope: SHA-256(scope bytes).
func RootKey(salt string) scheduler.BlockKey {
	return sha256.Sum256(ScopeBytes(salt))
}

// BlockKeyOf is SHA-256(parent ‖ tokens as LE uint32): the hash of a block
// holding tokens under parent, as events carry it. It allocates; the
// manager uses a keyHasher.
func BlockKeyOf(parent scheduler.BlockKey, tokens []int32) scheduler.BlockKey {
	var h keyHasher
	return h.sha(parent, tokens)
}

// LookupRootKey is the lookup key of the radix root of a scope: the lookup
// key of the scope bytes' SHA-256 (RootKey) with no tokens.
func LookupRootKey(salt string) scheduler.BlockKey {
	return LookupKeyOf(RootKey(salt), nil)
}

// LookupKeyOf is the lookup key of a block holding tokens under the block
// whose lookup key is parent: the radix tree's map key and the key of
// scheduler.BlockKeyChain and ProbeFirstNewBlockKey (not an event hash).
//
// Four 64-bit lanes, seeded from the parent's key and the token count,
// absorb 32 bytes of tokens per round, each lane one 8-byte word with a
// 64×64→128-bit multiply folded to 64 bits and the next lane's previous
// value (so the round's multiplies are independent); the lanes are
// cross-mixed at the end.
func LookupKeyOf(parent scheduler.BlockKey, tokens []int32) scheduler.BlockKey {
	const (
		k0 = 0xa0761d6478bd642f
		k1 = 0xe7037ed1a0b428db
		k2 = 0x8ebc6af09c88c6e3
		k3 = 0x589965cc75374cc3
		k4 = 0x1d8e4e27c47d124f
	)
	n := uint64(len(tokens))
	a := binary.LittleEndian.Uint64(parent[0:8]) ^ k0 ^ n
	b := binary.LittleEndian.Uint64(parent[8:16]) ^ k1
	c := binary.LittleEndian.Uint64(parent[16:24]) ^ k2
	d := binary.LittleEndian.Uint64(parent[24:32]) ^ k3 ^ n<<32
	for len(tokens) >= 8 {
		t := tokens[:8:8]
		w0 := uint64(uint32(t[0])) | uint64(uint32(t[1]))<<32
		w1 := uint64(uint32(t[2])) | uint64(uint32(t[3]))<<32
		w2 := uint64(uint32(t[4])) | uint64(uint32(t[5]))<<32
		w3 := uint64(uint32(t[6])) | uint64(uint32(t[7]))<<32
		// Each lane reads the others' previous values: the four
		// multiplies of a round are independent.
		a, b, c, d = mix64(a^w0, k1^b), mix64(b^w1, k2^c), mix64(c^w2, k3^d), mix64(d^w3, k4^a)
		tokens = tokens[8:]
	}
	for _, tok := range tokens {
		a = mix64(a^uint64(uint32(tok)), k4^b)
		b, c, d = c, d, a
	}
	var out scheduler.BlockKey
	binary.LittleEndian.PutUint64(out[0:], mix64(a^k0, b^k4))
	binary.LittleEndian.PutUint64(out[8:], mix64(b^k1, c^k0))
	binary.LittleEndian.PutUint64(out[16:], mix64(c^k2, d^k1))
	binary.LittleEndian.PutUint64(out[24:], mix64(d^k3, a^k2))
	return out
}

// nodeIndex is a lookup key's index in Manager.nodes: its first 64 bits
// (the lanes are mixed, so any 64 of them are as good).
func nodeIndex(key scheduler.BlockKey) uint64 { return binary.LittleEndian.Uint64(key[:8]) }

// mix64 is the 128-bit product of a and b folded to 64 bits.
func mix64(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// lookupChild returns the block of the tree under lookup key key when it is
// parent's child holding exactly tokens, nil otherwise (a miss, or another
// block whose lookup key collides).
// A parent with few children (a prompt's chain has one) is scanned rather
// than the map asked: the same node (a lookup key names at most one block
// of the tree), without hashing the key again.
func (m *Manager) lookupChild(parent *node, key scheduler.BlockKey, tokens []int32) *node {
	if parent == nil {
		return nil
	}
	if len(parent.children) <= scanChildren {
		for _, c := range parent.children {
			if c.key == key && slices.Equal(c.tokens, tokens) {
				return c
			}
		}
		return nil
	}
	b := m.nodes[nodeIndex(key)]
	if b == nil || b.key != key || b.parent != parent || !slices.Equal(b.tokens, tokens) {
		return nil
	}
	return b
}

// scanChildren is the most children lookupChild scans.
const scanChildren = 8

// keyHasher computes block keys with a reusable encoding buffer, so that
// hashing a long prompt allocates nothing after warm-up.
type keyHasher struct {
	buf []byte
}

// key returns the lookup key of tokens under parent (LookupKeyOf).
func (h *keyHasher) key(parent scheduler.BlockKey, tokens []int32) scheduler.BlockKey {
	return LookupKeyOf(parent, tokens)
}

// sha returns SHA-256(parent ‖ tokens): the event hash.
func (h *keyHasher) sha(parent scheduler.BlockKey, tokens []int32) scheduler.BlockKey {
	n := len(parent) + 4*len(tokens)
	if cap(h.buf) < n {
		h.buf = make([]byte, n)
	}
	b := h.buf[:n]
	copy(b, parent[:])
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[len(parent)+4*i:], uint32(t))
	}
	return sha256.Sum256(b)
}

// EventHashAlgo is the block hash carried by KV cache events (§9.2).
type EventHashAlgo int

// Event hash algorithms.
const (
	// HashSHA256_64 (default): the first 8 key bytes, big-endian, as uint64.
	HashSHA256_64 EventHashAlgo = iota
	// HashSHA256: the lowercase hex of the whole key.
	HashSHA256
)

// String is the algorithm name carried in every event.
func (a EventHashAlgo) String() string {
	if a == HashSHA256 {
		return "sha256"
	}
	return "sha256_64"
}

// BlockHash64 is the sha256_64 event hash of a key: its first 8 bytes,
// big-endian.
func BlockHash64(key scheduler.BlockKey) uint64 {
	return binary.BigEndian.Uint64(key[:8])
}

// KeyHex is the lowercase hex of a key (the sha256 event hash).
func KeyHex(key scheduler.BlockKey) string { return hex.EncodeToString(key[:]) }
