package main

import httpapi "github.com/lockstep-ai/lockstep/serve"

// newServeMetrics is the server's Prometheus metrics.
func newServeMetrics(model string, ranks int) httpapi.MetricsSink {
	return httpapi.NewMetrics(model, ranks)
}
