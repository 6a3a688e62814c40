package structured

import (
	"container/list"
	"sync"
)

// Cache keeps the guides compiled for one vocabulary, most recently used
// first, so that requests with the same pattern (a schema used again, the
// ranks of one process) share a guide and its cached masks. Safe for
// concurrent use.
type Cache struct {
	vocab *Vocab
	limit int

	mu    sync.Mutex
	lru   *list.List // of *Guide, most recent first
	byPat map[string]*list.Element
}

// NewCache keeps up to limit guides (at least 1) for vocab.
func NewCache(vocab *Vocab, limit int) *Cache {
	return &Cache{vocab: vocab, limit: max(limit, 1), lru: list.New(), byPat: make(map[string]*list.Element)}
}

// Vocab is the cache's vocabulary.
func (c *Cache) Vocab() *Vocab { return c.vocab }

// Guide returns pattern's guide, compiling it on first use. A pattern
// that fails to compile is not kept.
func (c *Cache) Guide(pattern string) (*Guide, error) {
	c.mu.Lock()
	if el, ok := c.byPat[pattern]; ok {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		return el.Value.(*Guide), nil
	}
	c.mu.Unlock()
	g, err := Compile(pattern, c.vocab)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byPat[pattern]; ok { // compiled meanwhile by another caller
		c.lru.MoveToFront(el)
		return el.Value.(*Guide), nil
	}
	c.byPat[pattern] = c.lru.PushFront(g)
	for c.lru.Len() > c.limit {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.byPat, old.Value.(*Guide).pattern)
	}
	return g, nil
}
