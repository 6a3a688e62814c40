// test_nccl.cu: NcclComm (allgather of variable-size bytes, broadcast,
// allreduce) on a device.
//
//   cuda_nccl_test             a one-rank group
//   cuda_nccl_test --ranks 2   two ranks on the one GPU, one process each
//
// Two ranks on one GPU: NCCL refuses two ranks of a communicator on the same
// device of the same host ("Duplicate GPU detected"), so each rank process
// gives NCCL a host id of its own (NCCL_HOSTID) and the ranks talk over
// NCCL's socket transport on the loopback interface, as two nodes would.
// That is the path the engine's non-blocking communicator must get right: a
// collective returns ncclInProgress while NCCL is still connecting the peers
// (its first collectives), and its result may be copied to the host only
// once it is on the stream (NcclComm::issued). Each round checks every byte
// of an allgather of varying sizes (zero included), a broadcast from
// alternating roots and sum/max allreduces; the first rounds run right after
// creation, where the copy used to race the collective. The processes are
// forked before either touches CUDA; rank 0 makes the unique id and hands it
// to rank 1 through a pipe. Prints "figure:" lines for the device check.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nccl_comm.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep_test;

namespace {

// Two processes' kernels share the GPU by time slices, so one collective may
// take milliseconds: 100 rounds (500 collectives) stay well inside a minute.
constexpr int kRounds = 100;

int one_rank() {
  skip_without_device("cuda_nccl_test");
  Report report;
  try {
    cudaStream_t stream;
    TCHECK(cudaStreamCreate(&stream));
    {
      NcclComm comm(NcclComm::new_unique_id(), 0, 1, 0, stream);
      const char msg[] = "rank state";
      std::vector<uint8_t> out;
      std::vector<uint64_t> sizes;
      comm.allgather(msg, sizeof msg, &out, &sizes);
      report.check(sizes.size() == 1 && sizes[0] == sizeof msg && std::memcmp(out.data(), msg, sizeof msg) == 0,
                   "allgather of one rank returns its bytes");
      int64_t v[3] = {3, -4, 5};
      comm.allreduce(v, 3, ReduceDType::kInt64, ReduceOp::kSum);
      report.check(v[0] == 3 && v[1] == -4 && v[2] == 5, "allreduce of one rank is the identity");
      char b[8] = "abcdefg";
      comm.broadcast(b, sizeof b, 0);
      report.check(std::strcmp(b, "abcdefg") == 0, "broadcast from rank 0");
    }
    TCHECK(cudaStreamDestroy(stream));
  } catch (const EngineError& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return report.finish();
}

// The bytes rank r contributes in round k, and their value at index i.
size_t gather_len(int round, int r) { return size_t((round * 7 + r * 13) % 50); }
uint8_t gather_byte(int round, int r, size_t i) { return uint8_t(round * 31 + r * 101 + i * 7); }

// One rank of the two-rank group; returns the process's exit status.
int rank_main(int rank, int id_fd_read, int id_fd_write) {
  // Before any NCCL call: a host id per rank, sockets over loopback.
  const std::string host = "lockstep-nccl-test-rank" + std::to_string(rank);
  setenv("NCCL_HOSTID", host.c_str(), 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_IB_DISABLE", "1", 1);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    if (rank == 0) std::printf("SKIP: no CUDA device (cuda_nccl_test --ranks 2)\n");
    return rank == 0 ? 0 : 3;  // rank 1 stops too (no id will come)
  }
  Report report;
  try {
    NcclUniqueIdBytes id;
    if (rank == 0) {
      id = NcclComm::new_unique_id();
      if (write(id_fd_write, id.data(), id.size()) != ssize_t(id.size())) {
        std::printf("FAIL: rank 0 could not hand the unique id to rank 1\n");
        return 1;
      }
    } else if (read(id_fd_read, id.data(), id.size()) != ssize_t(id.size())) {
      std::printf("FAIL: rank 1 got no unique id from rank 0\n");
      return 1;
    }
    cudaStream_t stream;
    TCHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int bad = 0;
    int64_t late = 0;
    {
      NcclComm comm(id, rank, 2, 0, stream, /*timeout_ms=*/60000);
      std::vector<uint8_t> mine, out;
      std::vector<uint64_t> sizes;
      for (int k = 0; k < kRounds; ++k) {
        mine.resize(gather_len(k, rank));
        for (size_t i = 0; i < mine.size(); ++i) mine[i] = gather_byte(k, rank, i);
        comm.allgather(mine.data(), mine.size(), &out, &sizes);
        bool ok = sizes.size() == 2 && out.size() == gather_len(k, 0) + gather_len(k, 1);
        for (int r = 0, at = 0; ok && r < 2; ++r)
          for (size_t i = 0; ok && i < gather_len(k, r); ++i) ok = out[size_t(at++)] == gather_byte(k, r, i);
        const int root = k % 2;
        std::vector<uint8_t> b(size_t(k % 40), 0);
        if (rank == root)
          for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(k + 3 * i);
        comm.broadcast(b.data(), b.size(), root);
        for (size_t i = 0; ok && i < b.size(); ++i) ok = b[i] == uint8_t(k + 3 * i);
        int64_t s[2] = {rank + k, 10 * rank - k};
        comm.allreduce(s, 2, ReduceDType::kInt64, ReduceOp::kSum);
        ok = ok && s[0] == 1 + 2 * k && s[1] == 10 - 2 * k;
        double m = rank == 0 ? -1.5 * k : 0.25 * k;
        comm.allreduce(&m, 1, ReduceDType::kFloat64, ReduceOp::kMax);
        ok = ok && m == 0.25 * k;
        if (!ok && bad++ < 5) std::printf("FAIL: rank %d round %d: a collective's result is wrong\n", rank, k);
      }
      late = comm.late_issues();
    }
    TCHECK(cudaStreamDestroy(stream));
    report.check(bad == 0, "rank " + std::to_string(rank) + ": " + std::to_string(kRounds) +
                               " rounds of allgather/broadcast/allreduce equal on both ranks (" + std::to_string(bad) +
                               " wrong)");
    if (rank == 0)
      std::printf("figure: 2 ranks on one GPU (socket transport): %d rounds x 4 collectives correct; %lld "
                  "collectives returned before NCCL had issued them (their copy back waited)\n",
                  kRounds, (long long)late);
  } catch (const EngineError& e) {
    std::printf("FAIL: rank %d: %s\n", rank, e.what());
    return 1;
  }
  return report.finish();
}

int two_ranks() {
  int fds[2];
  if (pipe(fds) != 0) {
    std::printf("FAIL: pipe\n");
    return 1;
  }
  std::fflush(stdout);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) {
      std::printf("FAIL: fork\n");
      return 1;
    }
    if (pids[r] == 0) {
      // Each rank keeps only its end of the pipe, so that rank 1's read ends
      // (EOF) if rank 0 dies before writing the id.
      close(r == 0 ? fds[0] : fds[1]);
      const int rc = rank_main(r, fds[0], fds[1]);
      std::fflush(stdout);
      _exit(rc);
    }
  }
  close(fds[0]);
  close(fds[1]);
  int failed = 0;
  for (int r = 0; r < 2; ++r) {
    int st = 0;
    if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      // Rank 1 of a machine without a device stops with 3 after rank 0's SKIP.
      if (r == 1 && WIFEXITED(st) && WEXITSTATUS(st) == 3) continue;
      std::printf("FAIL: rank %d process %s %d\n", r, WIFSIGNALED(st) ? "killed by signal" : "exited with",
                  WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      ++failed;
    }
  }
  std::printf("cuda_nccl_test --ranks 2: %s\n", failed ? "FAILED" : "both ranks passed");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--ranks") == 0 && std::strcmp(argv[2], "2") == 0) return two_ranks();
  if (argc != 1) {
    std::printf("usage: cuda_nccl_test [--ranks 2]\n");
    return 2;
  }
  return one_rank();
}
