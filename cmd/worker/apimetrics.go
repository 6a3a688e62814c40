package main

import httpapi "github.com/lockstep-ai/lockstep/serve"

// newServeMetrics is the server's Prometheus metrics (nil until they land).
func newServeMetrics(model string, ranks int) httpapi.MetricsSink { return nil }
