package nccl

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// GroupOptions configures OpenProcessGroup.
type GroupOptions struct {
	// CollectiveTimeout is the watchdog timeout of every collective
	// (--collective-timeout); 0 disables it.
	CollectiveTimeout time.Duration
	// ConnectTimeout bounds the rendezvous (store, transport); 0 means 60s.
	ConnectTimeout time.Duration
	// OpenMPI opens the MPI transport (bridge/native.OpenMPI); required when
	// the launch uses MPI. Kept as a function so that this package stays free
	// of cgo.
	OpenMPI func() (Transport, error)
	// StoreHost is where rank 0 serves the watchdog's store under an MPI
	// launch (an address every rank can reach). "" picks MASTER_ADDR when
	// set, 127.0.0.1 when every rank runs on one node, else the host name.
	StoreHost string
	// NCCL, when set, carries the world's collectives (the checked protocol)
	// over an NCCL communicator: GPU deployments with --engine cuda on a
	// library built with NCCL. The MPI or TCP transport is still opened
	// first: it bootstraps the NCCL group (the unique id) and rank 0's store.
	// Nil keeps the CPU transports (MPI, TCP). A world of one process never
	// uses NCCL (it has no peers).
	NCCL *NCCLOptions
	// Logger receives the start-up warnings about the job token (unset
	// while rank 0's store and TCP data port accept connections, or short)
	// and, on rank 0, one line per connection closed for failing the hello.
	// nil logs nothing.
	Logger *zap.Logger
}

// ProcessGroup is this process's membership of a multi-process world: the
// transport, the checked protocol over it, the bootstrap store and the
// watchdog. Use Comm for every collective.
type ProcessGroup struct {
	// Launch is the placement the group was opened with.
	Launch Launch
	// Comm is the world communicator: the checked protocol under the
	// watchdog. Call Comm.SetIteration at the start of every iteration.
	Comm *Watchdog
	// Transport names what carries the collectives: "nccl", "mpi" or "tcp".
	Transport string

	checked *CheckedComm
	server  *StoreServer // rank 0
	client  *StoreClient
	board   *StoreBoard
}

// OpenProcessGroup joins the world described by l:
//
//   - an MPI launch (mpirun, PMI, srun) opens the MPI transport with
//     o.OpenMPI and checks that MPI agrees with the environment on the rank
//     and world size; rank 0 serves the watchdog's store on an ephemeral
//     port whose address travels through the transport itself;
//   - a torchrun-style launch serves the store on MASTER_ADDR:MASTER_PORT on
//     rank 0 and connects the TCP transport through it;
//   - a world of one process needs no peers (no store, no board).
//
// Rank 0's store and TCP data port admit a connection only after the hello
// (handshake.go): with l.JobToken set, a challenge–response over it (the
// same token must be set on every rank); without one, a start-up warning
// goes to o.Logger under a torchrun-style launch, where any process that
// reaches the ports could take part. Under MPI the store uses a session
// token drawn by rank 0 when l.JobToken is unset.
//
// Every rank must call it at the same point of start-up. On failure nothing
// is left open.
func OpenProcessGroup(l Launch, o GroupOptions) (g *ProcessGroup, err error) {
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 60 * time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	g = &ProcessGroup{Launch: l}
	defer func() {
		if err != nil {
			g.Close()
			g = nil
		}
	}()
	var t Transport
	switch {
	case l.WorldSize <= 1:
		t, err = NewTCPTransport(TCPOptions{Rank: 0, Size: 1})
	case l.UsesMPI():
		t, err = g.openMPI(o)
	default:
		t, err = g.openTCP(o)
	}
	if err != nil {
		return g, err
	}
	if o.NCCL != nil && l.WorldSize > 1 {
		nt, err := openNCCLOver(t, *o.NCCL)
		switch {
		case errors.Is(err, errNCCLFallback):
			o.Logger.Warn("control plane stays on the CPU transport", zap.Error(err))
		case err != nil:
			t.Close()
			return g, err
		default:
			t = nt
		}
	}
	g.Transport = transportName(t)
	g.checked = NewCheckedComm(t)
	var board PeerBoard
	if g.client != nil {
		g.board = NewStoreBoard(g.client, l.Rank, l.WorldSize, "lockstep/watchdog")
		board = g.board
	}
	g.Comm = NewWatchdog(g.checked, WatchdogOptions{Timeout: o.CollectiveTimeout, Board: board})
	return g, nil
}

// transportName names the transport t for reports and logs.
func transportName(t Transport) string {
	switch t.(type) {
	case *ncclTransport:
		return "nccl"
	case *TCPTransport:
		return "tcp"
	}
	return "mpi"
}

// openTCP is the torchrun-style rendezvous: rank 0 serves the store on
// MASTER_ADDR:MASTER_PORT and talks to it in process; the others dial it.
// Both the store and the TCP transport authenticate with the job token when
// it is set.
func (g *ProcessGroup) openTCP(o GroupOptions) (Transport, error) {
	l := g.Launch
	addr := net.JoinHostPort(l.MasterAddr, strconv.Itoa(l.MasterPort))
	warnJobToken(o.Logger, l.JobToken, addr)
	var err error
	if l.Rank == 0 {
		g.server, err = ListenStore(addr, StoreOptions{WorldSize: l.WorldSize, Token: l.JobToken, Logger: o.Logger})
		if err != nil {
			return nil, fmt.Errorf("rank 0 serves the bootstrap store on MASTER_ADDR:MASTER_PORT: %w", err)
		}
		g.client, err = g.server.LocalClient(o.ConnectTimeout)
	} else {
		g.client, err = DialStore(addr, StoreClientOptions{Rank: l.Rank, WorldSize: l.WorldSize, Token: l.JobToken,
			Timeout: o.ConnectTimeout})
	}
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", l.Rank, err)
	}
	t, err := NewTCPTransport(TCPOptions{Rank: l.Rank, Size: l.WorldSize, Store: g.client, Host: l.MasterAddr,
		ConnectTimeout: o.ConnectTimeout, Token: l.JobToken, Logger: o.Logger})
	if err != nil && g.server != nil {
		// A rank whose token differs failed at the store; say so in rank
		// 0's timeout too.
		if s := g.server.rejectSummary(); s != "" {
			err = fmt.Errorf("%w; %s", err, s)
		}
	}
	return t, err
}

// warnJobToken logs what the user should know about the job token of a job
// whose rank 0 serves the store at addr.
func warnJobToken(log *zap.Logger, token JobToken, addr string) {
	if !token.IsSet() {
		log.Warn(noTokenWarning(addr))
	} else if w := token.Warning(); w != "" {
		log.Warn(w)
	}
}

// openMPI opens the MPI transport and the watchdog's store beside it.
//
// The store is authenticated even without LOCKSTEP_JOB_TOKEN: rank 0 then
// draws a random session token and hands it to the other ranks with the
// store's address, through MPI (a channel the launcher set up, which no
// process outside the job is part of). A token set by the user is never
// sent. Every rank also states whether it has a token, so that a token set
// on some ranks only fails every rank with the same error.
func (g *ProcessGroup) openMPI(o GroupOptions) (Transport, error) {
	l := g.Launch
	if o.OpenMPI == nil {
		return nil, fmt.Errorf("started by %s with %d ranks, but this binary has no MPI transport (build with `make`, which enables ENGINE_MPI when Open MPI is installed)", l.Launcher, l.WorldSize)
	}
	t, err := o.OpenMPI()
	if err != nil {
		return nil, err
	}
	if t.Rank() != l.Rank || t.Size() != l.WorldSize {
		t.Close()
		return nil, fmt.Errorf("MPI places this process at rank %d of %d, the %s environment at rank %d of %d: was it started by another launcher?",
			t.Rank(), t.Size(), l.Launcher, l.Rank, l.WorldSize)
	}
	if w := l.JobToken.Warning(); w != "" {
		o.Logger.Warn(w)
	}
	// Rank 0 serves the store; its address (and the session token) reach
	// the others through the transport (one raw allgather, before the
	// checked protocol starts, so it is not in any trace).
	token := l.JobToken
	payload := [][]byte{[]byte("0")}
	if token.IsSet() {
		payload[0] = []byte("1")
	}
	if l.Rank == 0 {
		var session []byte
		if !token.IsSet() {
			token = newSessionToken()
			session = token.secret
		}
		s, err := ListenStore(net.JoinHostPort(g.storeHost(o), "0"), StoreOptions{WorldSize: l.WorldSize, Token: token, Logger: o.Logger})
		if err == nil {
			g.server = s
			payload = append(payload, []byte(s.Addr()), session)
		}
		// On failure rank 0 sends no address: every rank then fails the
		// same way instead of waiting for a store that does not exist.
	}
	got, err := t.AllGatherBytes(appendStrings(nil, payload...))
	var addr, session []byte
	if err == nil {
		addr, session, err = parseMPIRendezvous(got)
	}
	switch {
	case err != nil:
	case l.Rank == 0:
		g.client, err = g.server.LocalClient(o.ConnectTimeout)
	default:
		if !token.IsSet() {
			token = JobToken{secret: session}
		}
		g.client, err = DialStore(string(addr), StoreClientOptions{Rank: l.Rank, WorldSize: l.WorldSize, Token: token,
			Timeout: o.ConnectTimeout})
	}
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("rank %d: %w", l.Rank, err)
	}
	return t, nil
}

// parseMPIRendezvous reads the allgather of openMPI: every rank's token flag,
// and rank 0's store address and session token (empty when the user set a
// token). The checks depend only on the gathered vector, so every rank
// reaches the same verdict.
func parseMPIRendezvous(got [][]byte) (addr, session []byte, err error) {
	var with, without []int
	var root [][]byte
	for r, p := range got {
		strs, err := splitStrings(p)
		if err != nil || len(strs) == 0 {
			return nil, nil, fmt.Errorf("rank %d sent a malformed store rendezvous (is every rank running the same program?)", r)
		}
		if string(strs[0]) == "1" {
			with = append(with, r)
		} else {
			without = append(without, r)
		}
		if r == 0 {
			root = strs
		}
	}
	if len(with) > 0 && len(without) > 0 {
		return nil, nil, &authError{fmt.Sprintf("%s is set on ranks %v and not on ranks %v: set the same token on every rank, or on none",
			JobTokenEnv, with, without)}
	}
	if len(root) != 3 {
		return nil, nil, errors.New("rank 0 could not serve the watchdog's bootstrap store (set MASTER_ADDR to an address of rank 0's node)")
	}
	return root[1], root[2], nil
}

// storeHost picks where rank 0 serves the store under MPI.
func (g *ProcessGroup) storeHost(o GroupOptions) string {
	switch {
	case o.StoreHost != "":
		return o.StoreHost
	case g.Launch.MasterAddr != "":
		return g.Launch.MasterAddr
	case g.Launch.LocalSize == g.Launch.WorldSize || g.Launch.LocalSize == 0:
		return "127.0.0.1"
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return "127.0.0.1"
}

// OnPeerGone has f called with a rank whose process left the group (closed
// it, or died) while this rank's group is open; only rank 0, which serves
// the group's store, learns of it (elsewhere it is a no-op).
func (g *ProcessGroup) OnPeerGone(f func(rank int)) {
	if g.server != nil {
		g.server.OnRankGone(f)
	}
}

// Close leaves the group: the communicator (and its transport; under MPI
// this finalises MPI), the board, the store client and, on rank 0, the
// store. After a collective timed out, do not call Close under MPI: exit the
// process instead (the blocked call cannot be cancelled).
func (g *ProcessGroup) Close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if g.board != nil {
		keep(g.board.Close())
	}
	if g.Comm != nil {
		keep(g.Comm.Close())
	}
	if g.client != nil {
		keep(g.client.Close())
	}
	if g.server != nil {
		keep(g.server.Close())
	}
	return first
}
