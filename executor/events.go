package executor

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/kvpool"
)

// EventSink receives the published KV cache event stream on rank 0: JSON
// Lines records {iteration, rank, seq, type, ...}, in rank order per flush.
type EventSink = io.Writer

// EventPublisher publishes a rank's KV cache events (Config.EventPublisher).
// evs is valid during the call only.
type EventPublisher interface {
	PublishEvents(evs []kvpool.Event)
}

// addKVCacheEventsSynced is the rank-symmetric flush helper (executor.md §9):
//
//   - events off (no sink configured on this run, or the pool has no events):
//     nothing, no collective (R5) — a configuration value, equal everywhere;
//   - attention DP: every rank flushes on every call and joins the event
//     allgather (C9), even with nothing new (R3);
//   - otherwise: flush only when a previous batch was processed (R4).
//
// Every rank publishes its last EventBufferMaxSize events of the flush (the
// rest count as dropped); rank 0 merges the ranks' lists in rank order and
// writes them. Events produced while no flush runs stay pending (R7).
func (e *Executor) addKVCacheEventsSynced(processed bool) error {
	if !e.cfg.Events || !e.d.KV.EventsEnabled() {
		return nil
	}
	if !e.adp() && !processed {
		return nil
	}
	e.flushes++
	evs, cut := kvpool.LastEvents(e.d.KV.FlushIterationEvents(), e.cfg.EventBufferMaxSize)
	buf := e.eventBuf[:0]
	buf = binary.LittleEndian.AppendUint64(buf, uint64(cut))
	for i := range evs {
		buf = evs[i].AppendJSONL(buf, e.iter, e.cfg.Rank)
	}
	e.eventBuf = buf
	if !e.adp() {
		if e.cfg.Rank == 0 {
			e.publishEvents(evs)
			return e.writeEvents([][]byte{buf})
		}
		return nil
	}
	t := e.waitStart()
	all, err := e.d.Comm.AllGather("kv_events", buf)
	e.waitEnd(t)
	if err != nil {
		return err
	}
	e.publishEvents(evs)
	if e.cfg.Rank != 0 {
		return nil
	}
	return e.writeEvents(all)
}

// publishEvents hands a flush's published events to the publisher, if any.
func (e *Executor) publishEvents(evs []kvpool.Event) {
	if e.cfg.EventPublisher != nil && len(evs) > 0 {
		e.cfg.EventPublisher.PublishEvents(evs)
	}
}

// writeEvents appends the gathered per-rank event lists to the sink.
func (e *Executor) writeEvents(perRank [][]byte) error {
	for r, b := range perRank {
		if len(b) < 8 {
			return fmt.Errorf("collective desync: KV event payload of %d bytes from rank %d", len(b), r)
		}
		e.res.EventsDropped += int64(binary.LittleEndian.Uint64(b))
		if e.cfg.EventSink != nil && len(b) > 8 {
			if _, err := e.cfg.EventSink.Write(b[8:]); err != nil {
				return fmt.Errorf("--kv-events: %w", err)
			}
		}
	}
	return nil
}

// submitCopies hands the page copies the pool decided in this pass
// (suspensions to the host tier, resumes back) to the engine, in list order,
// before any later forward (kvcache.md §2: copies run in stream order).
func (e *Executor) submitCopies() error {
	for _, run := range e.d.KV.TakeCopyRuns() {
		if err := e.d.Engine.CopyPages(bridge.Tier(run.SrcTier), run.Src, bridge.Tier(run.DstTier), run.Dst); err != nil {
			return fmt.Errorf("page copies: %w", err)
		}
	}
	return nil
}
