// Package usage marks errors that are the user's input: a flag, a config
// file's key, a trace or prompts file, a request that can never be served.
// The worker prints them like any error and exits 2 instead of 1, so that a
// script can tell "you asked for something impossible" from "it failed".
package usage

import (
	"errors"
	"fmt"
	"strings"
)

// Error wraps an error caused by bad input.
type Error struct{ Err error }

// Error implements error: the wrapped text, unchanged.
func (e Error) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error (errors.Is and errors.As see through).
func (e Error) Unwrap() error { return e.Err }

// Errorf formats a usage error.
func Errorf(format string, a ...any) error { return Error{fmt.Errorf(format, a...)} }

// Wrap marks err as a usage error; nil stays nil.
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	return Error{err}
}

// Is reports whether err is, or wraps, a usage error.
func Is(err error) bool {
	var e Error
	return errors.As(err, &e)
}

// OneOf checks a value against its allowed values; name says where it came
// from ("--engine", or a config file's "FILE:LINE key").
func OneOf(name, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return Errorf("%s %q is not allowed (allowed: %s)", name, v, strings.Join(allowed, ", "))
}

// goInternals are fragments of Go's own error texts (package-qualified type
// names, struct dumps, decoder internals) that a message for a user must
// never show.
var goInternals = []string{"main.", "fleet.", "scenario.", "struct {", "interface {", "*int", "[]uint8",
	"yaml: unmarshal", "reflect", "json:\""}

// Unreadable says why msg is not a message for a user: it is empty, or it
// shows one of Go's internals (a type name, a struct dump). "" when it
// reads as one. Tests of error texts use it.
func Unreadable(msg string) string {
	if strings.TrimSpace(msg) == "" {
		return "empty message"
	}
	for _, g := range goInternals {
		if strings.Contains(msg, g) {
			return fmt.Sprintf("shows a Go internal %q", g)
		}
	}
	return ""
}
