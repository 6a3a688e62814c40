package fleet

import (
	"github.com/lockstep-ai/lockstep/scheduler"
)

// SchedulerConfig is the scheduler configuration of the run: Options.Scheduler
// with the flags' conventions resolved (max_num_tokens 0 is unlimited, a
// chunk unit of 0 is the page size), every setting named by where it came
// from, and the TLLM_* variables (read through getenv) applied. The notes
// say what the variables changed.
func (o *Options) SchedulerConfig(getenv func(string) string) (scheduler.Config, []string, error) {
	c := o.Scheduler
	if c.MaxNumTokens == 0 {
		c.MaxNumTokens = scheduler.Unlimited
	}
	if c.ChunkUnitSize == 0 {
		c.ChunkUnitSize = o.TokensPerPage
	}
	c.LedgerBlockTokens = o.TokensPerPage
	o.nameSchedulerSettings(&c)
	return scheduler.ConfigFromEnv(c, getenv)
}
