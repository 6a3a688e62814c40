//go:build native

package native

// cgosymbolizer makes a crash inside the native library print its C/C++
// frames (file:line) in the Go traceback.
import _ "github.com/ianlancetaylor/cgosymbolizer"
