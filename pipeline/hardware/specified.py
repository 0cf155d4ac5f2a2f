"""Devices we cannot measure, from their makers' published specifications.

Every figure is the maker's own, dense (NVIDIA's datasheets print tensor-core rates "with
sparsity", 2:4 structured, twice the dense rate; those are halved here and the note says so),
at boost clock. The CPUs' makers publish cores, clocks and memory channels but no peak rate:
their peaks are derived (cores x base clock x operations per cycle per core, the per-cycle
figure from the maker's optimization documents), and the note says how. Memory bandwidth is
the interface's theoretical peak (channels x transfers/s x 8 bytes for DDR5). A roofline time
on these figures is therefore a lower bound from specifications, never a prediction of what a
runtime reaches.
"""

from __future__ import annotations

from pipeline.hardware.entry import Bandwidth, HardwareEntry, Peak, Source

TFLOP = 1e12
GB = 1e9
GPU_RUNTIMES = ["CUDAExecutionProvider", "TensorrtExecutionProvider", "TensorRT"]
_DENSE = "tensor-core rates printed with sparsity (2:4) halved to dense"


def _gpu(name: str, title: str, source: Source, sms: int, memory_gb: int, bandwidth_gb_s: float,
         memory_kind: str, tflops: dict[str, float], tensor: str, notes: dict[str, str] | None = None) -> HardwareEntry:
    """A GPU entry: fp32/fp64 on the CUDA cores, the rest on the tensor cores (`tensor`)."""
    peaks = [Peak(dtype=dtype, ops_per_s=value * TFLOP,
                  isa="CUDA cores (FMA)" if dtype in ("fp32", "fp64") else tensor,
                  note=(notes or {}).get(dtype, ""))
             for dtype, value in tflops.items()]
    return HardwareEntry(
        name=name, title=title, kind="gpu", provenance="specified", source=source, cores=sms,
        memory_bytes=memory_gb * 2**30,
        bandwidth=[Bandwidth(level="DRAM", bytes_per_s=bandwidth_gb_s * GB, capacity_bytes=memory_gb * 2**30,
                             method=f"{memory_kind}, maker's peak")],
        peaks=peaks, runtimes=GPU_RUNTIMES)


def _cpu(name: str, title: str, source: Source, cores: int, base_ghz: float, channels: int, mts: int,
         per_cycle: dict[str, tuple[int, str]]) -> HardwareEntry:
    """A CPU entry: peaks derived as cores x base clock x operations per cycle per core."""
    peaks = [Peak(dtype=dtype, ops_per_s=cores * base_ghz * 1e9 * ops, isa=isa,
                  note=f"derived: {cores} cores x {base_ghz} GHz base x {ops} per cycle per core")
             for dtype, (ops, isa) in per_cycle.items()]
    return HardwareEntry(
        name=name, title=title, kind="cpu", provenance="specified", source=source, cores=cores,
        bandwidth=[Bandwidth(level="DRAM", bytes_per_s=channels * mts * 1e6 * 8,
                             method=f"{channels} channels DDR5-{mts} x 8 bytes, theoretical peak")],
        peaks=peaks, runtimes=["CPUExecutionProvider"])


def entries() -> list[HardwareEntry]:
    return [*_gpus(), *_cpus()]


def _gpus() -> list[HardwareEntry]:
    return [
        _gpu("a100", "NVIDIA A100 SXM4 80GB", Source(
            document="NVIDIA A100 Tensor Core GPU datasheet (1758950-r4)",
            url="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf", date="2021-06", notes=_DENSE),
            sms=108, memory_gb=80, bandwidth_gb_s=2039, memory_kind="HBM2e",
            tflops={"fp64": 9.7, "fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "int8": 624},
            tensor="Tensor Cores (3rd gen)"),
        _gpu("h100", "NVIDIA H100 SXM5 80GB", Source(
            document="NVIDIA H100 Tensor Core GPU datasheet",
            url="https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            date="2023-07", notes=_DENSE + " (TF32 989, BF16/FP16 1,979, FP8/INT8 3,958 printed)"),
            sms=132, memory_gb=80, bandwidth_gb_s=3350, memory_kind="HBM3",
            tflops={"fp64": 34, "fp32": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979,
                    "int8": 1979}, tensor="Tensor Cores (4th gen)"),
        _gpu("h200", "NVIDIA H200 SXM 141GB", Source(
            document="NVIDIA H200 Tensor Core GPU datasheet / product page",
            url="https://www.nvidia.com/en-us/data-center/h200/", date="2024-11",
            notes=_DENSE + ". Measured on an H200 in this project (../shared/field-notes.md, PyTorch "
                  "2.11 + CUDA 13): device copy 4.18 TB/s, bf16 758, fp16 732, fp8 1,250 TFLOP/s, "
                  "int8 (torch._int_mm) 124 TOP/s"),
            sms=132, memory_gb=141, bandwidth_gb_s=4800, memory_kind="HBM3e",
            tflops={"fp64": 34, "fp32": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979,
                    "int8": 1979}, tensor="Tensor Cores (4th gen)"),
        _gpu("l4", "NVIDIA L4 24GB", Source(
            document="NVIDIA L4 Tensor Core GPU datasheet", url="https://www.nvidia.com/en-us/data-center/l4/",
            date="2023-03", notes=_DENSE + " (TF32 120, FP16/BF16 242, FP8/INT8 485 printed)"),
            sms=58, memory_gb=24, bandwidth_gb_s=300, memory_kind="GDDR6",
            tflops={"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5, "int8": 242.5},
            tensor="Tensor Cores (4th gen, Ada)"),
        _gpu("l40s", "NVIDIA L40S 48GB", Source(
            document="NVIDIA L40S GPU datasheet", url="https://www.nvidia.com/en-us/data-center/l40s/",
            date="2023-08", notes="dense figures as printed beside the sparse ones"),
            sms=142, memory_gb=48, bandwidth_gb_s=864, memory_kind="GDDR6",
            tflops={"fp32": 91.6, "tf32": 183, "bf16": 362.05, "fp16": 362.05, "fp8": 733, "int8": 733},
            tensor="Tensor Cores (4th gen, Ada)"),
        _gpu("rtx4090", "NVIDIA GeForce RTX 4090 24GB", Source(
            document="NVIDIA Ada GPU Architecture whitepaper (v2.1), appendix A",
            url="https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
            date="2023-01", notes="dense; fp16/bf16/fp8 with FP32 accumulate (GeForce runs FP32 "
                  "accumulation at half the FP16-accumulate rate: fp16 330.3, fp8 660.6 with FP16 accumulate)"),
            sms=128, memory_gb=24, bandwidth_gb_s=1008, memory_kind="GDDR6X",
            tflops={"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3, "int8": 660.6},
            tensor="Tensor Cores (4th gen, Ada)"),
    ]


def _cpus() -> list[HardwareEntry]:
    return [
        _cpu("xeon-8480", "Intel Xeon Platinum 8480+ (Sapphire Rapids, 1 socket)", Source(
            document="Intel ARK: Xeon Platinum 8480+ specifications; Intel 64 and IA-32 Architectures "
                     "Optimization Reference Manual (AMX: 1024 BF16 / 2048 INT8 operations per cycle per core)",
            url="https://www.intel.com/content/www/us/en/products/sku/231746/"
                "intel-xeon-platinum-8480-processor-105m-cache-2-00-ghz/specifications.html",
            date="2023-01", notes="56 cores, 2.0 GHz base, 8 channels DDR5-4800; peaks at base clock "
                                  "(AMX/AVX-512 licence clocks may be lower)"),
            cores=56, base_ghz=2.0, channels=8, mts=4800,
            per_cycle={"fp32": (64, "AVX-512 FMA, 2 ports"), "bf16": (1024, "AMX-BF16 tiles"),
                       "int8": (2048, "AMX-INT8 tiles")}),
        _cpu("epyc-9654", "AMD EPYC 9654 (Genoa, 1 socket)", Source(
            document="AMD EPYC 9654 product specifications; Software Optimization Guide for AMD Family 19h "
                     "(Zen 4: two 256-bit FMA pipes, AVX-512 on 256-bit datapaths)",
            url="https://www.amd.com/en/products/processors/server/epyc/4th-generation-9004-and-8004-series/"
                "amd-epyc-9654.html",
            date="2022-11", notes="96 cores, 2.4 GHz base, 12 channels DDR5-4800; AMD publishes no bf16 "
                                  "or int8 rate (avx512_bf16 and avx512_vnni are present)"),
            cores=96, base_ghz=2.4, channels=12, mts=4800,
            per_cycle={"fp32": (32, "AVX-512 FMA on 2 x 256-bit pipes")}),
    ]


ALIASES = {"h100-sxm": "h100", "a100-sxm": "a100", "h200-sxm": "h200", "4090": "rtx4090"}


def lookup(name: str) -> HardwareEntry | None:
    key = ALIASES.get(name.lower(), name.lower())
    return next((e for e in entries() if e.name == key), None)
