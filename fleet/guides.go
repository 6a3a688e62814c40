package fleet

import (
	"fmt"
	"sync"

	"github.com/lockstep-ai/lockstep/structured"
)

// guideCacheSize is how many compiled guides (structured outputs) a
// process keeps: a server sees a few schemas again and again.
const guideCacheSize = 64

// Guides is the compiled-guide cache of structured outputs for the loaded
// checkpoint's vocabulary (its stop tokens end a guided output), built on
// first use and shared by the process's ranks and its server; nil for a
// preset (no tokenizer). The vocabulary spans the model's logits (the
// engine's vocab size), ids the tokenizer lacks never allowed.
func (o *Options) Guides() (*structured.Cache, error) {
	if o.loaded == nil || o.loaded.Tokenizer == nil || o.guides == nil {
		return nil, nil
	}
	g := o.guides
	g.once.Do(func() {
		pieces := o.loaded.Tokenizer.TextPieces()
		n := o.loaded.Shape.VocabSize
		if n <= 0 {
			g.err = fmt.Errorf("structured outputs: the model's vocab size is %d", n)
			return
		}
		full := make([][]byte, n)
		copy(full, pieces)
		v, err := structured.NewVocab(full, o.stopTokens())
		if err != nil {
			g.err = fmt.Errorf("structured outputs: %w", err)
			return
		}
		g.cache = structured.NewCache(v, guideCacheSize)
	})
	return g.cache, g.err
}

// guideState is Guides' cache, built once and shared by the copies of the
// Options that loaded the checkpoint.
type guideState struct {
	once  sync.Once
	cache *structured.Cache
	err   error
}
