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
