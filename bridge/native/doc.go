// Package native binds the native engine (native/include/engine.h, built by
// CMake into build/native/libengine.a) to bridge.Engine. It is the only
// package of the module that imports "C" (DESIGN.md §1).
//
// The binding is compiled only with the build tag `native` (`make`, or
// `go build -tags native` after building the library); without it, Open
// returns an error explaining how to build with the engine, so that
// `CGO_ENABLED=0 go build ./...` and plain `go test ./...` work on machines
// without the library.
//
// Threading: each engine owns one goroutine locked to its OS thread
// (runtime.LockOSThread). Every native call on the handle is a request run on
// that goroutine, so calls are serialised, the native side always sees the
// same thread (a CUDA backend's current device, thread-local last errors),
// and a step costs exactly one cgo call. A loop that drives the engine may
// run on that goroutine itself (bridge.ThreadOwner, RunOnEngineThread): its
// calls then run in place, with no hand-off between two threads per call.
package native

// EngineLibrary is the hash of the libengine.a this binary links, stamped
// by the Makefile (-ldflags -X) so that Go relinks when the native library
// changes; "" when built without the stamp.
var EngineLibrary string
