package kvpool

import (
	"errors"
	"fmt"
	"math"
)

// Pure helpers for the executor's construction path (kvcache.md §3.2–3.5):
// token ↔ quota conversion, the device and host quotas, and the
// initialisation vote. The executor owns the collectives and the native
// pool; it passes them in as values and callbacks, so every rule here is
// testable without a device.

// QuotaConfig holds the settings the quota rules read.
type QuotaConfig struct {
	// BytesPerToken is Σ over local layers of the K and V bytes of one token.
	BytesPerToken int64
	// MaxGPUTotalBytes is the rank-local GPU quota; ≤ 0 = unset.
	MaxGPUTotalBytes int64
	// MaxTokens is the quota in tokens (global ledger tokens under Helix);
	// read only when HasMaxTokens.
	MaxTokens    int64
	HasMaxTokens bool
	// FreeGPUMemoryFraction is used when no quota is given; 0 = 0.9.
	FreeGPUMemoryFraction float64
	// MaxUtilForResume; 0 = 0.97.
	MaxUtilForResume float64
	// TokensPerBlock (P) and CP select the Helix wrappers (§10.7) when CP > 1.
	TokensPerBlock int
	CP             int
}

func (c QuotaConfig) util() float64 {
	if c.MaxUtilForResume == 0 {
		return defaultMaxUtilForResume
	}
	return c.MaxUtilForResume
}

func (c QuotaConfig) fraction() float64 {
	if c.FreeGPUMemoryFraction == 0 {
		return 0.9
	}
	return c.FreeGPUMemoryFraction
}

// TokensFromQuota converts q bytes into tokens: q div bytes_per_token, then,
// under Helix, into global ledger tokens (§3.2, §10.7).
func (c QuotaConfig) TokensFromQuota(q int64) int64 {
	return HelixTokensFromLocal(q/c.BytesPerToken, c.TokensPerBlock, c.CP)
}

// QuotaFromTokens converts N tokens (global under Helix) into rank-local
// bytes (§3.2, §10.7).
func (c QuotaConfig) QuotaFromTokens(n int64) int64 {
	return HelixLocalTokensFromGlobal(n, c.TokensPerBlock, c.CP) * c.BytesPerToken
}

// ceilDiv64 is ⌈x / util⌉ for the byte arithmetic of §3.3.
func ceilDivUtil(x int64, util float64) int64 { return int64(math.Ceil(float64(x) / util)) }

// DeviceQuota is steps 1–2 of §3.3 on one rank: the byte quota before the
// world sync. freeGPUBytes is the device's free memory.
func DeviceQuota(c QuotaConfig, freeGPUBytes int64) (int64, error) {
	if c.BytesPerToken <= 0 {
		return 0, fmt.Errorf("kvpool: bytes per token must be positive, got %d", c.BytesPerToken)
	}
	if c.HasMaxTokens && c.MaxTokens <= 0 {
		return 0, fmt.Errorf("kvpool: max_tokens must be positive, got %d", c.MaxTokens)
	}
	var fromTokens int64
	if c.HasMaxTokens {
		fromTokens = ceilDivUtil(c.QuotaFromTokens(c.MaxTokens), c.util())
	}
	switch {
	case c.MaxGPUTotalBytes > 0 && c.HasMaxTokens:
		return min(c.MaxGPUTotalBytes, fromTokens), nil
	case c.MaxGPUTotalBytes > 0:
		return c.MaxGPUTotalBytes, nil
	case c.HasMaxTokens:
		return fromTokens, nil
	case freeGPUBytes <= 0:
		return 0, errors.New("kvpool: no free memory to size the KV cache")
	}
	return int64(math.Floor(float64(freeGPUBytes) * c.fraction())), nil
}

// WorldSyncTokens is this rank's contribution to the allreduce_MIN of
// §3.3 step 3: tokens_from_quota(floor(quota · max_util_for_resume)).
func WorldSyncTokens(c QuotaConfig, quota int64) int64 {
	return c.TokensFromQuota(int64(math.Floor(float64(quota) * c.util())))
}

// ApplyWorldMin finishes §3.3 step 3 with the world minimum tMin:
// min(quota, ceil(quota_from_tokens(tMin) / max_util_for_resume)). Every
// rank ends with the same token capacity.
func ApplyWorldMin(c QuotaConfig, quota, tMin int64) int64 {
	return min(quota, ceilDivUtil(c.QuotaFromTokens(tMin), c.util()))
}

// PagesFromBytes is bytes div page_bytes (§3.3 step 4, §3.4).
func PagesFromBytes(bytes, pageBytes int64) int {
	if pageBytes <= 0 || bytes <= 0 {
		return 0
	}
	return int(min(bytes/pageBytes, MaxPages))
}

// InitStatus is a rank's pool-construction outcome, ordered by severity
// (§3.5); the world combines statuses with allreduce_MAX.
type InitStatus int8

// Initialisation statuses.
const (
	InitOK        InitStatus = 0
	InitUseNoHost InitStatus = 1 // the host buffer could not be allocated or pinned
	InitAbort     InitStatus = 2 // any other failure
)

// CombineInitStatus is the allreduce_MAX reduction of two statuses.
func CombineInitStatus(a, b InitStatus) InitStatus { return max(a, b) }

// ErrInitFailedElsewhere is raised by a rank whose own build succeeded when
// another rank's failed.
var ErrInitFailedElsewhere = errors.New("KV cache manager initialisation failed on another rank")

// InitVote runs the initialisation vote of §3.5. The executor supplies the
// native build and the collective.
type InitVote struct {
	// HostTier: the configured tiers include a host tier.
	HostTier bool
	// Build builds a candidate pool with or without the host tier and
	// classifies the outcome. It returns InitOK only with a live candidate;
	// on failure it has cleaned up after itself and returns its error.
	Build func(withHost bool) (InitStatus, error)
	// Destroy destroys the live candidate (called only after an InitOK).
	Destroy func()
	// AllReduceMax combines the statuses over the world; nil for a world of
	// one rank (the local status is the result).
	AllReduceMax func(InitStatus) (InitStatus, error)
}

// Run executes the vote: build; allreduce_MAX; ABORT → every rank destroys
// its candidate and fails (a failing rank with its own error, the others
// with ErrInitFailedElsewhere); USE_NO_HOST → every rank destroys its
// candidate, rebuilds without the host tier and votes again. It returns
// whether the final pool has a host tier (HasHostTier of §3.5 step 5).
func (v InitVote) Run() (hasHostTier bool, err error) {
	withHost := v.HostTier
	for phase := 0; phase < 2; phase++ {
		st, buildErr := v.Build(withHost)
		if st == InitOK && buildErr != nil {
			st = InitAbort
		}
		global := st
		if v.AllReduceMax != nil {
			if global, err = v.AllReduceMax(st); err != nil {
				if st == InitOK {
					v.Destroy()
				}
				return false, fmt.Errorf("kvpool: initialisation vote: %w", err)
			}
		}
		switch {
		case global == InitOK:
			return withHost, nil
		case global == InitUseNoHost && withHost:
			if st == InitOK {
				v.Destroy()
			}
			withHost = false
			continue
		}
		if st == InitOK {
			v.Destroy()
		}
		if buildErr != nil {
			return false, buildErr
		}
		return false, ErrInitFailedElsewhere
	}
	return false, ErrInitFailedElsewhere
}
