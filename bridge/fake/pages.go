package fake

import (
	"github.com/lockstep-ai/lockstep/bridge"
)

// CopyPages copies page src[k] of srcTier to page dst[k] of dstTier, for k
// in order. Every index is validated before anything is copied, so an
// invalid list changes nothing (engine.h, eng_engine_copy_pages).
func (e *Engine) CopyPages(srcTier bridge.Tier, src []int32, dstTier bridge.Tier, dst []int32) error {
	const op = "copy_pages"
	if err := e.usable(op); err != nil {
		return err
	}
	from, nFrom, err := e.slab(op, srcTier)
	if err != nil {
		return err
	}
	to, nTo, err := e.slab(op, dstTier)
	if err != nil {
		return err
	}
	if len(src) != len(dst) {
		return invalid(op, "src has %d pages, dst %d: lengths must be equal", len(src), len(dst))
	}
	for k := range src {
		if src[k] < 0 || int(src[k]) >= nFrom {
			return invalid(op, "src[%d] = %d outside %s pages [0, %d)", k, src[k], tierName(srcTier), nFrom)
		}
		if dst[k] < 0 || int(dst[k]) >= nTo {
			return invalid(op, "dst[%d] = %d outside %s pages [0, %d)", k, dst[k], tierName(dstTier), nTo)
		}
	}
	P := e.cfg.TokensPerPage
	for k := range src {
		s, d := int(src[k])*P, int(dst[k])*P
		copy(to[d:d+P], from[s:s+P])
	}
	return nil
}
