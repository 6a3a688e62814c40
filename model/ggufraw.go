package model

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// The GGUF parser this package uses trims white space from every string it
// reads, which turns a vocabulary's whitespace tokens ("\t", "\n", "  " in
// SentencePiece vocabularies, or a control token's trailing newline) into
// "" and changes the chat template's edges. ggufRawStrings re-reads the
// strings of the named keys (a string or an array of strings) as the file
// holds them, walking the metadata section itself.

// ggufRawStrings returns, per key found, its strings exactly as stored.
func ggufRawStrings(path string, keys ...string) (map[string][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	r := &ggufRaw{r: bufio.NewReaderSize(f, 1<<16), left: st.Size()}
	var head [24]byte
	if err := r.read(head[:]); err != nil {
		return nil, err
	}
	if string(head[:4]) != "GGUF" {
		return nil, fmt.Errorf("not a GGUF file")
	}
	if v := binary.LittleEndian.Uint32(head[4:]); v < 2 {
		return nil, fmt.Errorf("GGUF version %d: 64-bit lengths start at version 2", v)
	}
	n := binary.LittleEndian.Uint64(head[16:])
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	out := map[string][]string{}
	for i := uint64(0); i < n && len(out) < len(want); i++ {
		key, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("metadata entry %d: %w", i, err)
		}
		typ, err := r.u32()
		if err != nil {
			return nil, err
		}
		var strs *[]string
		if want[key] {
			strs = new([]string)
		}
		if err := r.value(typ, strs, 0); err != nil {
			return nil, fmt.Errorf("metadata %s: %w", key, err)
		}
		if strs != nil {
			out[key] = *strs
		}
	}
	return out, nil
}

type ggufRaw struct {
	r    *bufio.Reader
	left int64 // bytes of the file not yet read
}

func (g *ggufRaw) read(b []byte) error {
	if int64(len(b)) > g.left {
		return fmt.Errorf("truncated file")
	}
	g.left -= int64(len(b))
	_, err := io.ReadFull(g.r, b)
	return err
}

func (g *ggufRaw) u32() (uint32, error) {
	var b [4]byte
	err := g.read(b[:])
	return binary.LittleEndian.Uint32(b[:]), err
}

func (g *ggufRaw) u64() (uint64, error) {
	var b [8]byte
	err := g.read(b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

func (g *ggufRaw) skip(n uint64) error {
	if n > uint64(g.left) {
		return fmt.Errorf("truncated file")
	}
	g.left -= int64(n)
	_, err := g.r.Discard(int(n))
	return err
}

func (g *ggufRaw) str() (string, error) {
	n, err := g.u64()
	if err != nil {
		return "", err
	}
	if n > uint64(g.left) {
		return "", fmt.Errorf("a string of %d bytes in %d left (corrupt file?)", n, g.left)
	}
	b := make([]byte, n)
	return string(b), g.read(b)
}

// ggufScalarBytes are the sizes of GGUF's fixed-size value types.
var ggufScalarBytes = map[uint32]uint64{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

// value reads (or skips) one value of type typ; its strings go to strs when
// it is not nil.
func (g *ggufRaw) value(typ uint32, strs *[]string, depth int) error {
	if size, ok := ggufScalarBytes[typ]; ok {
		return g.skip(size)
	}
	switch typ {
	case 8: // string
		if strs == nil {
			n, err := g.u64()
			if err != nil {
				return err
			}
			return g.skip(n)
		}
		s, err := g.str()
		*strs = append(*strs, s)
		return err
	case 9: // array
		if depth > 4 {
			return fmt.Errorf("arrays nested deeper than 4")
		}
		et, err := g.u32()
		if err != nil {
			return err
		}
		n, err := g.u64()
		if err != nil {
			return err
		}
		if size, ok := ggufScalarBytes[et]; ok {
			if n > uint64(g.left)/size {
				return fmt.Errorf("an array of %d values in %d bytes (corrupt file?)", n, g.left)
			}
			return g.skip(n * size)
		}
		if n > uint64(g.left)/8 {
			return fmt.Errorf("an array of %d values in %d bytes (corrupt file?)", n, g.left)
		}
		if strs != nil && et == 8 {
			*strs = make([]string, 0, n)
		}
		for i := uint64(0); i < n; i++ {
			if err := g.value(et, strs, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown value type %d", typ)
}
