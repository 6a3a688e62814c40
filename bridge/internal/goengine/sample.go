package goengine

import "github.com/lockstep-ai/lockstep/bridge"

// Sample writes a pure-Go engine's outputs for every sequence of desc into
// res: the sampled token (-1 where a sequence does not sample), the
// log-probabilities when the step asks for them, and one logits row per
// sampling sequence when desc.WantLogits. The engines differ only in the
// sequence's hash (hash: its greedy token is hash % vocab) and in their
// deterministic row for a hash (logits appends it to dst; its argmax is the
// token). A row is built only for a sequence that samples stochastically,
// asks for log-probabilities or for logits: O(vocab) for it alone. row is
// the caller's scratch; Sample returns it for the next step.
func Sample(desc *bridge.StepDesc, res *bridge.StepResult, vocab int, hash func(sq *bridge.SeqStep) uint64,
	logits func(dst []float32, h uint64, tok int32, vocab int) []float32, row []float32) []float32 {
	res.Sampled = Resize(res.Sampled, len(desc.Seqs))
	res.Logits = res.Logits[:0]
	lp := desc.WantsLogprobs()
	bridge.ResizeLogprobs(res, len(desc.Seqs), lp)
	for i := range desc.Seqs {
		sq := &desc.Seqs[i]
		if !sq.Sample {
			res.Sampled[i] = -1
			if lp {
				bridge.FillLogprobs(res, i, nil, sq, -1)
			}
			continue
		}
		h := hash(sq)
		tok := int32(h % uint64(vocab))
		if sq.Sampling.IsGreedy() && !sq.HasProcessors() {
			res.Sampled[i] = tok
		} else {
			row = logits(row[:0], h, tok, vocab)
			res.Sampled[i] = bridge.SampleSeq(row, sq)
		}
		if lp {
			row = logits(row[:0], h, tok, vocab)
			bridge.FillLogprobs(res, i, row, sq, res.Sampled[i])
		}
		if desc.WantLogits {
			res.Logits = logits(res.Logits, h, tok, vocab)
		}
	}
	return row
}

// Score writes a pure-Go engine's scored rows (bridge.SeqStep.ScoreTargets)
// into res, or empties res's score slices when no row is scored. A scored
// row's logits are the row the engine would sample from for a sequence
// ending at that token: rowHashes appends one hash per token of sq (the
// hash Sample's hash gives for the sequence cut after that token), and
// logits builds the row as Sample does. hs and row are the caller's
// scratch, returned for the next step.
func Score(desc *bridge.StepDesc, res *bridge.StepResult, vocab int,
	rowHashes func(sq *bridge.SeqStep, dst []uint64) []uint64,
	logits func(dst []float32, h uint64, tok int32, vocab int) []float32, hs []uint64, row []float32) ([]uint64, []float32) {
	want, rows := desc.WantsScores()
	bridge.ResizeScores(res, rows, want)
	if !want {
		return hs, row
	}
	r := 0
	for i := range desc.Seqs {
		sq := &desc.Seqs[i]
		if !sq.Scores() {
			r += len(sq.Tokens)
			continue
		}
		hs = rowHashes(sq, hs[:0])
		for k, t := range sq.ScoreTargets {
			if t >= 0 {
				h := hs[k]
				row = logits(row[:0], h, int32(h%uint64(vocab)), vocab)
				bridge.FillScore(res, r+k, row, t, sq.ScoreTop)
			}
		}
		r += len(sq.Tokens)
	}
	return hs, row
}
