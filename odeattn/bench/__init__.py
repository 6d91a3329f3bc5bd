"""The bench: every execution path of the block timed side by side, against a plain PyTorch
block and this machine's own float32 matmul peak, both measured in the same run.

A library (the `odeattn bench` command drives it): one module per idea, from the timing harness
(timing) to the paths (paths, baseline), what the libraries allow (peak), memory, scaling,
cached decoding (decode), the JAX first call (compile), the floor under the main job's JAX
compile time (floor), the targets, and their tables and plots. How it measures, and why:
docs/performance-method.md.
"""

from .baseline import plain_torch_block as plain_torch_block
from .compile import (COMPILE_CONFIGS as COMPILE_CONFIGS, bench_compile as bench_compile,
                      compile_result as compile_result, compile_targets as compile_targets)
from .decode import (DECODE_CONTEXTS as DECODE_CONTEXTS, DECODE_RUNTIMES as DECODE_RUNTIMES,
                     DECODE_SHAPE as DECODE_SHAPE, bench_decode as bench_decode, decode_paths as decode_paths,
                     decode_result as decode_result)
from .memory import (MEMORY_RUNTIMES as MEMORY_RUNTIMES, MEMORY_SHAPE as MEMORY_SHAPE, MEMORY_STEPS as MEMORY_STEPS,
                     TARGET_RATIO as TARGET_RATIO, bench_memory as bench_memory, jax_train_program as jax_train_program,
                     live_tensor_bytes_mode as live_tensor_bytes_mode, long_context_table as long_context_table,
                     memory_probe as memory_probe, memory_result as memory_result, memory_table as memory_table,
                     ratios as ratios, run_memory_probe as run_memory_probe, torch_peak_bytes as torch_peak_bytes,
                     torch_train_step as torch_train_step)
from .paths import (LONG_SHAPE as LONG_SHAPE, PATH_SPECS as PATH_SPECS, PATHS as PATHS, SHAPES as SHAPES,
                    TORCH_PLAIN as TORCH_PLAIN, PathSpec as PathSpec, Skip as Skip, flops as flops,
                    onnx_model as onnx_model, path_inputs as path_inputs)
from .peak import (CHAIN_ARGS as CHAIN_ARGS, PEAK_LIBS as PEAK_LIBS, PRODUCT_LIBS as PRODUCT_LIBS,
                   ort_projections as ort_projections, peak_kernels as peak_kernels, product_chain as product_chain,
                   product_kernels as product_kernels, product_operands as product_operands)
from .plot import plot_memory as plot_memory, plot_scaling as plot_scaling
from .run import DEFAULT_REPEATS as DEFAULT_REPEATS, QUICK as QUICK, bench_shape as bench_shape, run_bench as run_bench
from .scaling import SCALING as SCALING, bench_scaling as bench_scaling
from .tables import format_compile as format_compile, format_decode as format_decode, format_memory as format_memory, format_tables as format_tables
from .targets import check_targets as check_targets
from .timing import (Timed as Timed, first_and_warm as first_and_warm, interleave as interleave,
                     interleaved_times as interleaved_times, measure as measure, paired_ratio as paired_ratio,
                     round_medians as round_medians)
