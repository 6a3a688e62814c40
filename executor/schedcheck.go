package executor

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// Errors of the Helix schedule check (executor.md §11.6); both are fatal.
var (
	// ErrScheduleDivergence: CP ranks scheduled differently.
	ErrScheduleDivergence = errors.New("helix schedule divergence")
	// ErrIncompletePrompt: a context request does not hold its full prompt.
	ErrIncompletePrompt = errors.New("incomplete prompt")
)

// ScheduleCheckEnv is the variable that turns the check on.
const ScheduleCheckEnv = "TLLM_HELIX_AGG_CHECK_SCHEDULE"

// ParseScheduleCheckEnv reads ScheduleCheckEnv: "1" turns the check on,
// unset, empty or "0" leave it off. Any other value is an error naming the
// variable and the allowed values, so a typo never silently disables a
// debugging aid the user asked for.
func ParseScheduleCheckEnv(value string) (bool, error) {
	switch value {
	case "1":
		return true, nil
	case "", "0":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q is not allowed (allowed: \"1\" to check every iteration, \"0\" or unset for off)",
		ScheduleCheckEnv, value)
}

// ScheduleCheckGate decides at start-up whether the check applies: the
// variable is "1", Helix is on, cp > 1 and pp == 1. When the variable is
// set but another condition fails it returns a warning to log once.
func ScheduleCheckGate(value string, helix bool, cp, pp int) (on bool, warning string) {
	if value != "1" {
		return false, ""
	}
	var reason string
	switch {
	case !helix:
		reason = "Helix is off"
	case cp <= 1:
		reason = fmt.Sprintf("cp_size is %d", cp)
	case pp != 1:
		reason = fmt.Sprintf("pp_size is %d", pp)
	default:
		return true, ""
	}
	return false, ScheduleCheckEnv + "=1 is set but the schedule check does not apply (" + reason + ")"
}

// AgreeScheduleCheck is I2: the CP ranks agree on the flag with MIN and MAX;
// a difference fails every rank with the same error.
func AgreeScheduleCheck(comm nccl.Comm, local bool) error {
	v := int64(0)
	if local {
		v = 1
	}
	mn, err := comm.AllReduceInt64("schedule_check_min", nccl.ReduceMin, []int64{v})
	if err != nil {
		return err
	}
	mx, err := comm.AllReduceInt64("schedule_check_max", nccl.ReduceMax, []int64{v})
	if err != nil {
		return err
	}
	if mn[0] != mx[0] {
		return errors.New(ScheduleCheckEnv + " must be set identically on every CP rank")
	}
	return nil
}

// scheduleSummary is the rank-invariant summary of one pass (§11.6).
type scheduleSummary struct {
	iter       uint64
	contexts   []ctxEntry
	gens       []genEntry
	recomputed []uint64
	satOut     []uint64
}

type ctxEntry struct {
	id, position, chunk, totalInputLen, tokenLen uint64
	tokens                                       [32]byte
}

type genEntry struct{ id, g, capacity uint64 }

// summarize builds the summary of out; capacity reads the ledger capacity
// of a request after its allocation.
func summarize(iter int64, out *scheduler.Output, capacity func(id uint64) int) scheduleSummary {
	s := scheduleSummary{iter: uint64(iter)}
	buf := make([]byte, 0, 4096)
	for _, r := range out.Context {
		buf = buf[:0]
		for _, t := range r.Tokens {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
		s.contexts = append(s.contexts, ctxEntry{id: r.ID, position: uint64(r.ContextPosition),
			chunk: uint64(r.ChunkSize), totalInputLen: uint64(r.TotalInputLenCP), tokenLen: uint64(len(r.Tokens)),
			tokens: sha256.Sum256(buf)})
	}
	for _, r := range out.Generation {
		s.gens = append(s.gens, genEntry{id: r.ID, g: uint64(r.HelixDecodeCount), capacity: uint64(capacity(r.ID))})
	}
	for _, r := range out.RecomputePaused {
		s.recomputed = append(s.recomputed, r.ID)
	}
	for _, r := range out.SatOut {
		s.satOut = append(s.satOut, r.ID)
	}
	return s
}

// encode is the canonical little-endian byte form: magic HXS1, iter, then
// each section with its count.
func (s scheduleSummary) encode() []byte {
	b := append([]byte(nil), "HXS1"...)
	u := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	u(s.iter)
	u(uint64(len(s.contexts)))
	for _, c := range s.contexts {
		u(c.id)
		u(c.position)
		u(c.chunk)
		u(c.totalInputLen)
		u(c.tokenLen)
		b = append(b, c.tokens[:]...)
	}
	u(uint64(len(s.gens)))
	for _, g := range s.gens {
		u(g.id)
		u(g.g)
		u(g.capacity)
	}
	for _, ids := range [][]uint64{s.recomputed, s.satOut} {
		u(uint64(len(ids)))
		for _, id := range ids {
			u(id)
		}
	}
	return b
}

// decodeSummary parses encode's output.
func decodeSummary(b []byte) (scheduleSummary, error) {
	var s scheduleSummary
	if !bytes.HasPrefix(b, []byte("HXS1")) {
		return s, errors.New("collective desync: schedule summary without its HXS1 magic")
	}
	d := decoder{b: b[4:]}
	s.iter = d.u64()
	n := d.u64()
	for i := uint64(0); i < n && d.err == nil; i++ {
		c := ctxEntry{id: d.u64(), position: d.u64(), chunk: d.u64(), totalInputLen: d.u64(), tokenLen: d.u64()}
		copy(c.tokens[:], d.bytes(32))
		s.contexts = append(s.contexts, c)
	}
	n = d.u64()
	for i := uint64(0); i < n && d.err == nil; i++ {
		s.gens = append(s.gens, genEntry{id: d.u64(), g: d.u64(), capacity: d.u64()})
	}
	for _, dst := range []*[]uint64{&s.recomputed, &s.satOut} {
		n = d.u64()
		for i := uint64(0); i < n && d.err == nil; i++ {
			*dst = append(*dst, d.u64())
		}
	}
	if d.err != nil {
		return s, fmt.Errorf("collective desync: schedule summary does not decode: %w", d.err)
	}
	return s, nil
}

// firstDifference names the first field in which b differs from a.
func firstDifference(a, b scheduleSummary) (field, va, vb string) {
	if a.iter != b.iter {
		return "iteration", fmt.Sprint(a.iter), fmt.Sprint(b.iter)
	}
	if len(a.contexts) != len(b.contexts) {
		return "number of context requests", fmt.Sprint(len(a.contexts)), fmt.Sprint(len(b.contexts))
	}
	for i := range a.contexts {
		x, y := a.contexts[i], b.contexts[i]
		entry := fmt.Sprintf("context entry %d (request %d)", i, x.id)
		switch {
		case x.id != y.id:
			return "request id of context entry " + fmt.Sprint(i), fmt.Sprint(x.id), fmt.Sprint(y.id)
		case x.position != y.position:
			return "ContextPosition of " + entry, fmt.Sprint(x.position), fmt.Sprint(y.position)
		case x.chunk != y.chunk:
			return "ChunkSize of " + entry, fmt.Sprint(x.chunk), fmt.Sprint(y.chunk)
		case x.totalInputLen != y.totalInputLen:
			return "TotalInputLenCP of " + entry, fmt.Sprint(x.totalInputLen), fmt.Sprint(y.totalInputLen)
		case x.tokenLen != y.tokenLen:
			return "token-list length of " + entry, fmt.Sprint(x.tokenLen), fmt.Sprint(y.tokenLen)
		case x.tokens != y.tokens:
			return "token-list digest of " + entry, fmt.Sprintf("%x", x.tokens[:8]), fmt.Sprintf("%x", y.tokens[:8])
		}
	}
	if len(a.gens) != len(b.gens) {
		return "number of generation requests", fmt.Sprint(len(a.gens)), fmt.Sprint(len(b.gens))
	}
	for i := range a.gens {
		x, y := a.gens[i], b.gens[i]
		entry := fmt.Sprintf("generation entry %d (request %d)", i, x.id)
		switch {
		case x.id != y.id:
			return "request id of generation entry " + fmt.Sprint(i), fmt.Sprint(x.id), fmt.Sprint(y.id)
		case x.g != y.g:
			return "g of " + entry, fmt.Sprint(x.g), fmt.Sprint(y.g)
		case x.capacity != y.capacity:
			return "ledger capacity of " + entry, fmt.Sprint(x.capacity), fmt.Sprint(y.capacity)
		}
	}
	if fmt.Sprint(a.recomputed) != fmt.Sprint(b.recomputed) {
		return "recompute-paused ids", fmt.Sprint(a.recomputed), fmt.Sprint(b.recomputed)
	}
	if fmt.Sprint(a.satOut) != fmt.Sprint(b.satOut) {
		return "sat-out ids", fmt.Sprint(a.satOut), fmt.Sprint(b.satOut)
	}
	return "", "", ""
}

// checkSchedule is C4: one 32-byte digest allgather over the CP group every
// iteration; on a mismatch (an agreed vector, so every rank takes the same
// branch) a full summary allgather and an error naming the first differing
// field of every diverging rank against CP rank 0. After the digests agree,
// every context entry must hold its full prompt.
func checkSchedule(comm nccl.Comm, s scheduleSummary) error {
	enc := s.encode()
	d := sha256.Sum256(enc)
	all, err := comm.AllGather("schedule_digest", d[:])
	if err != nil {
		return err
	}
	same := true
	for _, x := range all {
		same = same && bytes.Equal(x, all[0])
	}
	if !same {
		full, err := comm.AllGather("schedule_summary", enc)
		if err != nil {
			return err
		}
		sums := make([]scheduleSummary, len(full))
		for r, b := range full {
			if sums[r], err = decodeSummary(b); err != nil {
				return err
			}
		}
		var msgs []string
		for r := 1; r < len(sums); r++ {
			if f, v0, vr := firstDifference(sums[0], sums[r]); f != "" {
				msgs = append(msgs, fmt.Sprintf("%s differs: rank 0 %s, rank %d %s", f, v0, r, vr))
			}
		}
		return fmt.Errorf("%w at iteration %d: %s", ErrScheduleDivergence, s.iter, joinSemicolon(msgs))
	}
	for _, c := range s.contexts {
		if c.tokenLen != c.totalInputLen {
			return fmt.Errorf("%w: context request %d does not hold its full prompt (%d of %d tokens)",
				ErrIncompletePrompt, c.id, c.tokenLen, c.totalInputLen)
		}
	}
	return nil
}

func joinSemicolon(s []string) string {
	var b bytes.Buffer
	for i, x := range s {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(x)
	}
	return b.String()
}
