// test_comm_single: the eng_comm_* entry points on one process. With
// ENGINE_MPI this is an MPI singleton (no mpirun): a world of one, where the
// allgather returns this rank's bytes, argument errors are reported, and
// freeing the last communicator finalises MPI for good. Without ENGINE_MPI
// every init answers ENG_UNSUPPORTED with a message saying how to enable MPI.
// The multi-process behaviour is tested from Go under mpirun (tests/).
#include <cstring>
#include <string>

#include "check.h"
#include "engine.h"

namespace {

void test_null_handles() {
  CHECK(eng_comm_rank(nullptr) == -1);
  CHECK(eng_comm_size(nullptr) == -1);
  CHECK(eng_comm_free(nullptr) == ENG_OK);
  CHECK(eng_comm_init_mpi(nullptr) == ENG_INVALID_ARGUMENT);
  CHECK(std::string(eng_comm_last_error(nullptr)).find("out is NULL") != std::string::npos);
  int64_t lens[1];
  const uint8_t* recv = nullptr;
  CHECK(eng_comm_allgatherv(nullptr, "x", 1, lens, &recv) == ENG_INVALID_ARGUMENT);
  CHECK(eng_comm_abort(nullptr, 1) == ENG_INVALID_ARGUMENT);
  CHECK(eng_comm_idle_wait(nullptr, 0, 100, 0) == ENG_INVALID_ARGUMENT);
  CHECK(std::string(eng_comm_last_error(nullptr)).find("eng_comm_idle_wait") != std::string::npos);
}

#ifdef ENGINE_HAVE_MPI
void test_mpi_singleton() {
  eng_comm_t comm = nullptr;
  REQUIRE(eng_comm_init_mpi(&comm) == ENG_OK);
  CHECK(eng_comm_rank(comm) == 0);
  CHECK(eng_comm_size(comm) == 1);
  CHECK(std::string(eng_comm_last_error(comm)).empty());

  int64_t lens[1] = {-7};
  const uint8_t* recv = nullptr;
  CHECK(eng_comm_allgatherv(comm, "hello", 5, lens, &recv) == ENG_OK);
  CHECK(lens[0] == 5);
  CHECK(recv != nullptr && std::memcmp(recv, "hello", 5) == 0);

  // Nothing to send: a valid, empty result.
  CHECK(eng_comm_allgatherv(comm, nullptr, 0, lens, &recv) == ENG_OK);
  CHECK(lens[0] == 0);
  CHECK(recv != nullptr);

  // Bad arguments fail (on every rank; here the only one) and name the rank.
  CHECK(eng_comm_allgatherv(comm, "x", -1, lens, &recv) == ENG_INVALID_ARGUMENT);
  CHECK(std::string(eng_comm_last_error(comm)).find("rank 0 passed invalid arguments") != std::string::npos);
  CHECK(eng_comm_allgatherv(comm, nullptr, 3, lens, &recv) == ENG_INVALID_ARGUMENT);
  CHECK(eng_comm_allgatherv(comm, "x", 1, nullptr, &recv) == ENG_INVALID_ARGUMENT);
  // The communicator still works after a rejected call.
  CHECK(eng_comm_allgatherv(comm, "ab", 2, lens, &recv) == ENG_OK);
  CHECK(lens[0] == 2 && std::memcmp(recv, "ab", 2) == 0);

  // The idle doorbell: the root of a world of one has nobody to ring.
  CHECK(eng_comm_idle_wait(comm, 0, 500, 1000) == ENG_OK);
  CHECK(eng_comm_idle_wait(comm, 1, 500, 1000) == ENG_INVALID_ARGUMENT);
  CHECK(std::string(eng_comm_last_error(comm)).find("root 1 is outside the group of 1") != std::string::npos);
  CHECK(eng_comm_idle_wait(comm, 0, 0, 1000) == ENG_INVALID_ARGUMENT);
  CHECK(std::string(eng_comm_last_error(comm)).find("poll_us must be positive") != std::string::npos);
  CHECK(eng_comm_allgatherv(comm, "cd", 2, lens, &recv) == ENG_OK);

  // A second communicator while the first is open: MPI stays initialised
  // until the last one is freed.
  eng_comm_t second = nullptr;
  CHECK(eng_comm_init_mpi(&second) == ENG_OK);
  CHECK(eng_comm_free(comm) == ENG_OK);
  CHECK(eng_comm_allgatherv(second, "z", 1, lens, &recv) == ENG_OK);
  CHECK(eng_comm_free(second) == ENG_OK);

  // MPI was finalised with the last communicator: it cannot come back.
  eng_comm_t again = nullptr;
  CHECK(eng_comm_init_mpi(&again) == ENG_COMM_ERROR);
  CHECK(again == nullptr);
  CHECK(std::string(eng_comm_last_error(nullptr)).find("already finalised") != std::string::npos);
}
#else
void test_unsupported() {
  eng_comm_t comm = nullptr;
  CHECK(eng_comm_init_mpi(&comm) == ENG_UNSUPPORTED);
  CHECK(comm == nullptr);
  CHECK(std::string(eng_comm_last_error(nullptr)).find("built without MPI") != std::string::npos);
}
#endif

}  // namespace

int main() {
  test_null_handles();
#ifdef ENGINE_HAVE_MPI
  test_mpi_singleton();
#else
  test_unsupported();
#endif
  return check_exit_code("test_comm_single");
}
