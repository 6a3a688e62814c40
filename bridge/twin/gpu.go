package twin

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Coef is one figure of a cost profile together with where it comes from.
// Every number the twin uses is a Coef so that a profile file answers "why
// this value?" for each of them (STYLE.md, the Vidur row). Source must not be
// empty: a datasheet and the figure as printed, a paper and its table, a
// measurement and its date, or the word "assumption" and the reasoning.
type Coef struct {
	Value  float64 `json:"value"`  // in the unit the field's name says
	Source string  `json:"source"` // where the value comes from
}

// GPU is one accelerator's peak rates and capacity, per GPU.
//
// Bandwidth conventions: HBMBytesPerS is the datasheet memory bandwidth (a
// read or a write stream). NVLinkBytesPerS is PER DIRECTION: NVIDIA prints
// the total of both directions ("900 GB/s" on H100/H200 is 450 GB/s each
// way), and an all-to-all or ring all-reduce sends and receives at once, so
// the per-direction rate is what bounds it.
type GPU struct {
	// Name is the GPU's name (a built-in's key).
	Name string `json:"name"`
	// BF16FLOPS is the dense (not 2:4-sparse) BF16 tensor-core rate, FLOP/s.
	BF16FLOPS Coef `json:"bf16_flops"`
	// FP8FLOPS is the dense FP8 tensor-core rate, FLOP/s; GEMMs of models
	// whose weights are FP8 (weight_bytes 1) run at this rate.
	FP8FLOPS Coef `json:"fp8_flops"`
	// FP4FLOPS is the dense FP4 tensor-core rate, FLOP/s (0: none, before
	// Blackwell); GEMMs of NVFP4 weights run at this rate.
	FP4FLOPS Coef `json:"fp4_flops,omitzero"`
	// HBMBytesPerS is the HBM bandwidth, bytes/s.
	HBMBytesPerS Coef `json:"hbm_bytes_per_s"`
	// HBMBytes is the HBM capacity, bytes: what the driver reports as the
	// device's total memory (nvidia-smi's "Total", NVML's memory.total,
	// cudaMemGetInfo's total), the figure the CUDA engine sizes its pool
	// from and trtllm-bench its batch from. The datasheets' "80GB" and
	// "141GB" are binary gigabytes less a little the driver keeps, so the
	// decimal reading is 6-7 % short.
	HBMBytes Coef `json:"hbm_bytes"`
	// NVLinkBytesPerS is the NVLink bandwidth of one GPU in ONE direction,
	// bytes/s (half the bidirectional figure NVIDIA prints).
	NVLinkBytesPerS Coef `json:"nvlink_bytes_per_s"`
	// NVLinkDomainGPUs is how many GPUs one NVLink domain (an HGX board, a
	// GB300 NVL72 rack) joins: the default gpus_per_node of a profile.
	// Traffic between GPUs of different domains crosses the network.
	NVLinkDomainGPUs Coef `json:"nvlink_domain_gpus"`
	// RDMABytesPerS is the scale-out network bandwidth of one GPU in one
	// direction, bytes/s: its own RDMA NIC (400 Gb/s = 50 GB/s).
	RDMABytesPerS Coef `json:"rdma_bytes_per_s"`
}

// mib is a mebibyte: drivers report memory in MiB.
const mib = 1 << 20

// Datasheet names, quoted in each source string.
const (
	srcH100  = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column"
	srcH200  = "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column"
	srcHGXB  = "NVIDIA HGX B200 / DGX B200 datasheet (8 GPUs per board; per-GPU = board figure / 8)"
	srcGB300 = "NVIDIA GB300 NVL72 specifications (72 Blackwell Ultra GPUs; per-GPU = rack figure / 72)"
	// The DGX systems give every GPU its own scale-out NIC.
	srcCX7 = "one NVIDIA ConnectX-7 400 Gb/s NIC per GPU (DGX H100/H200 and DGX B200 datasheets: \"8x single-port " +
		"NVIDIA ConnectX-7 VPI, up to 400Gb/s InfiniBand/Ethernet\"); 400 Gb/s = 50 GB/s per direction, the ~50 GB/s " +
		"DeepEP's docs/legacy.md gives as the RDMA maximum of a CX7 400 Gb/s card"
	srcHGX8 = "8 GPUs per HGX/DGX board joined by NVSwitch; beyond the board traffic crosses the RDMA network"
)

// builtinGPUs are the datasheet figures. Sparse tensor-core figures are
// halved to dense; bidirectional NVLink figures are halved to one direction.
var builtinGPUs = map[string]GPU{
	"h100": {
		Name:             "h100",
		BF16FLOPS:        Coef{989.5e12, srcH100 + `: "BF16 Tensor Core 1,979 teraFLOPS*" (*with sparsity); dense = 1,979 / 2`},
		FP8FLOPS:         Coef{1979e12, srcH100 + `: "FP8 Tensor Core 3,958 teraFLOPS*" (*with sparsity); dense = 3,958 / 2`},
		HBMBytesPerS:     Coef{3.35e12, srcH100 + `: "GPU memory bandwidth 3.35TB/s"`},
		HBMBytes:         Coef{81559 * mib, srcH100 + `: "GPU memory 80GB"; the driver reports 81559 MiB total (nvidia-smi "NVIDIA H100 80GB HBM3 ... / 81559MiB")`},
		NVLinkBytesPerS:  Coef{450e9, srcH100 + `: "NVIDIA NVLink 900GB/s" (both directions, 18 NVLink-4 links); one direction = 900 / 2`},
		NVLinkDomainGPUs: Coef{8, srcHGX8},
		RDMABytesPerS:    Coef{50e9, srcCX7},
	},
	"h200": {
		Name:             "h200",
		BF16FLOPS:        Coef{989.5e12, srcH200 + `: "BF16 Tensor Core 1,979 TFLOPS*" (*with sparsity); dense = 1,979 / 2`},
		FP8FLOPS:         Coef{1979e12, srcH200 + `: "FP8 Tensor Core 3,958 TFLOPS*" (*with sparsity); dense = 3,958 / 2`},
		HBMBytesPerS:     Coef{4.8e12, srcH200 + `: "GPU Memory Bandwidth 4.8TB/s"`},
		HBMBytes:         Coef{143771 * mib, srcH200 + `: "GPU Memory 141GB"; the driver reports 143771 MiB total (nvidia-smi "NVIDIA H200 ... / 143771MiB")`},
		NVLinkBytesPerS:  Coef{450e9, srcH200 + `: "NVIDIA NVLink 900GB/s" (both directions); one direction = 900 / 2`},
		NVLinkDomainGPUs: Coef{8, srcHGX8},
		RDMABytesPerS:    Coef{50e9, srcCX7},
	},
	"b200": {
		Name:             "b200",
		BF16FLOPS:        Coef{2.25e15, srcHGXB + `: "FP16/BF16 Tensor Core 36 PFLOPS" per 8 GPUs, with sparsity; dense per GPU = 36 / 8 / 2 = 2.25 PFLOP/s`},
		FP8FLOPS:         Coef{4.5e15, srcHGXB + `: "FP8 Tensor Core 72 PFLOPS" per 8 GPUs, with sparsity; dense per GPU = 72 / 8 / 2 = 4.5 PFLOP/s`},
		FP4FLOPS:         Coef{9e15, srcHGXB + `: "FP4 Tensor Core 144 PFLOPS" per 8 GPUs, with sparsity; dense per GPU = 144 / 8 / 2 = 9 PFLOP/s`},
		HBMBytesPerS:     Coef{8e12, srcHGXB + `: "64TB/s HBM3e bandwidth" per 8 GPUs; per GPU = 8 TB/s`},
		HBMBytes:         Coef{183359 * mib, srcHGXB + `: "1,440GB total GPU memory" per 8 GPUs = 180 GB per GPU; the driver reports 183359 MiB total (nvidia-smi "NVIDIA B200 ... / 183359MiB")`},
		NVLinkBytesPerS:  Coef{900e9, srcHGXB + `: "14.4TB/s aggregate NVLink bandwidth" per 8 GPUs = 1.8 TB/s per GPU, both directions (NVLink 5); one direction = 900 GB/s`},
		NVLinkDomainGPUs: Coef{8, srcHGX8},
		RDMABytesPerS:    Coef{50e9, srcCX7},
	},
	"gb300": {
		Name:             "gb300",
		BF16FLOPS:        Coef{2.5e15, srcGB300 + `: "FP16/BF16 Tensor Core 360 PFLOPS" per 72 GPUs, with sparsity (180 dense); per GPU dense = 2.5 PFLOP/s`},
		FP8FLOPS:         Coef{5e15, srcGB300 + `: "FP8 Tensor Core 720 PFLOPS" per 72 GPUs, with sparsity (360 dense); per GPU dense = 5 PFLOP/s`},
		FP4FLOPS:         Coef{15e15, srcGB300 + `: "FP4 Tensor Core 1,440 PFLOPS" per 72 GPUs, with sparsity (1,080 dense); per GPU dense = 1,080 / 72 = 15 PFLOP/s`},
		HBMBytesPerS:     Coef{8e12, srcGB300 + `: "up to 576 TB/s" HBM3e bandwidth per 72 GPUs; per GPU = 8 TB/s`},
		HBMBytes:         Coef{284208 * mib, srcGB300 + `: "up to 21 TB" HBM3e per 72 GPUs, 288 GB HBM3e per Blackwell Ultra GPU; the driver reports 284208 MiB total (nvidia-smi "NVIDIA GB300 ... / 284208MiB")`},
		NVLinkBytesPerS:  Coef{900e9, srcGB300 + `: "130 TB/s" NVLink per 72 GPUs = 1.8 TB/s per GPU, both directions (NVLink 5); one direction = 900 GB/s`},
		NVLinkDomainGPUs: Coef{72, srcGB300 + ": one NVLink domain of 72 GPUs (NVLink Switch trays)"},
		RDMABytesPerS:    Coef{100e9, srcGB300 + `: "NVIDIA ConnectX-8 SuperNIC" 800 Gb/s per GPU for scale-out; 800 Gb/s = 100 GB/s per direction`},
	},
}

// GPUNames lists the built-in GPUs in sorted order.
func GPUNames() []string { return sortedKeys(builtinGPUs) }

// BuiltinGPU returns a built-in GPU or an error listing the allowed names.
func BuiltinGPU(name string) (GPU, error) {
	g, ok := builtinGPUs[name]
	if !ok {
		return GPU{}, fmt.Errorf("unknown GPU %q (allowed: %s)", name, strings.Join(GPUNames(), ", "))
	}
	return g, nil
}

// validate checks every figure; the error names the JSON field.
func (g *GPU) validate() error {
	if g.Name == "" {
		return fmt.Errorf("gpu.name is empty")
	}
	for _, c := range []struct {
		field string
		c     Coef
	}{
		{"gpu.bf16_flops", g.BF16FLOPS},
		{"gpu.fp8_flops", g.FP8FLOPS},
		{"gpu.hbm_bytes_per_s", g.HBMBytesPerS},
		{"gpu.hbm_bytes", g.HBMBytes},
		{"gpu.nvlink_bytes_per_s", g.NVLinkBytesPerS},
		{"gpu.nvlink_domain_gpus", g.NVLinkDomainGPUs},
		{"gpu.rdma_bytes_per_s", g.RDMABytesPerS},
	} {
		if err := c.c.positive(c.field); err != nil {
			return err
		}
	}
	if v := g.FP4FLOPS.Value; v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("gpu.fp4_flops.value must be 0 (no FP4 tensor cores) or positive, got %g", v)
	}
	if d := g.NVLinkDomainGPUs.Value; d != math.Trunc(d) || d > 1<<20 {
		return fmt.Errorf("gpu.nvlink_domain_gpus.value must be a whole number of GPUs, got %g", d)
	}
	return nil
}

// sortedKeys returns a map's keys in sorted order.
func sortedKeys[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
