//go:build cgo

package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// gpuInfo writes one line per visible NVIDIA GPU (name, total and free
// memory) plus the driver and CUDA driver versions, read through NVML.
// go-nvml loads libnvidia-ml at run time, so on a machine without an NVIDIA
// driver this prints why instead of failing: device discovery is advisory in
// `worker info`.
func gpuInfo(w io.Writer) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		fmt.Fprintf(w, "GPUs: no NVIDIA driver found (nvml: %v)\n", nvmlError(ret))
		return
	}
	defer nvml.Shutdown()

	driver, ret := nvml.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driver = "unknown (" + nvmlError(ret).Error() + ")"
	}
	cuda := "unknown"
	if v, ret := nvml.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		// NVML encodes CUDA 12.4 as 12040.
		cuda = fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
	}
	fmt.Fprintf(w, "NVIDIA driver %s, CUDA driver API %s\n", driver, cuda)

	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		fmt.Fprintf(w, "GPUs: cannot count devices (nvml: %v)\n", nvmlError(ret))
		return
	}
	if count == 0 {
		fmt.Fprintln(w, "GPUs: none visible")
		return
	}
	for i := 0; i < count; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			fmt.Fprintf(w, "GPU %d: unavailable (nvml: %v)\n", i, nvmlError(ret))
			continue
		}
		name, _ := dev.GetName()
		mem, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			fmt.Fprintf(w, "GPU %d: %s, memory unknown (nvml: %v)\n", i, name, nvmlError(ret))
			continue
		}
		fmt.Fprintf(w, "GPU %d: %s, memory %.1f GiB total, %.1f GiB free\n", i, name,
			gib(mem.Total), gib(mem.Free))
	}
}

// gpuFreeMemory returns the free memory of GPU `device` in bytes (NVML's
// view, which counts every process on the device). The worker sizes the
// CUDA page slab as a fraction of it. Errors name the device and NVML's reason.
func gpuFreeMemory(device int) (uint64, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return 0, fmt.Errorf("reading free memory of GPU %d: no NVIDIA driver found (nvml: %w)", device, nvmlError(ret))
	}
	defer nvml.Shutdown()
	dev, ret := nvml.DeviceGetHandleByIndex(device)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("reading free memory of GPU %d: %w", device, nvmlError(ret))
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("reading free memory of GPU %d: %w", device, nvmlError(ret))
	}
	return mem.Free, nil
}

// nvmlError turns an NVML return code into an error (Return implements error).
func nvmlError(ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	var err error = ret
	if errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		return fmt.Errorf("%w: libnvidia-ml.so.1 is not installed", err)
	}
	return err
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }
