// exchange_tcp.cpp: exchange groups of one member per process over TCP
// (cp_group.h, open_tcp_exchange_group): the transport for launches without
// MPI (torchrun-style), always built.
//
// Every member listens on an ephemeral port before the group is formed; the
// caller exchanges the addresses and a random secret through the control
// plane (authenticated), then each member connects to every lower rank and
// accepts every higher one, so that the members form a full mesh of TCP
// connections. A connection starts with a hello (magic, rank, size, secret)
// in each direction; one that does not present the secret, names a rank out
// of range or a rank already connected is closed and the member keeps
// waiting for the right one until the group's timeout.
//
// An exchange is the same as over MPI (exchange_mpi.cpp): one framed message
// (header: kind, layer, round, sender, length; then the payload) to every
// peer and one from every peer, driven by poll() on non-blocking sockets with
// the group's timeout; past it the member fails with ENG_TIMEOUT naming the
// exchange, the peers it still waits for and the last exchange received from
// each. A peer that closes its connection fails the exchange at once
// (ENG_COMM_ERROR), and a failed exchange leaves the group unusable (the
// streams are mid-message).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cp_group.h"
#include "exchange_tcp.h"
#include "exchange_wire.h"
#include "status.h"

namespace lockstep {
namespace {

constexpr uint32_t kMagic = 0x4c4b5854;       // "LKXT"
constexpr uint32_t kHelloMagic = 0x4c4b4854;  // "LKHT"
constexpr uint64_t kMaxMessage = uint64_t{1} << 36;

using Clock = std::chrono::steady_clock;

using Header = WireHeader;

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t size;
  uint8_t secret[kTcpSecretBytes];
};

[[noreturn]] void sys_fail(const std::string& what) {
  throw EngineError(ENG_COMM_ERROR, what + ": " + std::strerror(errno));
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

void set_nonblocking(int fd) {
  const int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) sys_fail("fcntl(O_NONBLOCK)");
}

// Reads or writes exactly n bytes on a non-blocking fd before the deadline;
// false on timeout, end of stream or error.
bool io_all(int fd, void* buf, size_t n, bool write, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0 && !write) return false;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0 || ::poll(&pfd, 1, ms) <= 0) return false;
  }
  return true;
}

bool same_secret(const uint8_t* a, const uint8_t* b) {
  uint8_t d = 0;
  for (int i = 0; i < kTcpSecretBytes; ++i) d |= static_cast<uint8_t>(a[i] ^ b[i]);
  return d == 0;
}

class TcpExchangeGroup;

class TcpMember final : public Exchange {
 public:
  TcpMember(std::shared_ptr<TcpExchangeGroup> g, const std::vector<int>* fds, int32_t rank, int32_t size,
            std::chrono::milliseconds timeout)
      : g_(std::move(g)), fds_(*fds), rank_(rank), size_(size), timeout_(timeout),
        ledger_(rank, size, "TCP", kMagic) {}
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  void allgather(const ExchangeTag& tag, const void* data, size_t bytes,
                 std::vector<std::vector<char>>* out) override {
    maybe_stall(tag);
    shared_.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    run(tag, nullptr, out);
    (*out)[static_cast<size_t>(rank_)] = shared_;
  }

  void alltoallv(const ExchangeTag& tag, const std::vector<std::vector<char>>& send,
                 std::vector<std::vector<char>>* out) override {
    maybe_stall(tag);
    if (static_cast<int32_t>(send.size()) != size_)
      throw EngineError(ENG_INTERNAL, describe(tag) + ": alltoallv with " + std::to_string(send.size()) +
                                          " blocks in a group of " + std::to_string(size_));
    run(tag, &send, out);
    (*out)[static_cast<size_t>(rank_)] = send[static_cast<size_t>(rank_)];
  }

 private:
  struct Peer {
    Header out_h{};
    const std::vector<char>* out = nullptr;
    size_t sent = 0;  // of header + payload
    Header in_h{};
    size_t got = 0;  // of header + payload
    bool done_send = false, done_recv = false;
  };

  void run(const ExchangeTag& tag, const std::vector<std::vector<char>>* send, std::vector<std::vector<char>>* out) {
    if (broken_) throw EngineError(ENG_COMM_ERROR, describe(tag) + ": the TCP exchange group failed earlier");
    const uint64_t round = round_++;
    const std::string what = ledger_.what(tag, round);
    out->resize(static_cast<size_t>(size_));
    peers_.assign(static_cast<size_t>(size_), Peer{});
    int32_t open = 0;
    for (int32_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      Peer& p = peers_[static_cast<size_t>(r)];
      p.out = send ? &(*send)[static_cast<size_t>(r)] : &shared_;
      p.out_h = ledger_.header(tag, round, p.out->size());
      open += 2;
    }
    broken_ = true;  // until the exchange completes
    const auto start = Clock::now(), deadline = start + timeout_;
    std::vector<pollfd> pfds;
    std::vector<int32_t> who;
    while (open > 0) {
      pfds.clear();
      who.clear();
      for (int32_t r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const Peer& p = peers_[static_cast<size_t>(r)];
        short ev = 0;
        if (!p.done_send) ev |= POLLOUT;
        if (!p.done_recv) ev |= POLLIN;
        if (ev == 0) continue;
        pfds.push_back(pollfd{fds_[static_cast<size_t>(r)], ev, 0});
        who.push_back(r);
      }
      const int ms = remaining_ms(deadline);
      const int n = ms == 0 ? 0 : ::poll(pfds.data(), pfds.size(), ms);
      if (n < 0 && errno != EINTR) sys_fail(what + ": poll");
      if (n == 0) {
        std::vector<int32_t> pending;
        for (int32_t r = 0; r < size_; ++r)
          if (r != rank_ && !peers_[static_cast<size_t>(r)].done_recv) pending.push_back(r);
        ledger_.timed_out(what, timeout_, pending);
      }
      for (size_t i = 0; i < pfds.size(); ++i) {
        const int32_t r = who[i];
        Peer& p = peers_[static_cast<size_t>(r)];
        const int fd = pfds[i].fd;
        if ((pfds[i].revents & POLLOUT) && !p.done_send) open -= pump_send(what, r, fd, &p);
        if ((pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) && !p.done_recv)
          open -= pump_recv(what, tag, round, r, fd, &p, &(*out)[static_cast<size_t>(r)]);
        else if ((pfds[i].revents & (POLLHUP | POLLERR)) && !p.done_send)
          throw EngineError(ENG_COMM_ERROR, what + ": the connection to rank " + std::to_string(r) +
                                                " failed (did it exit?)");
      }
    }
    broken_ = false;
    ++exchanges_;
  }

  // Sends what the socket takes; 1 when the message is complete.
  int pump_send(const std::string& what, int32_t r, int fd, Peer* p) {
    const size_t total = sizeof(Header) + p->out->size();
    while (p->sent < total) {
      const char* src;
      size_t len;
      if (p->sent < sizeof(Header)) {
        src = reinterpret_cast<const char*>(&p->out_h) + p->sent;
        len = sizeof(Header) - p->sent;
      } else {
        src = p->out->data() + (p->sent - sizeof(Header));
        len = total - p->sent;
      }
      const ssize_t k = ::send(fd, src, len, MSG_NOSIGNAL);
      if (k > 0) {
        p->sent += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
      throw EngineError(ENG_COMM_ERROR, what + ": sending to rank " + std::to_string(r) + " failed (" +
                                            std::strerror(errno) + "; did it exit?)");
    }
    p->done_send = true;
    bytes_sent_ += p->out->size();
    return 1;
  }

  // Reads what has arrived; 1 when the message is complete.
  int pump_recv(const std::string& what, const ExchangeTag& tag, uint64_t round, int32_t r, int fd, Peer* p,
                std::vector<char>* dst) {
    for (;;) {
      char* buf;
      size_t len;
      if (p->got < sizeof(Header)) {
        buf = reinterpret_cast<char*>(&p->in_h) + p->got;
        len = sizeof(Header) - p->got;
      } else {
        const size_t at = p->got - sizeof(Header);
        if (at == p->in_h.bytes) break;
        buf = dst->data() + at;
        len = p->in_h.bytes - at;
      }
      const ssize_t k = ::recv(fd, buf, len, 0);
      if (k == 0 || (k < 0 && errno == ECONNRESET))
        throw EngineError(ENG_COMM_ERROR, what + ": rank " + std::to_string(r) +
                                              " closed its connection (did it exit?)");
      if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        throw EngineError(ENG_COMM_ERROR, what + ": receiving from rank " + std::to_string(r) + " failed (" +
                                              std::strerror(errno) + ")");
      }
      p->got += static_cast<size_t>(k);
      if (p->got == sizeof(Header)) {
        const Header& h = p->in_h;
        ledger_.accept(what, r, h, tag, round, kMaxMessage);
        dst->resize(h.bytes);
      }
    }
    p->done_recv = true;
    bytes_received_ += p->in_h.bytes;
    return 1;
  }

  std::shared_ptr<TcpExchangeGroup> g_;  // keeps the sockets open
  const std::vector<int>& fds_;
  int32_t rank_, size_;
  std::chrono::milliseconds timeout_;
  uint64_t round_ = 0;
  bool broken_ = false;
  std::vector<char> shared_;
  std::vector<Peer> peers_;
  PeerLedger ledger_;
};

class TcpExchangeGroup final : public ExchangeGroup, public std::enable_shared_from_this<TcpExchangeGroup> {
 public:
  TcpExchangeGroup(std::vector<int> fds, int32_t rank, std::chrono::milliseconds timeout)
      : fds_(std::move(fds)), rank_(rank), timeout_(timeout) {}
  ~TcpExchangeGroup() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  int32_t size() const override { return static_cast<int32_t>(fds_.size()); }
  int32_t local_rank() const override { return rank_; }
  const char* transport() const override { return "TCP"; }
  std::unique_ptr<Exchange> member(int32_t rank) override {
    if (rank != rank_)
      throw EngineError(ENG_INVALID_ARGUMENT, "this process is rank " + std::to_string(rank_) +
                                                  " of its TCP exchange group; it cannot join as rank " +
                                                  std::to_string(rank));
    if (joined_) throw EngineError(ENG_INVALID_ARGUMENT, "an engine already joined this process's TCP exchange group");
    joined_ = true;
    return std::make_unique<TcpMember>(shared_from_this(), &fds_, rank_, size(), timeout_);
  }

 private:
  std::vector<int> fds_;
  int32_t rank_;
  std::chrono::milliseconds timeout_;
  bool joined_ = false;
};

// Splits "host:port" (or "[v6]:port").
void split_addr(const std::string& addr, std::string* host, std::string* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon + 1 == addr.size())
    throw EngineError(ENG_INVALID_ARGUMENT, "address \"" + addr + "\" is not host:port");
  *host = addr.substr(0, colon);
  *port = addr.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
}

// Connects to addr before the deadline (retrying while the peer is not
// listening yet); -1 on timeout.
int connect_to(const std::string& addr, Clock::time_point deadline) {
  std::string host, port;
  split_addr(addr, &host, &port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
    throw EngineError(ENG_COMM_ERROR, "resolving " + addr + ": " + gai_strerror(rc));
  int fd = -1;
  while (fd < 0 && Clock::now() < deadline) {
    for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        ::close(fd);
        fd = -1;
      }
    }
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::freeaddrinfo(res);
  return fd;
}

}  // namespace

TcpListener::TcpListener(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &res); rc != 0)
    throw EngineError(ENG_INVALID_ARGUMENT, "resolving listen host \"" + host + "\": " + gai_strerror(rc));
  for (addrinfo* a = res; a != nullptr && fd_ < 0; a = a->ai_next) {
    fd_ = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd_ < 0) continue;
    if (::bind(fd_, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd_, 64) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) sys_fail("listening on " + host);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) sys_fail("getsockname");
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  set_nonblocking(fd_);
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<ExchangeGroup> open_tcp_exchange_group(TcpListener* ln, int32_t rank,
                                                       const std::vector<std::string>& addrs,
                                                       const uint8_t secret[kTcpSecretBytes],
                                                       std::chrono::milliseconds timeout) {
  const int32_t size = static_cast<int32_t>(addrs.size());
  if (rank < 0 || rank >= size)
    throw EngineError(ENG_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " is out of range [0, " +
                                                std::to_string(size) + ")");
  std::vector<int> fds(static_cast<size_t>(size), -1);
  auto cleanup = [&] {
    for (int& fd : fds)
      if (fd >= 0) ::close(fd), fd = -1;
  };
  const auto deadline = Clock::now() + timeout;
  Hello mine{kHelloMagic, rank, size, {}};
  std::memcpy(mine.secret, secret, kTcpSecretBytes);
  auto setup = [&](int fd) {
    set_nonblocking(fd);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  };
  try {
    // Lower ranks: connect, say hello, check theirs.
    for (int32_t r = 0; r < rank; ++r) {
      const int fd = connect_to(addrs[static_cast<size_t>(r)], deadline);
      if (fd < 0)
        throw EngineError(ENG_TIMEOUT, "TCP exchange group: rank " + std::to_string(rank) + " could not connect to rank " +
                                           std::to_string(r) + " at " + addrs[static_cast<size_t>(r)] + " within " +
                                           std::to_string(timeout.count()) + " ms");
      fds[static_cast<size_t>(r)] = fd;
      setup(fd);
      Hello theirs{};
      if (!io_all(fd, &mine, sizeof mine, true, deadline) || !io_all(fd, &theirs, sizeof theirs, false, deadline) ||
          theirs.magic != kHelloMagic || theirs.rank != r || theirs.size != size || !same_secret(theirs.secret, secret))
        throw EngineError(ENG_COMM_ERROR, "TCP exchange group: the process at " + addrs[static_cast<size_t>(r)] +
                                              " did not answer as rank " + std::to_string(r) + " of this job");
    }
    // Higher ranks: accept until each has said a valid hello.
    int32_t missing = size - 1 - rank;
    while (missing > 0) {
      pollfd pfd{ln->fd(), POLLIN, 0};
      const int ms = remaining_ms(deadline);
      if (ms == 0 || ::poll(&pfd, 1, ms) <= 0) {
        std::string who;
        for (int32_t r = rank + 1; r < size; ++r)
          if (fds[static_cast<size_t>(r)] < 0) who += (who.empty() ? "" : ", ") + std::to_string(r);
        throw EngineError(ENG_TIMEOUT, "TCP exchange group: rank " + std::to_string(rank) + " timed out after " +
                                           std::to_string(timeout.count()) + " ms waiting for ranks " + who +
                                           " to connect");
      }
      const int fd = ::accept4(ln->fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      setup(fd);
      // A connection has a few seconds for its hello, so one that says
      // nothing delays the group only that long.
      const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
      Hello theirs{};
      const bool ok = io_all(fd, &theirs, sizeof theirs, false, hello_deadline) && theirs.magic == kHelloMagic &&
                      theirs.size == size && theirs.rank > rank && theirs.rank < size &&
                      same_secret(theirs.secret, secret) && fds[static_cast<size_t>(theirs.rank)] < 0 &&
                      io_all(fd, &mine, sizeof mine, true, hello_deadline);
      if (!ok) {
        ::close(fd);  // not a member of this job (or a duplicate): keep waiting
        continue;
      }
      fds[static_cast<size_t>(theirs.rank)] = fd;
      --missing;
    }
  } catch (...) {
    cleanup();
    throw;
  }
  return std::make_shared<TcpExchangeGroup>(std::move(fds), rank, timeout);
}

}  // namespace lockstep
