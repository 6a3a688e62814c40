package fleet

// Startup checks of `worker run` that need more than one option: the
// merged options, the scheduler configuration (TLLM_* applied), the launch
// and the environment. They run before any work (no workload read, no
// engine built, no collective), refuse what could never work with an error
// naming where each value came from, and return the notes that explain a
// setting that is accepted but has no effect.

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// startupChecks checks o with its scheduler configuration sc under launch
// l; getenv reads the environment. It returns the startup notes to log and
// records the test fault in o.fault.
func (o *Options) startupChecks(sc scheduler.Config, l nccl.Launch, getenv func(string) string) ([]string, error) {
	var notes []string
	if err := sc.CheckServable(); err != nil {
		return nil, usage.Wrap(err)
	}
	helix := o.CP > 1
	// kvcache.md §10 / executor.md §11.4 P-08: block reuse with Helix is a
	// construction error naming the option; reuse at its default is turned
	// off with a note. (A host tier is never sized automatically here: it
	// exists only with --host-pages, which Validate refuses with Helix.)
	if helix && o.Sources.ReuseOnBy != "" {
		return nil, usage.Errorf("%s turns block reuse on with %s %d: aggregated Helix does not support block reuse "+
			"(a ledger block's bytes span CP ranks); remove the setting or set it to false", o.Sources.ReuseOnBy, o.Src("cp"), o.CP)
	}
	if helix && !o.NoPrefixReuse {
		notes = append(notes, "aggregated Helix turns block reuse off (a ledger block's bytes span CP ranks)")
	}
	check, err := executor.ParseScheduleCheckEnv(getenv(executor.ScheduleCheckEnv))
	if err != nil {
		return nil, usage.Wrap(err)
	}
	world := o.world()
	if l.MultiProcess() {
		world = l.WorldSize
		// serveProcess refuses these too; here they fail before the
		// outputs are created and the workload is read.
		if err := o.checkMultiProcessHelix(l); err != nil {
			return nil, err
		}
		if !helix && o.Ranks != 1 && o.Ranks != l.WorldSize && o.Sources.RanksSet {
			return nil, usage.Errorf("%s %d does not match the %s launch of %d processes (one rank per process)",
				o.Src("ranks"), o.Ranks, l.Launcher, l.WorldSize)
		}
	}
	if o.fault, err = parseFault(getenv(FaultEnv)); err != nil {
		return nil, usage.Wrap(err)
	}
	if err := checkFault(o.fault, world, helix && check, helix || o.expertParallel(world)); err != nil {
		return nil, usage.Wrap(err)
	}
	if err := o.checkCUDA(); err != nil {
		return nil, usage.Wrap(err)
	}
	if err := o.checkMoE(world); err != nil {
		return nil, usage.Wrap(err)
	}
	if n := o.demotionNote(sc, world); n != "" {
		notes = append(notes, n)
	}
	if n := o.noValveNote(sc); n != "" {
		notes = append(notes, n)
	}
	return notes, nil
}

// noValveNote warns of a MAX_UTILIZATION pool with no way to free pages
// under pressure: recompute pause off and no host tier, so that a request
// that cannot grow suspends in place and keeps its pages (scheduler.md
// §11.3); a pool filled by growing requests then stalls the run. (Under
// Helix the same case is a fatal error at the first failed allocation.)
// "" when a valve exists.
func (o *Options) noValveNote(sc scheduler.Config) string {
	if sc.Policy != scheduler.MaxUtilization || sc.RecomputePause || o.HostPages > 0 || o.CP > 1 {
		return ""
	}
	return fmt.Sprintf("max_utilization with recompute pause disabled (%s) and no host tier (%s 0) cannot free KV "+
		"pages under pressure: if growing requests fill the pool the run stops after 1000 stalled passes; enable "+
		"recompute pause, give a host tier or use guaranteed_no_evict", sc.Name(scheduler.SettingRecomputePause),
		o.Src("host-pages"))
}

// demotionNote explains why long-prefill demotion, configured and on in the
// scheduler, will demote nothing: only the conversation-aware router
// publishes the uncached-prefill estimates it reads, and a router runs only
// under attention DP over more than one rank (scheduler.md §10.1,
// router-and-calibration.md §5). "" when demotion can work.
func (o *Options) demotionNote(sc scheduler.Config, world int) string {
	if sc.Demotion.UncachedTokens <= 0 || !sc.ChunkedContext {
		return "" // off, and ConfigFromEnv already said why
	}
	var why string
	switch {
	case o.CP > 1:
		why = fmt.Sprintf("Helix CP (%s %d) runs no router", o.Src("cp"), o.CP)
	case world <= 1:
		why = fmt.Sprintf("one rank (%s %d) runs no router", o.Src("ranks"), world)
	case o.Router != "conversation":
		why = fmt.Sprintf("the %s router (%s) publishes none", o.Router, o.Src("router"))
	default:
		return ""
	}
	return fmt.Sprintf("long-prefill demotion (%s = %d) will demote nothing: it needs the uncached-prefill estimates "+
		"of the conversation-aware router, and %s; to use it run --router conversation with --ranks > 1",
		sc.Name(scheduler.SettingDemoteUncachedTokens), sc.Demotion.UncachedTokens, why)
}

// nameSchedulerSettings tells the scheduler where its flag-backed settings
// came from, so that its errors and notes name the flag or the config
// file's key (the file-only settings were named by fileConfig.apply; the
// TLLM_* variables name themselves in ConfigFromEnv).
func (o *Options) nameSchedulerSettings(c *scheduler.Config) {
	c.Names[scheduler.SettingMaxBatchSize] = o.Src("max-batch-size")
	c.Names[scheduler.SettingMaxNumTokens] = o.Src("max-num-tokens")
	c.Names[scheduler.SettingChunkedContext] = o.Src("chunked-prefill")
	c.Names[scheduler.SettingChunkUnitSize] = o.Src("chunk-unit")
	if o.Scheduler.ChunkUnitSize == 0 {
		c.Names[scheduler.SettingChunkUnitSize] = fmt.Sprintf("%s (the chunk unit while %s is 0)",
			o.Src("tokens-per-page"), o.Src("chunk-unit"))
	}
	c.Names[scheduler.SettingPolicy] = o.Src("policy")
	c.Names[scheduler.SettingAdmissionLookahead] = o.Src("admission-lookahead")
	if c.Names[scheduler.SettingRecomputePause] == "" {
		c.Names[scheduler.SettingRecomputePause] = "scheduler.enable_recompute_pause in --config"
	}
	if c.Names[scheduler.SettingSchedulerCapacity] == "" {
		c.Names[scheduler.SettingSchedulerCapacity] = "scheduler.scheduler_capacity in --config"
	}
	c.Names[scheduler.SettingPoolSize] = fmt.Sprintf("%s (KV pages per rank) and %s", o.Src("pages"), o.Src("tokens-per-page"))
}
