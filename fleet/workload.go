package fleet

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/router"
	"github.com/lockstep-ai/lockstep/workload"
)

// settingName names a setting in errors by where its value came from: the
// flag ("--length-scale"), or the config file's "FILE:LINE key" that set it
// (src).
func (o *Options) settingName(flag string) string { return o.Src(flag) }

// validateScales checks --length-scale and --arrival-scale (or the config
// keys that set them) with the workload package's rules, so that flags,
// config and the trace reader can never disagree on what is allowed.
func (o *Options) validateScales() error {
	if err := workload.CheckLengthScale(o.LengthScale, o.settingName("length-scale")); err != nil {
		return usage.Wrap(err)
	}
	if err := workload.CheckArrivalScale(o.ArrivalScale, o.settingName("arrival-scale")); err != nil {
		return usage.Wrap(err)
	}
	if err := workload.CheckArrivals(o.Arrivals, o.settingName("arrivals")); err != nil {
		return usage.Wrap(err)
	}
	return nil
}

// attentionDPRanks is the number of attention-DP ranks of the run, which
// bounds a trace's attention_dp_rank: the in-process ranks, or the
// processes of a launch; 1 under Helix (its CP ranks share every request).
func (o *Options) AttentionDPRanks(l nccl.Launch) int {
	switch {
	case o.CP > 1:
		return 1
	case l.MultiProcess():
		return l.WorldSize
	}
	return o.Ranks
}

// adpConfigWarning is the warning for an attention_dp_config mode asked for
// where there is no attention DP (one rank, or Helix CP ranks): like
// TensorRT-LLM, which reads attention_dp_config only with attention DP on,
// the run goes on without it, but says so once.
func (o *Options) adpConfigWarning(adpRanks int) string {
	if adpRanks > 1 {
		return ""
	}
	var on []string
	if o.ADPBalance.Enable {
		on = append(on, o.Src("attention-dp-balance"))
	}
	if o.ADPBalance.CostLeveling {
		on = append(on, o.Src("attention-dp-cost-leveling"))
	}
	if len(on) == 0 {
		return ""
	}
	return strings.Join(on, " and ") + ": no effect without attention DP (this run has one attention-DP rank); ignored"
}

// routerConfigWarning is the warning for conversation-router settings on
// a run whose router is not the conversation-aware one: the default router
// places by load alone and reads neither, so the run goes on without them
// and says so once.
func (o *Options) routerConfigWarning() string {
	if o.Router == router.NameConversation {
		return ""
	}
	var on []string
	if o.NewConvPlacement != router.PlacementRoundRobin && o.NewConvPlacement != "" {
		on = append(on, o.Src("new-conv-placement"))
	}
	if o.LoadBalanceWeight != 0 {
		on = append(on, o.Src("load-balance-weight"))
	}
	if len(on) == 0 {
		return ""
	}
	return strings.Join(on, " and ") + ": read by the conversation router only (" + o.Src("router") + " is " +
		strconv.Quote(o.Router) + "; set --router conversation); ignored"
}

// workloadName labels the workload in messages: the trace path or the
// built-in sample.
func (o *Options) workloadName() string {
	if o.Text.Active() {
		return "prompts"
	}
	if o.Trace == "" {
		return workload.SampleName
	}
	return o.Trace
}

// loadWorkload reads the trace (or the built-in sample) with every value
// checked, for a run of adpRanks attention-DP ranks. No token is made here:
// rank 0 synthesises a request's prompt when it arrives and can be served.
func (o *Options) LoadWorkload(adpRanks int) ([]workload.Request, error) {
	if o.Text.Active() {
		return o.promptWorkload()
	}
	shape, _ := o.ModelShape() // validated
	opt := workload.Options{Limit: o.Limit, LengthScale: o.LengthScale, ArrivalScale: o.ArrivalScale,
		VocabSize: shape.VocabSize, Seed: o.Seed, Ranks: adpRanks,
		LengthScaleName: o.settingName("length-scale"), ArrivalScaleName: o.settingName("arrival-scale")}
	reqs, err := workload.Load(o.Trace, opt)
	if err == nil && o.Arrivals == workload.ArrivalsPoisson {
		workload.PoissonArrivals(reqs, o.Seed)
	}
	if err == nil && o.ContextOnly {
		for i := range reqs {
			reqs[i].MaxNewTokens = 1
		}
	}
	if err == nil && o.InferConversations {
		workload.InferConversations(reqs)
	}
	return reqs, err
}

// Admission is the arrival check every rank will apply (scheduler.Admission),
// built from the options before any rank exists. ok is false when the pool
// is sized from GPU memory at start-up (--pages 0): then only the ranks know.
func (o *Options) Admission(sc scheduler.Config) (a scheduler.Admission, ok bool) {
	if o.Pages <= 0 {
		return scheduler.Admission{}, false
	}
	return scheduler.Admission{Pages: o.Pages, LedgerBlockTokens: o.TokensPerPage * o.CP, MaxSeqLen: o.MaxSeqLen,
		Scheduler: sc}, true
}

// maxListedRejections bounds the reasons an all-rejected error lists.
const maxListedRejections = 5

// checkServable refuses, before any rank starts, a run in which no request
// could ever be served: every one would be rejected on arrival, so the run
// could only print rejections. Requests that cannot fit while others can
// are not an error: they are rejected with their reason in the report.
func (o *Options) checkServable(sc scheduler.Config, reqs []workload.Request) error {
	adm, ok := o.Admission(sc)
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
		len(reqs), adm.Pages, adm.LedgerBlockTokens, o.LengthScale, strings.Join(reasons, "\n  "), more)
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
func (o *Options) stopTokens() []int32 {
	if o.loaded == nil {
		return nil
	}
	return o.loaded.Tokenizer.StopTokens()
}
