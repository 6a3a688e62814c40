package router

// PopWaiting takes requests from the waiting queue for routing (spec §1.5).
//
// The budget is H·dp − Σ active: the fleet never holds more than H requests
// per rank on average. Items are examined first come first served until the
// budget is taken; a strict item whose target rank already holds H requests
// (counting the strict items taken before it in this pop) is put back.
// remaining is the put-back items, in order, followed by the items not
// examined, so put-backs keep their place at the front of the queue.
//
// taken and remaining are new slices; waiting is not modified. Both are nil
// when empty. Relaxed items are never put back, even when their target is
// full: routing balances them elsewhere.
func PopWaiting(waiting []Item, states []RankState, maxActivePerRank int) (taken, remaining []Item) {
	if len(waiting) == 0 {
		return nil, nil
	}
	dp := len(states)
	running := make([]int, dp)
	rankVectors(states, running, nil)
	budget := maxActivePerRank * dp
	for _, c := range running {
		budget -= c
	}
	i := 0
	for ; i < len(waiting) && len(taken) < budget; i++ {
		it := &waiting[i]
		t := it.target(dp)
		if it.Strict && t >= 0 {
			if running[t] >= maxActivePerRank {
				remaining = append(remaining, *it)
				continue
			}
			running[t]++
		}
		taken = append(taken, *it)
	}
	remaining = append(remaining, waiting[i:]...)
	return taken, remaining
}
