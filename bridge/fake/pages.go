package fake

import (
	"github.com/lockstep-ai/lockstep/bridge"
)

// CopyPages copies page src[k] of srcTier to page dst[k] of dstTier, for k
// in order. The whole list is validated first (bridge.CheckCopy), so an
// invalid list changes nothing (engine.h, eng_engine_copy_pages).
func (e *Engine) CopyPages(srcTier bridge.Tier, src []int32, dstTier bridge.Tier, dst []int32) error {
	const op = "copy_pages"
	if err := e.usable(op); err != nil {
		return err
	}
	if err := bridge.CheckCopy(srcTier, src, dstTier, dst, e.check.Geometry()); err != nil {
		return err
	}
	from, _, _ := e.slab(op, srcTier)
	to, _, _ := e.slab(op, dstTier)
	P := e.cfg.TokensPerPage
	for k := range src {
		s, d := int(src[k])*P, int(dst[k])*P
		copy(to[d:d+P], from[s:s+P])
	}
	return nil
}
