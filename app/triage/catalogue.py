"""The catalogue of train.log triage's patterns: every rule, by the state it reads (oom, diverged,
cuda_fault, stalled, io_error, data_error, completed) and the error semantics that read wording no
rule names. Each is registered with `app.triage.compiler._rule`: a name, a state, a weight (its
specificity), its lowercase needles and its regular expression, and the near misses its tests
hold. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from app.triage.compiler import _rule

# Rules the decision names
_SUMMARY_RULE = "run-summary"
_EXIT_SUMMARY_RULE = "shell-time-summary"
_TRACEBACK_RULE = "traceback-any"


def _scale_below_one(m: re.Match[str]) -> bool:
    """The loss scale fell below 1, or the scaler is at its floor and still overflowing
    (DeepSpeed's `Attempted loss scale: 1, reducing to 1`: min_loss_scale reached, every step skipped)."""
    try:
        groups = m.groupdict()
        if groups.get("scale") is not None:
            return float(groups["scale"]) < 1.0
        if groups.get("lg") is not None:  # the scale's log2
            return float(groups["lg"]) < 0.0
        return float(groups["to"]) < 1.0 or float(groups["attempt"]) == float(groups["to"])
    except (TypeError, ValueError):
        return False


def _scale_tiny(m: re.Match[str]) -> bool:
    try:
        return float(m.group("scale")) < 1e-5
    except (TypeError, ValueError):
        return False


def _nonzero(m: re.Match[str]) -> bool:
    try:
        return int(m.group("n")) > 0
    except (TypeError, ValueError):
        return False


# --- oom: GPU and host memory, the kernel's OOM killer ---------------------------------------
_rule(
    "cuda-oom",
    "oom",
    99,
    ("cudaerrormemoryallocation", "cuda_error_out_of_memory", "out of memory", "outofmemory"),
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cuda failure 'out of memory'"
    r"|HIP out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY",
)
_rule("tried-to-allocate", "oom", 98, "tried to allocate", r"Tried to allocate [\d.]+ ?[KMGT]i?B")
_rule(
    "oom-killer",
    "oom",
    98,
    ("oom-kill", "out of memory: kill", "oom_reaper", "memory cgroup out of memory", "invoked oom-killer"),
    r"Out of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:|oom_reaper: reaped"
    r"|Memory cgroup out of memory",
)
_rule(
    "cpu-alloc",
    "oom",
    97,
    (
        "resource_exhausted",
        "that was not possible",
        "defaultcpuallocator",
        "cannot allocate memory",
        "can't allocate memory",
        "std::bad_alloc",
        "memoryerror",
        "not enough memory",
        "memory allocation error on worker",
    ),
    r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)|\bMemoryError\b"
    r"|\bMemory allocation error on worker \d+"  # XGBoost's device allocator (dh::ThrowOOMError)
    r"|Cannot allocate memory|std::bad_alloc|RESOURCE_EXHAUSTED.{0,40}memory"
    # XLA (TPU/GPU): "RESOURCE_EXHAUSTED: Attempting to reserve 11.35G at the bottom of memory.
    # That was not possible. There are 12.18G free, ..." (also "Attempting to allocate 50.00M.")
    r"|RESOURCE_EXHAUSTED.{0,80}Attempting to (?:reserve|allocate) [\d.]+ ?[KMGT]"
    r"|Attempting to (?:reserve|allocate) [\d.]+ ?[KMGT]i?B?\b.{0,40}That was not possible",
)
_rule(
    "shm-oom",
    "oom",
    85,
    (
        "shared memory",
        "exited unexpectedly",
        "is killed by signal",
        "bus error",
        "enough gpu ram",
        "dispatched on the cpu",
    ),
    r"insufficient shared memory|bus error encountered in worker|DataLoader worker \(pid\(?s?\)? [\d, ]+\) (?:is killed|exited unexpectedly)"
    r"|enough GPU RAM to fit|modules are dispatched on the CPU or the disk",
    confidence=0.85,
)
_rule(
    "bnb-oom",
    "oom",
    96,
    (
        "cudamalloc",
        "cublas_status_alloc_failed",
        "alloc_failed",
        "memory object allocation failure",
        "mem_object_allocation_failure",
    ),
    r"cudaMalloc(?:Async)? (?:failed|retries)|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    r"|CUFFT_ALLOC_FAILED|CUSOLVER_STATUS_ALLOC_FAILED|CUSPARSE_STATUS_ALLOC_FAILED"
    r"|Memory Object Allocation Failure|CL_MEM_OBJECT_ALLOCATION_FAILURE",
)  # OpenCL (LightGBM's GPU trainer, ...)
_rule(
    "oom-recovered",
    "oom",
    70,
    ("attempting to recover", "skipping batch"),
    r"(?:ran out of memory|OOM).{0,80}(?:attempting to recover|skipping batch)",
    soft=True,
    confidence=0.7,
)
_rule(
    "generic-oom",
    "oom",
    80,
    ("out of memory", "oom"),
    r"\bout of memory\b|\bOOM(?:ed)?\b(?! *[:=]? *0(?:\.0+)?(?![\d.]))",
    confidence=0.85,
)
# (not a counter at zero: "oom 0", "OOM: 0", fairseq's progress stats "oom=0.000")
# TensorFlow's BFC allocator dumps its chunks and this total only when an allocation failed (before
# its "ran out of memory" line and the ResourceExhaustedError, which a cut excerpt may lack).
_rule(
    "tf-allocator-dump", "oom", 80, ("sum total of in-use chunks",), r"\bSum Total of in-use chunks: ", confidence=0.85
)
_rule(
    "sigkill",
    "oom",
    60,
    ("sigkill", "exitcode", "exit code", "return code", "exit status", "killed", "error code -"),
    r"Signals\.SIGKILL|Signal 9 \(SIGKILL\)|exit ?code:? ?-9\b|exitcode\s*:\s*-9\b|return code = -9\b"
    r"|\berror code -9\b"  # NVIDIA DIGITS, for the Caffe/Torch process it ran
    r"|killed by signal: Killed"
    r"|exit status (?:-9|137)\b|exit code 137\b|^(?:\S*: line \d+: +\d+ )?Killed\b"
    # The shell's "Killed" lands at the cursor: after a progress bar that ended without a newline,
    # bare or as a script's job report ("<script>: line 6:  3305 Killed   <command>").
    r"|(?<=\])Killed[ \t]*$|: line \d+: +\d+ Killed\b",
    confidence=0.8,
)

# --- diverged: NaN/inf loss or grad norm, loss-scale underflow, exploding loss ---------------
_INF_NEEDLES = ("nan", ": inf", "=inf", "= inf", "loss inf", "norm inf", "-inf", "+inf", "infinity", "'inf")
_rule(
    "nan-loss",
    "diverged",
    94,
    _INF_NEEDLES,
    r"""loss(?:_(?!scale)\w+)?['"]?\s*[:=|]?\s*['"]?(?:\[\s*|tensor\(\s*)?[-+]?(?:nan|inf(?:inity)?)\b"""
    # ("| loss | nan |": a logger's key-value table, OpenAI baselines' and the repos built on it;
    # "Loss: epoch NaN - batch NaN": a loss given with what it is averaged over, burn's metrics)
    r"""|loss\s*[:=]\s*(?:epoch|batch|step|iter|avg|average|mean|ema|running|smoothed|total|train|val|valid|test)"""
    r"""\s+[-+]?(?:nan|inf(?:inity)?)\b"""
    # (mmdet/mmseg log every loss term by its key: `decode.loss_seg: nan`, `loss_cls: nan`)
    # losses logged by their own names (GluonCV/MXNet metrics: CrossEntropy=nan, SmoothL1=nan)
    r"""|\b(?:cross_?entropy|smooth_?l1|nll|bce|focal|kl_?div)\w*['"]?\s*[:=]\s*['"]?[-+]?nan\b"""
    # the terms of a loss listed by name and value without a separator, their total NaN (the YOLOv3
    # ports' `[Losses: x 0.1, y 0.2, ..., total nan]`)
    r"""|\blosses\b[^\n]{0,160}?\btotal\s*[:=]?\s*[-+]?nan\b""",
)
# A printed tensor of NaNs (the model's outputs or loss, printed by the script): torch or TensorFlow
_rule(
    "nan-tensor",
    "diverged",
    85,
    ("nan, nan", "nan nan"),
    r"\btensor\(\[+(?:[-+]?nan(?:, *| +)){2,}[-+]?nan\b",
    confidence=0.85,
)
# DeepXDE's step table once the losses are NaN: "2000      [nan]         [nan]         [nan]" (each
# column a list of loss terms; a row whose train and test columns are both all NaN)
_rule(
    "nan-table-row", "diverged", 88, ("[nan",), r"^\d+[ \t]+\[nan(?:, *nan)*\][ \t]+\[nan(?:, *nan)*\]", confidence=0.9
)
# darknet's region layers: a NaN IOU where the layer had objects (with `count: 0` it is 0/0, and normal)
_rule("darknet-nan", "diverged", 90, ("avg iou",), r"\bAvg IOU: -?nan\b[^\n]*\bcount: [1-9]", confidence=0.9)
_rule(
    "nan-grad-norm",
    "diverged",
    60,
    _INF_NEEDLES,
    r"""\bgrad[ _]norm['"]?\s*[:=]?\s*['"]?[-+]?(?:nan|inf(?:inity)?)\b""",
    confidence=0.8,
)
_rule(
    "loss-is-nan",
    "diverged",
    95,
    (
        "nan",
        "non-finite",
        "not finite",
        "infinite",
        "loss is",
        "loss became",
        "loss has become",
        "detected inf",
        "inf loss",
        "inf gradient",
        "norm is inf",
        "norm was inf",
        "norm became inf",
    ),
    r"loss (?:is|became|has become|returned[^.\n]{0,40}is) (?:nan|inf|non-finite|infinite)"
    r"|non-finite (?:loss|gradient|grad norm|values?)|is not finite|returned nan values"
    r"|found NaN in local grad norm|NaN or Inf found in input tensor|detected (?:inf|nan)"
    r"|(?:nan|inf) (?:loss|gradients?) detected|\b(?:nan|inf) loss with\b|\bgave (?:a )?NaN loss\b|loss contains nan|Encountered nan"
    # a script's own check raising on the loss: DDSP-SVC's `raise ValueError(' [x] nan loss ')`
    r"|(?:Error|Exception):[^\n]{0,30}?\b(?:nan|inf) loss\b"
    # a check raising on any tensor gone NaN: MONAI's "ValueError: cls_logits is NaN or Inf."
    r"|(?:Error|Exception): ?[^\n]{0,60}?\b(?:is|are|became|become) nan\b"
    r"|grad(?:ient)?[ _]norm (?:is|was|became) (?:nan|inf)"
    # TensorFlow's CheckNumerics (clip_by_global_norm's, or tf.debugging.check_numerics on a loss)
    r"|Found Inf or NaN global norm|Tensor had (?:NaN|Inf) values",
)
_rule(
    "min-loss-scale",
    "diverged",
    96,
    (
        "decrease scale",
        "minimum loss scale",
        "already at minimum",
        "underflow",
        "reached minimum",
        "scale is too small",
        "reached the minimum",
        "fell below",
        "too small",
        "in a row due to overflow",
    ),
    r"Minimum loss scale reached|loss scale already at minimum|cannot decrease scale anymore|grad_scale is too small"
    r"|loss[ _]scale (?:has )?(?:underflow|reached (?:the )?minimum|fell below|too small)"
    # GPT-NeoX's overflow monitor, giving up after so many fp16 overflow skips in a row
    r"|Skipped \d+ iterations in a row due to Overflow",
)
_rule(
    "scale-underflow",
    "diverged",
    90,
    ("reducing loss scale to", "reducing to", "setting loss scale to", "decreased lg_loss_scale to"),
    r"(?:reducing loss scale to|setting loss scale to:?) (?P<scale>[0-9.eE+-]+)"
    r"|Attempted loss scale: (?P<attempt>[0-9.eE+-]+), reducing to (?P<to>[0-9.eE+-]+)"
    # OpenAI's guided-/improved-diffusion keep the scale's log2: "Found NaN, decreased lg_loss_scale to -3.0"
    r"|decreased lg_loss_scale to (?P<lg>[0-9.eE+-]+)",
    check=_scale_below_one,
)
# icefall/k2 warn while the fp16 grad scale is below 1 (it may recover) and give up below 1e-5
# ("grad_scale is too small"): a scale that far down is an overflow that never ends.
_rule(
    "grad-scale-small",
    "diverged",
    85,
    "grad scale is small",
    r"Grad scale is small: (?P<scale>[0-9.eE+-]+)",
    check=_scale_tiny,
    confidence=0.9,
)
# torch.distributions refuses a parameter that went NaN (an RL policy's mean, a VAE's scale).
_rule(
    "distribution-nan",
    "diverged",
    92,
    ("found invalid values", "normal expects all elements of std"),
    r"to satisfy the constraint \w+\(\), but found invalid values"
    r"|normal expects all elements of std >= 0",  # torch.normal on a NaN std: an RL policy's std blew up
    confidence=0.85,
)
_rule(
    "megatron-nan-iters",
    "diverged",
    85,
    "number of nan iterations",
    r"number of nan iterations:\s*(?P<n>\d+)",
    check=_nonzero,
    confidence=0.9,
)
_rule(
    "loss-exploded",
    "diverged",
    90,
    ("explosion", "explod", "diverg"),
    r"loss (?:is |has )?(?:probably )?(?:exploding|exploded|diverg(?:ed|ing))|training diverged"
    r"|gradient explosion|exploding gradients? detected",
)

# --- cuda_fault: driver/runtime mismatch, no device, illegal access, Xid/ECC, NCCL errors ----
_rule(
    "xid",
    "cuda_fault",
    97,
    ("xid", "fallen off the bus"),
    r"NVRM: Xid|\bXid \(?PCI|\bXid:? ?\d+\b|GPU has fallen off the bus"
    # the kernel wraps long NVRM messages: "NVRM: The NVIDIA GPU ... / NVRM: fallen off the bus and ..."
    r"|NVRM: .{0,80}fallen off the bus|fallen off the bus and is not responding",
)
_rule(
    "ecc",
    "cuda_fault",
    97,
    ("ecc", "row remap"),
    r"uncorrectable ECC error|\bECC error|double[- ]bit ECC|row remap(?:ping)? (?:failure|pending)",
)
_rule(
    "illegal-access",
    "cuda_fault",
    96,
    (
        "launchfailure",
        "illegal",
        "misaligned",
        "unspecified launch failure",
        "launch failure",
        "launch timed out",
        "memory access fault by gpu",
    ),
    r"illegal memory access|illegal instruction was encountered|misaligned address"
    r"|Memory access fault by GPU node"  # ROCm/HIP
    r"|unspecified launch failure|CUDA_ERROR_ILLEGAL_ADDRESS|cudaErrorIllegalAddress"
    r"|the launch timed out and was terminated|cudaErrorLaunchFailure",
)
_rule(
    "driver-mismatch",
    "cuda_fault",
    96,
    (
        "not compatible with the current pytorch",
        "driver",
        "nvml",
        "compute capability",
        "sm_",
        "no kernel image",
        "forward compatibility",
        "error 802:",
        "error 803:",
        "error 804:",
        "nvidia-container-cli",
        "rminitadapter",
        "device handle",
    ),
    r"driver version is insufficient|NVIDIA driver on your system is too old"
    r"|Driver/library version mismatch|Failed to initialize NVML|couldn't communicate with the NVIDIA driver"
    r"|no kernel image is available|forward compatibility was attempted"
    r"|unsupported display driver|CUDA capability sm_\d+ is not compatible"
    r"|not compatible with the current PyTorch installation|CUDA driver initialization failed"
    r"|Found no NVIDIA driver|cudaErrorInsufficientDriver|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
    r"|Error 80[234]:|could not select device driver|nvidia-container-cli: .{0,80}error"
    r"|RmInitAdapter failed|Unable to determine the device handle|compute capability of at least",
)
_rule(
    "no-device",
    "cuda_fault",
    96,
    (
        "no cuda gpus",
        "cuda-capable",
        "no_device",
        "nodevice",
        "not compiled with cuda",
        "cudagetdevicecount",
        "cuda unknown error",
        "invalid device ordinal",
        "gpu is lost",
        "unavailable",
        "cuinit",
        "cuda initialization",
        "no visible gpu",
        "cpu training is not allowed",
    ),
    r"No CUDA GPUs are available|no CUDA-capable device is detected|CUDA_ERROR_NO_DEVICE"
    r"|cudaErrorNoDevice|CUDA-capable device\(s\) is/are busy or unavailable"
    r"|Torch not compiled with CUDA enabled|Unexpected error from cudaGetDeviceCount"
    r"|CUDA unknown error - this may be due to an incorrectly set up environment"
    r"|invalid device ordinal|GPU is lost|GPU (?:\d+ )?(?:is )?unavailable|cuInit\(\) failed"
    r"|CUDA initialization: .{0,80}(?:error|failed)|cudaErrorDevicesUnavailable"
    r"|No visible GPU is found"  # XGBoost asked for a GPU that the process cannot see
    # VITS' train.py and its many forks (so-vits-svc, Bert-VITS2, ...): assert torch.cuda.is_available()
    r"|CPU training is not allowed",
)
# The TPU's runtime failing to come up or to be had: JAX/libtpu, TensorFlow's TPU strategy, torch_xla's
# XRT configuring the TPU's topology. (JAX's INFO line about a backend it could not load on a GPU or
# CPU machine, and its "No GPU/TPU found, falling back to CPU" warning, are no failure.)
_rule(
    "tpu-runtime",
    "cuda_fault",
    94,
    (
        "tpu initialization failed",
        "tpus not found",
        "tpu is already in use",
        "global core array",
        "initialize backend 'tpu'",
    ),
    r"TPU initialization failed|TPUs not found in the cluster|TPU is already in use by"
    r"|Global core array does not contain host cores|RuntimeError: Unable to initialize backend 'tpu'",
)
_rule(
    "hw-unsupported",
    "cuda_fault",
    93,
    ("ampere", "bf16", "bfloat16", "flashattention", "flash attention"),
    r"FlashAttention only supports Ampere GPUs or newer|Your setup doesn't support bf16"
    r"|bf16 \(?bfloat16\)? (?:is )?not supported|does not support bfloat16|requires (?:an )?Ampere",
)
_rule(
    "cuda-lib",
    "cuda_fault",
    88,
    (
        "libcuda",
        "libcudart",
        "libcublas",
        "libnvrtc",
        "libcudnn",
        "bitsandbytes cuda binary",
        "compiled without gpu",
        "cuda setup",
        "libbitsandbytes",
        "nvcc",
        "cuda_home",
        "detected cuda version",
        "named symbol not found",
    ),
    r"lib(?:cuda|cudart|cublas(?:Lt)?|nvrtc|cudnn)[\w.]*\.so[\d.]*: cannot open shared object file"
    r"|CUDA Setup failed|Could not find the bitsandbytes CUDA binary|libbitsandbytes_cuda\d+\S*\.so"
    r"|bitsandbytes was compiled without GPU support|CUDA SETUP: .{0,60}(?:not found|failed|Problem)"
    r"|nvcc fatal\s*:\s*Unsupported gpu architecture|CUDA_HOME does not exist"
    r"|detected CUDA version \([\d.]+\) mismatches the version that was used to compile PyTorch"
    r"|Error named symbol not found at line \d+ in file|libbitsandbytes_cpu\.so: undefined symbol",
    soft=True,
    confidence=0.9,
)
# The CUDA toolkit itself is missing on the host (a JIT extension build cannot find nvcc): no
# ambiguity left, unlike a bare "Error building extension" (often a compiler or code problem).
# A CUDA extension (flash-attn, xformers, apex, ...) built against another torch or CUDA: the
# environment on the host is broken, not the job's data.
_rule(
    "cuda-ext-abi",
    "cuda_fault",
    88,
    ("undefined symbol",),
    r"\S*cuda\S*\.so: undefined symbol|undefined symbol: _ZN3c10\d*cuda",
    confidence=0.85,
)
_rule(
    "cuda-toolkit-missing",
    "cuda_fault",
    80,
    ("nvcc", "no cuda runtime"),
    r"nvcc: (?:not found|No such file or directory)|/nvcc\S*: (?:not found|No such file)"
    r"|No CUDA runtime is found",
    confidence=0.9,
)
_rule(
    "ext-build",
    "cuda_fault",
    70,
    ("error building extension", "ninja", "nvcc"),
    r"Error building extension '\w+'|ninja: build stopped: subcommand failed|nvcc: not found",
    confidence=0.75,
)
_rule(
    "bnb-nogpu-warn",
    "cuda_fault",
    40,
    ("compiled without gpu support", "setting accelerator to cpu"),
    r"compiled without GPU support|Setting accelerator to CPU",
    soft=True,
    confidence=0.6,
)
# Intel XPU (IPEX, torch.xpu): the Unified Runtime under SYCL failed a device call.
_rule(
    "xpu-runtime",
    "cuda_fault",
    85,
    ("ur error", "ur_result_error"),
    r"RuntimeError: UR error\b|\bUR_RESULT_ERROR_[A-Z_]+",
    confidence=0.9,
)
_rule(
    "cublas-fault",
    "cuda_fault",
    85,
    (
        "cublas_status",
        "cudnn_status",
        "cuda error",
        "cudaerror",
        "cuda_error",
        "deferredcudacallerror",
        "find an engine",
        "cudnn algorithm",
        "cufft_",
        "cusolver_status",
        "curand_status",
        "cusparse_status",
    ),
    r"CUBLAS_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH|NOT_SUPPORTED)"
    r"|CUDNN_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH|MAPPING_ERROR|NOT_SUPPORTED)"
    r"|unable to find an engine to execute this computation|Unable to find a valid cuDNN algorithm"
    r"|CUDA error: (?:unknown error|operation not permitted|an? \w+ error|initialization error"
    r"|operation not supported|uncorrectable|invalid argument|system not yet initialized)"
    r"|DeferredCudaCallError|cudaErrorUnknown|CUDA_ERROR_UNKNOWN|CUDA_ERROR_LAUNCH_FAILED"
    # the other CUDA libraries' internal failures (a runtime that does not match the driver, most often)
    r"|CUFFT_(?:INTERNAL_ERROR|EXEC_FAILED|SETUP_FAILED)|CUSOLVER_STATUS_(?:INTERNAL_ERROR|EXECUTION_FAILED|NOT_INITIALIZED)"
    r"|CURAND_STATUS_(?:INTERNAL_ERROR|INITIALIZATION_FAILED|LAUNCH_FAILURE)|CUSPARSE_STATUS_(?:INTERNAL_ERROR|EXECUTION_FAILED)",
    confidence=0.9,
)
_rule(
    "nccl-error",
    "cuda_fault",
    84,
    (
        "nccl error",
        "ncclsystem",
        "ncclinternal",
        "ncclunhandled",
        "ncclinvalid",
        "ncclremote",
        "nccl warn",
        "distbackenderror",
        "communicator was aborted",
        "unhandled system error",
        "unhandled cuda error",
    ),
    r"NCCL error(?: in)?|nccl(?:System|Internal|UnhandledCuda|Invalid\w*|RemoteError)Error?"
    r"|NCCL WARN (?:Cuda failure|NET/IB\s*:\s*Got completion|Call to)"
    r"|DistBackendError|NCCL communicator was aborted|unhandled (?:system|cuda) error",
    confidence=0.9,
)
# NCCL's own error trail: each function an error passes through logs "file.cc:line -> result" (a non-zero
# ncclResult_t), and its bootstrap's socket connect fails with a WARN. Above the generic network rule:
# a refused connection between NCCL's peers is an NCCL failure (the host or its fabric), not a download.
_rule(
    "nccl-error-trail",
    "cuda_fault",
    91,
    (".cc:", "nccl warn connect to", "nccl warn bootstrap"),
    r"NCCL INFO [\w/.+-]+\.cc:\d+ -> [1-9]\d*\b|NCCL WARN (?:Connect to \S+ failed|Bootstrap)",
    confidence=0.9,
)
# NCCL refusing a call it was given (torch's "NCCL error in: <file>:<line>, invalid argument", then
# the result's name): raised on the rank itself, never by a peer that died, so above the config
# rule, whose words ("Invalid config ...") NCCL's own "Last error:" detail may use.
_rule(
    "nccl-invalid-call",
    "cuda_fault",
    91,
    ("nccl error in:", "ncclinvalid"),
    r"NCCL error in: \S+, invalid (?:argument|usage)\b|\bnccl(?:InvalidArgument|InvalidUsage)\b",
    confidence=0.9,
)
_rule(
    "nccl-warn",
    "cuda_fault",
    60,
    "nccl warn",
    r"NCCL WARN .{0,60}(?:error|fail|could not|cannot|unable)",
    soft=True,
    confidence=0.7,
)  # ("Could not find real path of /sys/class/pci_bus/...": its topology probe, at init)
_rule(
    "sigbus-gpu",
    "cuda_fault",
    50,
    (
        "segmentation",
        "segmentation fault",
        "sigsegv",
        "core dumped",
        "0xc0000005",
        "code -1073741819",
        "code 3221225477",
    ),
    r"Segmentation fault|SIGSEGV|Fatal Python error: Segmentation"
    # Windows' segfault, STATUS_ACCESS_VIOLATION, as IDEs and shells report the exit code (signed or not)
    r"|\b0xC0000005\b|\bcode -1073741819\b|\bcode 3221225477\b",
    confidence=0.55,
)

# --- stalled: collective/watchdog/rendezvous timeouts ------------------------------------------
_rule(
    "nccl-watchdog",
    "stalled",
    92,
    ("before timing out", "watchdog", "timed out", "timeout", "heartbeat", "original reason for failure was"),
    r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out"
    r"|watchdog got stuck|Heartbeat monitor timed out|Timeout at NCCL work"
    r"|collective operation timeout"
    r"|dump signal due to a collective timeout"  # ProcessGroupNCCL's flight recorder, when a peer timed out
    r"|NCCL (?:watchdog )?timeout|Timed out waiting \d+ ?ms for send operation"
    # the communicator the watchdog aborted, with its reason (the timeout, or the watchdog itself stuck),
    # which a posted excerpt may cut mid-word: "... Original reason for failure was: [Rank 0] Watchdog caug"
    r"|Original reason for failure was: \[Rank \d+\] Watchdog\b",
)
# Huawei Ascend's HCCL: a collective waited past HCCL_EXEC_TIMEOUT for a peer's notify.
_rule(
    "hccl-timeout",
    "stalled",
    91,
    ("notify record", "hccl_exec_timeout"),
    r"has not received the Notify record from remote rank|HCCL_EXEC_TIMEOUT",
    confidence=0.9,
)
# Only the watchdog's C++ frames survived (the message line was cut off): the timeout path.
# "failed OR timed out": the watchdog's line for both, so a specific NCCL error (ncclRemoteError, an
# IB completion error) printed with it outranks it.
_rule("nccl-failed-or-timed-out", "stalled", 80, ("timed out",), r"Some NCCL operations have failed or timed out")
_rule(
    "nccl-watchdog-frames",
    "stalled",
    78,
    ("checktimeout",),
    r"ProcessGroupNCCL::WorkNCCL::checkTimeout",
    confidence=0.85,
)
_rule(
    "rendezvous",
    "stalled",
    91,
    ("diststoreerror", "rendezvous", "timed out", "timeout", "clients joined", "socket", "monitoredbarrier"),
    r"RendezvousTimeoutError|Rendezvous (?:timed out|timeout)|Timed out after \d+ seconds waiting for clients"
    r"|clients joined|The client socket has timed out|DistStoreError: .{0,60}[Tt]imed? ?out"
    r"|Socket Timeout|wait timeout after \d+ ?ms|timed out waiting for (?:the )?(?:store|barrier|peers|workers)"
    r"|barrier timed out|monitoredBarrier|Timed out initializing process group"
    r"|Timed out waiting \d+ ?ms for (?:send|recv|recv operation)|The server socket has timed out"
    r"|Timeout waiting for key",  # a c10d store's get (FileStore, HashStore): a peer never wrote its key
    confidence=0.95,
)
# JAX/XLA multi-host start-up: registering with the coordination service, or its barrier, timed
# out (the other tasks never came). Not "agent in error status" alone: every task prints that
# when any peer fails, whatever the failure was.
_rule(
    "coordination-deadline",
    "stalled",
    78,
    ("registertask", "barrier timed out"),
    r"DEADLINE_EXCEEDED: Barrier timed out|CoordinationService/RegisterTask",
    confidence=0.85,
)
# Horovod's stall inspector, repeated while ranks wait on one that never submits (soft: training
# that moves on after it was only slow).
_rule(
    "horovod-stall",
    "stalled",
    80,
    ("waiting for remainder of ranks", "stalled ops"),
    r"waiting for remainder of ranks for more than \d+ seconds|^Stalled ops:",
    soft=True,
    confidence=0.85,
)
# torch.distributed's store-based barrier, printed every few seconds while ranks wait for peers
# that never join (soft: a slow start-up moves on and logs progress after it).
_rule(
    "store-barrier-wait",
    "stalled",
    80,
    ("waiting in store based barrier",),
    r"Waiting in store based barrier to initialize process group",
    soft=True,
    confidence=0.85,
)
_rule(
    "rendezvous-fail",
    "stalled",
    75,
    ("rendezvous", "address already in use", "distnetworkerror", "keep-alive heartbeat"),
    r"RendezvousConnectionError|RendezvousClosedError|DistNetworkError|failed to send a keep-alive heartbeat"
    r"|failed to bind to .{0,40}Address already in use",
    confidence=0.85,
)
_rule(
    "hang-detected",
    "stalled",
    80,
    ("hang", "stuck", "no progress"),
    r"\bhang(?:ing)? detected|training (?:appears|seems) (?:to be )?(?:stuck|hung)"
    r"|no progress (?:for|in) \d+|process (?:is )?stuck",
    confidence=0.85,
)

# --- io_error: disk full, write failures, downloads and network ------------------------------
_rule(
    "disk-full",
    "io_error",
    96,
    (
        "disk is full",
        "no space left",
        "errno 28",
        "disk quota",
        "storagefull",
        "enospc",
        "disk full",
        "not enough disk space",
    ),
    r"No space left on device|\[Errno 28\]|Disk quota exceeded|StorageFull|\bENOSPC\b|disk (?:is )?full"
    r"|Not enough disk space\b",
)  # HF datasets, before it downloads or prepares a dataset
_rule(
    "permission",
    "io_error",
    80,
    ("permission denied", "errno 13]"),
    r"PermissionError: \[Errno 13\]|\[Errno 13\] Permission denied",
    confidence=0.85,
)
_rule(
    "write-failed",
    "io_error",
    95,
    (
        "write incomplete",
        "too many open files",
        "errno 24]",
        "pytorchstreamwriter",
        "errno 116]",
        "file write failed",
        "unexpected pos",
        "read-only file system",
        "input/output error",
        "stale file handle",
        "errno 5]",
        "errno 30]",
        "errno 122]",
        "winerror 32]",
        "error while serializing: ioerror",
        "errno 39]",
        "tmp-checkpoint-",
        "errno 17] file exists:",
    ),
    r"file write failed|PytorchStreamWriter failed|unexpected pos \d+ vs \d+|Read-only file system"
    # Errno 39 (ENOTEMPTY): the Trainer's rename of tmp-checkpoint-* onto a checkpoint dir that exists
    r"|Input/output error|\[Errno (?:5|30|122|116|24|39)\]|Stale file handle|Too many open files"
    r"|FileStream\.Write incomplete|\[WinError 32\]"  # WinError 32: the file is held by another process
    r"|Error while serializing: IoError"  # safetensors' save_file, on the OS's write error
    # the Trainer's staging dir vanished under it while saving (only its save makes tmp-checkpoint-N)
    r"|No such file or directory: '[^'\n]*tmp-checkpoint-\d+"
    # a checkpoint's own (staging) directory already there as the save creates it: Orbax's async save
    # (".../30000.orbax-checkpoint-tmp-0"), a save racing a leftover from a killed run
    r"|\[Errno 17\] File exists: '[^'\n]*(?:checkpoint|ckpt)",
)
_rule(
    "ckpt-save-failed",
    "io_error",
    85,
    (
        "to save",
        "to write",
        "checkpoint save",
        "checkpoint write",
        "checkpoint upload",
        "error saving",
        "error writing",
    ),
    r"(?:failed|unable|could not) to (?:save|write) (?:the )?(?:checkpoint|model|state|adapter)"
    r"|Error writing (?:\(tmp\) )?checkpoint"
    r"|checkpoint (?:save|write|upload) failed|Error saving checkpoint",
    confidence=0.9,
)
_rule(
    "network",
    "io_error",
    90,
    (
        "name or service",
        "no route",
        "chunkedencoding",
        "protocolerror",
        "aiohttp",
        "connect",
        "payload",
        "commerror",
        "run initialization",
        "timed out",
        "timeout",
        "name resolution",
        "getaddrinfo",
        "max retries",
        "ssl",
        "unreachable",
        "resolve",
        "reset by peer",
        "incompleteread",
        "broken pipe",
        "read operation timed out",
        "error: timed out",
        "timeout: timed out",
        "urlopen error",
        "winerror 1006",
        "winerror 1005",
        "transport endpoint",
    ),
    r"(?<!Rendezvous)ConnectionError|ConnectTimeout|ConnectTimeoutError|ReadTimeout(?:Error)?|Read timed out"
    r"|Max retries exceeded|Failed to establish a new connection|Connection refused"
    r"|\bConnection error\.[ \t]*$"  # openai-python's APIConnectionError as a client logs it (not Ray's "exits with a connection error code")
    r"|Connection (?:reset|aborted|broken)|reset by peer|IncompleteRead|RemoteDisconnected"
    r"|Temporary failure in name resolution|Name or service not known|getaddrinfo failed"
    r"|Could not resolve host|Network is unreachable|No route to host|SSLError|SSL: CERTIFICATE"
    r"|ChunkedEncodingError|ProtocolError|httpx\.(?:ConnectError|ReadError|RemoteProtocolError)"
    r"|aiohttp\.client_exceptions|EndpointConnectionError|couldn't connect to 'https?://"
    r"|Connection timed out|Response payload is not completed|CommError|Run initialization has timed out"
    r"|The read operation timed out|(?:TimeoutError|socket\.timeout): timed out$"
    # urllib's wrapper of a socket error; Windows' socket errors (10060 timed out, 10054 reset, 10061 refused, ...)
    r"|<urlopen error \[(?:WinError|Errno) \d+\]|\[WinError 100(?:5\d|6[01])\]"
    # ENOTCONN: on a socket, the peer is gone; on a file, its network mount (Colab's Drive, s3fs, gcsfuse)
    r"|\[Errno 107\] Transport endpoint is not connected",
    soft=True,
    confidence=0.95,
)
_rule(
    "http-error",
    "io_error",
    88,
    (
        "gated repo",
        "is restricted",
        "server error",
        "client error",
        "hfhubhttperror",
        "httperror",
        "too many requests",
        "gateway",
        "service unavailable",
        "gatedrepoerror",
        "unauthorized",
        "forbidden",
    ),
    r"\b5\d\d Server Error|\b429 Client Error|Too Many Requests|HfHubHTTPError|\bHTTPError\b"
    r"|Bad Gateway|Gateway Time-?out|Service Unavailable|GatedRepoError|Cannot access gated repo"
    r"|40[13] Client Error|Unauthorized for url|Access to model .{0,60} is restricted",
    soft=True,
    confidence=0.92,
)
_rule(
    "offline-cache",
    "io_error",
    87,
    (
        "localentrynotfounderror",
        "outgoing traffic has been disabled",
        "consistency check failed",
        "download",
        "headertoolarge",
        "metadataincompletebuffer",
        "incomplete",
        "pytorchstreamreader",
        "invalid load key",
        "unexpected eof",
        "while downloading",
        "url fetch failure",
    ),
    r"LocalEntryNotFoundError|outgoing traffic has been disabled|Consistency check failed"
    r"|download(?:ing)? (?:failed|error|interrupted|incomplete)|failed (?:to download|downloading)"
    r"|\berror (?:occurred |happened )?while downloading\b"  # huggingface_hub's hf_transfer path, and others
    r"|\berror downloading\b|\bURL fetch failure on\b"  # Keras' get_file (its message, and its examples' hint)
    r"|HeaderTooLarge|MetadataIncompleteBuffer|incomplete (?:download|file)"
    r"|PytorchStreamReader failed reading zip archive|invalid load key"
    r"|unexpected EOF, expected \d+ more bytes\. The file might be corrupted",
    confidence=0.9,
)  # torch.load, a cut file
# transformers' "Can't load tokenizer for 'openai/clip-vit-large-patch14'" (and the same for the
# configuration, image processor, feature extractor, processor) is raised when none of the files
# could be fetched: connection errors are swallowed first. For a Hub id (org/name) it is the network
# far more often than a wrong name, which fails earlier as "is not a valid model identifier" (the
# threads' fixes: a mirror, a proxy, pre-downloading). For a local path it stays a config error.
_rule(
    "hub-unreachable",
    "io_error",
    95,
    ("can't load",),
    r"Can't load (?:tokenizer|the configuration of|image processor|feature extractor|processor) (?:for )?"
    r"'[a-z0-9][\w.-]*/[\w.-]+'",
    confidence=0.85,
)
_rule(
    "s3",
    "io_error",
    86,
    ("upload failed", "botocore", "s3", "nosuchbucket", "slowdown", "failed to upload"),
    r"botocore\.exceptions\.\w+|S3UploadFailedError|upload failed|NoSuchBucket|SlowDown|Failed to upload \S+ to\b",
    soft=True,
    confidence=0.85,
)
_rule(
    "retry-warn",
    "io_error",
    35,
    ("retrying", "[retry "),
    r"Retrying in [\d.]+ ?s|\[Retry \d+/\d+\]|Retrying \(Retry\(total=|retrying after",
    soft=True,
    confidence=0.55,
)
_rule(
    "wandb-net",
    "io_error",
    30,
    ("wandb: error", "wandb: network error"),
    r"wandb: (?:ERROR|Network error).{0,80}(?:connect|network|timed? ?out|retry)",
    soft=True,
    confidence=0.5,
)

# --- data_error: dataset, tokenizer, template, schema, config ---------------------------------
_rule(
    "device-assert-data",
    "data_error",
    95,
    ("out of bounds for dimension", "assertion", "device-side assert", "index out of range", "indexselect"),
    r"Assertion `(?:srcIndex < srcSelectDimSize|t >= 0 && t < n_classes|input_val >= zero && input_val <= one"
    r"|idx_dim >= 0 && idx_dim < index_size|index out of bounds|cur_target >= 0 && cur_target < n_classes"
    # ATen's IndexKernel.cu: `-sizes[i] <= index && index < sizes[i] && "index out of bounds"`
    r"|-sizes\[i\] <= index && index < sizes\[i\])[^`]*` failed"
    r"|device-side assert triggered|IndexError: index out of range in self"
    r"|index \S+ is out of bounds for dimension",
)
_rule(
    "template",
    "data_error",
    95,
    ("roles must alternate", "template", "jinja"),
    r"chat_template is not set|Cannot use chat template|jinja2\.exceptions\.\w+"
    r"|Conversation roles must alternate|TemplateError|Template \S+ does not exist"
    r"|unknown (?:chat )?template|No chat template|template .{0,30}not found",
)
_rule(
    "tokenizer",
    "data_error",
    94,
    (
        "text input must",
        "untagged enum",
        "size mismatch",
        "token id",
        "tokenizer",
        "pad",
        "truncation",
        "textencodeinput",
        "text input must be",
    ),
    r"Asking to pad but the tokenizer does not have a padding token|Unable to create tensor, you should probably activate truncation"
    r"|Tokenizer class \S+ does not exist|TextEncodeInput must be|text input must (?:be )?of type"
    r"|Can't load tokenizer|tokenizer\.json.{0,40}(?:not found|missing|corrupt)"
    r"|Exception: data did not match any variant of untagged enum|tokenizer .{0,30}has no attribute"
    r"|vocab(?:ulary)? size mismatch|token id \d+ (?:is )?out of (?:range|vocab)",
)
_rule(
    "dataset",
    "data_error",
    94,
    (
        "datasetgeneration",
        "arrowinvalid",
        "arrowtypeerror",
        "casterror",
        "jsondecodeerror",
        "json parse error",
        "unicodedecodeerror",
        "couldn't cast",
        "column",
        "valid samples",
        "undefined dataset",
        "dataset script",
        "unable to find '",
        "empty",
        "num_samples=0",
        "not found",
        "invalid dataset",
        "dataset format",
        "tokenization strategy",
        "failed to load dataset",
        "datasets.exceptions",
        "splits",
        "expected schema",
        "schema mismatch",
        "keyerror: '",
        "no data",
        "no image",
        "no samples",
        "no training",
        "no valid",
        "stopped: no training batches",
    ),
    r"DatasetGenerationError|DatasetGenerationCastError|ArrowInvalid|ArrowTypeError|CastError"
    r"|JSONDecodeError|JSON parse error|UnicodeDecodeError|Couldn't cast|column .{0,40}not (?:found|in)"
    r"|Column \S+ not in the dataset|No columns in the dataset match|Cannot find valid samples"
    r"|Undefined dataset .{0,60}in dataset_info|Couldn't find a dataset script|Unable to find '[^']+'"
    r"|dataset (?:is )?empty|empty dataset|num_samples=0|Dataset .{0,40}not found"
    r"|Invalid dataset|Please check the dataset format|unhandled prompt tokenization strategy"
    r"|Failed to load dataset|datasets\.exceptions\.\w+|ExpectedMoreSplits|SplitsNotFoundError"
    r"|\bno (?:data|images?|samples|training (?:data|samples|images)|valid (?:data|samples|images)) (?:was |were )?found\b"
    r"|`Trainer\.fit` stopped: No training batches"  # Lightning, when the train dataloader is empty
    r"|NonMatchingSplitsSizesError|doesn't match the expected schema|schema mismatch|KeyError: '(?:text|input|output|instruction|messages|conversations|label|labels|prompt|response|chosen|rejected|content|role|from|value|input_ids|attention_mask)'",
)
_rule(
    "batch-shape",
    "data_error",
    90,
    (
        "batch_size",
        "did not return a loss",
        "target size",
        "labels",
        "target",
        "supply an encoding",
        "batch received was empty",
        "same device",
        "cannot be multiplied",
        "expected scalar type",
        "unscale fp16",
        "purely quantized",
        "stack expects",
        "must be broadcastable",
        "incompatible shapes",
        "label must be",
        "labels must be",
        "_obj.cc:",
        "_obj.cu:",
    ),
    r"Expected input batch_size \(\d+\) to match target batch_size|did not return a loss from the inputs"
    r"|Target size \(.{0,40}\) must be the same as input size|labels? .{0,30}out of (?:range|bounds)"
    r"|Target \d+ is out of bounds|You should supply an encoding or a list of encodings"
    r"|The batch received was empty|Expected all tensors to be on the same device"
    r"|shapes cannot be multiplied|expected scalar type \w+ but found|Attempting to unscale FP16 gradients"
    r"|cannot perform fine-tuning on purely quantized models|stack expects each tensor to be equal size"
    r"|logits and labels must be broadcastable|Incompatible shapes: \["
    r"|\blabels? must be (?:in \[|between|less than|non-?negative)"
    r"|_obj\.(?:cc|cu):\d+: Check failed:",
    confidence=0.92,
)  # XGBoost's objectives check labels against predictions
# XGBoost's and CatBoost's own checks on what they were given ("XGBoostError: ... src/data/data.cc:
# Check failed: labels.Size() == num_row", "CatBoostError: .../target/data_providers.cpp: Target
# contains only one unique value"); their memory and device errors match the heavier rules first.
_rule(
    "gbdt-data",
    "data_error",
    75,
    ("xgboosterror", "catboosterror"),
    r"(?:XGBoostError|CatBoostError):[^\n]{0,200}?(?:\blabels?\b|\btarget\b|\bfeatures?\b|\bcolumns?\b|categor"
    r"|/data/|\bnum_row|\bshape\b|\bdtype\b)",
    confidence=0.85,
)
# ultralytics drops each image whose label names a class beyond the dataset's (soft: the rest may train)
_rule(
    "label-class",
    "data_error",
    85,
    ("exceeds dataset class count",),
    r"Label class \d+ exceeds dataset class count \d+",
    soft=True,
    confidence=0.9,
)
_rule(
    "config",
    "data_error",
    90,
    (
        "unknown ",
        "validationerror",
        "yaml.",
        "scannererror",
        "parsererror",
        "unexpected keyword argument",
        "not found in the base model",
        "please specify",
        "not a valid model identifier",
        "unrecognized",
        "size mismatch for",
        "loading state_dict",
        "missing key(s)",
        "configerror",
        "invalidconfig",
        "invalid config",
        "error: argument",
        "hfargumentparser",
        "invalid choice",
        "unknown optimizer",
        "unknown scheduler",
        "unknown model type",
        "unknown quantization",
        "does not appear to have a file named",
        "configuration file",
        "cannot find config",
        "config.json",
        "invalid arguments!",
        "missingconfigexception",
        "configcompositionexception",
        "which is not available",
        "could not find the monitored key",
        "could not override '",
        "could not append to config",
        "error merging override",
        "is not in struct",
        "missing mandatory value",
    ),
    r"ValidationError|yaml\.(?:scanner|parser|constructor)\.\w+Error|ScannerError|ParserError"
    r"|got an unexpected keyword argument|Target modules .{0,80}not found in the base model"
    r"|Please specify `?\w+`? in|is not a valid model identifier|Unrecognized configuration class"
    r"|Unrecognized model in|size mismatch for|Error\(s\) in loading state_dict|Missing key\(s\) in state_dict"
    r"|ConfigError|InvalidConfig|Invalid config|unrecognized arguments:|error: argument"
    r"|Some specified arguments are not used by the HfArgumentParser|invalid choice:"
    r"|Unknown (?:optimizer|scheduler|model type|quantization)|does not appear to have a file named"
    r"|configuration file .{0,40}not found|Cannot find config|config\.json.{0,20}not found"
    r"|^invalid arguments!"  # Lua Torch's argcheck, before the usage it prints
    r"|\bMissingConfigException\b|\bConfigCompositionException\b"  # Hydra: the run's config does not compose
    # Lightning's callbacks monitoring a metric the module never logs, when they raise (EarlyStopping's
    # strict default, ModelCheckpoint once validation ran); otherwise it is a warning and the run goes on
    r"|(?:RuntimeError|MisconfigurationException): (?:Early stopping|ReduceLROnPlateau) conditioned on metric "
    r".{0,120}? which is not available"
    r"|MisconfigurationException: .{0,80}could not find the monitored key in the returned metrics"
    # Hydra refusing a command-line override, OmegaConf a key its schema lacks or a value never set
    r"|^Could not override '|^Could not append to config\.|^Error merging override "
    r"|\bKey '[^'\n]+' is not in struct\b|\bMissing mandatory value: ",
    confidence=0.92,
)
_rule(
    "config-hint",
    "data_error",
    45,
    ("error: ",),
    r"^\S*Error: .{0,120}(?:should be (?:a|an|one of)|must be (?:a multiple|divisible|one of|greater|less|positive|set)|is not supported for)",
    soft=True,
    confidence=0.65,
)
# A dataset found, loaded or cached with no samples at all ("PreprocessedTensorDataset: 0 samples cached",
# "Found 0 images in ...", the HF Trainer's "Num examples = 0"): the run has nothing to train on.
_rule(
    "no-samples",
    "data_error",
    72,
    (
        " 0 samples",
        " 0 examples",
        " 0 images",
        " 0 valid",
        " 0 training",
        " 0 train ",
        " 0 sequences",
        " 0 records",
        "num examples = 0",
    ),
    r"(?:dataset|found|loaded|loading|cached|contains|has|with|got)\W{0,3}0 (?:valid |usable |training |train )?"
    r"(?:samples|examples|images|sequences|records)\b|\bnum examples = 0\b",
    soft=True,
    confidence=0.8,
)
# ultralytics' dataset scan, per image whose label file it cannot read (soft: training goes on with the rest)
_rule(
    "corrupt-labels",
    "data_error",
    72,
    ("ignoring corrupt image",),
    r"ignoring corrupt image/label:",
    soft=True,
    confidence=0.8,
)
_rule(
    "module-missing",
    "data_error",
    70,
    (
        "modulenotfounderror",
        "importerror",
        "no module named",
        "requires the latest version",
        "requires the following packages",
    ),
    r"ModuleNotFoundError|No module named|ImportError|requires the latest version of|requires the following packages",
    soft=True,
    confidence=0.8,
)
_rule(
    "file-missing",
    "data_error",
    70,
    ("isadirectoryerror", "notadirectoryerror", "filenotfounderror", "no such file or directory", "errno 2]"),
    r"FileNotFoundError|No such file or directory|\[Errno 2\]|IsADirectoryError|NotADirectoryError",
    soft=True,
    confidence=0.8,
)
# LLaVA and its forks (LLaVA-NeXT, ShareGPT4V, ...): the conversation template does not fit the
# tokenizer, so every such sample's labels are masked out and the run learns nothing.
_rule(
    "tokenization-mismatch",
    "data_error",
    50,
    ("tokenization mismatch",),
    r"\btokenization mismatch: \d+ vs\. \d+",
    confidence=0.8,
)
# unsloth refusing to train on tokens whose embeddings were never trained (reserved or special tokens
# in the data, with a base model's untrained rows): the data or the choice of model, not the numbers
# (its message says they would cause NaNs). Its benign form ("... Setting them to the mean") stays quiet.
_rule(
    "untrained-tokens",
    "data_error",
    55,
    ("untrained tokens of",),
    r"\bUntrained tokens of \[.*\] found, but embed_tokens & lm_head not trainable",
    confidence=0.85,
)
_rule(
    "python-bug",
    "data_error",
    40,
    ("error:", "exception:", "assertionerror"),
    r"^[ \t]*\S*(?:KeyError|ValueError|TypeError|IndexError|AttributeError|AssertionError|NameError"
    r"|ZeroDivisionError|NotImplementedError|RecursionError|UnboundLocalError|LookupError)\b:?",
    confidence=0.8,
)

_rule(
    _TRACEBACK_RULE,
    "data_error",
    30,
    ("traceback (most recent call last)", "error: ", "exception: "),
    r"^Traceback \(most recent call last\)|^[\w.]*(?:Error|Exception): ",
    confidence=0.45,
)
_rule(
    "error-words",
    "data_error",
    25,
    ("fatal", "error", "abort", "failed", "crash", "exception"),
    # not on warnings: lines saying "warn", or in glog's/TensorFlow's format a W-level line
    # ("W0821 01:57:42.623 ..." or "2020-06-08 05:30:15.889706: W tensorflow/...")
    # and not on the severity column of an exported Cloud Logging line ("ERROR   2022-01-26 14:19:34 +1100
    # workerpool0-0  ..."): Vertex AI tags everything a job writes to stderr (progress bars too) ERROR
    r"^(?![^\n]*warn)(?!w\d{4} |[\d-]+ [\d:.]+: w )"
    r"(?:error\s+\d{4}-\d\d-\d\d[ t]\d\d:\d\d:\d\d[.,\d]*(?:\s*(?:[+-]\d{4}|z|utc))?\s)?+"
    # (not a metric named so: HiFi-GAN's "Mel-Spec. Error : 0.407")
    r"[^\n]*?\b(?:fatal|error(?![ \t]*:[ \t]*[-+]?\d+\.\d)|aborting|aborted|failed|crashed|exception)\b",
    soft=True,
    confidence=0.4,
)
_rule(
    "abort",
    "cuda_fault",
    35,
    ("aborted (core dumped)", "sigabrt", "terminate called"),
    r"Aborted \(core dumped\)|SIGABRT|terminate called after throwing",
    confidence=0.45,
)

# --- error semantics: a failure word plus what failed ------------------------------------------
# Home-grown scripts and wrappers print failures in their own words ("GPU memory exhausted",
# "weights contain NaN", "waiting for rank 3 ... gave up"). These rules read a line as
# (failure word) + (object) + (what happened to it) instead of an exact phrase. They only fire on
# a line that says something failed (and not on warnings), rank above the generic fallbacks and
# below every specific rule, and are still terminal (weight >= _FATAL_FLOOR).
_FAIL_WORDS = (
    "fatal",
    "error",
    "critical",
    "fail",
    "abort",
    "gave up",
    "giving up",
    "stopping",
    "halting",
    "cannot",
    "can't",
    "could",
    "unable",
    "crash",
    "terminated",
    "exiting",
    "killed",
)
_FAILING_LINE = re.compile(
    r"\bfatal\b|\berror\b|\bcritical\b|\bfail(?:ed|ure|s)?\b|\babort|\bgave up\b|\bgiving up\b|\bstopping\b"
    r"|\bhalting\b|\bcannot\b|\bcan't\b|\bcould ?n[o']t\b|\bunable\b|\bcrash|\bterminated\b|\bexiting\b|\bkilled\b"
)
# (and not a progress bar: llama-recipes' bar reads "Training Epoch: 2/3, step 49/50 completed ...: 100%|")
# (and not one epoch's or step's end: "training done for epoch 3", "epoch 3 training finished")
_UPBEAT_SPOILERS = re.compile(
    r"\berror|\bfail|\bfatal|\babort|\bwarn|\bexception|\bno\b|\bnot\b|\bnever\b|\bwithout\b|n't\b|%\|"
    r"|\b(?:for|of) (?:the )?(?:epoch|step|iteration|batch|fold|round|episode)\b|\bepoch (?:\d+ )?training\b"
)


def _match_line(m: re.Match[str]) -> str:
    text = m.string
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start : end if end >= 0 else len(text)]


def _on_failing_line(m: re.Match[str]) -> bool:
    """The match's line says something failed, and is not a warning."""
    line = _match_line(m)
    return "warn" not in line and _FAILING_LINE.search(line) is not None


def _on_upbeat_line(m: re.Match[str]) -> bool:
    """The match's line has no failure word and no negation ("no step completed"), and is no bar."""
    return _UPBEAT_SPOILERS.search(_match_line(m)) is None


def _failing_line_text(line: str) -> bool:
    return "warn" not in line and _FAILING_LINE.search(line) is not None


def _upbeat_line_text(line: str) -> bool:
    return _UPBEAT_SPOILERS.search(line) is None


def _off_step_dict_text(line: str) -> bool:
    return "'loss':" not in line and '"loss":' not in line


def _off_step_dict(m: re.Match[str]) -> bool:
    """The match's line logs no step's own 'loss' (a closing summary logs 'train_loss')."""
    return _off_step_dict_text(_match_line(m))


# Match checks that depend only on the match's line, as line predicates: a line that fails one
# is skipped before the rule's regex runs (the checks stay the definition).
_LINE_CHECKS: dict[Callable[[re.Match[str]], bool], Callable[[str], bool]] = {
    _on_failing_line: _failing_line_text,
    _on_upbeat_line: _upbeat_line_text,
    _off_step_dict: _off_step_dict_text,
}


def _semantic(name: str, state: str, weight: int, body: str, *, confidence: float = 0.85) -> None:
    _rule(name, state, weight, _FAIL_WORDS, body, confidence=confidence, soft=True, check=_on_failing_line, lazy=True)


_MEM = r"(?:memory|vram|\bram\b|\bhbm\b)"
_semantic(
    "sem-oom",
    "oom",
    58,
    r"\b(?:ran|run|running|is|are|went) out of (?:\w+ ){0,2}"
    + _MEM
    + r"|(?:not enough|insufficient|no (?:more|free)|exhausted|out of) (?:\w+ ){0,2}"
    + _MEM
    + r"|"
    + _MEM
    + r"[^\n]{0,40}?\b(?:exhausted|is full|was full|exceeded|limit (?:reached|hit)|insufficient)"
    + r"|\balloc(?:at(?:e|ion|ing))?\b[^\n]{0,60}?\b(?:failed|fails)\b"
    + r"|(?:failed|unable|could ?n[o']t|cannot) (?:to )?allocate"
    + r"|out-of-memory|\boom[- ]?kill",
)
_semantic(
    "sem-diverged",
    "diverged",
    58,
    r"\b(?:loss(?:es)?|train_loss|gradients?|grads?|grad(?:ient)?[ _]norm|weights?|parameters?|activations?|logits"
    r"|outputs?|update)\b[^\n]{0,40}?(?:\bnan\b|\binf\b|infinit|non-finite|not finite|non-numeric|\bexplod|blew up"
    r"|blown up|\bdiverg|jumped (?:from|to)|spiked?)"
    r"|(?:\bnan\b|\binf\b|non-finite|non-numeric|infinite) (?:values? )?(?:in|detected in|found in) "
    r"(?:the )?(?:loss|gradients?|grads?|weights|parameters|activations|logits)"
    r"|\b(?:nan|inf|non-finite|non-numeric|infinite|invalid) (?:\w+ )?(?:loss|gradients?|grads?|weights|activations)\b",
)
_semantic(
    "sem-cuda",
    "cuda_fault",
    57,
    r"\b(?:gpu|gpus|cuda(?::\d+)?|device|nvidia|driver|accelerator)\b[^\n]{0,40}?\b(?:stopped responding|not responding"
    r"|no longer (?:visible|available|responding|present|accessible)|(?:is |was |got )?lost\b|fell off|fallen off"
    r"|hardware (?:fault|error|failure)|unrecoverable|uncorrectable|crashed|disappeared|went away"
    r"|not (?:found|detected|visible|available)|unavailable|hung\b|reset)"
    r"|\b(?:hardware|device|driver|ecc|xid) (?:fault|failure|error)\b|kernel launch failed",
)
_semantic(
    "sem-io",
    "io_error",
    57,
    r"\b(?:checkpoint|ckpt|volume|disk|filesystem|file system|storage|bucket|upload\w*|download\w*|fetch\w*|sav(?:e|ed|ing)"
    r"|writ(?:e|ing)|sync\w*|network|connection|endpoint|http|hub|s3|mount|nfs|shard)\b[^\n]{0,60}?"
    r"(?:\b(?:is |was )?full\b|no (?:free )?space|out of (?:disk|space)|timed? ?out|unreachable|refused|\breset\b"
    r"|i/o error|io error|\bhttp \d{3}\b|\b(?:50[0-9]|429|403|401)\b|\bretries\b|\btries\b|\battempts\b|read-only|quota"
    r"|failed|could ?n[o']t|cannot|unable)",
)
_semantic(
    "sem-stalled",
    "stalled",
    57,
    r"\b(?:all-?reduce|all-?gather|reduce-?scatter|broadcast|barrier|collective|rendezvous|rank \d+|ranks|peers?"
    r"|workers?|heartbeat|watchdog|nccl|process group|synchroni[sz]\w*)\b[^\n]{0,60}?(?:timed? ?out|did not (?:complete|finish"
    r"|answer|respond|arrive|join)|has not (?:answered|responded|joined|arrived)|no (?:response|answer|reply)"
    r"|not responding|gave up|giving up|stuck|\bhung\b|\bhang|frozen|deadlock)"
    r"|\bno (?:training )?(?:steps?|batch(?:es)?|progress|iterations?|updates?)\b[^\n]{0,30}?\b(?:in|for|within)"
    r" (?:the )?(?:last )?\d+"
    r"|(?:appears|looks|seems|is) (?:to be )?(?:hung|stuck|frozen|deadlocked)",
    confidence=0.85,
)
_rule(
    "sem-hung",
    "stalled",
    57,
    (
        "hung",
        "stuck",
        "frozen",
        "deadlocked",
        "no training",
        "no step",
        "no progress",
        "no batch",
        "no iteration",
        "no update",
    ),
    r"\bno (?:training )?(?:steps?|batch(?:es)?|progress|iterations?|updates?)\b[^\n]{0,30}?\b(?:in|for|within)"
    r" (?:the )?(?:last )?\d+|(?:appears|looks|seems) (?:to be )?(?:hung|stuck|frozen|deadlocked)"
    r"|\b(?:training|run|job|process|step) (?:is |has )?(?:hung|stuck|frozen|deadlocked)\b",
    soft=True,
    confidence=0.85,
    lazy=True,
)
_semantic(
    "sem-data",
    "data_error",
    56,
    r"\b(?:samples?|records?|examples?|rows?|line \d+|fields?|keys?|columns?|templates?|prompts?|dataset|data ?file"
    r"|training file|jsonl?|csv|parquet|schema|tokeni[sz]er|vocab\w*|labels?|config\w*|yaml|arguments?|hyperparam\w*"
    r"|learning_rate|lr|batch_size|values?|variable|sequence)\b[^\n]{0,60}?"
    r"(?:\bmissing\b|malformed|\binvalid\b|\bbad\b|corrupt|unexpected|undefined|\bunknown\b|pars(?:e|ing)|\bempty\b"
    r"|\bexpected\b|must be|not (?:a valid|allowed|supported|defined)|has no\b|mismatch|out of range|decode)"
    r"|\b(?:missing|malformed|invalid|bad|corrupt(?:ed)?|empty|undefined|unknown) (?:\w+ ){0,2}(?:samples?|records?"
    r"|examples?|rows?|fields?|keys?|columns?|templates?|dataset|data|json|schema|tokens?|labels?|config\w*|arguments?"
    r"|variables?|values?)\b",
    confidence=0.8,
)

# --- completed ------------------------------------------------------------------------------------
_rule(
    "completed",
    "completed",
    50,
    (
        "training is",
        "run is",
        "run complete",
        "completed in",
        "optimizer stripped",
        "exits successfully",
        "early stop",
        "run done",
        "final adapter saved",
        "training completed",
        "train metrics",
        "training complete",
        "stopped:",
        "after training is done",
        "finished training",
        "training finished",
        "training done",
        "run finished",
        "saving final",
        "final model saved",
        "status: completed",
        "done training",
        "finished step=",
        "steps reached",
        "epochs reached",
        "iterations reached",
        "finish train",
        "shrink model to",
        "bestiteration =",
        "best iteration",
        "average val",
        "average test",
        "final val",
        "final test",
        "end time of running main",
        "saved final",
        "training was",
        "run was",
        "saving the final",
        "max epochs num!",
        "max frames num!",
        "*** best metric:",
        "saved pipeline to output directory",
        "train completed, best_metric",
        "key: avg_",
        "optimization done",
        "testing using ",
        "- f1-score (micro)",
        "optimization finished!",
        "loss for final step:",
        "eval metrics",
        "test metrics",
        "predict metrics",
        "eval results",
        "last_model_checkpoint: ",
        "reporting training success",
        "training job completed",
        "billable seconds: ",
        "fl finished in ",
        "epoch loaded: ",
    ),
    r"Training completed\. Do not forget|Training Completed!|\*{3,} train metrics \*{3,}"
    r"|`Trainer\.fit` stopped: `max_(?:epochs|steps)=\d+` reached|\[after training is done\]"
    # (ESPnet: "was"; not one epoch's or step's end, as hand-written loops print it: "Training completed
    # for epoch 3", "Training done for epoch 3", "One epoch training finished")
    r"|(?<!epoch )(?<!epochs )\b(?:training|run) (?:is |was )?(?:finished|complete(?:d)?|done)\b(?! *[:=] *(?:false|0))"
    r"(?! *,? *(?:for|of|in) (?:the )?(?:epoch|step|iteration|iter|batch|fold|round|episode)s?\b)"
    # (DLRM prints "Finished training it 1000/2000 of epoch 0" every interval: only the counter at its total ends)
    r"|finished training(?! it (?P<fin_it>\d+)/(?!(?P=fin_it)\b)\d+)|done training|saving (?:the )?final (?:model|adapter|checkpoint)"  # DeepSpeed-Chat: "the"
    r"|\bSaving final epoch checkpoint\."  # torchtune's checkpointers, for the last epoch only
    # SpeechBrain's recipes: the test stage's stats, logged by evaluate() after fit() returned
    r"|\bEpoch loaded: \d+ - test "
    r"|final (?:model|adapter) saved|status: completed|z finished step=\d+"
    r"|^\d+ (?:epochs?|iterations|steps) completed in [\d.]+ ?(?:hours|minutes|seconds|[hms])\b"
    r"|^Optimizer stripped from \S+"  # ultralytics, once the last epoch is done
    r"|\bProcess \d+ exits successfully"  # the DeepSpeed launcher, per process at the end
    r"|\bEarly stop(?:ping)? at epoch \d+|\bEarly stopping triggered|^Epoch \d+: early stopping\b"
    r"|\bmax(?:imum)? (?:training )?(?:steps|epochs|iterations) reached\b|\bFinish train\b"  # llama-recipes, LightGBM
    r"|^Shrink model to first \d+ iterations|^bestIteration = \d+"  # CatBoost, at the end of fit
    # XGBoost's early stop, LightGBM's end of fit ("Early stopping, best iteration is:", "Did not meet
    # early stopping. Best iteration is:", and its R/CLI logger's "Best iteration: N")
    r"|\bStopping\. Best iteration:|\bBest iteration is:|^(?:\[[\d:]+\] )?Best iteration: \d+[ \t]*$"
    r"|^(?:Average|Final) (?:val\w*|test)\b[^\n]{0,40}\u00b1"  # the mean +- spread over repeated runs (OGB, DGL)
    r"|End time of running main:"  # ms-swift, once main() returned
    r"|\[INFO:swift\] last_model_checkpoint: "  # ms-swift, the trainer state it logs after train()
    r"|\bSaved final (?:weights|model|adapters?|checkpoint)s? to\b"  # mlx-lm and many scripts, after the loop
    r"|\bFinal validation metrics:"  # verl's trainer, on its last step before it returns
    r"|^MAX (?:EPOCHS|FRAMES) NUM!"  # rl_games (Isaac Gym, IsaacGymEnvs), as it leaves the loop
    r"|\*\*\* Best metric: \S+ \(epoch \d+\)"  # timm's train.py, after the last epoch
    r"|Saved pipeline to output directory"  # spaCy's `train`, only when the loop ended without an error
    r"|\bTesting using (?:best|final|last state of(?: the)?) model\b"  # flair's ModelTrainer, after the last epoch
    r"|^- F1-score \(micro\) [\d.]+[ \t]*$"  # flair's final test report
    r"|^Optimization Finished!"  # pygcn, GAT and the graph repos built on them, after the epoch loop
    r"|\bLoss for final step: "  # TF Estimator's train(), as it returns
    # HF example scripts' `trainer.log_metrics(...)` banner for evaluate()/predict() after train()
    # (the Trainer's own evaluations during training log a dict, never this banner)
    r"|\*{3,} (?:eval|test|predict) metrics \*{3,}|\*{3,} Eval results \*{3,}"  # (and the older scripts' banner)
    r"|\btrain completed, best_metric:"  # MONAI's training loops, after the last epoch
    # SageMaker: the training toolkit in the container once the entry point exited 0, and the SDK's
    # job log stream (its status line, then the billed time, printed for a completed job only)
    r"|\bReporting training SUCCESS\b|\bCompleted - Training job completed\b|\bBillable seconds: \d+"
    r"|(?:^|\] )Optimization Done\.?[ \t]*$"  # Caffe's solver (glog line, or bare under DIGITS), after max_iter
    # Flower's server once fit() ran every round (its workflows too; start_server since 1.5 logs "Run finished
    # N round(s)", which this rule reads as "run finished")
    r"|\bFL finished in \d"
    r"|^Key: avg_(?:train_prep|train_loss|eval_prep|eval_loss|epoch_time|checkpoint_time), Value: ",  # llama-recipes,
    # printing what train() returned
    confidence=0.95,
)
# The Trainer's closing summary ({'train_runtime': ..., 'train_loss': ...}). unsloth's per-step dicts
# carry train_runtime too, beside the step's own 'loss' (the summary's is 'train_loss').
_rule(
    "trainer-summary", "completed", 50, ("train_runtime",), r"\btrain_runtime\b", confidence=0.95, check=_off_step_dict
)
# A run's closing summary (detectron2's hooks, DSSTNE). detectron2 prints it in a `finally`, after
# an exception too, so it is completion only with no terminal failure before it (`_decide`).
# The whole run's bar (not an epoch's) at N/N: gaussian-splatting's "Training progress", ...
_rule(
    "run-bar-full",
    "completed",
    50,
    ("training progress:", "training:"),
    r"^Training(?: progress)?:\s*100%\|[^|\n]*\|\s*(\d+)/\1\b",
    confidence=0.85,
)
# The shell's `time` report ("real\t0m46.551s"), IPython's `%%time` ("Wall time: 55.2 s"), or Ray
# Tune's as its tuning loop returns ("Total run time: 41.77 seconds (41.75 seconds for the tuning
# loop)."): the process, the notebook cell or the sweep has ended. It is completion only with no
# failure at all before it (`_decide`), since a crash gets the same report (Tune logs "Trials did not
# complete" just before it, when it does not raise).
_rule(
    _EXIT_SUMMARY_RULE,
    "completed",
    50,
    ("real ", "real\t", "wall time: ", "for the tuning loop"),
    r"^real[ \t]+\d+m\d+(?:[.,]\d+)?s[ \t]*$|^Wall time: \d+(?:\.\d+)?(?:min \d+)? ?(?:s|ms|µs|us|ns|min)[ \t]*$"
    r"|\bTotal run time: [\d.]+ seconds \([\d.]+ seconds for the tuning loop\)",
    confidence=0.75,
)
_rule(
    _SUMMARY_RULE,
    "completed",
    50,
    (
        "total training time",
        "training time ",
        "training time: ",
        "best validation loss",
        "best model at step",
        "overall test ",
        " best validation ",
        "best valid :",
        "best valid:",
        "final:",
        "training spent: ",
        "_finish",
    ),
    r"(?<!estimated )(?<!remaining )\bTotal training time\b"
    # DETR's main() and the repos built on it (DeiT, MAE, DINO, ...), after the loop: str(timedelta), with
    # its days past 24 hours ("Training time 1 day, 8:12:40"); litgpt's (and its forks') as train() returns
    r"|^Training time (?:\d+ days?, )?\d+:\d\d:\d\d\b|^Training time: \d+(?:\.\d+)?s[ \t]*$"
    r"|^Best Validation Loss \S+ on Epoch \d+"  # DiffDock's train.py (and its forks), after the epoch loop
    # DeepXDE's Model.train() as it returns, also after a run whose losses went NaN
    r"|^Best model at step \d+:"
    # chemprop's run_training / cross_validate, after the epoch loop and over the folds
    r"|^Model \d+ best validation \S+ = \S+ on epoch \d+|^Overall test \S+ = [-\d.e]+ \+/- [-\d.e]+"
    # RecBole's run_recbole, once fit() and evaluate() returned ("best valid : OrderedDict([...])")
    r"|\bbest valid ?: ?(?:OrderedDict\(|\{)"
    # a script's closing scores, numbers only (spaCy's train_ud.py: "Final:\t84.881\t81.538\t96.845")
    r"|^Final:(?:[ \t]+\d+(?:\.\d+)?%?)+[ \t]*$"
    # modelscope's KAN-TTS recipes, as each model's training returns ("SAMBERT training spent: 0.19 hours")
    r"|\btraining spent: \d+(?:\.\d+)? (?:hours|minutes|seconds)\b"
    # ChainerRL's and pfrl's train_agent* once the loop ends, saving under "<step>_finish" (on an
    # exception it saves "<step>_except" and raises)
    r"|\bSaved the agent to \S*\d_finish\b",
    confidence=0.85,
)
_rule(
    "sem-completed",
    "completed",
    50,
    ("done", "finish", "complete", "succeed", "success", "reached max", "exported", "stored", "written", "exit code 0"),
    r"(?:\b(?:training|fine-?tun(?:e|ing)|run|job|experiment|all (?:\d+ )?(?:steps|epochs|iterations))\b[^\n]{0,30}?"
    r"\b(?:done|finished|complete|completed|succeeded|successful(?:ly)?)\b"
    # (not a step before or beside training: XLA's "successfully finished dry run", "... loading")
    r"|\bsuccess(?:fully)?\b[^\n]{0,30}?\b(?:finished|completed|trained|done)\b"
    r"(?! (?:a |the )?(?:dry[ -]?run|warm-?up|compil|load|initiali[sz]|download|prepar|build|setup|tracing|profil))"
    r"|reached max_?(?:steps|epochs|iters?)\b[^\n]{0,60}?\b(?:final|saving|writing|saved|ok|done)"
    r"|\b(?:final|best) (?:model|weights|adapter|checkpoint)s?\b[^\n]{0,30}?\b(?:saved|written|stored|exported)"
    r"|(?:adapter|weights|model) (?:written|exported|stored|saved) to\b[^\n]{0,80}?\b(?:final|done)"
    r"|\bexit(?:ed)? (?:with )?code 0\b)",
    confidence=0.85,
    check=_on_upbeat_line,
    lazy=True,
)
