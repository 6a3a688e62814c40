// exchange_wire.h: what the point-to-point exchange transports (MPI,
// TCP) share: the header that opens every message, and a member's ledger of
// its peers' last messages, which checks each header against the exchange
// the member is in and words the errors.
#ifndef LOCKSTEP_NATIVE_EXCHANGE_WIRE_H
#define LOCKSTEP_NATIVE_EXCHANGE_WIRE_H

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cp_group.h"

namespace lockstep {

// The header of one exchange message; the payload (bytes) follows.
struct WireHeader {
  uint32_t magic;
  int32_t kind;
  int32_t layer;
  int32_t sender;
  uint64_t round;
  uint64_t bytes;
};

class PeerLedger {
 public:
  // Member `rank` of `size` over `transport` ("MPI", "TCP"); magic marks
  // this transport's messages.
  PeerLedger(int32_t rank, int32_t size, const char* transport, uint32_t magic);
  // The header of this member's message in exchange (tag, round).
  WireHeader header(const ExchangeTag& tag, uint64_t round, uint64_t bytes) const;
  // "Helix attention exchange at layer 3 (round 57) (rank 0 of 2, MPI)".
  std::string what(const ExchangeTag& tag, uint64_t round) const;
  // Records peer r's header. Throws ENG_COMM_ERROR when it is malformed
  // (magic, sender, or more than max_bytes) or names another exchange than
  // (tag, round): then the message names both.
  void accept(const std::string& what, int32_t r, const WireHeader& h, const ExchangeTag& tag, uint64_t round,
              uint64_t max_bytes);
  // Throws ENG_TIMEOUT: the exchange, the timeout, and each peer in
  // `pending` with the last exchange received from it.
  [[noreturn]] void timed_out(const std::string& what, std::chrono::milliseconds timeout,
                              const std::vector<int32_t>& pending) const;

 private:
  struct Last {
    ExchangeTag tag;
    uint64_t round = 0;
    bool heard = false;
  };
  int32_t rank_, size_;
  const char* transport_;
  uint32_t magic_;
  std::vector<Last> last_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_EXCHANGE_WIRE_H
