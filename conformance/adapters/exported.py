"""The adapters that run the exported ONNX models: ONNX Runtime in its forms, and ONNX's own
reference evaluator. Each exports a case's block (odeattn.export) once per case config and runs
it; a subclass supplies _build, the runnable of a model (external.py's runs it in another
process, in another language; targets.py's in a process with its runtime alone).

A form has the methods of the models it has: every form the block model's (_ExportedAdapter);
those with the prefill and decode-step models run_decode too (_ExportedWithDecode), and those
with the encoder stack's run_encoder (_EncoderStack; _ExportedWithEncoder has all three). A form without them has no such
method, so its decode or encoder cases are reported "not supported".
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ode_ref.encoder import check_encoder_input
from ode_ref.precision import HALF_DTYPES
from odeattn.export.options import ExportOptions, loop_refusal  # no onnx: the options name a form before any export

from ..cases import decode_loop
from ..wire.counters import compiling
from .protocol import NotSupported

FLOAT32_ONLY = "not supported: the {what} is exported in float32 only (export.half covers the block model)"


def _threads():
    """Intra-op threads: the conformance worker's share of the cores, if it set one."""
    return int(os.environ.get("ODEATTN_WORKER_THREADS", "0")) or None


def form_refusal(options: ExportOptions, config):
    """Why a block of config has no model in the form options name (export.block.loop_refusal), or None."""
    reason = loop_refusal(options, config)
    return None if reason is None else f"not supported: {reason}"


class _ExportedAdapter:
    """The block exported in the case's dtype: float32, or for an adapter that lists them a half
    dtype (export_model's dtype; run_* then receive and return arrays of it). options names the
    form (export.options): its opset, BitLinear's products, the Loop form (its steps fed at run
    time, fed_steps); each case's model is options.for_case, the prefill and decode-step models
    options with their graph."""

    dtypes = ("float32",)
    options = ExportOptions()
    variant = None  # a variant of the spec's SelfAttention (ode_ref.variants) exported in the spec's place
    diagnostics = True  # each case's block model with the outputs f0 and step_k (run_func, run_trajectory)
    _built = (None, None)  # (key, runnable): the last exported block model

    def supports(self, config, dtype):
        return form_refusal(self.options, config)

    def _build(self, model):
        """A runnable: feed (name -> array) -> name -> array, for every output of model."""
        raise NotImplementedError

    def _runnable(self, config, params, padding_mask, dtype, stages: bool = False):
        """(model, runnable) of the block exported with the diagnostic outputs where self.diagnostics
        (f0, the steps) and, with stages, the stage values of f(0, x), the last one kept for the next case."""
        digest = hashlib.sha256()
        for k in sorted(params):
            digest.update(k.encode() + np.ascontiguousarray(params[k], np.float32).tobytes())
        key = (config, padding_mask is not None, digest.hexdigest(), dtype, stages)
        if self._built[0] != key:
            from odeattn.export.block import export_model

            options = self.options.for_case(padding_mask=padding_mask is not None, dtype=dtype, stages=stages,
                                            diagnostics=self.diagnostics)
            with compiling("exports"):
                model = export_model(config, params, options, attention=self._attention(config))
            self._built = (key, (model, self._session(model)))
        return self._built[1]

    def _attention(self, config):
        return None if self.variant is None else self.variant(config)

    def _session(self, model):
        """_build(model), timed and counted as a session built (conformance.wire.counters)."""
        with compiling("sessions"):
            return self._build(model)

    def _outputs(self, config, params, x, padding_mask, dtype, stages: bool = False) -> dict:
        from odeattn.export.runtime import make_feed

        model, runnable = self._runnable(config, params, padding_mask, dtype, stages)
        return runnable(make_feed(model, x, padding_mask, self.fed_steps(config) if self.options.steps_input else None))

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (conformance.cases.stages) from the diagnostic export's stage outputs
        (export_model(..., stages=True): the export's own attention, recording)."""
        out = self._outputs(config, params, x, padding_mask, dtype, stages=True)
        return {k.removeprefix("stage_"): v for k, v in out.items() if k.startswith("stage_")}

    def fed_steps(self, config) -> int:
        """The Loop form's steps input for a case of this config."""
        return config.ode_steps

    def run_func(self, config, params, t, x, padding_mask, dtype):
        return self._outputs(config, params, x, padding_mask, dtype)["f0"]

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        """x, then the state after each step: the unrolled form's outputs step_k, or the Loop
        form's scan output `trajectory`."""
        out = self._outputs(config, params, x, padding_mask, dtype)
        if self.options.steps_input:
            return np.concatenate([x[None], out["trajectory"]])
        return np.stack([x] + [out[f"step_{k}"] for k in range(1, config.ode_steps + 1)])

    def run_block(self, config, params, x, padding_mask, dtype):
        return self._outputs(config, params, x, padding_mask, dtype)["z"]


class _ExportedWithDecode(_ExportedAdapter):
    """The block model, and the prefill and decode-step models for the decode cases."""

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        """The exported prefill model on the prompt, then the decode-step model per token, each
        step's present cache fed back as the next past (export.decode.OnnxDecoder)."""
        from odeattn.export.block import export_model
        from odeattn.export.decode import OnnxDecoder

        if dtype in HALF_DTYPES:
            raise NotSupported(FLOAT32_ONLY.format(what="prefill and decode-step models"))

        with compiling("exports"):
            prefill = export_model(config, params, self._cached("prefill"), attention=self._attention(config))
        with compiling("exports"):
            step = export_model(config, params, self._cached("decode_step"), attention=self._attention(config))
        decoder = OnnxDecoder(config, self._session(prefill), self._session(step))
        return decode_loop(decoder.prefill, decoder.decode_step, x, padding_mask, prompt)

    def _cached(self, graph: str) -> ExportOptions:
        """The prefill or decode-step model's options: the form's opset, every other field the cached
        models' own, as they have one form (a Loop-form runtime of external.py runs them unrolled)."""
        return ExportOptions(graph=graph, opset=self.options.opset)


class _EncoderStack:
    """The encoder stack's model for the encoder cases, beside a form's block model."""

    def run_encoder(self, config, params, x, padding_mask, dtype):
        """The stack exported (export.encoder) and run by this adapter's runnable, after the spec's
        input checks (as export.encoder.run_encoder_model)."""
        from odeattn.export.encoder import export_encoder_model
        from odeattn.export.runtime import make_feed

        check_encoder_input(x, config, padding_mask)
        with compiling("exports"):
            model = export_encoder_model(config, params, padding_mask=padding_mask is not None)
        return self._session(model)(make_feed(model, x, padding_mask))["z"]


class _ExportedWithEncoder(_EncoderStack, _ExportedWithDecode):
    """The block, prefill and decode-step models, and the encoder stack for the encoder cases."""


class _OnnxRuntimeSessions(_ExportedAdapter):
    """Each model run by an ONNX Runtime session on the worker's share of the cores."""

    half_rows = HALF_DTYPES  # what a form can run: ONNX Runtime's CPU kernels run both half exports

    def _build(self, model):
        from odeattn.export.decode import session_runner

        return session_runner(model, threads=_threads())


class OnnxRuntimeAdapter(_ExportedWithEncoder, _OnnxRuntimeSessions):
    name = "onnxruntime"
    # ONNX Runtime's CPU kernels run both half exports (their Casts; float32 between): run_* take
    # and return HALF_DTYPES arrays. The other ONNX Runtime rows run float32 only (half_rows: what they can
    # run), so the main job exports each half case once, here.
    dtypes = ("float32", *HALF_DTYPES)

    def run_encoder(self, config, params, x, padding_mask, dtype):
        if dtype in HALF_DTYPES:
            raise NotSupported(FLOAT32_ONLY.format(what="encoder stack"))
        return super().run_encoder(config, params, x, padding_mask, dtype)


class OnnxRuntimeOpset23Adapter(_OnnxRuntimeSessions):
    """The block model at opset 23; no decode or encoder cases: the prefill and decode-step
    models, and the encoder's, are opset 17."""

    name = "onnxruntime-opset23"
    dtypes = ("float32",)
    options = ExportOptions(opset=23)


class OnnxRuntimeIntegerAdapter(_OnnxRuntimeSessions):
    """BitLinear blocks exported with bitlinear="integer": every projection an exact integer product
    (MatMulInteger) times one float scale per token. A float block has no such products: skipped.
    No decode or encoder cases: the prefill and decode-step models have the float form only, and
    the encoder has no BitLinear."""

    name = "onnxruntime-integer"
    dtypes = ("float32",)
    options = ExportOptions(bitlinear="integer")

    def supports(self, config, dtype):
        return None if config.use_bitnet else "not supported: a float block (integer BitLinear applies to use_bitnet)"


class OnnxRuntimeLoopAdapter(_OnnxRuntimeSessions):
    """The Loop form (export_model(..., steps_input=True)): each block case's file, its steps
    passed as the runtime input `steps`; the state after each step is the Loop's scan output
    `trajectory`. The prefill and decode-step models keep a fixed step count: no decode cases;
    the encoder's blocks step once: no encoder cases."""

    name = "onnxruntime-loop"
    dtypes = ("float32",)
    options = ExportOptions(steps_input=True)



def other_steps(steps: int) -> int:
    """The count onnxruntime-loop-other-steps feeds a file whose default is `steps`: half of it
    (rounded down) above 4 steps, one more up to 4."""
    return steps // 2 if steps > 4 else steps + 1


class OnnxRuntimeLoopOtherStepsAdapter(OnnxRuntimeLoopAdapter):
    """The Loop form's file of each block case (its default: the case's steps) fed another step
    count, other_steps(case steps); the runner checks it against the spec at that count, computed
    from ode_ref in the run (cases.at_steps; reference_steps), since no golden file holds it."""

    name = "onnxruntime-loop-other-steps"
    half_rows = ()  # its reference is the spec at another step count, computed in the run in float64 only
    # A built-in's reference_steps(steps): the step count its outputs for a block case of `steps`
    # are judged at (the runner builds that reference, cases.at_steps; none: the case's own).
    reference_steps = staticmethod(other_steps)

    def fed_steps(self, config) -> int:
        return other_steps(config.ode_steps)


class OnnxReferenceAdapter(_ExportedWithDecode):
    name = "onnx-reference"

    def _build(self, model):
        from onnx.reference import ReferenceEvaluator

        ref, names = ReferenceEvaluator(model), [o.name for o in model.graph.output]

        def run(feed):
            with np.errstate(divide="ignore"):  # the norms' Log(max|x|) of a zero (padded) token is -inf by design
                return dict(zip(names, ref.run(None, feed)))

        return run
