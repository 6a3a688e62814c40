package kvpool

import (
	"testing"

	"github.com/lockstep-ai/lockstep/scheduler"
)

func collisionReq(id uint64, tokens []int32) *scheduler.Request {
	return &scheduler.Request{ID: id, State: scheduler.ContextInit, PromptLen: len(tokens), Tokens: tokens,
		MaxNewTokens: 1, BatchIndex: scheduler.NoBatchIndex, UncachedEstimate: scheduler.UnsetEstimate}
}

// runPrompt prefills r in one chunk and closes its cache.
func runPrompt(t *testing.T, m *Manager, r *scheduler.Request) {
	t.Helper()
	if !m.PrepareContext(r) || !m.ResizeContext(r, r.PromptLen-r.ContextPosition) {
		t.Fatalf("admission of request %d failed", r.ID)
	}
	r.ContextPosition = r.PromptLen
	m.UpdateAfterContext(r)
	m.Free(r)
	if err := m.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestLookupKeyCollisionIsAMiss (issue 24, item 6): the radix tree is looked
// up by non-cryptographic lookup keys, so a hit is re-checked against the
// block's parent and tokens. A block filed under the lookup key of another
// prompt's block (a collision, forced here by re-filing the map entry) is
// neither matched for that prompt nor overwritten by its commit.
func TestLookupKeyCollisionIsAMiss(t *testing.T) {
	m, err := New(Config{NumPages: 16, TokensPerPage: 4, EnableBlockReuse: true, EventBufferMaxSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	a := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	runPrompt(t, m, collisionReq(1, a))
	b := []int32{11, 12, 13, 14, 15, 16, 17, 18, 19}
	root := m.roots[""]
	blockA := m.nodes[nodeIndex(LookupKeyOf(root.key, a[:4]))]
	if blockA == nil {
		t.Fatal("the first block of a is not in the tree")
	}
	keyB := LookupKeyOf(root.key, b[:4])
	m.nodes[nodeIndex(keyB)] = blockA // b's first block now collides with a's
	r := collisionReq(2, b)
	if got := m.ProbeReuse(r); got != 0 {
		t.Fatalf("a colliding block was reused: %d tokens", got)
	}
	if key, ok := m.ProbeFirstNewBlockKey(r); !ok || key != keyB {
		t.Fatal("the colliding block is not b's first new block")
	}
	if !m.PrepareContext(r) || r.ContextPosition != 0 || !m.ResizeContext(r, len(b)) {
		t.Fatalf("admission of b: position %d", r.ContextPosition)
	}
	r.ContextPosition = len(b)
	m.UpdateAfterContext(r)
	if m.nodes[nodeIndex(keyB)] != blockA {
		t.Fatal("committing b replaced the block filed under its lookup key")
	}
	delete(m.nodes, nodeIndex(keyB)) // undo the forced collision for the invariant check
	m.Free(r)
	if err := m.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	// Without the collision b is stored and matched as usual, and its
	// event hash is the §6.1 SHA-256 chain key.
	runPrompt(t, m, collisionReq(3, b))
	nb := m.nodes[nodeIndex(keyB)]
	if nb == nil || nb.hash != BlockKeyOf(RootKey(""), b[:4]) {
		t.Fatal("b's first block is not stored under its lookup key with its SHA-256 hash")
	}
	if got := m.ProbeReuse(collisionReq(4, b)); got != 8 {
		t.Fatalf("b reuses %d tokens, want 8", got)
	}
}
