package main

import (
	"fmt"
	"strings"

	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// settingName names a setting in errors by where its value came from: the
// flag ("--length-scale"), or the config file's "FILE:LINE key" that set it
// (src).
func (o *serveOptions) settingName(flag string) string { return o.src(flag) }

// validateScales checks --length-scale and --arrival-scale (or the config
// keys that set them) with the workload package's rules, so that flags,
// config and the trace reader can never disagree on what is allowed.
func (o *serveOptions) validateScales() error {
	if err := workload.CheckLengthScale(o.lengthScale, o.settingName("length-scale")); err != nil {
		return usageError{err}
	}
	if err := workload.CheckArrivalScale(o.arrivalScale, o.settingName("arrival-scale")); err != nil {
		return usageError{err}
	}
	return nil
}

// attentionDPRanks is the number of attention-DP ranks of the run, which
// bounds a trace's attention_dp_rank: the in-process ranks, or the
// processes of a launch; 1 under Helix (its CP ranks share every request).
func (o *serveOptions) attentionDPRanks(l nccl.Launch) int {
	switch {
	case o.cp > 1:
		return 1
	case l.MultiProcess():
		return l.WorldSize
	}
	return o.ranks
}

// workloadName labels the workload in messages: the trace path or the
// built-in sample.
func (o *serveOptions) workloadName() string {
	if o.text.active() {
		return "prompts"
	}
	if o.trace == "" {
		return workload.SampleName
	}
	return o.trace
}

// loadWorkload reads the trace (or the built-in sample) with every value
// checked, for a run of adpRanks attention-DP ranks. No token is made here:
// rank 0 synthesises a request's prompt when it arrives and can be served.
func (o *serveOptions) loadWorkload(adpRanks int) ([]workload.Request, error) {
	if o.text.active() {
		return o.promptWorkload()
	}
	shape, _ := o.modelShape() // validated
	opt := workload.Options{Limit: o.limit, LengthScale: o.lengthScale, ArrivalScale: o.arrivalScale,
		VocabSize: shape.VocabSize, Seed: o.seed, Ranks: adpRanks,
		LengthScaleName: o.settingName("length-scale"), ArrivalScaleName: o.settingName("arrival-scale")}
	var reqs []workload.Request
	var err error
	if o.trace == "" {
		reqs, err = workload.Sample(opt)
	} else {
		reqs, err = workload.ReadFile(o.trace, opt)
	}
	if err == nil && o.contextOnly {
		for i := range reqs {
			reqs[i].MaxNewTokens = 1
		}
	}
	if err == nil && o.inferConversations {
		workload.InferConversations(reqs)
	}
	return reqs, err
}

// admission is the arrival check every rank will apply (scheduler.Admission),
// built from the options before any rank exists. ok is false when the pool
// is sized from GPU memory at start-up (--pages 0): then only the ranks know.
func (o *serveOptions) admission(sc scheduler.Config) (a scheduler.Admission, ok bool) {
	if o.pages <= 0 {
		return scheduler.Admission{}, false
	}
	return scheduler.Admission{Pages: o.pages, LedgerBlockTokens: o.tokensPerPage * o.cp, MaxSeqLen: o.maxSeqLen,
		Scheduler: sc}, true
}

// maxListedRejections bounds the reasons an all-rejected error lists.
const maxListedRejections = 5

// checkServable refuses, before any rank starts, a run in which no request
// could ever be served: every one would be rejected on arrival, so the run
// could only print rejections. Requests that cannot fit while others can
// are not an error: they are rejected with their reason in the report.
func (o *serveOptions) checkServable(sc scheduler.Config, reqs []workload.Request) error {
	adm, ok := o.admission(sc)
	if !ok || len(reqs) == 0 {
		return nil
	}
	var reasons []string
	for i := range reqs {
		r := &reqs[i]
		v := adm.Verdict(r.Len(), r.MaxNewTokens)
		if v.Code != scheduler.NeverFits {
			return nil
		}
		why := v.Reason
		if len(reasons) < maxListedRejections {
			reasons = append(reasons, fmt.Sprintf("%s: %s", requestPlace(o.workloadName(), r), why))
		}
	}
	more := ""
	if n := len(reqs) - len(reasons); n > 0 {
		more = fmt.Sprintf("\n  ... and %d more", n)
	}
	return fmt.Errorf("none of the %d requests can ever be served with this configuration "+
		"(a KV pool of %d pages × %d tokens per rank, length scale %v); nothing was run:\n  %s%s",
		len(reqs), adm.Pages, adm.LedgerBlockTokens, o.lengthScale, strings.Join(reasons, "\n  "), more)
}

// requestPlace names a request for a message: "file:line" for a trace
// line, "<sample> request i" otherwise.
func requestPlace(name string, r *workload.Request) string {
	if r.Line > 0 {
		return fmt.Sprintf("%s:%d", name, r.Line)
	}
	return fmt.Sprintf("%s request %d", name, r.Index)
}

// stopTokens are the model's end-of-generation tokens (none for presets).
func (o *serveOptions) stopTokens() []int32 {
	if o.loaded == nil {
		return nil
	}
	return o.loaded.Tokenizer.StopTokens()
}
