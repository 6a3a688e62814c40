package fleet

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"go.uber.org/zap"

	"github.com/lockstep-ai/lockstep/bridge"
	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// runProcess runs this process's rank of a multi-process world (mpirun,
// srun, PMI or a torchrun-style launcher): one rank per process, the ranks
// meet through the process group's checked collectives under the watchdog.
// Rank 0 returns the result; the others return nil, nil.
func runProcess(o *Options, sc scheduler.Config, reqs []workload.Request, l nccl.Launch,
	log *zap.Logger, stderr io.Writer, getenv func(string) string) (*Result, error) {
	if err := o.checkMultiProcessHelix(l); err != nil {
		return nil, err
	}
	if o.CP <= 1 {
		if o.Ranks != 1 && o.Ranks != l.WorldSize && o.Sources.RanksSet {
			return nil, usage.Errorf("%s %d does not match the %s launch of %d processes (one rank per process)",
				o.Src("ranks"), o.Ranks, l.Launcher, l.WorldSize)
		}
		o.Ranks = l.WorldSize
	}
	log = log.With(zap.Int("rank", l.Rank))
	pg, err := nccl.OpenProcessGroup(l, nccl.GroupOptions{CollectiveTimeout: o.CollectiveTimeout, OpenMPI: nativeengine.OpenMPI,
		NCCL: controlPlaneNCCL(o.Engine, l.LocalRank, o.CollectiveTimeout), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("rank %d: joining the %s world of %d: %w", l.Rank, l.Launcher, l.WorldSize, err)
	}
	if l.Rank == 0 && o.API != nil {
		// A peer that dies makes the fleet's next collective hang; the
		// server answers its clients now instead.
		pg.OnPeerGone(o.API.PeerLost)
	}
	cpGroup, closeGroups, err := o.openProcessGroups(l, pg, getenv)
	if err != nil {
		return nil, err
	}
	defer closeGroups()
	setup := &rankSetup{o: o, sc: o.helixConfig(sc), cpGroup: cpGroup, log: log, rankTagged: true, fault: o.fault, td: newTeardown(),
		getenv: getenv}
	parts, err := setup.buildAndVote(l, pg)
	if err != nil {
		return nil, err
	}
	defer parts.close()
	start := time.Now()
	if l.Rank == 0 {
		o.logServing(log, len(reqs), zap.String("launcher", string(l.Launcher)))
		var prog *progress
		if o.API == nil {
			prog = newProgress(stderr, o.Progress, len(reqs))
			defer prog.done()
		}
		o.setSource(parts.ex, reqs, start, prog)
	}
	if cpGroup != nil {
		if err := executor.AgreeScheduleCheck(pg.Comm, parts.ex.ScheduleCheck()); err != nil {
			return nil, exitAfterCollectiveError(pg, l, err)
		}
	}
	res, err := parts.ex.Run()
	if err != nil {
		return nil, exitAfterCollectiveError(pg, l, err)
	}
	if err := pg.Close(); err != nil {
		return nil, err
	}
	if l.Rank != 0 {
		return nil, nil
	}
	return &Result{Rank0: res, Wall: time.Since(start), DeviceMS: []float64{res.DeviceMS}}, nil
}

// openProcessGroups opens this process's members of the engines' exchange
// groups, before anything that can fail on one rank only (their creation
// is collective; every rank that opened the process group reaches it): the
// Helix CP group (returned; nil without Helix), or the expert-parallel group
// of a MoE model (o.epGroup; EP and Helix exclude each other). On failure
// the process group is closed.
func (o *Options) openProcessGroups(l nccl.Launch, pg *nccl.ProcessGroup, getenv func(string) string) (cpGroup any, closeGroups func(), err error) {
	closeGroups = func() {}
	var what string
	switch {
	case o.CP > 1:
		what = "the Helix CP exchange group"
	case o.expertParallel(l.WorldSize):
		what = "the expert-parallel exchange group"
	default:
		return nil, closeGroups, nil
	}
	g, err := openProcessExchangeGroup(l, pg.Comm, o.CollectiveTimeout, getenv)
	if err != nil {
		pg.Close()
		return nil, closeGroups, fmt.Errorf("rank %d: opening %s: %w", l.Rank, what, err)
	}
	closeGroups = func() { g.Close() }
	if o.CP > 1 {
		return g, closeGroups, nil
	}
	o.epGroup = g
	return nil, closeGroups, nil
}

// buildAndVote builds this process's rank and votes on the outcome with
// every other rank, so that one failing rank makes all of them fail before
// any loop collective.
func (s *rankSetup) buildAndVote(l nccl.Launch, pg *nccl.ProcessGroup) (*rankParts, error) {
	parts, berr := s.build(l.Rank, l.LocalRank, pg.Comm, s.o.out.iterLog(l.Rank), s.o.out.eventSink(l.Rank))
	status := executor.InitOK
	if berr != nil {
		status = executor.InitAbort
		// Said before the vote: once the others learn of the failure they
		// exit, and a launcher may tear this process down before its
		// final message.
		s.log.Error("initialisation failed", zap.Error(berr))
	}
	if _, err := executor.InitVote(pg.Comm, status, berr); err != nil {
		if parts != nil {
			parts.close()
		}
		return nil, exitAfterCollectiveError(pg, l, err)
	}
	return parts, nil
}

// checkMultiProcessHelix checks --cp under a multi-process launch: one CP
// rank per process, every process in one CP group (world = cp), and an MPI
// launch, since the per-layer exchange of attention partials runs over MPI.
func (o *Options) checkMultiProcessHelix(l nccl.Launch) error {
	if o.CP <= 1 {
		return nil
	}
	if o.Sources.RanksSet && o.Ranks != 1 {
		return usage.Errorf("%s %d with %s %d: attention DP together with Helix (world = dp x cp) is not supported; "+
			"launch exactly %d processes, one CP rank each, without %s", o.Src("ranks"), o.Ranks, o.Src("cp"), o.CP, o.CP, o.Src("ranks"))
	}
	if l.WorldSize != o.CP {
		if l.WorldSize%o.CP == 0 {
			return usage.Errorf("%s %d under a %s launch of %d processes: attention DP together with Helix "+
				"(%d DP groups of %d CP ranks) is not supported; launch exactly %d processes, one CP rank each",
				o.Src("cp"), o.CP, l.Launcher, l.WorldSize, l.WorldSize/o.CP, o.CP, o.CP)
		}
		return usage.Errorf("%s %d under a %s launch of %d processes: Helix runs one CP rank per process; launch exactly %d processes",
			o.Src("cp"), o.CP, l.Launcher, l.WorldSize, o.CP)
	}
	return nil
}

// ExchangeHostEnv overrides the address a process listens on and advertises
// for the engines' in-step exchanges over TCP (launches without MPI).
const ExchangeHostEnv = "LOCKSTEP_EXCHANGE_HOST"

// openProcessExchangeGroup opens the group over which this process's engine
// exchanges data inside its steps with the other processes (one member per
// process, ranked as the launch ranks them): MPI under an MPI launch, else a
// TCP mesh whose addresses and secret travel through comm (the control
// plane, authenticated). The TCP listener binds $LOCKSTEP_EXCHANGE_HOST, else
// 127.0.0.1 when every rank runs on this node, else this host's name.
func openProcessExchangeGroup(l nccl.Launch, comm nccl.Comm, timeout time.Duration,
	getenv func(string) string) (*nativeengine.CPGroup, error) {
	if l.UsesMPI() {
		g, err := nativeengine.NewMPICPGroup(0, timeout)
		if err != nil {
			return nil, err
		}
		if g.Size() != l.WorldSize || g.LocalRank() != l.Rank {
			g.Close()
			return nil, fmt.Errorf("the MPI exchange group places this process at rank %d of %d, the %s launch at rank %d of %d",
				g.LocalRank(), g.Size(), l.Launcher, l.Rank, l.WorldSize)
		}
		return g, nil
	}
	host := getenv(ExchangeHostEnv)
	if host == "" {
		if l.LocalSize == l.WorldSize || l.LocalSize == 0 {
			host = "127.0.0.1"
		} else if h, err := os.Hostname(); err == nil {
			host = h
		} else {
			return nil, fmt.Errorf("no host to listen on for the exchange group (%v); set %s", err, ExchangeHostEnv)
		}
	}
	var secret []byte
	if l.Rank == 0 {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, err
		}
	}
	secret, err := comm.Broadcast("exchange_group_secret", 0, secret)
	if err != nil {
		return nil, err
	}
	return nativeengine.NewTCPCPGroup(l.Rank, l.WorldSize, host, secret, timeout, func(addr []byte) ([][]byte, error) {
		return comm.AllGather("exchange_group_addrs", addr)
	})
}

// exitAfterCollectiveError handles a failed multi-process rank. After a
// watchdog timeout a collective may still be blocked inside MPI and cannot
// be cancelled, so the group is not closed: the caller exits non-zero (and
// the launcher tears the other ranks down); rank 0 lingers a moment so that
// its peers can still read the watchdog reports from its store. Any other
// error (a mismatch, a schedule divergence, a failed init vote) leaves the
// ranks in step, so the group closes cleanly.
func exitAfterCollectiveError(pg *nccl.ProcessGroup, l nccl.Launch, err error) error {
	if !strings.HasPrefix(err.Error(), fmt.Sprintf("rank %d", l.Rank)) {
		err = fmt.Errorf("rank %d: %w", l.Rank, err)
	}
	// A timeout inside the engine's MoE exchanges leaves a peer's step
	// blocked in its own group the same way.
	if errors.Is(err, nccl.ErrTimeout) || errors.Is(err, bridge.ErrTimeout) {
		if l.Rank == 0 {
			time.Sleep(time.Second)
		}
		return err
	}
	pg.Close()
	return err
}
