package scheduler

// This file is the prefix-aware skip (spec §8): when two first-chunk
// requests share a prefix that is not cached yet, the second waits one pass
// and then reuses the blocks the first one committed.

// prefixSkip holds the registered first-new-block keys of one pass. The set
// is cleared at the start of every pass; it is only ever queried for
// membership, so map order never matters.
type prefixSkip struct {
	on   bool // probing in this pass
	keys map[BlockKey]struct{}
}

// begin decides whether this pass probes: the feature is on (prefix-aware
// scheduling, block reuse, ALL_REUSABLE) and pending holds at least two first
// chunks, or one first chunk and one continuation.
func (p *prefixSkip) begin(s *Scheduler) {
	clear(p.keys)
	p.on = false
	if !s.cfg.PrefixAware || len(s.pending) < 2 {
		return
	}
	first, cont := 0, 0
	for _, idx := range s.pending {
		if s.list[idx].State == ContextInit {
			first++
		} else {
			cont++
		}
	}
	if first == 0 || first+cont < 2 {
		return
	}
	p.on = s.kv.BlockReuseEnabled() && s.kv.ReusePolicy() == AllReusable
}

// probe returns the first-new-block key of a first-chunk request (before
// PrepareContext and any allocation), when probing.
func (p *prefixSkip) probe(s *Scheduler, r *Request) (BlockKey, bool) {
	if !p.on || r.State != ContextInit {
		return BlockKey{}, false
	}
	return s.kv.ProbeFirstNewBlockKey(r)
}

// registered reports whether key belongs to a request scheduled earlier in this pass.
func (p *prefixSkip) registered(key BlockKey) bool {
	_, ok := p.keys[key]
	return ok
}

// register adds the key of a SCHEDULED context request: the key probed before
// scheduling for a first chunk, a fresh probe for a continuation.
func (p *prefixSkip) register(s *Scheduler, r *Request, key BlockKey, ok bool) {
	if !p.on {
		return
	}
	if r.State != ContextInit {
		key, ok = s.kv.ProbeFirstNewBlockKey(r)
	}
	if ok {
		p.keys[key] = struct{}{}
	}
}
