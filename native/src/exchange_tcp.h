// exchange_tcp.h: exchange groups of one member per process over TCP
// (exchange_tcp.cpp), for launches without MPI.
#ifndef LOCKSTEP_NATIVE_EXCHANGE_TCP_H
#define LOCKSTEP_NATIVE_EXCHANGE_TCP_H

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lockstep {

class ExchangeGroup;

constexpr int kTcpSecretBytes = 32;

// A listening socket on host (all interfaces when empty), ephemeral port.
class TcpListener {
 public:
  explicit TcpListener(const std::string& host);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  int fd() const { return fd_; }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Forms the mesh: addrs[r] is member r's listener ("host:port"); this
// process is member `rank` listening on ln. Every member passes the same
// addrs and secret. Throws ENG_TIMEOUT when the mesh is not complete within
// timeout (which also bounds each exchange afterwards).
std::shared_ptr<ExchangeGroup> open_tcp_exchange_group(TcpListener* ln, int32_t rank,
                                                       const std::vector<std::string>& addrs,
                                                       const uint8_t secret[kTcpSecretBytes],
                                                       std::chrono::milliseconds timeout);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_EXCHANGE_TCP_H
