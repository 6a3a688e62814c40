// status.h: how native code reports failures internally.
//
// Inside the library a failure is a thrown EngineError carrying the eng_status
// and a message a user can act on. Only the C entry points (engine.cpp) catch
// it, store the message as the last error and return the status: exceptions
// never cross the C ABI.
#ifndef LOCKSTEP_NATIVE_STATUS_H
#define LOCKSTEP_NATIVE_STATUS_H

#include <stdexcept>
#include <string>

#include "engine.h"

namespace lockstep {

// EngineError is a failure with a status other than ENG_OK.
class EngineError : public std::runtime_error {
 public:
  EngineError(eng_status status, const std::string& msg)
      : std::runtime_error(msg), status_(status) {}
  eng_status status() const { return status_; }

 private:
  eng_status status_;
};

// Throws EngineError(ENG_INVALID_ARGUMENT, msg).
[[noreturn]] inline void invalid_argument(const std::string& msg) {
  throw EngineError(ENG_INVALID_ARGUMENT, msg);
}

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_STATUS_H
