package router

// lru is a bounded map string → int64 with least-recently-used eviction
// (spec §3.1): a lookup that uses an entry, or a write, makes it most recent;
// beyond capacity the oldest entry is evicted. Recency is a doubly linked
// list over a slab of nodes, so eviction order never depends on Go map
// iteration, and a full map reuses the evicted node instead of allocating.
type lru struct {
	capacity int
	index    map[string]int32
	nodes    []lruNode
	head     int32 // most recent; nilNode when empty
	tail     int32 // least recent; nilNode when empty
}

type lruNode struct {
	key        string
	val        int64
	prev, next int32
}

const nilNode int32 = -1

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, index: make(map[string]int32), head: nilNode, tail: nilNode}
}

// len is the number of entries.
func (l *lru) len() int { return len(l.index) }

// peek returns the value of k without changing its recency.
func (l *lru) peek(k string) (int64, bool) {
	n, ok := l.index[k]
	if !ok {
		return 0, false
	}
	return l.nodes[n].val, true
}

// has reports whether k is present, without changing its recency.
func (l *lru) has(k string) bool {
	_, ok := l.index[k]
	return ok
}

// touch makes k most recent if present.
func (l *lru) touch(k string) {
	if n, ok := l.index[k]; ok {
		l.unlink(n)
		l.pushFront(n)
	}
}

// put writes k = v, makes k most recent and evicts the oldest entry when the
// capacity is exceeded.
func (l *lru) put(k string, v int64) {
	if n, ok := l.index[k]; ok {
		l.nodes[n].val = v
		l.unlink(n)
		l.pushFront(n)
		return
	}
	var n int32
	if len(l.index) >= l.capacity {
		n = l.tail // reuse the evicted node
		l.unlink(n)
		delete(l.index, l.nodes[n].key)
	} else {
		n = int32(len(l.nodes))
		l.nodes = append(l.nodes, lruNode{})
	}
	l.nodes[n] = lruNode{key: k, val: v, prev: nilNode, next: nilNode}
	l.index[k] = n
	l.pushFront(n)
}

// keys returns the keys, most recent first (diagnostics and tests).
func (l *lru) keys() []string {
	out := make([]string, 0, len(l.index))
	for n := l.head; n != nilNode; n = l.nodes[n].next {
		out = append(out, l.nodes[n].key)
	}
	return out
}

func (l *lru) unlink(n int32) {
	nd := &l.nodes[n]
	if nd.prev != nilNode {
		l.nodes[nd.prev].next = nd.next
	} else {
		l.head = nd.next
	}
	if nd.next != nilNode {
		l.nodes[nd.next].prev = nd.prev
	} else {
		l.tail = nd.prev
	}
	nd.prev, nd.next = nilNode, nilNode
}

func (l *lru) pushFront(n int32) {
	l.nodes[n].prev = nilNode
	l.nodes[n].next = l.head
	if l.head != nilNode {
		l.nodes[l.head].prev = n
	}
	l.head = n
	if l.tail == nilNode {
		l.tail = n
	}
}
