// test_exchange: the exchange groups engines use inside a step (cp_group.h).
//
// In-process (always): allgather and alltoallv deliver every member's bytes
// in rank order, empty blocks included, and count the bytes a point-to-point
// transport would move; members that enter different exchanges fail with a
// message naming both; a member that never arrives makes the others fail with
// ENG_TIMEOUT naming the exchange and what the missing member last entered;
// an armed stall delays exactly the matching exchange.
//
// Over MPI (`test_exchange mpi` under mpirun -np N, registered with ctest for
// N = 2 and 4 in MPI builds): the same deliveries across processes, a tag
// mismatch, and a rank that stops makes the others time out naming it and the
// last exchange received from it.
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#ifdef ENGINE_HAVE_MPI
#include "mpi_session.h"
#endif

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "cp_group.h"
#include "exchange_tcp.h"
#include "status.h"

using lockstep::EngineError;
using lockstep::Exchange;
using lockstep::ExchangeKind;
using lockstep::ExchangeTag;

namespace {

using Bufs = std::vector<std::vector<char>>;

// The block member `from` sends to member `to` in round `round`: its length
// varies with all three (zero for some pairs), its bytes name them.
std::vector<char> block(int32_t from, int32_t to, int32_t round) {
  const int32_t n = (from * 7 + to * 3 + round) % 5 == 0 ? 0 : 1 + (from * 131 + to * 17 + round * 29) % 300;
  std::vector<char> b(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) b[static_cast<size_t>(i)] = static_cast<char>(from * 31 + to * 7 + round + i);
  return b;
}

// One member's script: rounds of allgather then alltoallv; returns whether
// every delivery matched.
bool run_script(Exchange& x, int32_t rounds) {
  bool ok = true;
  const int32_t n = x.size(), me = x.rank();
  for (int32_t round = 0; round < rounds; ++round) {
    const std::vector<char> mine = block(me, me, round);
    Bufs got;
    x.allgather(ExchangeTag{ExchangeKind::kHelixAttention, round % 3}, mine.data(), mine.size(), &got);
    ok &= static_cast<int32_t>(got.size()) == n;
    for (int32_t r = 0; r < n && ok; ++r) ok &= got[static_cast<size_t>(r)] == block(r, r, round);
    Bufs send(static_cast<size_t>(n));
    for (int32_t r = 0; r < n; ++r) send[static_cast<size_t>(r)] = block(me, r, round);
    x.alltoallv(ExchangeTag{ExchangeKind::kMoeDispatch, round % 3}, send, &got);
    ok &= static_cast<int32_t>(got.size()) == n;
    for (int32_t r = 0; r < n && ok; ++r) ok &= got[static_cast<size_t>(r)] == block(r, me, round);
  }
  return ok;
}

// The bytes member me sends to others over `rounds` rounds of run_script.
uint64_t expected_sent(int32_t me, int32_t n, int32_t rounds) {
  uint64_t b = 0;
  for (int32_t round = 0; round < rounds; ++round)
    for (int32_t r = 0; r < n; ++r)
      if (r != me) b += block(me, me, round).size() + block(me, r, round).size();
  return b;
}

void test_local_delivery() {
  for (int32_t n : {1, 2, 3, 4}) {
    auto g = std::make_shared<lockstep::LocalCpGroup>(n, std::chrono::milliseconds(20000));
    std::vector<std::unique_ptr<Exchange>> members;
    for (int32_t r = 0; r < n; ++r) members.push_back(g->member(r));
    std::vector<int> ok(static_cast<size_t>(n), 0);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < n; ++r)
      threads.emplace_back([&, r] { ok[static_cast<size_t>(r)] = run_script(*members[static_cast<size_t>(r)], 20); });
    for (auto& t : threads) t.join();
    for (int32_t r = 0; r < n; ++r) {
      CHECKF(ok[static_cast<size_t>(r)], "n=%d member %d got wrong bytes", n, r);
      CHECKF(members[static_cast<size_t>(r)]->bytes_sent() == expected_sent(r, n, 20), "n=%d member %d sent %llu", n,
             r, static_cast<unsigned long long>(members[static_cast<size_t>(r)]->bytes_sent()));
      CHECK(members[static_cast<size_t>(r)]->exchanges() == 40);
    }
  }
}

// Runs fn on each member's thread and returns each member's error ("" = none).
std::vector<std::string> run_members(lockstep::LocalCpGroup& g, int32_t n,
                                     const std::function<void(Exchange&)>& fn) {
  std::vector<std::unique_ptr<Exchange>> members;
  for (int32_t r = 0; r < n; ++r) members.push_back(g.member(r));
  std::vector<std::string> errs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*members[static_cast<size_t>(r)]);
      } catch (const EngineError& e) {
        errs[static_cast<size_t>(r)] = std::string(e.status() == ENG_TIMEOUT ? "TIMEOUT: " : "ERROR: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errs;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

void test_local_mismatch_timeout_and_stall() {
  {  // member 1 enters a combine where the others enter a dispatch
    auto g = std::make_shared<lockstep::LocalCpGroup>(3, std::chrono::milliseconds(5000));
    auto errs = run_members(*g, 3, [](Exchange& x) {
      Bufs out;
      const char c = 1;
      x.allgather(ExchangeTag{ExchangeKind::kMoeDispatch, 0}, &c, 1, &out);
      const ExchangeKind k = x.rank() == 1 ? ExchangeKind::kMoeCombine : ExchangeKind::kMoeDispatch;
      x.allgather(ExchangeTag{k, 4}, &c, 1, &out);
    });
    int named = 0;
    for (const auto& e : errs) {
      CHECKF(!e.empty(), "every member fails");
      named += contains(e, "another member entered") && contains(e, "(the members' steps diverged)");
    }
    CHECKF(named >= 1, "one member names both exchanges: %s | %s | %s", errs[0].c_str(), errs[1].c_str(),
           errs[2].c_str());
  }
  {  // member 2 never enters round 1
    auto g = std::make_shared<lockstep::LocalCpGroup>(3, std::chrono::milliseconds(300));
    const auto start = std::chrono::steady_clock::now();
    auto errs = run_members(*g, 3, [](Exchange& x) {
      Bufs out;
      const char c = 1;
      x.allgather(ExchangeTag{ExchangeKind::kHelixAttention, 0}, &c, 1, &out);
      if (x.rank() == 2) return;
      x.allgather(ExchangeTag{ExchangeKind::kHelixAttention, 1}, &c, 1, &out);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECKF(s < 5.0, "bounded wait (%.1f s)", s);
    CHECK(errs[2].empty());
    int timeouts = 0;
    for (int r = 0; r < 2; ++r) {
      const std::string& e = errs[static_cast<size_t>(r)];
      timeouts += contains(e, "TIMEOUT: Helix attention exchange at layer 1 (round 1)") &&
                  contains(e, "waiting for member 2 (last entered Helix attention exchange at layer 0 (round 0))");
    }
    CHECKF(timeouts >= 1, "a timeout names the exchange and the missing member: %s | %s", errs[0].c_str(),
           errs[1].c_str());
  }
  {  // an armed stall delays only the matching exchange
    auto g = std::make_shared<lockstep::LocalCpGroup>(2, std::chrono::milliseconds(20000));
    auto m0 = g->member(0), m1 = g->member(1);
    m1->arm_stall(static_cast<int32_t>(ExchangeKind::kMoeCombine), 2, 400);
    double took[3] = {0, 0, 0};
    auto script = [&](Exchange& x, bool time) {
      Bufs out;
      const char c = 1;
      const ExchangeTag tags[3] = {{ExchangeKind::kMoeDispatch, 2}, {ExchangeKind::kMoeCombine, 1},
                                   {ExchangeKind::kMoeCombine, 2}};
      for (int i = 0; i < 3; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        x.allgather(tags[i], &c, 1, &out);
        if (time) took[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    };
    std::thread t([&] { script(*m1, false); });
    script(*m0, true);
    t.join();
    CHECKF(took[0] < 0.3 && took[1] < 0.3 && took[2] >= 0.35, "stall hit only combine@2: %.3f %.3f %.3f", took[0],
           took[1], took[2]);
  }
}

// Forms a TCP group of n members on loopback, one thread each, and runs fn
// on each member; returns each member's error ("" = none). Before the mesh
// forms, an intruder connects to member 0 with the wrong secret.
std::vector<std::string> run_tcp(int32_t n, int32_t timeout_ms, const std::function<void(Exchange&)>& fn) {
  std::vector<std::unique_ptr<lockstep::TcpListener>> ls;
  std::vector<std::string> addrs;
  for (int32_t r = 0; r < n; ++r) {
    ls.push_back(std::make_unique<lockstep::TcpListener>("127.0.0.1"));
    addrs.push_back("127.0.0.1:" + std::to_string(ls.back()->port()));
  }
  uint8_t secret[lockstep::kTcpSecretBytes];
  for (int i = 0; i < lockstep::kTcpSecretBytes; ++i) secret[i] = static_cast<uint8_t>(i * 7 + 3);
  {  // the intruder: a hello with a wrong secret, then silence
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(ls[0]->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      char junk[44] = {0};
      (void)!::write(fd, junk, sizeof junk);
    }
    ::close(fd);
  }
  std::vector<std::string> errs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto g = lockstep::open_tcp_exchange_group(ls[static_cast<size_t>(r)].get(), r, addrs, secret,
                                                   std::chrono::milliseconds(timeout_ms));
        auto x = g->member(r);
        fn(*x);
      } catch (const EngineError& e) {
        errs[static_cast<size_t>(r)] = std::string(e.status() == ENG_TIMEOUT ? "TIMEOUT: " : "ERROR: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errs;
}

void test_tcp() {
  for (int32_t n : {2, 3, 4}) {
    std::vector<int> ok(static_cast<size_t>(n), 0);
    auto errs = run_tcp(n, 20000, [&](Exchange& x) {
      ok[static_cast<size_t>(x.rank())] = run_script(x, 20) && x.bytes_sent() == expected_sent(x.rank(), n, 20);
    });
    for (int32_t r = 0; r < n; ++r)
      CHECKF(ok[static_cast<size_t>(r)] && errs[static_cast<size_t>(r)].empty(), "tcp n=%d member %d: %s", n, r,
             errs[static_cast<size_t>(r)].c_str());
  }
  {  // member 2 stays but never enters round 1: the others time out naming it
    auto errs = run_tcp(3, 600, [](Exchange& x) {
      std::vector<std::vector<char>> out;
      const char c = 1;
      x.allgather(ExchangeTag{ExchangeKind::kHelixAttention, 0}, &c, 1, &out);
      if (x.rank() == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        return;
      }
      x.allgather(ExchangeTag{ExchangeKind::kHelixAttention, 1}, &c, 1, &out);
    });
    for (int r = 0; r < 2; ++r)
      CHECKF(contains(errs[static_cast<size_t>(r)], "TIMEOUT: Helix attention exchange at layer 1 (round 1) (rank " +
                                                        std::to_string(r) + " of 3, TCP): timed out after 600 ms; "
                                                        "waiting for rank 2 (last received from it: Helix attention "
                                                        "exchange at layer 0 (round 0))"),
             "member %d: %s", r, errs[static_cast<size_t>(r)].c_str());
  }
  {  // member 1 leaves (its sockets close): the others fail at once
    const auto start = std::chrono::steady_clock::now();
    auto errs = run_tcp(3, 20000, [](Exchange& x) {
      std::vector<std::vector<char>> out;
      const char c = 1;
      x.allgather(ExchangeTag{ExchangeKind::kMoeCombine, 2}, &c, 1, &out);
      if (x.rank() == 1) return;
      x.allgather(ExchangeTag{ExchangeKind::kMoeCombine, 3}, &c, 1, &out);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECKF(s < 10.0, "no waiting for the timeout (%.1f s)", s);
    // Each fails at once; at least one names rank 1 (the other may first
    // find that the one who named it is gone).
    int named = 0;
    for (int r : {0, 2}) {
      const std::string& e = errs[static_cast<size_t>(r)];
      CHECKF(contains(e, "ERROR: MoE combine exchange at layer 3 (round 1)") && contains(e, "did it exit?"),
             "member %d: %s", r, e.c_str());
      named += contains(e, "rank 1 closed its connection (did it exit?)") || contains(e, "sending to rank 1 failed");
    }
    CHECKF(named >= 1, "%s | %s", errs[0].c_str(), errs[2].c_str());
  }
}

#ifdef ENGINE_HAVE_MPI
int mpi_main() {
  auto g = lockstep::open_mpi_exchange_group(0, std::chrono::milliseconds(1500));
  const int32_t me = g->local_rank(), n = g->size();
  REQUIRE(n >= 2);
  auto x = g->member(me);
  CHECKF(run_script(*x, 30), "rank %d: deliveries", me);
  CHECKF(x->bytes_sent() == expected_sent(me, n, 30), "rank %d sent %llu", me,
         static_cast<unsigned long long>(x->bytes_sent()));
  bool refused = false;
  try {
    g->member((me + 1) % n);
  } catch (const EngineError& e) {
    refused = e.status() == ENG_INVALID_ARGUMENT;
  }
  CHECK(refused);
  // The last rank enters a combine where the others enter a dispatch: every
  // rank that hears from it fails naming both.
  Bufs out;
  const char c = 1;
  const ExchangeKind k = me == n - 1 ? ExchangeKind::kMoeCombine : ExchangeKind::kMoeDispatch;
  std::string err;
  try {
    x->allgather(ExchangeTag{k, 5}, &c, 1, &out);
  } catch (const EngineError& e) {
    err = e.what();
  }
  CHECKF(!err.empty(), "rank %d: the mismatch fails", me);
  if (me != n - 1)
    CHECKF(contains(err, "rank " + std::to_string(n - 1) + " is in MoE combine exchange at layer 5 (round 60)"),
           "rank %d: %s", me, err.c_str());
  // A fresh group; rank 1 stops after one exchange: the others time out
  // naming it and the last exchange received from it.
  auto g2 = lockstep::open_mpi_exchange_group(0, std::chrono::milliseconds(700));
  auto y = g2->member(me);
  y->allgather(ExchangeTag{ExchangeKind::kHelixAttention, 3}, &c, 1, &out);
  if (me != 1) {
    err.clear();
    const auto start = std::chrono::steady_clock::now();
    try {
      y->allgather(ExchangeTag{ExchangeKind::kHelixAttention, 4}, &c, 1, &out);
    } catch (const EngineError& e) {
      err = e.status() == ENG_TIMEOUT ? e.what() : "";
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECKF(s < 5.0, "bounded wait (%.1f s)", s);
    CHECKF(contains(err, "Helix attention exchange at layer 4 (round 1) (rank " + std::to_string(me) + " of " +
                             std::to_string(n) + ", MPI): timed out after 700 ms; waiting for rank 1 (last "
                             "received from it: Helix attention exchange at layer 3 (round 0))"),
           "rank %d: %s", me, err.c_str());
  } else {
    // Late: its peers gave up; entering now drains their messages, so that
    // every send completes and MPI can finalise.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    try {
      y->allgather(ExchangeTag{ExchangeKind::kHelixAttention, 4}, &c, 1, &out);
    } catch (const EngineError&) {
    }
  }
  // The failed members keep their groups' communicators (sends that timed
  // out cannot be cancelled): finalise with them still allocated.
  MPI_Barrier(MPI_COMM_WORLD);
  const int code = check_exit_code(me == 0 ? "test_exchange mpi" : "test_exchange mpi (other rank)");
  MPI_Finalize();
  return code;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "mpi") {
#ifdef ENGINE_HAVE_MPI
    return mpi_main();
#else
    std::fprintf(stderr, "built without MPI\n");
    return 1;
#endif
  }
  test_local_delivery();
  test_local_mismatch_timeout_and_stall();
  test_tcp();
  return check_exit_code("test_exchange");
}
