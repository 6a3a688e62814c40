package workload

import "fmt"

// Conversation inference for traces without conversation ids (Mooncake).
//
// A later turn of a chat resends the whole conversation so far: the previous
// prompt, the previous answer and the new message. In hash-id terms the new
// prompt starts with every block of the previous prompt except possibly the
// last one: a partial last block is re-hashed once the conversation grows
// past it. So a request continues an earlier request when the earlier
// request's hash ids minus its last block (its "chain") are a prefix of the
// request's hash ids. Dropping the last block unconditionally, rather than
// only when it is partial, keeps the rule independent of --length-scale
// (scaling can make a partial block look full) and loses nothing: a full
// last block that the new turn repeats still matches one block deeper.
//
// Blocks every request starts with are not evidence of a conversation: in
// the Mooncake conversation trace every prompt begins with block 0 (a shared
// system prompt), and a short request whose chain is just that block would
// otherwise swallow every later request. The shared preamble is the longest
// prefix common to all requests of the input; a chain counts only if it is
// longer than the preamble.
//
// The rule is causal (a request looks only at earlier requests, in trace
// order) and deterministic: among the earlier requests whose chain is a
// prefix of this request's hash ids, the one with the longest chain wins
// (the most recent turn of the conversation), and among equal chains the
// latest request (identical retries and branches follow the newest one).
//
// Limitation: when the whole input is a single conversation, its first
// turn's chain is the common prefix of all requests and is taken for a
// preamble, so the second turn starts a new conversation (the third turn
// continues the second). Real traces mix many conversations.

// ConversationStats summarises an InferConversations run.
type ConversationStats struct {
	// PreambleBlocks is the number of leading blocks shared by every request
	// (ignored as conversation evidence).
	PreambleBlocks int
	// Continued counts requests without an id that were found to continue
	// an earlier request.
	Continued int
	// Started counts requests without an id that start a new conversation.
	Started int
}

// InferConversations sets ConversationID on every request of reqs that has
// none (reqs in trace order). A request that continues an earlier one (see
// the rule above) takes that request's conversation id, given or inferred;
// any other request starts a conversation named "conv-<Index>" after its
// own trace index. Requests that already carry an id keep it and can be
// continued like any other.
func InferConversations(reqs []Request) ConversationStats {
	st := ConversationStats{PreambleBlocks: commonPrefixBlocks(reqs)}
	t := newChainTrie()
	for i := range reqs {
		r := &reqs[i]
		if r.ConversationID == "" {
			if j := t.longestOwner(r.HashIDs, st.PreambleBlocks); j >= 0 {
				r.ConversationID = reqs[j].ConversationID
				st.Continued++
			} else {
				r.ConversationID = fmt.Sprintf("conv-%d", r.Index)
				st.Started++
			}
		}
		if n := len(r.HashIDs) - 1; n > st.PreambleBlocks {
			t.own(r.HashIDs[:n], i)
		}
	}
	return st
}

// commonPrefixBlocks is the length of the longest hash-id prefix shared by
// every request; 0 for fewer than two requests (one request shares nothing).
func commonPrefixBlocks(reqs []Request) int {
	if len(reqs) < 2 {
		return 0
	}
	n := len(reqs[0].HashIDs)
	for _, r := range reqs[1:] {
		n = min(n, len(r.HashIDs))
		for k := 0; k < n; k++ {
			if r.HashIDs[k] != reqs[0].HashIDs[k] {
				n = k
				break
			}
		}
	}
	return n
}

// chainTrie is a trie over hash-id prefixes. Node 0 is the empty prefix;
// owner[n] is the latest request whose chain ends at node n, or -1.
type chainTrie struct {
	child map[trieEdge]int32
	owner []int
}

type trieEdge struct {
	parent int32
	hash   uint64
}

func newChainTrie() *chainTrie {
	return &chainTrie{child: make(map[trieEdge]int32), owner: []int{-1}}
}

// longestOwner returns the owner of the deepest node on the path of h at a
// depth greater than minDepth, or -1.
func (t *chainTrie) longestOwner(h []uint64, minDepth int) int {
	best, node := -1, int32(0)
	for d, x := range h {
		next, ok := t.child[trieEdge{node, x}]
		if !ok {
			break
		}
		node = next
		if d+1 > minDepth && t.owner[node] >= 0 {
			best = t.owner[node]
		}
	}
	return best
}

// own records request i as the latest owner of chain, creating its path.
func (t *chainTrie) own(chain []uint64, i int) {
	node := int32(0)
	for _, x := range chain {
		e := trieEdge{node, x}
		next, ok := t.child[e]
		if !ok {
			next = int32(len(t.owner))
			t.owner = append(t.owner, -1)
			t.child[e] = next
		}
		node = next
	}
	t.owner[node] = i
}
