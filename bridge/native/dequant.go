//go:build native

package native

/*
#cgo CFLAGS: -I${SRCDIR}/../../native/include
#cgo LDFLAGS: -L${SRCDIR}/../../build/native -lengine -lstdc++ -lm
#include <stdlib.h>
#include "engine.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/lockstep-ai/lockstep/bridge"
)

// DequantizeRow converts one row of cols elements in dtype to float32, as
// the engines read checkpoint weights (eng_dequantize_row).
func DequantizeRow(dtype bridge.DType, data []byte, cols int64) ([]float32, error) {
	if len(data) == 0 || cols <= 0 {
		return nil, fmt.Errorf("native: DequantizeRow: %d bytes for %d columns", len(data), cols)
	}
	out := make([]float32, cols)
	st := C.eng_dequantize_row(C.int32_t(dtype), unsafe.Pointer(&data[0]), C.int64_t(len(data)), C.int64_t(cols), (*C.float)(unsafe.Pointer(&out[0])))
	if st != C.ENG_OK {
		return nil, fmt.Errorf("native: DequantizeRow: %s", C.GoString(C.eng_last_error()))
	}
	return out, nil
}
