package fleet

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/report"
)

// FitStats describes a linear fit: steps used and the in-sample relative
// error of the fitted step times.
type FitStats struct {
	Samples                 int
	MeanAbsErr, P90AbsErr   float64
	HostMedianMS            float64
	Coefficients            twin.LinearCoefficients
	MeasuredMS, PredictedMS []float64
}

// FitTwinProfile fits the linear cost model of docs/twin.md to every step
// the logs record (an iteration with a forward and a measured device time):
// features from the record (new tokens, Σ n·(kv + n/2) of the context
// chunks, Σ KV of the decodes, sequences; an attention-DP dummy counts as a
// one-token decode at depth 0), the measured device_ms as the target (less
// moe_wait_ms for a MoE model under expert parallelism: compute). The
// host time per iteration is the median of host_ms, the measured host CPU
// time of the loop's own work (scheduling, step building, result
// application); a log written before issue 24 has no iter_ms and its
// host_ms is the iteration's wall time: there host_ms − device_ms −
// wait_ms is taken, as then.
func FitTwinProfile(files []string, m twin.Model) (*twin.Profile, FitStats, error) {
	var samples []twin.LinearSample
	var hosts []float64
	err := report.ScanIterLogs(files, func(path string, line int, text []byte) error {
		l, keys, err := report.DecodeIterRecord(text)
		if err != nil || !keys.Iter {
			return fmt.Errorf("%s:%d: not an iteration-log record (written by --iter-log)", path, line)
		}
		if l.DeviceMS == nil || *l.DeviceMS <= 0 {
			return nil
		}
		if !keys.GenKVTokens {
			return fmt.Errorf("%s:%d: the record has no gen_kv_tokens (a log of an older worker): rerun with this one", path, line)
		}
		// A MoE rank's own cost is its compute: the time it waited in
		// MoE exchanges belongs to the slowest rank (the twin's fleet
		// step, the max over ranks, adds it back).
		compute := *l.DeviceMS
		if l.MoEWaitMS != nil {
			compute -= *l.MoEWaitMS
		}
		if compute <= 0 {
			return nil
		}
		s := twin.LinearSample{Tokens: float64(l.CtxTokens + l.GenTokens), CtxWork: l.CostS,
			DecodeKV: float64(l.GenKVTokens), Seqs: float64(l.NumCtxRequests + l.NumGenRequests), MS: compute}
		if l.ADPDummy {
			s.Tokens++
			s.DecodeKV++
			s.Seqs++
		}
		samples = append(samples, s)
		if keys.IterMS {
			hosts = append(hosts, l.HostMS)
		} else {
			hosts = append(hosts, max(0, l.HostMS-*l.DeviceMS-l.WaitMS))
		}
		return nil
	})
	if err != nil {
		return nil, FitStats{}, err
	}
	if len(samples) < 10 {
		return nil, FitStats{}, fmt.Errorf("the logs hold %d steps with a device time; a fit needs at least 10", len(samples))
	}
	c, err := twin.FitLinear(samples)
	if err != nil {
		return nil, FitStats{}, fmt.Errorf("linear fit: %w", err)
	}
	st := FitStats{Samples: len(samples), Coefficients: c}
	errs := make([]float64, len(samples))
	for i, s := range samples {
		pred := c.Predict(s)
		st.MeasuredMS = append(st.MeasuredMS, s.MS)
		st.PredictedMS = append(st.PredictedMS, pred)
		errs[i] = math.Abs(pred-s.MS) / s.MS
		st.MeanAbsErr += errs[i] / float64(len(errs))
	}
	slices.Sort(errs)
	st.P90AbsErr = errs[min(len(errs)-1, len(errs)*9/10)]
	slices.Sort(hosts)
	st.HostMedianMS = hosts[len(hosts)/2]
	p, err := twin.NewLinearProfile(m, c, fmt.Sprintf("fitted by worker twin-profile --fit to %d steps of %s", len(samples), strings.Join(files, ", ")))
	if err != nil {
		return nil, FitStats{}, err
	}
	p.HostOverheadMS = twin.Coef{Value: math.Round(st.HostMedianMS*1000) / 1000,
		Source: "median host CPU time per iteration (host_ms; host_ms − device_ms − wait_ms in logs without iter_ms) of the fitted logs"}
	if err := p.Validate(); err != nil {
		return nil, FitStats{}, err
	}
	return p, st, nil
}
