// bench_exchange: the per-layer Helix exchange of the CPU engine, bytes and
// time per iteration, over the CPU transports (make bench).
//
//   bench_exchange            in-process groups of C = 2 and 4 members (threads),
//                             and TCP meshes of C = 2 and 4 members on loopback
//                             (one thread per member, as one process per member would)
//   mpirun -np C bench_exchange mpi
//                             one member per process over MPI (the world's size)
//
// A Helix step exchanges, every layer, each CP rank's attention partials:
// one record of head_dim + 2 floats (m, l, o) per (row, head, page the rank
// owns) (model_cpu.cpp, helix_attention). The scenarios are decode
// iterations of a batch of rows at one KV depth, with the shapes of the tiny
// preset, SmolLM2-135M and Llama-3-8B; the payloads are those sizes (the
// bytes are what the engine would send; the values do not matter). Printed
// per scenario: bytes each rank sends per iteration, the median time of an
// iteration's exchanges (one per layer), per layer, and the rate.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cp_group.h"
#include "exchange_tcp.h"
#include "status.h"

namespace {

using lockstep::Exchange;
using lockstep::ExchangeKind;
using lockstep::ExchangeTag;

struct Scenario {
  const char* name;
  int32_t layers, heads, head_dim, rows, depth, page;
};

const Scenario kScenarios[] = {
    {"tiny, 32 rows @ 1k", 2, 4, 16, 32, 1024, 16},
    {"smollm2-135m, 8 rows @ 2k", 30, 9, 64, 8, 2048, 16},
    {"llama-8b, 8 rows @ 2k", 32, 32, 128, 8, 2048, 16},
};

// Bytes member k of c sends per layer.
size_t layer_bytes(const Scenario& s, int32_t c, int32_t k) {
  const int32_t pages = (s.depth + s.page - 1) / s.page;
  const int32_t owned = pages > k ? (pages - 1 - k) / c + 1 : 0;
  return size_t{4} * static_cast<size_t>(s.rows) * s.heads * owned * (s.head_dim + 2);
}

// Runs `iters` iterations (one exchange per layer) on member x and returns
// each iteration's seconds.
std::vector<double> run(Exchange& x, const Scenario& s, int32_t iters) {
  std::vector<char> mine(layer_bytes(s, x.size(), x.rank()), 1);
  std::vector<std::vector<char>> out;
  std::vector<double> t;
  for (int32_t it = 0; it < iters; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t l = 0; l < s.layers; ++l)
      x.allgather(ExchangeTag{ExchangeKind::kHelixAttention, l}, mine.data(), mine.size(), &out);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_header() {
  std::printf("%-12s %2s  %-28s %14s %12s %12s %10s\n", "transport", "C", "scenario", "sent/rank/it", "ms/iter",
              "us/layer", "GB/s/rank");
}

void print_row(const char* transport, int32_t c, const Scenario& s, uint64_t bytes_per_iter, double sec) {
  std::printf("%-12s %2d  %-28s %11.2f MB %12.3f %12.1f %10.2f\n", transport, c, s.name, bytes_per_iter / 1e6,
              sec * 1e3, sec * 1e6 / s.layers, bytes_per_iter / sec / 1e9);
}

int32_t iters_for(const Scenario& s) { return s.head_dim >= 128 ? 4 : 12; }

void bench_local() {
  print_header();
  for (int32_t c : {2, 4}) {
    for (const Scenario& s : kScenarios) {
      auto g = std::make_shared<lockstep::LocalCpGroup>(c, std::chrono::milliseconds(600000));
      std::vector<std::unique_ptr<Exchange>> m;
      for (int32_t r = 0; r < c; ++r) m.push_back(g->member(r));
      std::vector<std::vector<double>> t(static_cast<size_t>(c));
      std::vector<std::thread> th;
      for (int32_t r = 0; r < c; ++r)
        th.emplace_back([&, r] { t[static_cast<size_t>(r)] = run(*m[static_cast<size_t>(r)], s, 1 + iters_for(s)); });
      for (auto& x : th) x.join();
      std::vector<double> t0(t[0].begin() + 1, t[0].end());  // the first iteration warms up
      print_row("in-process", c, s, m[0]->bytes_sent() / (1 + iters_for(s)), median(t0));
    }
  }
}

void bench_tcp() {
  for (int32_t c : {2, 4}) {
    for (const Scenario& s : kScenarios) {
      std::vector<std::unique_ptr<lockstep::TcpListener>> ls;
      std::vector<std::string> addrs;
      for (int32_t r = 0; r < c; ++r) {
        ls.push_back(std::make_unique<lockstep::TcpListener>("127.0.0.1"));
        addrs.push_back("127.0.0.1:" + std::to_string(ls.back()->port()));
      }
      uint8_t secret[lockstep::kTcpSecretBytes] = {1, 2, 3};
      std::vector<std::vector<double>> t(static_cast<size_t>(c));
      std::vector<uint64_t> sent(static_cast<size_t>(c));
      std::vector<std::thread> th;
      for (int32_t r = 0; r < c; ++r)
        th.emplace_back([&, r] {
          auto g = lockstep::open_tcp_exchange_group(ls[static_cast<size_t>(r)].get(), r, addrs, secret,
                                                     std::chrono::milliseconds(600000));
          auto x = g->member(r);
          t[static_cast<size_t>(r)] = run(*x, s, 1 + iters_for(s));
          sent[static_cast<size_t>(r)] = x->bytes_sent();
        });
      for (auto& x : th) x.join();
      std::vector<double> t0(t[0].begin() + 1, t[0].end());
      print_row("TCP loopback", c, s, sent[0] / (1 + iters_for(s)), median(t0));
    }
  }
}

#ifdef ENGINE_HAVE_MPI
int bench_mpi() {
  auto g = lockstep::open_mpi_exchange_group(0, std::chrono::milliseconds(600000));
  const int32_t me = g->local_rank(), c = g->size();
  auto x = g->member(me);
  if (me == 0) print_header();
  for (const Scenario& s : kScenarios) {
    const uint64_t before = x->bytes_sent();
    std::vector<double> t = run(*x, s, 1 + iters_for(s));
    std::vector<double> t0(t.begin() + 1, t.end());
    if (me == 0) print_row("MPI", c, s, (x->bytes_sent() - before) / (1 + iters_for(s)), median(t0));
    std::fflush(stdout);
  }
  x.reset();
  g.reset();  // the last communicator: finalises MPI
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "mpi") {
#ifdef ENGINE_HAVE_MPI
    return bench_mpi();
#else
    std::fprintf(stderr, "bench_exchange: built without MPI\n");
    return 1;
#endif
  }
  bench_local();
  bench_tcp();
  return 0;
}
