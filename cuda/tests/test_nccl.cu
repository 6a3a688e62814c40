// test_nccl.cu: a one-rank NCCL group through NcclComm (allgather of
// variable-size bytes, broadcast, allreduce). Multi-rank runs belong to the
// launcher tests; this checks that the wrapper links and works on a device.
#include <cstring>

#include "nccl_comm.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep_test;

int main() {
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
