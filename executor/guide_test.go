package executor

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/structured"
)

// guideVocab is a vocabulary of the tiny preset's 512 ids: 0 ends
// generation, 1..95 are the printable ASCII characters, then the pairs of
// digits and a few words.
func guideVocab(t testing.TB) (*structured.Vocab, [][]byte) {
	t.Helper()
	pieces := make([][]byte, bridge.Presets["tiny"].VocabSize)
	pieces[0] = []byte("</s>")
	for c := 32; c < 127; c++ {
		pieces[c-31] = []byte{byte(c)}
	}
	id := 96
	for d := range 100 {
		pieces[id] = fmt.Appendf(nil, "%02d", d)
		id++
	}
	for _, w := range []string{"alpha", "beta", "gamma", "al", "ph", "ga", "mm", `{"`, `":`, `"}`, ", ", "true", "false"} {
		pieces[id] = []byte(w)
		id++
	}
	v, err := structured.NewVocab(pieces, []int32{0})
	require.NoError(t, err)
	return v, pieces
}

// editSource hands out a trace source's arrivals after edit.
type editSource struct {
	Source
	edit func(a *Arrival)
}

func (s *editSource) Due(now time.Time) []Arrival {
	items := s.Source.Due(now)
	for i := range items {
		s.edit(&items[i])
	}
	return items
}

// guided gives arrival i the guide patterns[i % len] and, with params,
// sampling parameters seeded by the id.
func guided(src Source, patterns []string, params bridge.SamplingParams, stopEOS bool) Source {
	return &editSource{Source: src, edit: func(a *Arrival) {
		a.Guide, a.StopAtEOS = patterns[int(a.ID)%len(patterns)], stopEOS
		if params != (bridge.SamplingParams{}) {
			a.Sampling = params
			a.Sampling.Seed = 100 + a.ID
		}
	}}
}

// Guided requests produce matches of their patterns, end where the match
// cannot go on (or at a stop token once it is a match), and give the same
// tokens on 1 and 4 ranks, in both loops, through recompute preemptions.
func TestGuidedOutputsMatchAndAreInvariant(t *testing.T) {
	vocab, pieces := guideVocab(t)
	guides := structured.NewCache(vocab, 8)
	patterns := []string{`\{"n": [0-9]{1,6}\}`, `(?:alpha|beta|gamma)`, `[a-z ]{3,40}\.`, `(?:true|false)(?:, (?:true|false)){0,5}`}
	reqs := longOutputRequests(12, 40, 60)
	text := func(out []int32) string {
		var sb strings.Builder
		for _, id := range out {
			if id != 0 {
				sb.Write(pieces[id])
			}
		}
		return sb.String()
	}
	run := func(ranks, pages int, overlap bool, params bridge.SamplingParams, stopEOS bool) (map[uint64][]int32, int) {
		f := &fleet{ranks: ranks, reqs: reqs, pages: pages, overlap: overlap, stopTokens: []int32{0}, guides: guides,
			source: guided(NewTraceSource(reqs, time.Now()), patterns, params, stopEOS)}
		f.run(t)
		f.requireNoErrors(t)
		outs := map[uint64][]int32{}
		recomputed := 0
		for _, r := range f.results[0].Responses {
			require.Empty(t, r.Error, "request %d", r.ID)
			re := regexp.MustCompile(`^(?:` + patterns[int(r.ID)%len(patterns)] + `)$`)
			got := text(r.Output)
			require.True(t, r.Stopped, "request %d (%q) ended at the length limit", r.ID, got)
			require.Less(t, len(r.Output), 60, "request %d", r.ID)
			require.Regexp(t, re, got, "request %d", r.ID)
			outs[r.ID] = r.Output
			recomputed += r.Recomputed
		}
		require.Len(t, outs, len(reqs))
		return outs, recomputed
	}
	for _, params := range []bridge.SamplingParams{{}, {Temperature: 1.2, TopK: 50}} {
		ref, _ := run(1, 512, false, params, true)
		for _, overlap := range []bool{false, true} {
			got, _ := run(4, 512, overlap, params, true)
			require.Equal(t, ref, got, "4 ranks, overlap %v, %+v", overlap, params)
			tight, recomputed := run(2, 14, overlap, params, true)
			require.Positive(t, recomputed, "the tight pool should force recompute")
			require.Equal(t, ref, tight, "tight pool, overlap %v, %+v", overlap, params)
		}
		// Without StopAtEOS (ignore_eos) a guided request still ends where
		// its match is complete.
		run(2, 512, true, params, false)
	}
}

// Rank 0 rejects a guide it cannot run before the broadcast, naming why;
// without a vocabulary every guided arrival is rejected.
func TestBadGuidesRejected(t *testing.T) {
	vocab, _ := guideVocab(t)
	reqs := longOutputRequests(4, 16, 4)
	patterns := []string{`(unclosed`, `é`, `ok`, `\bx`}
	f := &fleet{ranks: 2, reqs: reqs, stopTokens: []int32{0}, guides: structured.NewCache(vocab, 4),
		source: guided(NewTraceSource(reqs, time.Now()), patterns, bridge.SamplingParams{}, true)}
	f.run(t)
	f.requireNoErrors(t)
	errs := map[uint64]string{}
	for _, r := range f.results[0].Responses {
		errs[r.ID] = r.Error
	}
	require.Contains(t, errs[0], "invalid guide: ")
	require.Contains(t, errs[0], "missing closing )")
	require.Contains(t, errs[1], "no token of the model's vocabulary can begin a match")
	require.Empty(t, errs[2])
	require.Contains(t, errs[3], "word boundaries")

	f = &fleet{ranks: 2, reqs: reqs, stopTokens: []int32{0},
		source: guided(NewTraceSource(reqs, time.Now()), []string{"ok"}, bridge.SamplingParams{}, false)}
	f.run(t)
	f.requireNoErrors(t)
	for _, r := range f.results[0].Responses {
		require.Contains(t, r.Error, "structured outputs need the model's vocabulary")
	}
}

func TestArrivalPayloadGuide(t *testing.T) {
	items := []Arrival{{ID: 1, MaxNewTokens: 3, Prompt: []int32{4}, Guide: `[0-9]+`},
		{ID: 2, MaxNewTokens: 3, Prompt: []int32{5}, Guide: "é|\x00", Logprobs: true, TopLogprobs: 2},
		{ID: 3, MaxNewTokens: 3, Prompt: []int32{6}, MinTokens: 3},
		{ID: 4, MaxNewTokens: 3, Prompt: []int32{6}, AllowedTokenIDs: []int32{5, 0, 511}, Guide: "x"},
		{ID: 5, MaxNewTokens: 3, Prompt: []int32{6}, AllowedTokenIDs: []int32{7}, MinTokens: 1},
		{ID: 6, MaxNewTokens: 3, Prompt: []int32{6}, BadWords: [][]int32{{1}, {2, 3, 4}}}}
	got, err := decodeArrivals(encodeArrivals(items), len(items))
	require.NoError(t, err)
	require.Equal(t, items, materialized(got))
	payload := encodeArrivals(items[:1])
	_, err = decodeArrivals(payload[:len(payload)-6], 1)
	require.ErrorContains(t, err, "collective desync")
	// An unknown extra flag is a desync.
	payload = encodeArrivals(items[3:4])
	at := 8 + 8 + 4 + 4 + 4 + 1 + 4 + 4 + 1 // id … rank, then the guide "x": the extra flags
	require.Equal(t, byte(extraAllowedIDs), payload[at])
	payload[at] = 0x80
	_, err = decodeArrivals(payload, 1)
	require.ErrorContains(t, err, "bad extra flags")
}

// Before min_tokens no stop token is picked; after it the stop tokens
// end requests as before, the same on 1 and 3 ranks.
func TestMinTokens(t *testing.T) {
	stops := make([]int32, 0, 400)
	for id := range int32(400) { // most of the tiny vocabulary: unmasked, answers stop at once
		stops = append(stops, id)
	}
	reqs := longOutputRequests(8, 30, 40)
	run := func(ranks, min int) map[uint64][]int32 {
		f := &fleet{ranks: ranks, reqs: reqs, stopTokens: stops, overlap: true,
			source: &editSource{Source: NewTraceSource(reqs, time.Now()), edit: func(a *Arrival) {
				a.StopAtEOS, a.MinTokens = true, min
				a.Sampling = bridge.SamplingParams{Temperature: 1, Seed: a.ID}
			}}}
		return outputsOf(t, f)
	}
	short := 0
	for _, o := range run(1, 0) {
		if len(o) < 5 {
			short++
		}
	}
	require.Greater(t, short, 4, "without min_tokens most answers should stop within a few tokens")
	ref := run(1, 12)
	for id, o := range ref {
		require.GreaterOrEqual(t, len(o), 12, "request %d", id)
		for k, tok := range o[:12] {
			require.GreaterOrEqual(t, tok, int32(400), "request %d token %d is a stop token before min_tokens", id, k)
		}
		require.True(t, len(o) == 40 || o[len(o)-1] < 400, "request %d ends at a stop token or at max", id)
	}
	require.Equal(t, ref, run(3, 12))
}

// min_tokens without any stop token that could end the request (trace
// replays send ignore_eos with min_tokens = max_tokens) adds no mask.
func TestMinTokensWithoutStopsAddsNoMask(t *testing.T) {
	e := &Executor{}
	r := &request{minTokens: 5}
	require.Nil(t, e.pickMask(r))
	r.stopAtEOS = true // the model has no stop tokens (a preset)
	require.Nil(t, e.pickMask(r))
	require.Nil(t, r.mask)
}

// outputsOf runs f and returns every request's output; none may fail.
func outputsOf(t *testing.T, f *fleet) map[uint64][]int32 {
	t.Helper()
	f.run(t)
	f.requireNoErrors(t)
	outs := map[uint64][]int32{}
	for _, r := range f.results[0].Responses {
		require.Empty(t, r.Error, "request %d", r.ID)
		outs[r.ID] = r.Output
	}
	return outs
}

// restricted gives every arrival allowed token ids, a guide and bad
// words, StopAtEOS and sampling seeded by the id.
func restricted(src Source, ids []int32, guide string, bad [][]int32) Source {
	return &editSource{Source: src, edit: func(a *Arrival) {
		a.AllowedTokenIDs, a.Guide, a.BadWords, a.StopAtEOS = ids, guide, bad, true
		a.Sampling = bridge.SamplingParams{Temperature: 1, Seed: a.ID}
	}}
}

// allowed_token_ids restrict every pick, alone or within a guide's mask
// (which wins when they share no token); the same on 1 and 3 ranks.
func TestAllowedTokenIDs(t *testing.T) {
	vocab, pieces := guideVocab(t)
	reqs := longOutputRequests(6, 20, 30)
	digit := func(c byte) int32 { return int32(c) - 31 }
	run := func(ranks int, ids []int32, guide string) map[uint64][]int32 {
		f := &fleet{ranks: ranks, reqs: reqs, stopTokens: []int32{0}, guides: structured.NewCache(vocab, 4),
			source: restricted(NewTraceSource(reqs, time.Now()), ids, guide, nil)}
		return outputsOf(t, f)
	}
	only := []int32{7, 300, 511}
	ref := run(1, only, "")
	for id, o := range ref {
		require.Len(t, o, 30, "request %d", id)
		for _, tok := range o {
			require.Contains(t, only, tok, "request %d", id)
		}
	}
	require.Equal(t, ref, run(3, only, ""))

	twelve := []int32{digit('1'), digit('2'), 0}
	for id, o := range run(2, twelve, `[0-9]{1,8}`) {
		var text strings.Builder
		for _, tok := range o {
			require.Contains(t, twelve, tok, "request %d", id)
			text.Write(pieces[tok])
		}
		require.Regexp(t, `^[12]{1,8}(</s>)?$`, text.String(), "request %d", id)
	}
	for id, o := range run(2, twelve, `[a-c]`) { // no token in common: the guide's mask
		require.Len(t, o, 1, "request %d", id)
		require.Contains(t, "abc", string(pieces[o[0]]), "request %d", id)
	}
}

// Bad words: a one-token word never comes, a two-token word's last token
// never follows its first; the same on 1 and 3 ranks.
func TestBadWords(t *testing.T) {
	reqs := longOutputRequests(6, 20, 40)
	run := func(ranks int, bad [][]int32) map[uint64][]int32 {
		f := &fleet{ranks: ranks, reqs: reqs, stopTokens: []int32{0},
			source: restricted(NewTraceSource(reqs, time.Now()), []int32{7, 300, 301}, "", bad)}
		return outputsOf(t, f)
	}
	pairs := func(outs map[uint64][]int32) (sevens, after int) {
		for _, o := range outs {
			for k, tok := range o {
				if tok == 7 {
					sevens++
				}
				if k > 0 && o[k-1] == 300 && tok == 301 {
					after++
				}
			}
		}
		return
	}
	s, a := pairs(run(1, nil))
	require.Positive(t, s)
	require.Positive(t, a, "without bad words 301 follows 300 somewhere")
	bad := [][]int32{{7}, {300, 301}}
	ref := run(1, bad)
	s, a = pairs(ref)
	require.Zero(t, s)
	require.Zero(t, a)
	require.Equal(t, ref, run(3, bad))
	// After 300 both 7 and 301 are banned: 300 follows.
	for _, o := range ref {
		for k := 1; k < len(o); k++ {
			if o[k-1] == 300 {
				require.Equal(t, int32(300), o[k])
			}
		}
	}
}
