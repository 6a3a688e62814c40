// Command mpiprog is the test program of tests/mpirun_test.go and
// tests/launch_test.go: one rank of a multi-process world, started by mpirun
// (MPI transport) or with torchrun-style variables (TCP transport), that runs
// a few iterations of collectives through nccl.OpenProcessGroup and checks
// every result. A scenario injects a fault at iteration 2:
//
//	ok        no fault
//	mismatch  the last rank enters broadcast:"arrivals" where the others enter
//	          allgather:"batch_size"
//	stop      rank 1 stops (sleeps for -stop-for, then exits 3)
//	idle      no fault; after every iteration the ranks meet at the idle
//	          doorbell (nccl.IdleWaiter), rank 0 ringing after a nap: the
//	          others must wait for the ring without spinning, give up at
//	          their timeout at iteration 1 (rank 0 naps past it) and drop
//	          that late ring at iteration 2
//
// Each rank writes one line to <out>/rank-<r>.txt: "OK <trace digest>" or
// "ERROR after <ms>ms: <error>", and exits 0 (OK), 1 (an error) or 2 (a
// collective timeout, without closing: the blocked call cannot be cancelled).
package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/internal/cputime"
	"github.com/lockstep-ai/lockstep/nccl"
)

func main() {
	scenario := flag.String("scenario", "ok", "ok | mismatch | stop | idle")
	timeout := flag.Duration("timeout", 3*time.Second, "collective timeout")
	stopFor := flag.Duration("stop-for", 10*time.Second, "how long the stopped rank sleeps")
	iterations := flag.Int("iterations", 5, "iterations")
	out := flag.String("out", ".", "directory for the per-rank result files")
	flag.Parse()

	l, err := nccl.DetectLaunch(os.Getenv)
	if err != nil {
		fail(*out, -1, time.Now(), err)
	}
	g, err := nccl.OpenProcessGroup(l, nccl.GroupOptions{CollectiveTimeout: *timeout,
		ConnectTimeout: 30 * time.Second, OpenMPI: native.OpenMPI})
	if err != nil {
		fail(*out, l.Rank, time.Now(), err)
	}
	start := time.Now()
	if err := run(g, *scenario, *iterations, *stopFor); err != nil {
		report(*out, l.Rank, start, err)
		if errors.Is(err, nccl.ErrTimeout) {
			// No Close: the blocked call cannot be cancelled. Linger a moment
			// before exiting: rank 0 serves the store the other ranks read
			// their reports from, and under mpirun the first exit makes the
			// launcher kill every rank, perhaps before it has reported.
			time.Sleep(time.Second)
			os.Exit(2)
		}
		g.Close() // the group is still paired after a mismatch
		os.Exit(1)
	}
	digest := sha256.New()
	for _, e := range g.Comm.Trace() {
		fmt.Fprintf(digest, "%d %s\n", e.Seq, e)
	}
	if err := g.Close(); err != nil {
		fail(*out, l.Rank, start, err)
	}
	write(*out, l.Rank, fmt.Sprintf("OK %x\n", digest.Sum(nil)))
}

// run is the iteration loop with its checks.
func run(g *nccl.ProcessGroup, scenario string, iterations int, stopFor time.Duration) error {
	c := g.Comm
	r, size := c.Rank(), c.Size()
	for it := range iterations {
		c.SetIteration(int64(it))
		if it == 2 && scenario == "stop" && r == 1 {
			time.Sleep(stopFor)
			os.Exit(3)
		}
		if it == 2 && scenario == "mismatch" && r == size-1 {
			if _, err := c.Broadcast("arrivals", 0, nil); err != nil {
				return err
			}
			return errors.New("the injected mismatch went unnoticed")
		}
		// Variable-size allgather: rank p sends p+it bytes of value p.
		got, err := c.AllGather("batch_size", bytes.Repeat([]byte{byte(r)}, r+it))
		if err != nil {
			return err
		}
		for p := range size {
			if !bytes.Equal(got[p], bytes.Repeat([]byte{byte(p)}, p+it)) {
				return fmt.Errorf("iteration %d: allgather[%d] = %v", it, p, got[p])
			}
		}
		root := it % size
		b, err := c.Broadcast("arrivals", root, []byte(fmt.Sprintf("arrivals of %d at %d", r, it)))
		if err != nil {
			return err
		}
		if want := fmt.Sprintf("arrivals of %d at %d", root, it); string(b) != want {
			return fmt.Errorf("iteration %d: broadcast = %q, want %q", it, b, want)
		}
		sum, err := c.AllReduceInt64("init_status", nccl.ReduceSum, []int64{int64(r), 1})
		if err != nil {
			return err
		}
		mx, err := c.AllReduceInt64("init_status", nccl.ReduceMax, []int64{int64(r), -int64(r)})
		if err != nil {
			return err
		}
		if want := []int64{int64(size * (size - 1) / 2), int64(size)}; !slices.Equal(sum, want) {
			return fmt.Errorf("iteration %d: allreduce sum = %v, want %v", it, sum, want)
		}
		if want := []int64{int64(size - 1), 0}; !slices.Equal(mx, want) {
			return fmt.Errorf("iteration %d: allreduce max = %v, want %v", it, mx, want)
		}
		if scenario == "idle" {
			if err := idleRound(c, r, it); err != nil {
				return err
			}
		}
	}
	return nil
}

// idleRound is the idle scenario's doorbell after iteration it. Rank 0
// naps, then rings; every other rank must have waited for the ring (at
// least most of the nap: a rank that returned sooner took an old ring, or
// none), asleep (its process used under half the wait in CPU; spinning in
// MPI uses all of it). At iteration 1 rank 0 naps past the others'
// timeout, so they give up early; iteration 2 then checks that its late
// ring was dropped.
func idleRound(c nccl.IdleWaiter, rank, it int) error {
	const poll = 500 * time.Microsecond
	nap, timeout := 150*time.Millisecond, 10*time.Second
	if it == 1 {
		nap, timeout = 400*time.Millisecond, 50*time.Millisecond
	}
	if rank == 0 {
		time.Sleep(nap)
		return c.IdleWait(0, poll, timeout)
	}
	cpu0, _ := cputime.Process()
	t0 := time.Now()
	if err := c.IdleWait(0, poll, timeout); err != nil {
		return err
	}
	wall := time.Since(t0)
	cpu, _ := cputime.Process()
	cpu -= cpu0
	switch {
	case it == 1 && (wall < timeout || wall > nap-100*time.Millisecond):
		return fmt.Errorf("iteration 1: the idle wait with a %v timeout took %v (rank 0 rang after %v)", timeout, wall, nap)
	case it != 1 && wall < nap-50*time.Millisecond:
		return fmt.Errorf("iteration %d: the idle wait returned after %v, before rank 0 rang (after %v)", it, wall, nap)
	case cpu > wall/2:
		return fmt.Errorf("iteration %d: the idle wait of %v used %v of CPU", it, wall, cpu)
	}
	return nil
}

// report records err on stderr and in the rank's result file.
func report(out string, rank int, start time.Time, err error) {
	fmt.Fprintf(os.Stderr, "rank %d: %v\n", rank, err)
	write(out, rank, fmt.Sprintf("ERROR after %dms: %v\n", time.Since(start).Milliseconds(), err))
}

// fail reports err and exits 1.
func fail(out string, rank int, start time.Time, err error) {
	report(out, rank, start, err)
	os.Exit(1)
}

func write(out string, rank int, line string) {
	name := filepath.Join(out, fmt.Sprintf("rank-%d.txt", rank))
	if err := os.WriteFile(name, []byte(line), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", rank, err)
	}
}
