package nccl

import (
	"fmt"
	"strconv"
	"strings"
)

// Launcher names what started this process (Launch.Launcher).
type Launcher string

// Launchers DetectLaunch recognises.
const (
	// LauncherSingle: no launcher environment; one process (which may still
	// run several in-process ranks with --ranks).
	LauncherSingle Launcher = "single"
	// LauncherOpenMPI: Open MPI's mpirun (OMPI_COMM_WORLD_*).
	LauncherOpenMPI Launcher = "openmpi"
	// LauncherPMI: a PMI launcher such as MPICH's Hydra (PMI_RANK, PMI_SIZE).
	LauncherPMI Launcher = "pmi"
	// LauncherSlurm: srun (SLURM_PROCID, SLURM_NTASKS).
	LauncherSlurm Launcher = "slurm"
	// LauncherTorchrun: torchrun or any launcher exporting RANK, WORLD_SIZE,
	// MASTER_ADDR and MASTER_PORT.
	LauncherTorchrun Launcher = "torchrun"
)

// Launch is where this process sits in the job, as its launcher describes it.
type Launch struct {
	Launcher Launcher
	// Rank is this process's index in the world, WorldSize the process count.
	Rank, WorldSize int
	// LocalRank is the index among the processes of this node (the GPU to
	// use); LocalSize their number, 0 when the launcher does not say. A
	// launcher that gives no local rank is taken to run one node: LocalRank
	// is then Rank.
	LocalRank, LocalSize int
	// MasterAddr and MasterPort locate rank 0's bootstrap store (torchrun;
	// also read, when set, under the other launchers).
	MasterAddr string
	MasterPort int
	// JobToken is LOCKSTEP_JOB_TOKEN (the zero token when unset): the secret
	// that authenticates the ranks to each other at rank 0's bootstrap store
	// and TCP data port. It renders as "[job token set]" in every format.
	JobToken JobToken
}

// UsesMPI reports whether the processes should meet through MPI (started by
// an MPI launcher or srun) rather than the TCP transport.
func (l Launch) UsesMPI() bool {
	switch l.Launcher {
	case LauncherOpenMPI, LauncherPMI, LauncherSlurm:
		return l.WorldSize > 1
	}
	return false
}

// MultiProcess reports whether the world has more than one process.
func (l Launch) MultiProcess() bool { return l.WorldSize > 1 }

// String renders the placement for logs.
func (l Launch) String() string {
	return fmt.Sprintf("%s rank %d/%d (local %d/%d)", l.Launcher, l.Rank, l.WorldSize, l.LocalRank, l.LocalSize)
}

// launcherVars is one launcher's environment: which variables hold the rank,
// the world size, the local rank and the local size ("" = not provided), in
// order of preference where several spellings exist.
type launcherVars struct {
	name      Launcher
	rank      string
	size      string
	localRank []string
	localSize []string
}

// launchers lists the launchers in detection order. The first one whose rank
// or size variable is set wins.
var launchers = []launcherVars{
	{LauncherOpenMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
		[]string{"OMPI_COMM_WORLD_LOCAL_RANK"}, []string{"OMPI_COMM_WORLD_LOCAL_SIZE"}},
	{LauncherPMI, "PMI_RANK", "PMI_SIZE",
		[]string{"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}, []string{"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}},
	{LauncherSlurm, "SLURM_PROCID", "SLURM_NTASKS",
		[]string{"SLURM_LOCALID"}, nil},
	{LauncherTorchrun, "RANK", "WORLD_SIZE",
		[]string{"LOCAL_RANK"}, []string{"LOCAL_WORLD_SIZE"}},
}

// DetectLaunch reads the launcher's environment through getenv (os.Getenv
// in the worker, a map in tests). Launchers are tried in the order Open MPI,
// PMI, Slurm, torchrun; none means a single process. Inconsistent or
// non-numeric values are an error naming the variable, never a guess: a
// process that misplaces itself would pair its collectives with the wrong
// peers.
//
// One exception to the order: a Slurm step of one task that also carries a
// torchrun-style world (torchrun started inside salloc/sbatch) is a torchrun
// launch, since the Slurm variables describe the allocation's batch step,
// not the processes torchrun started.
func DetectLaunch(getenv func(string) string) (Launch, error) {
	for _, lv := range launchers {
		if getenv(lv.rank) == "" && getenv(lv.size) == "" {
			continue
		}
		if lv.name == LauncherSlurm && getenv("SLURM_NTASKS") == "1" && getenv("WORLD_SIZE") != "" {
			continue
		}
		return lv.detect(getenv)
	}
	return Launch{Launcher: LauncherSingle, WorldSize: 1, LocalSize: 1}, nil
}

// detect reads one launcher's variables.
func (lv launcherVars) detect(getenv func(string) string) (Launch, error) {
	l := Launch{Launcher: lv.name}
	fail := func(format string, args ...any) (Launch, error) {
		return Launch{}, fmt.Errorf("launcher %s: %s", lv.name, fmt.Sprintf(format, args...))
	}
	var err error
	if l.WorldSize, err = envInt(getenv, lv.size, true); err != nil {
		return fail("%v", err)
	}
	if l.Rank, err = envInt(getenv, lv.rank, true); err != nil {
		return fail("%v", err)
	}
	if l.WorldSize < 1 {
		return fail("%s=%d: the world needs at least one process", lv.size, l.WorldSize)
	}
	if l.Rank < 0 || l.Rank >= l.WorldSize {
		return fail("%s=%d is outside [0, %s=%d)", lv.rank, l.Rank, lv.size, l.WorldSize)
	}
	localRankVar, localSizeVar := "", ""
	l.LocalRank, localRankVar, err = firstInt(getenv, lv.localRank)
	if err != nil {
		return fail("%v", err)
	}
	l.LocalSize, localSizeVar, err = firstInt(getenv, lv.localSize)
	if err != nil {
		return fail("%v", err)
	}
	if localRankVar == "" {
		// Unknown: assume one node (the local rank picks the GPU).
		l.LocalRank = l.Rank
		if l.WorldSize == 1 {
			l.LocalSize = 1
		}
	}
	if localSizeVar != "" {
		if l.LocalSize < 1 || l.LocalSize > l.WorldSize {
			return fail("%s=%d is outside [1, %s=%d]", localSizeVar, l.LocalSize, lv.size, l.WorldSize)
		}
		if l.LocalRank >= l.LocalSize {
			return fail("%s=%d is outside [0, %s=%d)", localRankVar, l.LocalRank, localSizeVar, l.LocalSize)
		}
	}
	if localRankVar != "" && (l.LocalRank < 0 || l.LocalRank >= l.WorldSize) {
		return fail("%s=%d is outside [0, %s=%d)", localRankVar, l.LocalRank, lv.size, l.WorldSize)
	}
	l.MasterAddr = strings.TrimSpace(getenv("MASTER_ADDR"))
	l.JobToken = NewJobToken(getenv(JobTokenEnv))
	if l.MasterPort, err = envInt(getenv, "MASTER_PORT", false); err != nil {
		return fail("%v", err)
	}
	if l.MasterPort < 0 || l.MasterPort > 65535 {
		return fail("MASTER_PORT=%d is not a TCP port", l.MasterPort)
	}
	if lv.name == LauncherTorchrun && l.WorldSize > 1 {
		if l.MasterAddr == "" {
			return fail("MASTER_ADDR is not set: rank 0's bootstrap store needs an address every rank can reach")
		}
		if l.MasterPort == 0 {
			return fail("MASTER_PORT is not set: rank 0's bootstrap store needs a port")
		}
	}
	return l, nil
}

// envInt parses the variable name; a missing variable is an error when
// required and 0 otherwise.
func envInt(getenv func(string) string, name string, required bool) (int, error) {
	s := strings.TrimSpace(getenv(name))
	if s == "" {
		if required {
			return 0, fmt.Errorf("%s is not set", name)
		}
		return 0, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not an integer", name, s)
	}
	return v, nil
}

// firstInt parses the first set variable of names and returns its name too
// ("" when none is set).
func firstInt(getenv func(string) string, names []string) (int, string, error) {
	for _, n := range names {
		if strings.TrimSpace(getenv(n)) == "" {
			continue
		}
		v, err := envInt(getenv, n, true)
		return v, n, err
	}
	return 0, "", nil
}
