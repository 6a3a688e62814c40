//go:build native

package native

/*
#include <stdlib.h>
#include "engine.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/lockstep-ai/lockstep/bridge"
)

// samplingBuf is a reusable C array of eng_sampling.
type samplingBuf struct {
	p   *C.eng_sampling
	cap int
}

// slice returns a pointer to n elements (contents not preserved on growth).
func (b *samplingBuf) slice(n int) *C.eng_sampling {
	if n > b.cap {
		b.free()
		b.p = (*C.eng_sampling)(C.calloc(C.size_t(n), C.sizeof_eng_sampling))
		b.cap = n
	}
	return b.p
}

func (b *samplingBuf) free() {
	if b.p != nil {
		C.free(unsafe.Pointer(b.p))
		b.p, b.cap = nil, 0
	}
}

// SampleRow samples one logits row with the native engine's procedure
// (eng_sample_row) for the token at absolute position pos: the reference
// that bridge.Sample is checked against.
func SampleRow(logits []float32, p bridge.SamplingParams, pos int64) (int32, error) {
	if err := p.Validate(); err != nil {
		return 0, bridge.StatusError("sample_row", bridge.StatusInvalidArgument, err.Error())
	}
	if len(logits) == 0 || len(logits) > 1<<31-1 {
		return 0, bridge.StatusError("sample_row", bridge.StatusInvalidArgument, fmt.Sprintf("vocab %d out of range", len(logits)))
	}
	n := len(logits)
	buf := (*C.float)(C.malloc(C.size_t(n) * 4))
	defer C.free(unsafe.Pointer(buf))
	copy(unsafe.Slice((*float32)(unsafe.Pointer(buf)), n), logits)
	cp := (*C.eng_sampling)(C.calloc(1, C.sizeof_eng_sampling))
	defer C.free(unsafe.Pointer(cp))
	*cp = C.eng_sampling{temperature: C.float(p.Temperature), top_k: C.int32_t(p.TopK),
		top_p: C.float(p.NativeTopP()), seed: C.uint64_t(p.Seed)}
	out := (*C.int32_t)(C.malloc(4))
	defer C.free(unsafe.Pointer(out))
	runtime.LockOSThread() // eng_last_error is thread-local
	defer runtime.UnlockOSThread()
	if st := C.eng_sample_row(buf, C.int32_t(n), cp, C.int64_t(pos), out); st != C.ENG_OK {
		return 0, bridge.StatusError("sample_row", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	return int32(*out), nil
}
