// exchange_mpi.cpp: exchange groups of one member per process over MPI
// (cp_group.h, open_mpi_exchange_group). Built with ENGINE_MPI.
//
// Each group has a communicator of its own (MPI_Comm_split of
// MPI_COMM_WORLD), so its exchanges, made on an engine thread, never
// interleave with the control plane's collectives on another thread
// (MPI_THREAD_MULTIPLE). An exchange is point to point: this member sends one
// message to every peer and receives one from every peer, each a header
// (kind, layer, round, sender, length) and the payload. Polling instead of
// blocking gives the bounded wait: past the group's timeout the member fails
// with ENG_TIMEOUT naming the exchange, the peers it is still waiting for and
// the last exchange it received from each, and a header that names another
// exchange fails the step on both sides with ENG_COMM_ERROR naming both.
#include <chrono>
#include <climits>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cp_group.h"
#include "exchange_wire.h"
#include "mpi_session.h"
#include "status.h"

namespace lockstep {
namespace {

constexpr int kTag = 7;
constexpr uint32_t kMagic = 0x4c4b5850;  // "LKXP"
using Header = WireHeader;

class MpiExchangeGroup;

class MpiMember final : public Exchange {
 public:
  MpiMember(std::shared_ptr<MpiExchangeGroup> g, MPI_Comm comm, int32_t rank, int32_t size,
            std::chrono::milliseconds timeout)
      : g_(std::move(g)), comm_(comm), rank_(rank), size_(size), timeout_(timeout),
        ledger_(rank, size, "MPI", kMagic) {}
  // A member whose last exchange failed with sends in flight leaks its send
  // buffers and its group's communicator: MPI cannot cancel those sends, and
  // a peer may still read the buffers (single-copy transports read them in
  // place). The process is about to exit anyway.
  ~MpiMember() override;
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  void allgather(const ExchangeTag& tag, const void* data, size_t bytes,
                 std::vector<std::vector<char>>* out) override {
    frame(&send_[0], tag, data, bytes);
    run(tag, /*shared=*/true, out);
    (*out)[static_cast<size_t>(rank_)].assign(static_cast<const char*>(data),
                                               static_cast<const char*>(data) + bytes);
  }

  void alltoallv(const ExchangeTag& tag, const std::vector<std::vector<char>>& send,
                 std::vector<std::vector<char>>* out) override {
    if (static_cast<int32_t>(send.size()) != size_)
      throw EngineError(ENG_INTERNAL, describe(tag) + ": alltoallv with " + std::to_string(send.size()) +
                                          " blocks in a group of " + std::to_string(size_));
    if (send_.size() < send.size()) send_.resize(send.size());
    for (int32_t r = 0; r < size_; ++r)
      if (r != rank_) frame(&send_[static_cast<size_t>(r)], tag, send[static_cast<size_t>(r)].data(),
                            send[static_cast<size_t>(r)].size());
    run(tag, /*shared=*/false, out);
    (*out)[static_cast<size_t>(rank_)] = send[static_cast<size_t>(rank_)];
  }

 private:
  void frame(std::vector<char>* buf, const ExchangeTag& tag, const void* data, size_t bytes) {
    if (bytes > static_cast<size_t>(INT_MAX) - sizeof(Header))
      throw EngineError(ENG_INVALID_ARGUMENT, describe(tag) + ": " + std::to_string(bytes) +
                                                  " bytes exceed one MPI message (2^31-1 bytes)");
    const Header h = ledger_.header(tag, round_, bytes);
    buf->resize(sizeof h + bytes);
    std::memcpy(buf->data(), &h, sizeof h);
    if (bytes > 0) std::memcpy(buf->data() + sizeof h, data, bytes);
  }

  // One exchange: send_[0] to every peer (shared) or send_[r] to peer r,
  // and one message from every peer into out[r].
  void run(const ExchangeTag& tag, bool shared, std::vector<std::vector<char>>* out) {
    maybe_stall(tag);
    const uint64_t round = round_++;
    const std::string what = ledger_.what(tag, round);
    out->resize(static_cast<size_t>(size_));
    reqs_.clear();
    for (int32_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::vector<char>& b = send_[shared ? 0 : static_cast<size_t>(r)];
      MPI_Request req = MPI_REQUEST_NULL;
      mpi_check(MPI_Isend(b.data(), static_cast<int>(b.size()), MPI_BYTE, r, kTag, comm_, &req),
                (what + ": MPI_Isend").c_str());
      reqs_.push_back(req);
      bytes_sent_ += b.size() - sizeof(Header);
    }
    std::vector<int32_t> pending;
    for (int32_t r = 0; r < size_; ++r)
      if (r != rank_) pending.push_back(r);
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    bool sends_done = reqs_.empty();
    sends_in_flight_ = !sends_done;
    for (uint64_t polls = 0;; ++polls) {
      bool progress = false;
      for (size_t i = 0; i < pending.size();) {
        const int32_t r = pending[i];
        int flag = 0;
        MPI_Message msg = MPI_MESSAGE_NULL;
        MPI_Status st;
        mpi_check(MPI_Improbe(r, kTag, comm_, &flag, &msg, &st), (what + ": MPI_Improbe").c_str());
        if (!flag) {
          ++i;
          continue;
        }
        int count = 0;
        mpi_check(MPI_Get_count(&st, MPI_BYTE, &count), (what + ": MPI_Get_count").c_str());
        recv_.resize(static_cast<size_t>(count));
        mpi_check(MPI_Mrecv(recv_.data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE), (what + ": MPI_Mrecv").c_str());
        Header h{};
        if (static_cast<size_t>(count) < sizeof h)
          throw EngineError(ENG_COMM_ERROR, what + ": rank " + std::to_string(r) + " sent a short message");
        std::memcpy(&h, recv_.data(), sizeof h);
        ledger_.accept(what, r, h, tag, round, static_cast<uint64_t>(count) - sizeof h);
        if (h.bytes != static_cast<uint64_t>(count) - sizeof h)
          throw EngineError(ENG_COMM_ERROR, what + ": rank " + std::to_string(r) + " sent a malformed message");
        (*out)[static_cast<size_t>(r)].assign(recv_.data() + sizeof h, recv_.data() + count);
        bytes_received_ += h.bytes;
        pending[i] = pending.back();
        pending.pop_back();
        progress = true;
      }
      if (!sends_done) {
        int flag = 0;
        mpi_check(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE),
                  (what + ": MPI_Testall").c_str());
        sends_done = flag != 0;
        sends_in_flight_ = !sends_done;
      }
      if (pending.empty() && sends_done) break;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) ledger_.timed_out(what, timeout_, pending);
      // Spin briefly (a layer's exchange is short when every member is
      // there), then yield the core to the peers' threads.
      if (!progress && now - start > std::chrono::microseconds(200)) {
        if (now - start < std::chrono::milliseconds(5)) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    ++exchanges_;
  }

  bool sends_in_flight_ = false;
  std::shared_ptr<MpiExchangeGroup> g_;  // keeps the communicator alive
  MPI_Comm comm_;
  int32_t rank_, size_;
  std::chrono::milliseconds timeout_;
  uint64_t round_ = 0;
  std::vector<std::vector<char>> send_ = std::vector<std::vector<char>>(1);
  std::vector<char> recv_;
  std::vector<MPI_Request> reqs_;
  PeerLedger ledger_;
};

class MpiExchangeGroup final : public ExchangeGroup, public std::enable_shared_from_this<MpiExchangeGroup> {
 public:
  MpiExchangeGroup(MPI_Comm comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {
    mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiExchangeGroup() override {
    if (!leak_) mpi_release_comm(&comm_);
  }
  // Keeps the communicator (and MPI) alive to the end of the process.
  void leak() { leak_ = true; }
  int32_t size() const override { return size_; }
  int32_t local_rank() const override { return rank_; }
  const char* transport() const override { return "MPI"; }
  std::unique_ptr<Exchange> member(int32_t rank) override {
    if (rank != rank_)
      throw EngineError(ENG_INVALID_ARGUMENT, "this process is rank " + std::to_string(rank_) +
                                                  " of its MPI exchange group; it cannot join as rank " +
                                                  std::to_string(rank));
    return std::make_unique<MpiMember>(shared_from_this(), comm_, rank_, size_, timeout_);
  }

 private:
  MPI_Comm comm_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 0;
  bool leak_ = false;
};

MpiMember::~MpiMember() {
  if (!sends_in_flight_) return;
  g_->leak();
  new std::vector<std::vector<char>>(std::move(send_));  // deliberately leaked, see above
}

}  // namespace

std::shared_ptr<ExchangeGroup> open_mpi_exchange_group(int32_t color, std::chrono::milliseconds timeout) {
  const int provided = mpi_session_open();
  if (provided < MPI_THREAD_MULTIPLE)
    throw EngineError(ENG_UNSUPPORTED,
                      "the MPI library provides thread level " + std::to_string(provided) +
                          ", below MPI_THREAD_MULTIPLE: the engine's per-layer exchanges run on its own "
                          "thread beside the control plane's collectives (use an MPI built with thread "
                          "support, e.g. Open MPI >= 3)");
  int world_rank = 0;
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank(world)");
  MPI_Comm comm = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split(MPI_COMM_WORLD, color, world_rank, &comm), "MPI_Comm_split(world)");
  mpi_check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  mpi_adopt_comm();
  try {
    return std::make_shared<MpiExchangeGroup>(comm, timeout);
  } catch (...) {
    mpi_release_comm(&comm);
    throw;
  }
}

}  // namespace lockstep
