package structured_test

import (
	"testing"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/model/modeltest"
	"github.com/lockstep-ai/lockstep/structured"
)

// personPattern is the pattern serve makes of a three-property schema
// (name a string, age a non-negative integer, city one of three).
const personPattern = `\{"name": ?"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*", ?"age": ?(?:0|[1-9][0-9]*), ?"city": ?(?:"Paris"|"Rome"|"Berlin")\}`

// countedPattern is a string of at most 200 characters (maxLength 200):
// every position is a state of its own, each with a mask to walk.
const countedPattern = `"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]){0,200}"`

// BenchmarkGuideSmolLM2 is a guided answer's host cost per token on
// SmolLM2's vocabulary (49 152 ids): the mask before each pick and the
// advance after it. cold: a new guide per answer (every mask walked);
// counted: the same for a string of at most 200 characters (a state, and
// a mask walked, per character position); warm: the guide of earlier
// answers (masks cached).
func BenchmarkGuideSmolLM2(b *testing.B) {
	m, err := model.Load(modeltest.SmolLM2(b))
	if err != nil {
		b.Skip(err)
	}
	defer m.Close()
	tok := m.Tokenizer
	full := make([][]byte, m.Shape.VocabSize)
	copy(full, tok.TextPieces())
	v, err := structured.NewVocab(full, tok.StopTokens())
	if err != nil {
		b.Fatal(err)
	}
	answer := tok.Encode(`{"name": "Marcus Aurelius the younger", "age": 25, "city": "Rome"}`, model.EncodeOptions{})
	counted := tok.Encode(`"Marcus Aurelius the younger was an emperor of Rome for many years"`, model.EncodeOptions{})
	walk := func(g *structured.Guide) {
		mt := g.NewMatcher()
		answer := answer
		if g.Pattern() == countedPattern {
			answer = counted
		}
		for _, id := range answer {
			if !mt.Live() || !mt.Advance(id) {
				b.Fatalf("token %d refused", id)
			}
		}
		if !mt.Accepting() {
			b.Fatal("the answer is not a match")
		}
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			g, err := structured.Compile(personPattern, v)
			if err != nil {
				b.Fatal(err)
			}
			walk(g)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(answer)), "ns/token")
	})
	b.Run("counted", func(b *testing.B) {
		// A new guide per answer, as cold, of countedPattern.
		for b.Loop() {
			g, err := structured.Compile(countedPattern, v)
			if err != nil {
				b.Fatal(err)
			}
			walk(g)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(counted)), "ns/token")
	})
	b.Run("warm", func(b *testing.B) {
		g, err := structured.Compile(personPattern, v)
		if err != nil {
			b.Fatal(err)
		}
		walk(g)
		for b.Loop() {
			walk(g)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(answer)), "ns/token")
	})
}
