package kvpool_test

import (
	"encoding/hex"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
)

// TestKeyVectors is KR-01 and EV-13: the test vectors of kvcache.md §6.1.
func TestKeyVectors(t *testing.T) {
	root := kvpool.RootKey("")
	b1 := kvpool.BlockKeyOf(root, []int32{1, 2, 3, 4})
	b2 := kvpool.BlockKeyOf(b1, []int32{5, 6, 7, 8})
	partial := kvpool.BlockKeyOf(b1, []int32{5, 6})
	saltRoot := kvpool.RootKey("tenant-a")
	saltB1 := kvpool.BlockKeyOf(saltRoot, []int32{1, 2, 3, 4})
	hexOf := func(k [32]byte) string { return hex.EncodeToString(k[:]) }
	tests := []struct{ name, got, want string }{
		{"scope, no salt", hex.EncodeToString(kvpool.ScopeBytes("")), "00"},
		{"root, no salt", hexOf(root), "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"},
		{"[1,2,3,4]", hexOf(b1), "e432228522a304ab556d66e6e40979ad05575f28b19b554264dd3c6277aaf073"},
		{"[5,6,7,8]", hexOf(b2), "756b1d258c63ccc0cbd6284ab33b043c81175086163f9d2821f5764079efb75c"},
		{"partial [5,6]", hexOf(partial), "7fabfb79be197b116ecec3a823a33b6cf1597e2d2a662f43165da8d2c118116d"},
		{"scope, salt", hex.EncodeToString(kvpool.ScopeBytes("tenant-a")), "0280a707af7dc77ee1"},
		{"root, salt", hexOf(saltRoot), "ceb640ee7c220334c7d84519e6d26f378de1afb061d8427adbcd3d1891662359"},
		{"salted [1,2,3,4]", hexOf(saltB1), "b4c950a41ade125ebdbafd8dcf8a17bbe24b891746c3a790b43ad14c26bd7cd9"},
		{"KeyHex", kvpool.KeyHex(b1), "e432228522a304ab556d66e6e40979ad05575f28b19b554264dd3c6277aaf073"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %s, want %s", tt.name, tt.got, tt.want)
		}
	}
	for _, tt := range []struct {
		key  [32]byte
		want uint64
	}{{b1, 16443243144690205867}, {b2, 8460888372051954880}, {saltB1, 13027032062901490270}} {
		if got := kvpool.BlockHash64(tt.key); got != tt.want {
			t.Errorf("sha256_64 = %d, want %d", got, tt.want)
		}
	}
}
