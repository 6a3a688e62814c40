package model

import (
	"strings"
	"unicode/utf8"
)

// The GPT-2 byte-level alphabet: printable Latin-1 bytes stand for
// themselves, the other 68 bytes are moved to U+0100.. in byte order, so
// every byte has a visible, non-space character.
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	next := rune(256)
	for b := 0; b < 256; b++ {
		printable := b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = next
			next++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// bytesToUnicode spells s in the byte-level alphabet.
func bytesToUnicode(s string) string {
	var sb strings.Builder
	sb.Grow(len(s) * 2)
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteToRune[s[i]])
	}
	return sb.String()
}

// unicodeToBytes maps a byte-level spelling back to bytes. Characters
// outside the alphabet (a vocabulary entry not in byte-level spelling) are
// kept as their UTF-8 bytes.
func unicodeToBytes(s string) []byte {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if b, ok := runeToByte[r]; ok {
			out = append(out, b)
		} else {
			out = utf8.AppendRune(out, r)
		}
	}
	return out
}
