package kvpool

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Block keys (kvcache.md §6.1) are a SHA-256 hash chain over a canonical
// byte encoding, so they are identical across processes, runs and ranks
// (never maphash or a random seed):
//
//	scope bytes = mask byte, then one little-endian uint64 per present field
//	              (bit 1 = cache salt: first 8 bytes of SHA-256(salt), LE)
//	root key    = SHA-256(scope bytes)
//	block key   = SHA-256(parent key ‖ token₀ ‖ … ‖ tokenₖ₋₁), tokens as LE uint32
//
// There is no token re-check on a key hit, so keys stay 256-bit.

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

// RootKey is the key of the radix root of a scope: SHA-256(scope bytes).
func RootKey(salt string) scheduler.BlockKey {
	return sha256.Sum256(ScopeBytes(salt))
}

// BlockKeyOf is SHA-256(parent ‖ tokens as LE uint32): the key of a block
// holding tokens under parent. It allocates; the manager uses a keyHasher.
func BlockKeyOf(parent scheduler.BlockKey, tokens []int32) scheduler.BlockKey {
	var h keyHasher
	return h.key(parent, tokens)
}

// keyHasher computes block keys with a reusable encoding buffer, so that
// hashing a long prompt allocates nothing after warm-up.
type keyHasher struct {
	buf []byte
}

// key returns SHA-256(parent ‖ tokens).
func (h *keyHasher) key(parent scheduler.BlockKey, tokens []int32) scheduler.BlockKey {
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
