package kvpool

import (
	"slices"
	"testing"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Internal tests of the event buffer's coalescing rules (kvcache.md §9.3)
// on hand-built blocks: EV-05 (the worked example), EV-06, EV-07.

// fakeBlock is a tree block named by its key's first byte.
func fakeBlock(id byte, parent *node) *node {
	var key scheduler.BlockKey
	key[0] = id
	return &node{key: key, hash: key, parent: parent, tokens: []int32{int32(id)}}
}

func TestEventWorkedExample(t *testing.T) {
	var b eventBuffer
	b.init(Config{NumPages: 4, TokensPerPage: 4, EventBufferMaxSize: 16})
	root := &node{isRoot: true}
	h1 := fakeBlock(1, root)
	h2 := fakeBlock(2, h1)
	h3 := fakeBlock(3, h2)
	h4 := fakeBlock(4, h3)
	h9 := fakeBlock(9, root)
	h9.tracked = true
	b.stored(h1, 4)
	b.stored(h2, 4)
	b.stored(h3, 4)
	b.removed(h9)
	b.stored(h4, 4)
	b.updated(h1, 0, 1)
	got := b.drain()
	kinds := []EventKind{EventCreated, EventStored, EventRemoved, EventStored, EventUpdated}
	if len(got) != len(kinds) {
		t.Fatalf("%d events, want %d", len(got), len(kinds))
	}
	for i, e := range got {
		if e.ID != uint64(i) || e.Kind != kinds[i] {
			t.Fatalf("event %d: id %d kind %s, want id %d kind %s", i, e.ID, e.Kind, i, kinds[i])
		}
	}
	if len(got[1].Blocks) != 3 || got[1].HasParent || got[1].Blocks[2].Hash != h3.hash {
		t.Errorf("first stored %+v, want [h1,h2,h3] without parent", got[1])
	}
	if !slices.Equal(got[2].Hashes, []scheduler.BlockKey{h9.hash}) {
		t.Errorf("removed %+v, want [h9]", got[2].Hashes)
	}
	if !got[3].HasParent || got[3].Parent != h3.hash || len(got[3].Blocks) != 1 {
		t.Errorf("second stored %+v, want parent h3, [h4]", got[3])
	}
	if got[4].Hash != h1.hash || got[4].FromLevel != 0 || got[4].ToLevel != 1 {
		t.Errorf("updated %+v", got[4])
	}
}

func TestUntrackedBlocksEmitNothing(t *testing.T) {
	var b eventBuffer
	b.init(Config{NumPages: 4, TokensPerPage: 4, EventBufferMaxSize: 16})
	b.drain()
	x := fakeBlock(7, &node{isRoot: true})
	b.updated(x, 0, 1) // EV-06
	b.removed(x)       // EV-07
	if got := b.drain(); len(got) != 0 || len(b.removedBuf) != 0 {
		t.Fatalf("untracked block produced %+v", got)
	}
}
