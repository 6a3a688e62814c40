package nccl

import (
	"errors"
	"fmt"
)

// NCCLIDBytes is the size of an NCCL unique id (ncclUniqueId).
const NCCLIDBytes = 128

// NCCLOptions selects the NCCL transport for the control plane (GPU
// deployments: --engine cuda on a library built with NCCL). The functions
// come from bridge/native (UniqueID = eng_comm_nccl_unique_id, Open =
// eng_comm_init_nccl on the rank's device with a bounded wait), so that this
// package stays free of cgo; tests pass fakes.
type NCCLOptions struct {
	// UniqueID makes a fresh NCCL unique id (called on rank 0 only).
	UniqueID func() ([]byte, error)
	// Open joins the NCCL group named by id as rank of size.
	Open func(id []byte, rank, size int) (Transport, error)
	// Fallback: when rank 0 cannot make an id (a library built without
	// NCCL), every rank keeps the CPU transport instead of failing. The
	// decision reads only what rank 0 sent in the bootstrap allgather, so
	// every rank makes the same one.
	Fallback bool
}

// errNCCLFallback: rank 0 could not make an id and Fallback is set.
var errNCCLFallback = errors.New("nccl transport unavailable")

// ncclTransport is the NCCL transport stacked on the CPU transport that
// bootstrapped it (MPI or TCP): collectives go over NCCL, Close closes both
// (the NCCL communicator first).
type ncclTransport struct {
	Transport           // NCCL
	boot      Transport // MPI or TCP, idle after the bootstrap
}

// Close leaves the NCCL group, then the bootstrap transport.
func (t *ncclTransport) Close() error {
	return errors.Join(t.Transport.Close(), t.boot.Close())
}

// openNCCLOver bootstraps an NCCL group over boot: rank 0 makes the unique
// id and every rank receives it in one raw allgather of boot (before the
// checked protocol starts, so it is in no trace), then every rank opens the
// NCCL transport. Rank 0's failure to make an id travels in the same
// allgather, so every rank fails with the same error instead of waiting.
// On success the returned transport owns boot; on failure boot is left open
// (the caller closes it).
func openNCCLOver(boot Transport, o NCCLOptions) (Transport, error) {
	if o.UniqueID == nil || o.Open == nil {
		return nil, errors.New("nccl transport: NCCLOptions needs both UniqueID and Open")
	}
	rank, size := boot.Rank(), boot.Size()
	var payload []byte
	if rank == 0 {
		id, err := o.UniqueID()
		switch {
		case err != nil && o.Fallback:
			payload = []byte("?" + err.Error())
		case err != nil:
			payload = []byte("!" + err.Error())
		case len(id) != NCCLIDBytes:
			payload = []byte(fmt.Sprintf("!the NCCL unique id has %d bytes, want %d", len(id), NCCLIDBytes))
		default:
			payload = id
		}
	}
	got, err := boot.AllGatherBytes(payload)
	if err != nil {
		return nil, fmt.Errorf("nccl transport: exchanging the unique id over the bootstrap transport: %w", err)
	}
	if len(got) != size {
		return nil, fmt.Errorf("nccl transport: the bootstrap allgather returned %d contributions for %d ranks", len(got), size)
	}
	id := got[0]
	if len(id) > 0 && id[0] == '?' {
		return nil, fmt.Errorf("%w: rank 0: %s", errNCCLFallback, id[1:])
	}
	if len(id) != NCCLIDBytes {
		msg := "sent no id"
		if len(id) > 0 && id[0] == '!' {
			msg = string(id[1:])
		}
		return nil, fmt.Errorf("nccl transport: rank 0 could not make the NCCL unique id: %s", msg)
	}
	t, err := o.Open(id, rank, size)
	if err != nil {
		return nil, fmt.Errorf("nccl transport: rank %d of %d: %w", rank, size, err)
	}
	if t.Rank() != rank || t.Size() != size {
		t.Close()
		return nil, fmt.Errorf("nccl transport: NCCL placed this process at rank %d of %d, the bootstrap at rank %d of %d",
			t.Rank(), t.Size(), rank, size)
	}
	return &ncclTransport{Transport: t, boot: boot}, nil
}
