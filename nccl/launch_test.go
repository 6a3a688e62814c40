package nccl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
)

func TestDetectLaunch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    nccl.Launch
		wantErr string
		mpi     bool
	}{
		{name: "nothing: single process", env: nil,
			want: nccl.Launch{Launcher: nccl.LauncherSingle, WorldSize: 1, LocalSize: 1}},
		{name: "open mpi", env: map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
			"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
			want: nccl.Launch{Launcher: nccl.LauncherOpenMPI, Rank: 3, WorldSize: 4, LocalRank: 1, LocalSize: 2}, mpi: true},
		{name: "open mpi wins over slurm and torchrun", env: map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
			"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"},
			want: nccl.Launch{Launcher: nccl.LauncherOpenMPI, Rank: 0, WorldSize: 2, MasterAddr: "h", MasterPort: 29500}, mpi: true},
		{name: "mpirun -np 1", env: map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
			want: nccl.Launch{Launcher: nccl.LauncherOpenMPI, WorldSize: 1, LocalSize: 1}},
		{name: "pmi with MPICH local rank", env: map[string]string{"PMI_RANK": "2", "PMI_SIZE": "4",
			"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
			want: nccl.Launch{Launcher: nccl.LauncherPMI, Rank: 2, WorldSize: 4, LocalRank: 0, LocalSize: 2}, mpi: true},
		{name: "pmi with PMI_LOCAL_RANK", env: map[string]string{"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_LOCAL_RANK": "1"},
			want: nccl.Launch{Launcher: nccl.LauncherPMI, Rank: 1, WorldSize: 2, LocalRank: 1}, mpi: true},
		{name: "pmi without local rank: one node", env: map[string]string{"PMI_RANK": "1", "PMI_SIZE": "2"},
			want: nccl.Launch{Launcher: nccl.LauncherPMI, Rank: 1, WorldSize: 2, LocalRank: 1}, mpi: true},
		{name: "slurm", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"},
			want: nccl.Launch{Launcher: nccl.LauncherSlurm, Rank: 5, WorldSize: 8, LocalRank: 1}, mpi: true},
		{name: "torchrun inside a one-task slurm step", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1",
			"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
			want: nccl.Launch{Launcher: nccl.LauncherTorchrun, Rank: 1, WorldSize: 2, LocalRank: 1, LocalSize: 2,
				MasterAddr: "127.0.0.1", MasterPort: 29500}},
		{name: "torchrun", env: map[string]string{"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
			"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
			want: nccl.Launch{Launcher: nccl.LauncherTorchrun, Rank: 3, WorldSize: 4, LocalRank: 3, LocalSize: 4,
				MasterAddr: "10.0.0.1", MasterPort: 29500}},
		{name: "torchrun with a job token", env: map[string]string{"RANK": "1", "WORLD_SIZE": "2",
			"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "LOCKSTEP_JOB_TOKEN": " s3cret\n"},
			want: nccl.Launch{Launcher: nccl.LauncherTorchrun, Rank: 1, WorldSize: 2, LocalRank: 1,
				MasterAddr: "10.0.0.1", MasterPort: 29500, JobToken: nccl.NewJobToken("s3cret")}},
		{name: "open mpi with a job token", env: map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
			"LOCKSTEP_JOB_TOKEN": "s3cret"},
			want: nccl.Launch{Launcher: nccl.LauncherOpenMPI, WorldSize: 2, JobToken: nccl.NewJobToken("s3cret")}, mpi: true},
		{name: "torchrun world of one needs no master", env: map[string]string{"RANK": "0", "WORLD_SIZE": "1"},
			want: nccl.Launch{Launcher: nccl.LauncherTorchrun, WorldSize: 1, LocalSize: 1}},

		{name: "non-numeric rank", env: map[string]string{"OMPI_COMM_WORLD_RANK": "zero", "OMPI_COMM_WORLD_SIZE": "2"},
			wantErr: `launcher openmpi: OMPI_COMM_WORLD_RANK="zero" is not an integer`},
		{name: "size without rank", env: map[string]string{"PMI_SIZE": "2"},
			wantErr: "launcher pmi: PMI_RANK is not set"},
		{name: "rank beyond size", env: map[string]string{"SLURM_PROCID": "4", "SLURM_NTASKS": "4"},
			wantErr: "launcher slurm: SLURM_PROCID=4 is outside [0, SLURM_NTASKS=4)"},
		{name: "zero world", env: map[string]string{"RANK": "0", "WORLD_SIZE": "0"},
			wantErr: "launcher torchrun: WORLD_SIZE=0: the world needs at least one process"},
		{name: "local rank beyond local size", env: map[string]string{"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2",
			"LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			wantErr: "launcher torchrun: LOCAL_RANK=2 is outside [0, LOCAL_WORLD_SIZE=2)"},
		{name: "local size beyond world", env: map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
			"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
			wantErr: "launcher openmpi: OMPI_COMM_WORLD_LOCAL_SIZE=3 is outside [1, OMPI_COMM_WORLD_SIZE=2]"},
		{name: "local rank beyond world", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "2"},
			wantErr: "launcher slurm: SLURM_LOCALID=2 is outside [0, SLURM_NTASKS=2)"},
		{name: "negative local rank", env: map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "-1"},
			wantErr: "launcher pmi: MPI_LOCALRANKID=-1 is outside [0, PMI_SIZE=2)"},
		{name: "torchrun without master addr", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500"},
			wantErr: "launcher torchrun: MASTER_ADDR is not set"},
		{name: "torchrun without master port", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"},
			wantErr: "launcher torchrun: MASTER_PORT is not set"},
		{name: "bad master port", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
			wantErr: "launcher torchrun: MASTER_PORT=70000 is not a TCP port"},
		{name: "non-numeric master port", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "http"},
			wantErr: `launcher torchrun: MASTER_PORT="http" is not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nccl.DetectLaunch(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.want.JobToken.IsSet(), got.JobToken.IsSet())
			require.Equal(t, tc.mpi, got.UsesMPI())
		})
	}
}
