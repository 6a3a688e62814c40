package kvpool

// Page copies (kvcache.md §2): the manager decides copies while it plans
// (migration to the host, resume from the host, copy-on-resume of a shared
// partial block) and hands them back as data; the executor submits them to
// the engine (eng_engine_copy_pages) on the compute stream.
//
// Ordering contract (the executor's side):
//
//  1. Drain with TakeCopies (or TakeCopyRuns) once per iteration, right
//     after scheduling and before the step is built, whether or not a
//     forward runs; submit the copies before this iteration's forward.
//  2. Submit them in list order. eng_engine_copy_pages takes one tier pair
//     per call, so submit each CopyRun in turn (CopyRuns keeps the order);
//     never regroup copies by tier pair across runs.
//  3. Copies run on the compute stream, so they are ordered after every
//     forward already launched and before every later one.
//
// Under this contract a page freed by the manager while a copy that reads
// it is still queued (a GPU page migrated to the host, a host page brought
// back, a shared partial page after copy-on-resume) may be handed out again
// at once: anything that writes it later is either a later copy in the same
// ordered list or a later forward, and both run after the queued copy has
// read it. Nothing reads or writes page memory between a TakeCopies and the
// submission. A page is never the destination of a copy while a sequence
// that is running (locked) reads it: copies only target freshly taken pages.

// PageCopy is one page copy: page SrcPage of SrcTier to page DstPage of
// DstTier.
type PageCopy struct {
	SrcTier Tier
	SrcPage int32
	DstTier Tier
	DstPage int32
}

// CopyRun is a maximal run of consecutive copies between the same pair of
// tiers: the arguments of one eng_engine_copy_pages call.
type CopyRun struct {
	SrcTier, DstTier Tier
	Src, Dst         []int32
}

// queueCopy records a copy for the executor.
func (m *Manager) queueCopy(src, dst pageLoc) {
	m.copies = append(m.copies, PageCopy{SrcTier: src.tier, SrcPage: src.page, DstTier: dst.tier, DstPage: dst.page})
}

// PendingCopies is the number of copies queued since the last TakeCopies.
func (m *Manager) PendingCopies() int { return len(m.copies) }

// TakeCopies returns the copies queued since the last call, in the order
// they must run, and clears the queue. The returned slice is valid until the
// next TakeCopies (the manager alternates two buffers, so steady state
// allocates nothing).
func (m *Manager) TakeCopies() []PageCopy {
	out := m.copies
	m.copies, m.copiesSpare = m.copiesSpare[:0], out
	return out
}

// TakeCopyRuns is TakeCopies grouped by CopyRuns.
func (m *Manager) TakeCopyRuns() []CopyRun { return CopyRuns(m.TakeCopies()) }

// CopyRuns splits copies into maximal runs of the same (source tier,
// destination tier), preserving order. Submitting the runs one after the
// other is equivalent to submitting the list in order.
func CopyRuns(copies []PageCopy) []CopyRun {
	var runs []CopyRun
	for _, c := range copies {
		if n := len(runs); n == 0 || runs[n-1].SrcTier != c.SrcTier || runs[n-1].DstTier != c.DstTier {
			runs = append(runs, CopyRun{SrcTier: c.SrcTier, DstTier: c.DstTier})
		}
		r := &runs[len(runs)-1]
		r.Src = append(r.Src, c.SrcPage)
		r.Dst = append(r.Dst, c.DstPage)
	}
	return runs
}
