package main

import (
	"errors"
	"io"
)

// runSchedule is replaced by the scheduler dry-run tool (schedule.go).
func runSchedule(args []string, stdout, stderr io.Writer) error {
	return errors.New("schedule: not available in this build")
}
