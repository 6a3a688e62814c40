package kvpool

import (
	"strconv"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// AppendJSONL appends e as one JSON Lines record (with the trailing
// newline) for the --kv-events file:
//
//	{"iteration":I,"rank":R,"seq":ID,"type":"stored","window_size":W,
//	 "hash_algo":"sha256_64"[,"attention_dp_rank":D], kind fields…}
//
// Kind fields: created {"blocks_per_level":[g,h]}; stored {"parent_hash":
// H|null,"blocks":[{"hash":H,"tokens":[…],"cache_level":0,"priority":35
// [,"cache_salt":S]}]}; removed {"hashes":[H…]}; updated {"hash":H,
// "cache_level":{"old":0,"new":1}}. H is a JSON number for sha256_64 and a
// hex string for sha256. seq is the event id: per rank, from 0, no gaps.
// The encoding is canonical (fixed field order), so files compare bytewise.
func (e *Event) AppendJSONL(dst []byte, iteration int64, rank int) []byte {
	dst = append(dst, `{"iteration":`...)
	dst = strconv.AppendInt(dst, iteration, 10)
	dst = append(dst, `,"rank":`...)
	dst = strconv.AppendInt(dst, int64(rank), 10)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, e.ID, 10)
	dst = append(dst, `,"type":"`...)
	dst = append(dst, e.Kind.String()...)
	dst = append(dst, `","window_size":`...)
	dst = strconv.AppendInt(dst, int64(e.WindowSize), 10)
	dst = append(dst, `,"hash_algo":"`...)
	dst = append(dst, e.HashAlgo.String()...)
	dst = append(dst, '"')
	if e.HasDPRank {
		dst = append(dst, `,"attention_dp_rank":`...)
		dst = strconv.AppendInt(dst, int64(e.AttentionDPRank), 10)
	}
	switch e.Kind {
	case EventCreated:
		dst = append(dst, `,"blocks_per_level":[`...)
		for i, n := range e.BlocksPerLevel {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(n), 10)
		}
		dst = append(dst, ']')
	case EventStored:
		dst = append(dst, `,"parent_hash":`...)
		if e.HasParent {
			dst = e.appendHash(dst, e.Parent)
		} else {
			dst = append(dst, "null"...)
		}
		dst = append(dst, `,"blocks":[`...)
		for i, b := range e.Blocks {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"hash":`...)
			dst = e.appendHash(dst, b.Hash)
			dst = append(dst, `,"tokens":[`...)
			for j, t := range b.Tokens {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = strconv.AppendInt(dst, int64(t), 10)
			}
			dst = append(dst, `],"cache_level":`...)
			dst = strconv.AppendInt(dst, int64(b.CacheLevel), 10)
			dst = append(dst, `,"priority":`...)
			dst = strconv.AppendInt(dst, int64(b.Priority), 10)
			if b.CacheSalt != "" {
				dst = append(dst, `,"cache_salt":`...)
				dst = strconv.AppendQuote(dst, b.CacheSalt)
			}
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	case EventRemoved:
		dst = append(dst, `,"hashes":[`...)
		for i, h := range e.Hashes {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = e.appendHash(dst, h)
		}
		dst = append(dst, ']')
	case EventUpdated:
		dst = append(dst, `,"hash":`...)
		dst = e.appendHash(dst, e.Hash)
		dst = append(dst, `,"cache_level":{"old":`...)
		dst = strconv.AppendInt(dst, int64(e.FromLevel), 10)
		dst = append(dst, `,"new":`...)
		dst = strconv.AppendInt(dst, int64(e.ToLevel), 10)
		dst = append(dst, '}')
	}
	return append(dst, "}\n"...)
}

// appendHash renders a block key per the event's hash algorithm.
func (e *Event) appendHash(dst []byte, key scheduler.BlockKey) []byte {
	if e.HashAlgo == HashSHA256 {
		dst = append(dst, '"')
		dst = append(dst, KeyHex(key)...)
		return append(dst, '"')
	}
	return strconv.AppendUint(dst, BlockHash64(key), 10)
}
