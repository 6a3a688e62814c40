module github.com/lockstep-ai/lockstep

go 1.26

require (
	github.com/ianlancetaylor/cgosymbolizer v0.0.0-20241129212102-9c50ad6b591e
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	go.uber.org/zap v1.28.0
	go.yaml.in/yaml/v3 v3.0.6
)

require (
	github.com/NVIDIA/go-nvml v0.13.4-1 // indirect
	go.uber.org/multierr v1.10.0 // indirect
)
