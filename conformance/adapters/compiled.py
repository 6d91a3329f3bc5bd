"""The torch port compiled ahead of time, as backends: each case's block exported by torch.export
with dynamic batch and sequence, then compiled into an AOTInductor package (aoti) or lowered to
an ExecuTorch program (executorch), or converted by litert-torch at the case's shape into a LiteRT
model (litert) (export/aoti_program.py, export/executorch_program.py, export/litert_program.py),
then loaded and called by its runtime in the row's runtime-only worker (targets.py). Each returns
z(1) only, so a block case is judged at z1; none has cached decoding, a backward pass, the encoder
or the language model."""

from __future__ import annotations

from .targets import BlockTarget


# a case's build takes 9 s to about 3 min on 2 cores, growing with the evaluations of f (rk4 x 8
# steps with BitLinear, 32 of them, the longest of the golden set)
CASE_TIMEOUT = 600.0


class AotiAdapter(BlockTarget):
    name = target = "aoti"
    dtypes = ("float32", "float64")
    case_timeout = CASE_TIMEOUT
    compiler = True  # Inductor builds each package with the machine's C++ compiler

    def supports(self, config, dtype):
        return None

    def run_block(self, config, params, x, padding_mask, dtype):
        from odeattn.export.aoti_program import export_aoti_block

        package = export_aoti_block(config, params, dtype=dtype, padding_mask=padding_mask is not None)
        return self.call(package, config, x, padding_mask, dtype)


class ExecuTorchAdapter(BlockTarget):
    name = target = "executorch"
    dtypes = ("float32",)
    case_timeout = CASE_TIMEOUT

    def supports(self, config, dtype):
        return None

    def run_block(self, config, params, x, padding_mask, dtype):
        from odeattn.export.executorch_program import MAX_BATCH, MAX_SEQ, export_executorch_block

        # the default bounds, raised to the case's shape where it is larger
        program = export_executorch_block(config, params, padding_mask=padding_mask is not None,
                                          max_batch=max(MAX_BATCH, x.shape[0]), max_seq=max(MAX_SEQ, x.shape[1]))
        return self.call(program, config, x, padding_mask, dtype)


class LiteRtAdapter(BlockTarget):
    name = target = "litert"
    dtypes = ("float32",)
    case_timeout = CASE_TIMEOUT
    imports = ("torch",)  # litert-torch's own import is noisy (TensorFlow's and torchao's logs): made quietly below

    def __init__(self):
        from odeattn.export.litert_program import import_quietly

        super().__init__()  # the worker first: the import below starts threads (targets.TargetRow)
        import_quietly()

    def supports(self, config, dtype):
        """None, or why LiteRT cannot hold the config (litert_program.check_config: float64 or int64 tables)."""
        from ode_ref.config import ODEConfig
        from odeattn.export.litert_program import check_config

        if not isinstance(config, ODEConfig):  # an encoder's or a language model's: no run_encoder, no run_lm
            return None
        try:
            check_config(config)
        except ValueError as err:
            return f"not supported: {err}"
        return None

    def run_block(self, config, params, x, padding_mask, dtype):
        from odeattn.export.litert_program import export_litert_block

        model = export_litert_block(config, params, batch=x.shape[0], seq=x.shape[1], padding_mask=padding_mask is not None)
        return self.call(model, config, x, padding_mask, dtype)
