"""The runtime-only worker of the deployment targets' rows: a process that imports NumPy,
safetensors and one target's runtime, and nothing of odeattn or ode_ref, run as

    python target_worker.py FRAMES_PY STANDALONE_PY

the paths of wire/frames.py and export/standalone.py, each loaded by its path alone. It speaks the
external protocol's frames and its onnx consumer's messages (docs/protocol.md), its load request
naming the target and the artifact's inputs and outputs (adapters/targets.py sends them):

    hello {"op": "hello"}                                    ->  a hello_reply (the schema's)
    load  {"op": "load", "model", "target", "inputs", "outputs", "threads"} + model (uint8)
                                                             ->  {"status": "loaded"}
    infer {"op": "infer", "model"} + feed                    ->  {"status": "ran"} + every output
    drop  {"op": "drop", "model"}; exit {"op": "exit"}       (no reply)

After every load and infer it checks that neither odeattn nor ode_ref is among its modules, and
replies an error naming them if one is: a row's every case is then run where only the runtime is.
"""

import importlib.util
import os
import sys

# Python puts this script's folder first on the path, where the suite's own modules would shadow the
# standard library's (profile.py): the worker imports nothing from it.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

FOREIGN = ("odeattn", "ode_ref")  # what the process must not import: the artifact runs alone
MESSAGE_LIMIT = 2000


def _module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def foreign_modules() -> list:
    return sorted(m for m in sys.modules if m.split(".")[0] in FOREIGN)


def error(err: Exception) -> dict:
    """An error reply: the exception's kind and message on one line (a runtime's span several), at
    most MESSAGE_LIMIT characters (the schema's bound on a text is 100000)."""
    text = "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or "no message"
    return {"status": "error", "message": f"{type(err).__name__}: {text}"[:MESSAGE_LIMIT]}


def answer(standalone, models: dict, message: dict, arrays: dict) -> tuple:
    """(reply, arrays) for a hello, load or infer request."""
    op = message["op"]
    if op == "hello":
        return {"protocol": 2, "name": "target-worker", "dtypes": ["float32"], "kinds": ["block"], "consumes": "onnx",
                "onnx": {"opset": 17, "form": "unrolled"},  # the schema's fields; the host reads none of them
                "about": "a deployment target's runtime alone: each load names the target"}, None
    if op == "load":
        models[message["model"]] = standalone.load(message["target"], arrays["model"].tobytes(), message["inputs"],
                                                   message["outputs"], message.get("threads"))
        return {"status": "loaded"}, None
    if op == "infer":
        return {"status": "ran"}, models[message["model"]](arrays)
    return {"status": "error", "message": f"op: expected hello, load, infer, drop or exit; got {op!r}"}, None


def main(frames_path: str, standalone_path: str) -> None:
    frames = _module("frames", frames_path)
    standalone = _module("standalone", standalone_path)
    fd_in, fd_out = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # a runtime's prints go nowhere near the frames,
    os.dup2(quiet, 2)  # nor its logs (ExecuTorch's CPU probe) into the run's: every error is a reply
    models = {}
    while True:
        try:
            message, arrays = frames.read_frame(fd_in)
        except EOFError:
            return
        if message["op"] == "exit":
            return
        if message["op"] == "drop":
            models.pop(message["model"], None)
            continue
        try:
            reply, out = answer(standalone, models, message, arrays)
        except Exception as err:  # the runtime's refusal, or its failure on a feed: the case's error
            reply, out = error(err), None
        loaded = foreign_modules()
        if loaded and message["op"] != "hello":
            models.pop(message.get("model"), None)
            reply, out = {"status": "error", "message": f"the runtime's worker imported {', '.join(loaded)}"}, None
        try:
            frames.write_frame(fd_out, reply, out)
        except (ValueError, TypeError) as err:  # outputs safetensors cannot hold, found before a byte is written
            frames.write_frame(fd_out, error(err))


if __name__ == "__main__":
    main(*sys.argv[1:])
