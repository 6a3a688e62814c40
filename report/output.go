package report

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// Writes to an output never fail the run: a write that fails (a full
// disk) keeps its first error, the run finishes, the report is printed, and
// only then is the error reported, naming the flag and the path.

// OutputFile is one output file of a run (--requests-out, --iter-log,
// --kv-events). It is created before any work starts, so that a path that
// cannot be written fails at once, naming the flag and the path. Writes are serialised (ranks of one process
// share a file when its path has no {rank}) and never fail: the first error
// is kept for close and reported once through onFail.
type OutputFile struct {
	flag, path string
	w          io.Writer
	f          *os.File // nil for standard error, which is not closed
	onFail     func(error)

	mu     sync.Mutex
	err    error
	closed bool
}

// SameFile reports whether a and b name the same file: the same existing
// file (links included), or the same cleaned absolute path. An output is
// checked against the inputs with it before it is created (truncated).
func SameFile(a, b string) bool {
	if sa, err := os.Stat(a); err == nil {
		if sb, err := os.Stat(b); err == nil {
			return os.SameFile(sa, sb)
		}
	}
	aa, err1 := filepath.Abs(a)
	ab, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && aa == ab
}

// CreateOutput creates (or truncates) path for flag; onFail (may be nil)
// hears of the first failed write. "-" is standard error
// where allowStderr is set.
func CreateOutput(flag, path string, allowStderr bool, onFail func(error)) (*OutputFile, error) {
	out := &OutputFile{flag: flag, path: path, onFail: onFail}
	if path == "-" && allowStderr {
		out.w = os.Stderr
		return out, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s %q cannot be written: %w", flag, path, err)
	}
	out.w, out.f = f, f
	return out, nil
}

// Write implements io.Writer; see outputFile.
func (o *OutputFile) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil && !o.closed {
		if _, err := o.w.Write(b); err != nil {
			o.err = fmt.Errorf("%s: writing %s failed: %w", o.flag, o.path, err)
			if o.onFail != nil {
				o.onFail(o.err)
			}
		}
	}
	return len(b), nil
}

// Close closes the file once and returns its first error (write or close).
func (o *OutputFile) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.closed = true
		if o.f != nil {
			if err := o.f.Close(); err != nil && o.err == nil {
				o.err = fmt.Errorf("%s: closing %s failed: %w", o.flag, o.path, err)
			}
		}
	}
	return o.err
}
