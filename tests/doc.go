// Package tests holds cross-package and end-to-end tests: the worker binary
// serving real traces on several in-process ranks with the native CPU engine.
package tests
