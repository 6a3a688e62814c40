package scheduler

// Exports for the external test package (scheduler_test), whose scenario
// tests use scheduler/sim, which imports this package.

// FakeKV is the scripted fake KV manager.
type FakeKV = fakeKV

// NewFakeKV returns a fake with P = 64, no host tier, reuse off, unlimited pool.
func NewFakeKV() *FakeKV { return newFakeKV() }

// SetPool sets the page size and pool size (0 = unlimited) and the host tier.
func (f *fakeKV) SetPool(tokensPerPage, pages int, host bool) {
	f.P, f.pages, f.host = tokensPerPage, pages, host
}

// Available is the GNE admission quantity (free − reserved pages).
func (f *fakeKV) Available() int { return f.available() }

// FailResize makes every ResizeContext of id fail while fail is true.
func (f *fakeKV) FailResize(id uint64, fail bool) {
	if !fail {
		f.resizeFn = nil
		return
	}
	f.resizeFn = resizeFailIDs(id)
}

// SetCostFloor overrides the equal-cost floor F (the reference's one-unit
// floor, for comparisons in W8/W13).
func (s *Scheduler) SetCostFloor(f int64) { s.st.cost.floor = f }

// Pages is the pool size (0 = unlimited).
func (f *fakeKV) Pages() int { return f.pages }
