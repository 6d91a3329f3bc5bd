"""External backends: a program in any language, driven over its standard input and output.

`odeattn conformance --backend exec:"CMD ARGS"` (or a backends file's entry, or an entry point
whose object is an Exec) runs CMD as the backend. An Exec, called in the suite's worker process,
starts the program and returns an adapter (protocol.py) that forwards every call to it; so the
program gets what a Python backend gets: its own worker process (it is that process's child, in
its process group: the run's per-case timeout kills both), fresh inputs per call, the same
reports and exit codes.

The frames are the suite's own workers' (wire/frames.py): an 8-byte header (two little-endian
uint32: the JSON part's length, the payload's), a JSON object, and a safetensors payload or
nothing. The messages are those of conformance/protocol.schema.json, version PROTOCOL (a worker
of an older version in PROTOCOLS is spoken to in its own), and every reply is checked against it:

    hello {"op": "hello", "protocol": 2}  ->  {"protocol", "name", "dtypes", "kinds", "consumes", "onnx"?, "supports"?}
    (the host's newest version; the worker answers its own, 1 or 2; "supports", version 2: the
    configs it runs, adapters/support.py, so that none outside them is built or sent)
    consumes "params" (a native port):
      run   {"op": "run", "kind", "dtype", "config", "prompt"?} + x, padding_mask?, param/<name>
            -> {"status": "ran"} + z1 | trajectory | decode | z (encoder) | logits (lm) | stage/<name>... (stages)
            (lm: x holds the token ids, int64 (batch, seq))
    consumes "onnx" (a runtime; the host exports each case's model, once per case config; the
    stages of f(0, x) are outputs stage_<name> of a model exported with them):
      load  {"op": "load", "model": ID} + model (uint8)  ->  {"status": "loaded"}
      infer {"op": "infer", "model": ID} + feed          ->  {"status": "ran"} + every output
      drop  {"op": "drop", "model": ID}                  (no reply)
    any reply may be {"status": "unsupported" | "error", "message"}
    exit  {"op": "exit"}                                 (no reply)

A worker that prints something else on its stdout, exits mid-frame, announces a frame over the
limits, does not answer the handshake in time, or speaks another version is an ExternalError
naming the backend and what it did: an error for that backend only.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ode_ref.recording import STAGES
from odeattn.export.options import ExportOptions, OptionError

from ode_ref.config import stored_fields
from ..wire import counters
from ..wire.frames import HEADER, decode, encode
from ..wire.lifetime import describe_exit, die_with_parent
from .exported import _ExportedWithEncoder, form_refusal
from .protocol import NotSupported
from .support import check_support

PROTOCOL = 2  # the newest version, which the hello offers
PROTOCOLS = (1, 2)  # the versions a worker may answer with: 2 added the hello reply's "supports"
SCHEMA_PATH = Path(__file__).parents[1] / "protocol.schema.json"  # in conformance/, where docs/protocol.md names it
JS_DIR = Path(__file__).parents[1] / "js"  # the reference workers; `npm ci --prefix` it to install them
HANDSHAKE_TIMEOUT = 60.0  # seconds for the hello reply (ONNX Runtime Web compiles its WebAssembly first)
JSON_LIMIT = 1 << 20  # bytes: a reply's JSON part is a status and maybe a message
PAYLOAD_LIMIT = 1 << 30  # bytes: a reply's arrays; more is refused before it is read


class ExternalError(RuntimeError):
    """An external worker broke the protocol: a malformed or oversized frame, an early exit, no
    handshake, another version. The message names the backend."""


@lru_cache(maxsize=None)
def _validator(message: str):
    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA_PATH.read_text())
    del schema["oneOf"]  # any message; here, the one named
    return Draft202012Validator({**schema, "$ref": f"#/$defs/{message}"})


def check_message(message: dict, definition: str) -> None:
    """ValueError naming the most telling defect if message is not a valid `definition` (one of the
    schema's $defs: hello, hello_reply, run, load, infer, drop, exit, reply)."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator(definition).iter_errors(message))
    if error is not None:
        where = "/".join(map(str, error.path)) or "the message"
        raise ValueError(f"{definition}: {where}: {error.message}")


def _preview(data: bytes) -> str:
    text = data[:40].decode("utf-8", "replace")
    return f"{text!r}{'...' if len(data) > 40 else ''}"


class Channel:
    """The program's process and its two pipes; request() sends a frame and reads the reply."""

    def __init__(self, argv: Sequence[str], label: str, cwd: Optional[str] = None, env: Optional[dict] = None):
        self.label = label
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=None, cwd=cwd, env=env, bufsize=0, preexec_fn=die_with_parent())
        except OSError as err:
            raise ExternalError(f"backend {label}: cannot start {argv[0]!r} ({err.strerror or err})") from None
        self.read_so_far = b""
        self.broken = ""  # the fault that stopped the worker, if one did

    def error(self, what: str) -> ExternalError:
        return ExternalError(f"backend {self.label}: {what}")

    def _exit_status(self) -> str:
        try:
            return describe_exit(self.proc.wait(timeout=5.0))
        except subprocess.TimeoutExpired:
            return "closed its stdout"

    def _read(self, n: int, deadline: float, during: str) -> bytes:
        chunks, fd = [], self.proc.stdout.fileno()
        while n:
            wait = None if deadline == float("inf") else deadline - time.monotonic()
            if (wait is not None and wait <= 0) or not select.select([fd], [], [], wait)[0]:
                raise self.error(f"no reply within {self._timeout:g} s {during}")
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                got = b"".join(chunks)
                raise self.error(f"the worker {self._exit_status()} {during}"
                                 + (f", mid-frame (after {len(self.read_so_far + got)} bytes)" if self.read_so_far or got else ""))
            chunks.append(chunk)
            n -= len(chunk)
        data = b"".join(chunks)
        self.read_so_far += data
        return data

    def _peek(self) -> None:
        """What more of its stdout is already there (up to 64 bytes), for an error's preview."""
        fd = self.proc.stdout.fileno()
        if select.select([fd], [], [], 0.2)[0]:
            self.read_so_far += os.read(fd, 64)

    def send(self, message: dict, arrays: Optional[dict] = None) -> None:
        try:
            self.proc.stdin.write(encode(message, arrays))
        except (BrokenPipeError, ValueError):  # ValueError: stdin already closed
            raise self.error(f"the worker {self._exit_status()} before reading the {message['op']} request") from None

    def request(self, message: dict, arrays: Optional[dict] = None, *, timeout: float = float("inf")):
        """(reply, arrays) for message; the reply checked against the schema's reply (or, for
        hello, hello_reply). timeout: seconds for the whole reply (the run's per-case timeout
        otherwise bounds it, killing this process)."""
        if self.broken:
            raise self.error(f"not run: the worker was stopped after an earlier fault ({self.broken})")
        try:
            return self._request(message, arrays, timeout)
        except ExternalError as err:  # the stream is out of step: nothing more can be read from it
            self.broken = str(err).removeprefix(f"backend {self.label}: ")
            self.proc.kill()
            raise

    def _request(self, message: dict, arrays: Optional[dict], timeout: float):
        op = message["op"]
        during = f"to the {op} request"
        self.send(message, arrays)
        self._timeout, deadline, self.read_so_far = timeout, time.monotonic() + timeout, b""
        n_json, n_payload = HEADER.unpack(self._read(HEADER.size, deadline, during))
        if n_json > JSON_LIMIT or n_payload > PAYLOAD_LIMIT:
            self._peek()
            raise self.error(f"announced a frame of {n_json} + {n_payload} bytes, over the limits ({JSON_LIMIT} and "
                             f"{PAYLOAD_LIMIT}) {during}; its stdout began {_preview(self.read_so_far)} "
                             "(a worker's logs go to its stderr)")
        body = self._read(n_json, deadline, during)
        payload = self._read(n_payload, deadline, during)
        try:
            reply, out = decode(body, payload)
        except Exception as err:  # malformed JSON or safetensors: the worker's fault, named
            raise self.error(f"sent a malformed frame {during} ({type(err).__name__}: {err}); its stdout began "
                             f"{_preview(self.read_so_far)}") from None
        definition = "hello_reply" if op == "hello" else "reply"
        try:
            if not isinstance(reply, dict):
                raise ValueError(f"{definition}: expected a JSON object; got {type(reply).__name__}")
            check_message(reply, definition)
        except ValueError as err:
            raise self.error(f"sent a malformed {definition} {during}: {err}") from None
        return reply, out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"op": "exit"})
                self.proc.stdin.close()
                self.proc.wait(timeout=5.0)
            except (ExternalError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _reply_status(channel: Channel, reply: dict, expected: str) -> None:
    """Nothing for the expected status ('ran' or 'loaded'); NotSupported for 'unsupported' (the
    case is skipped with the worker's message), RuntimeError for 'error' (the case's error),
    ExternalError for any other."""
    status = reply["status"]
    if status == "unsupported":
        message = reply["message"]
        raise NotSupported(message if message.startswith("not supported") else f"not supported: {message}")
    if status == "error":
        raise RuntimeError(reply["message"])
    if status != expected:
        raise channel.error(f"replied {status!r}; expected {expected!r}")


class _External:
    """What both external adapters (ParamsAdapter, OnnxAdapter) share: the channel, the handshake's
    facts. calls: the protocol's run kinds the worker answers (the hello reply's "kinds"), named
    calls here since a kind in the suite is a case's (cases/kinds.py)."""

    def __init__(self, channel: Channel, hello: dict):
        self.channel, self.hello = channel, hello
        self.name, self.dtypes, self.calls = hello["name"], tuple(hello["dtypes"]), tuple(hello["kinds"])
        self.support = hello.get("supports")  # version 2: what it runs (adapters/support.py), checked at the handshake
        for call, method in (("trajectory", "run_trajectory"), ("decode", "run_decode"), ("encoder", "run_encoder"),
                             ("lm", "run_lm")):
            if call not in self.calls:
                setattr(self, method, None)  # absent: those cases are "not supported" (protocol.py)

    def supports(self, config, dtype) -> Optional[str]:
        return None  # beyond its declared support, the worker says so per case ("unsupported"), naming what it lacks

    def close(self) -> None:
        self.channel.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class ParamsAdapter(_External):
    """A native port in another language: it gets the config and the parameters (run). The call
    "stages" (run_stages) is a worker's only if its handshake lists it."""

    def __init__(self, channel: Channel, hello: dict):
        super().__init__(channel, hello)
        if "stages" not in self.calls:
            self.run_stages = None

    def _run(self, call: str, array: Optional[str], config, params, x, padding_mask, dtype, **extra):
        """The reply's array named `array` of a run request for call (its JSON "kind"); with None, all of them."""
        arrays = {"x": x, **{f"param/{k}": v for k, v in params.items()}}
        if padding_mask is not None:
            arrays["padding_mask"] = padding_mask
        message = {"op": "run", "kind": call, "dtype": dtype, "config": stored_fields(config), **extra}
        reply, out = self.channel.request(message, arrays)
        _reply_status(self.channel, reply, "ran")
        if array is None:
            return out
        if array not in out:
            raise self.channel.error(f"replied 'ran' to a {call} request without the array {array!r} "
                                     f"(got {sorted(out) or 'no arrays'})")
        return out[array]

    def run_block(self, config, params, x, padding_mask, dtype):
        return self._run("block", "z1", config, params, x, padding_mask, dtype)

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        return self._run("trajectory", "trajectory", config, params, x, padding_mask, dtype)

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        return self._run("decode", "decode", config, params, x, padding_mask, dtype, prompt=int(prompt))

    def run_encoder(self, config, params, x, padding_mask, dtype):
        return self._run("encoder", "z", config, params, x, padding_mask, dtype)

    def run_lm(self, config, params, ids, attention_mask, dtype):
        return self._run("lm", "logits", config, params, ids, attention_mask, dtype)

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values: the arrays stage/<name> of a stages run (any subset of the
        spec's names, conformance.cases.stages); an array of any other name is the worker's fault."""
        out = self._run("stages", None, config, params, x, padding_mask, dtype)
        stray = sorted(k for k in out if not (k.startswith("stage/") and k.removeprefix("stage/") in STAGES))
        if stray:
            raise self.channel.error(f"replied 'ran' to a stages request with the arrays {stray}; expected stage/<name> "
                                     f"for names among {', '.join(STAGES)}")
        return {k.removeprefix("stage/"): v for k, v in out.items()}


class RemoteRun:
    """A Run (export.decode) over one artifact loaded in the worker: by default an ONNX model's bytes,
    each feed checked against the model's declared inputs here, as a local session's is
    (export.decode.SessionRun), then sent. fields: more of the load request (a target worker's,
    targets.py: the target and the artifact's inputs and outputs); artifact: bytes sent in the
    model's place (a target's own, made from the model, or, with no model, a block artifact's,
    whose feed export.artifact_inputs checks where it is made)."""

    _ids = itertools.count()

    def __init__(self, channel: Channel, model=None, *, artifact: Optional[bytes] = None, fields: Optional[dict] = None):
        from odeattn.export.decode import SessionRun

        self.channel, self.model, self.artifact, self.fields = channel, model, artifact, dict(fields or {})
        if model is None:
            self.check, self.outputs = (lambda feed: feed), list(self.fields["outputs"])
        else:
            local = SessionRun(model)  # the declared inputs and defaults; its session is never built
            self.declared, self.defaults, self.check = local.declared, local.defaults, local.check
            self.outputs = [o.name for o in model.graph.output]
        self.id = f"m{next(self._ids)}"
        self.loaded = False

    def start(self) -> None:
        """Sends the artifact once; NotSupported if the worker's runtime cannot build it."""
        if not self.loaded:
            data = self.model.SerializeToString() if self.artifact is None else self.artifact
            message = {"op": "load", "model": self.id, **self.fields}
            reply, _ = self.channel.request(message, {"model": np.frombuffer(data, np.uint8)})
            _reply_status(self.channel, reply, "loaded")
            self.loaded, self.record = True, counters.artifact(self.fields.get("target", "onnx"), data)

    def __call__(self, feed: dict) -> dict:
        return self.unchecked(self.check(feed))

    def unchecked(self, feed: dict) -> dict:
        self.start()
        counters.ran(self.record)  # this case's file, kept from an earlier case or not, whether or not the run fails
        reply, out = self.channel.request({"op": "infer", "model": self.id}, feed)
        _reply_status(self.channel, reply, "ran")
        missing = [n for n in self.outputs if n not in out]
        if missing:
            raise self.channel.error(f"replied 'ran' to an infer request without the outputs {missing}")
        return out

    def drop(self) -> None:
        """Frees the model in the worker; nothing where the worker has stopped (the error that
        stopped it is the case's, not this)."""
        if self.loaded and not self.channel.broken and self.channel.proc.poll() is None:
            self.channel.send({"op": "drop", "model": self.id})
            self.loaded = False


class RemoteModels:
    """Models loaded in a worker process (RemoteRun), each dropped there once no case needs it: the
    block model when the next case's replaces it, a decode or encoder case's own after the case. A
    form's adapter (exported.py) mixes it in before its form; its _build returns remote(run). A
    subclass whose form has no run_decode or run_encoder has none here either (protocol.py: the
    method absent, those cases are not supported)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        after = cls.__mro__[cls.__mro__.index(RemoteModels) + 1:]  # the form, once a class has one (its run_block)
        for method in ("run_decode", "run_encoder"):
            if (method not in vars(cls) and any("run_block" in vars(base) for base in after)
                    and not any(method in vars(base) for base in after)):
                setattr(cls, method, None)

    @property
    def _live(self) -> list:
        """The runs loaded in the worker, in the order they were started."""
        return self.__dict__.setdefault("_live_runs", [])

    def remote(self, run: RemoteRun) -> RemoteRun:
        """run, started (its model sent) and kept until dropped."""
        run.start()
        self._live.append(run)
        return run

    def _runnable(self, config, params, padding_mask, dtype, stages: bool = False):
        before = self._built[1]
        built = super()._runnable(config, params, padding_mask, dtype, stages)
        if before is not None and before is not built:
            self._drop([before[1]])
        return built

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        return self._once(super().run_decode, config, params, x, padding_mask, prompt, dtype)

    def run_encoder(self, config, params, x, padding_mask, dtype):
        return self._once(super().run_encoder, config, params, x, padding_mask, dtype)

    def _once(self, run, *args):
        """run(*args), then drop the models it loaded: a decode or encoder case's own."""
        mark = len(self._live)
        try:
            return run(*args)
        finally:
            self._drop(self._live[mark:])

    def _drop(self, runs) -> None:
        for run in list(runs):
            run.drop()
            self._live.remove(run)


class OnnxAdapter(_External, RemoteModels, _ExportedWithEncoder):
    """A runtime that runs the exported models: the ONNX Runtime adapters' export and feeds
    (exported._ExportedWithEncoder), every model loaded and run in the worker (RemoteRun,
    RemoteModels), of the opset and form its handshake names (options)."""

    def __init__(self, channel: Channel, hello: dict):
        try:  # the form the handshake names, checked by the export's own rules: a refusal is the worker's fault
            self.options = ExportOptions(opset=hello["onnx"]["opset"], steps_input=hello["onnx"]["form"] == "loop")
        except OptionError as err:
            raise channel.error(f"sent a hello_reply to the hello request whose onnx form the export does not make: "
                                f"{err}") from None
        super().__init__(channel, hello)
        if "trajectory" not in self.calls:
            self.run_func = None

    def supports(self, config, dtype) -> Optional[str]:
        return form_refusal(self.options, config) or _External.supports(self, config, dtype)  # the form's, then the worker's

    def _build(self, model):
        return self.remote(RemoteRun(self.channel, model))


@dataclass(frozen=True)
class Exec:
    """An external backend: the program `command` (a string, split as a shell would, or a list),
    started in `cwd`. Calling it (what the suite's worker does) starts the program, checks its
    handshake and returns its adapter. The object is what an entry point or a 'module:object'
    reference names; `--backend exec:CMD` and a backends file make one."""

    command: "str | Sequence[str]"
    cwd: Optional[str] = None
    handshake_timeout: float = HANDSHAKE_TIMEOUT

    @property
    def argv(self) -> list:
        argv = shlex.split(self.command) if isinstance(self.command, str) else list(self.command)
        if not argv:
            raise ValueError("backend exec: expected a command; got an empty one")
        return argv

    def __call__(self):
        argv = self.argv
        channel = Channel(argv, f"exec:{shlex.join(argv)}", self.cwd)
        try:
            hello, _ = channel.request({"op": "hello", "protocol": PROTOCOL}, timeout=self.handshake_timeout)
            if hello["protocol"] not in PROTOCOLS:
                raise channel.error(f"speaks protocol version {hello['protocol']}; this odeattn speaks "
                                    f"{' or '.join(map(str, PROTOCOLS))}")
            try:
                check_support(hello.get("supports"), "hello_reply: supports")
            except ValueError as err:
                raise channel.error(f"sent a malformed hello_reply to the hello request: {err}") from None
            adapter = (OnnxAdapter if hello["consumes"] == "onnx" else ParamsAdapter)(channel, hello)
        except BaseException:
            channel.proc.kill()
            channel.proc.wait()
            raise
        channel.label = hello["name"]
        return adapter


def from_reference(reference: str) -> Exec:
    """The Exec of an 'exec:CMD ARGS' reference, or of a backends file's entry ('exec:' and the
    JSON object {"command", "cwd", "start_timeout"?}: load_backends_file)."""
    command = reference[len("exec:"):].strip()
    if not command:
        raise ValueError("backend: expected a command after 'exec:'; got none")
    if command.startswith("{"):
        entry = json.loads(command)
        if "start_timeout" in entry:
            check_start_timeout(entry["start_timeout"], f"backend {reference}: start_timeout")
        return Exec(entry["command"], entry["cwd"], entry.get("start_timeout", HANDSHAKE_TIMEOUT))
    try:
        shlex.split(command)
    except ValueError as err:
        raise ValueError(f"backend {reference}: cannot split the command ({err})") from None
    return Exec(command)


# The reference workers in JavaScript (js/), on Node.js: ONNX Runtime's two JavaScript builds.
onnxruntime_node = Exec(["node", str(JS_DIR / "ort.mjs"), "node"])
onnxruntime_web = Exec(["node", str(JS_DIR / "ort.mjs"), "web"])
NPM_INSTALL = "npm ci --prefix conformance/js"  # the one command (from a checkout) that installs them


def missing_js(packages: Sequence[str]) -> list:
    """What a JavaScript worker lacks: node on PATH, or npm packages not installed in js/."""
    missing = [] if shutil.which("node") else ["node (Node.js 20 or later)"]
    missing += [f"the npm package {p} ({NPM_INSTALL})" for p in packages
                if not (JS_DIR / "node_modules" / p / "package.json").is_file()]
    return missing


def start_timeout(reference: str) -> float | None:
    """A backends file entry's "start_timeout" from its reference (load_backends_file), else None."""
    command = reference[len("exec:"):].strip() if reference.startswith("exec:") else ""
    return json.loads(command).get("start_timeout") if command.startswith("{") else None


MAX_START_TIMEOUT = 86400.0  # a day; select() overflows on timeouts of about 1e10 s


def check_start_timeout(value, field: str) -> None:
    """A start_timeout must be a number of seconds in (0, MAX_START_TIMEOUT]; ValueError naming field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_START_TIMEOUT:
        raise ValueError(f"{field}: expected a number of seconds > 0 and <= {MAX_START_TIMEOUT:g}; got {value!r}")


def load_backends_file(path: str) -> dict:
    """name -> Exec reference from a backends file: JSON {"backends": {NAME: {"exec": CMD,
    "cwd": DIR?, "start_timeout": S?}}}, cwd relative to the file's folder (its folder by
    default), start_timeout the seconds its program may take to start and answer the hello (by
    default HANDSHAKE_TIMEOUT for the hello, within the run's --timeout for the whole start), which
    then bounds both. ValueError naming the field otherwise."""
    where = Path(path)
    try:
        data = json.loads(where.read_text())
    except OSError as err:
        raise ValueError(f"external: cannot read {path!r} ({err.strerror or err})") from None
    except ValueError as err:
        raise ValueError(f"external: {path!r} is not JSON ({err})") from None
    entries = data.get("backends") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"external: expected {{\"backends\": {{NAME: {{\"exec\": CMD}}}}}} in {path!r}")
    out = {}
    for name, entry in entries.items():
        fields = {"exec", "cwd", "start_timeout"}
        if not isinstance(entry, dict) or not isinstance(entry.get("exec"), str) or set(entry) - fields:
            raise ValueError(f"external: backends.{name}: expected {{\"exec\": CMD, \"cwd\": DIR (optional), "
                             f"\"start_timeout\": SECONDS (optional)}}; got {entry!r}")
        start = entry.get("start_timeout")
        if "start_timeout" in entry:
            check_start_timeout(start, f"external: backends.{name}.start_timeout")
        try:
            if not shlex.split(entry["exec"]):
                raise ValueError("an empty command")
        except ValueError as err:
            raise ValueError(f"external: backends.{name}.exec: cannot split {entry['exec']!r} ({err})") from None
        cwd = (where.parent / entry.get("cwd", ".")).resolve()
        if not cwd.is_dir():
            raise ValueError(f"external: backends.{name}.cwd: expected a folder; got {str(cwd)!r}")
        reference = {"command": entry["exec"], "cwd": str(cwd), **({} if start is None else {"start_timeout": start})}
        out[name] = "exec:" + json.dumps(reference)
    return out
