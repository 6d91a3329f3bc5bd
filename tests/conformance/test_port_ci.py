"""The suite in a port's CI: an expectations file, --list and --shard, the failures' triage (the
settings they share, the stage of f), and the compliance matrix joining JSON reports."""

import json
import re
import sys

import pytest

from odeattn.cli import main
from odeattn.conformance.golden import load_cases
from odeattn.conformance.running import expectations, shards
from odeattn.conformance.running.matrix import load_report, markdown, to_html

PORT = '''
from odeattn.conformance.adapters import SpecAdapter

class Port(SpecAdapter):
    """The spec, with a planted RoPE bug: f and q 0.1% and 1% off wherever the rotation acts."""
    name = "port"
    bug = True

    def off(self, config):
        return self.bug and config.ode_use_pe and config.positional_encoding == "rope"

    def run_func(self, config, params, t, x, padding_mask, dtype):
        f = super().run_func(config, params, t, x, padding_mask, dtype)
        return f * 1.001 if self.off(config) else f

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        z = super().run_trajectory(config, params, x, padding_mask, dtype)
        if self.off(config):
            z[1:] *= 1.001
        return z

    def run_stages(self, config, params, x, padding_mask, dtype):
        stages = dict(super().run_stages(config, params, x, padding_mask, dtype))
        if self.off(config):
            stages["q"] = stages["q"] * 1.01
        return stages

class Fixed(Port):
    bug = False
'''

EXPECTED = {"odeattn_expectations": 1, "expectations": [
    {"backend": "port", "config": {"positional_encoding": "rope"}, "mode": "xfail",  # the encoding in effect
     "reason": "RoPE is wrong", "link": "https://example.org/port/issues/1"},
    {"backend": "port", "dtype": "float64", "case": "^decode_", "mode": "skip", "reason": "no cache yet"},
    {"backend": "port", "kind": "encoder", "mode": "xfail", "reason": "selects nothing here"},
    {"backend": "prot", "mode": "skip", "reason": "a typo"}]}

# Nine rope block cases, a block case without an encoding, and a decode case with RoPE
SELECTION = ["-k", "_positions-rope$", "-k", "^block_derf_euler_encoder_float_nopad_s1_b2t5h2d8$", "-k", "^decode_rk4_layer_norm_rope_pad$"]


@pytest.fixture
def port(tmp_path, monkeypatch):
    """tmp_path as the working folder, holding the port's module and its expectations file."""
    (tmp_path / "myport.py").write_text(PORT)
    (tmp_path / "expected.json").write_text(json.dumps(EXPECTED))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command adds the working folder
    return tmp_path


def _run(*args) -> tuple[int, dict]:
    code = main(["conformance", "-j", "1", *SELECTION, "--json", "r.json", "--force", *args])
    return code, json.loads(open("r.json").read())


def test_expectations_xfail_strictly_and_skip_what_must_not_run(port, capsys):
    code, report = _run("--backend", "myport:Port", "--expectations", "expected.json")
    statuses = {r["case"]: (r["status"], r["message"]) for r in report["results"]}
    assert code == 0, capsys.readouterr()
    assert statuses["decode_rk4_layer_norm_rope_pad"] == ("skipped", "not run: expected.json: expectations[1] (no cache yet)")
    xfailed = [c for c, (s, _) in statuses.items() if s == "xfailed"]
    assert len(xfailed) == 9 and all(c.endswith("_positions-rope") for c in xfailed)
    assert "(expected: expected.json: expectations[0] (RoPE is wrong; https://example.org/port/issues/1))" in statuses[xfailed[0]][1]
    assert statuses["block_derf_euler_encoder_float_nopad_s1_b2t5h2d8"][0] == "passed"
    assert report["warnings"] == ["expected.json: expectations[2] (selects nothing here): selected nothing in this run",
                                  "expected.json: expectations[3] (a typo): names the backend 'prot', which no backend of "
                                  "this run reports; did you mean 'port'?"]

    capsys.readouterr()
    code = main(["conformance", "-j", "1", "--backend", "myport:Port", "--expectations", "expected.json",
                 "-k", "^decode_rk4_layer_norm_rope_pad$"])  # nothing judged is not a pass, and says why
    assert code == 1 and "myport:Port: ran no case: the expectations file skips every selected case" in capsys.readouterr().out

    code, report = _run("--backend", "myport:Fixed", "--expectations", "expected.json")  # the bug fixed: strict
    xpassed = [r for r in report["results"] if r["status"] == "xpassed"]
    assert code == 1 and len(xpassed) == 9
    assert xpassed[0]["message"] == ("unexpected pass: expected.json: expectations[0] (RoPE is wrong; "
                                     "https://example.org/port/issues/1) expects it to fail")


def test_a_failure_group_names_its_shared_settings_and_its_stage(port, capsys):
    code, report = _run("--backend", "myport:Port")
    (group,) = [g for g in report["failure_groups"] if g["divergence"] == "f0"]
    assert code == 1 and len(group["cases"]) == 9
    assert "ode_use_pe=True (9 of the 10 cases run with it fail)" in group["shared_settings"]  # the decode case passes
    assert group["stage"]["stage"] == "q" and group["stage"]["agree"] == ["norm"]
    out = capsys.readouterr().out
    assert "    every one has: " in out and "ode_use_pe=True (9 of the 10 cases run with it fail)" in out
    assert f"    stages of {group['cases'][0]}: first divergent stage of f(0, x): q, q after preprocess_qkv (norm agree)" in out


@pytest.mark.parametrize("entry, message", [
    ({"mode": "xfial", "reason": "r"}, "expectations[0].mode: expected one of xfail, skip; got 'xfial'"),
    ({"mode": "skip"}, "expectations[0].reason: expected a non-empty string"),
    ({"mode": "skip", "reason": "r", "dtype": "float8"}, "expectations[0].dtype: expected one of float32, float64, bfloat16, float16"),
    ({"mode": "skip", "reason": "r", "case": "("}, "expectations[0].case: invalid regular expression '('"),
    ({"mode": "skip", "reason": "r", "config": {"rope_bse": 1}}, "expectations[0].config.rope_bse: expected a field of the "
     "block's or the encoder's config; got 'rope_bse'; did you mean 'rope_base'?"),
    ({"mode": "skip", "reason": "r", "config": {"ode_steps": "2"}}, "expectations[0].config.ode_steps: expected a int"),
    ({"mode": "skip", "reason": "r", "backends": "x"}, "expectations[0]: expected the fields backend, case, config, dtype, "
     "kind, link, mode, reason; got the unknown 'backends'; did you mean 'backend'?"),
])
def test_a_bad_expectations_file_is_refused_naming_the_field(tmp_path, entry, message):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"odeattn_expectations": 1, "expectations": [entry]}))
    with pytest.raises(ValueError) as err:
        expectations.load([path])
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)


def test_a_bad_expectations_file_is_one_line_and_exit_2_before_any_case(tmp_path, capsys):
    (tmp_path / "e.json").write_text(json.dumps({"odeattn_expectations": 2, "expectations": []}))
    assert main(["conformance", "--backend", "spec", "--expectations", str(tmp_path / "e.json")]) == 2
    err = capsys.readouterr().err
    assert err == (f"odeattn conformance: {tmp_path / 'e.json'}: odeattn_expectations: expected the format version 1; got 2\n")


def test_the_measured_times_name_the_packaged_cases():
    """case_seconds.json (benchmarks/case_seconds.py) holds every packaged case and no other: a
    case added or renamed without a new measurement would weigh the median."""
    assert set(shards.measured_seconds()) == {c.name for c in load_cases()}


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_hold_every_case_once_and_near_equal_measured_time(count):
    cases = load_cases()
    parts = shards.parts(cases, count)
    names = [c.name for part in parts for c in part]
    assert sorted(names) == sorted(c.name for c in cases)
    weight = shards.weights(cases)
    loads = [sum(weight[c.name] for c in part) for part in parts]
    assert max(loads) <= sum(loads) / count + max(weight.values())  # the greedy rule's bound


def test_list_prints_the_shards_cases_and_runs_nothing(capsys):
    assert main(["conformance", "--list", "-k", "^block_"]) == 0
    every = capsys.readouterr().out.split()
    halves = []
    for i in (1, 2):
        assert main(["conformance", "--list", "-k", "^block_", "--shard", f"{i}/2"]) == 0
        out = capsys.readouterr()
        halves.append(out.out.split())
        assert out.err.startswith(f"shard {i}/2: {len(halves[-1])} of {len(every)} cases, ")
    assert sorted(halves[0] + halves[1]) == sorted(every) and not set(halves[0]) & set(halves[1])
    assert main(["conformance", "--list", "-k", "^block_t1_h1_decoder_bitnet$", "--shard", "1/2"]) == 2
    assert capsys.readouterr().err == ("odeattn conformance: --shard: expected at most as many parts as the 1 selected "
                                       "cases; got 2 parts\n")  # a part would judge nothing
    assert main(["conformance", "--list", "--shard", "3/2"]) == 2
    assert capsys.readouterr().err == "odeattn conformance: --shard: expected I/N with 1 <= I <= N (the I-th of N parts, e.g. 1/2); got '3/2'\n"


def test_the_matrix_joins_reports_and_states_what_conforms(port, capsys):
    shards_run = [main(["conformance", "-j", "1", "--backend", "spec", "-k", "^block_derf", "--shard", f"{i}/2",
                        "--json", f"spec{i}.json"]) for i in (1, 2)]
    assert shards_run == [0, 0]
    assert main(["conformance", "-j", "1", "--backend", "myport:Port", *SELECTION, "--json", "port.json"]) == 1
    capsys.readouterr()
    reports = [load_report(f) for f in ("spec1.json", "spec2.json", "port.json")]  # named as given
    text = markdown(reports)
    digest = reports[0]["digest"]
    spec_cases = len([c for c in load_cases() if c.name.startswith("block_derf")])
    total = len(load_cases())
    assert f"odeattn suite {digest} ({total} cases): 0 of 2 columns conform on every case (none)." in text
    assert "| spec/float64 | " in text and f"| spec1.json, spec2.json | {spec_cases} | 0 | 0 | 0 | 0 | incomplete ({spec_cases} of {total}" in text
    assert "| port/float64 |" in text and "| fails (9 cases) |" in text
    assert "| `block_derf_euler_encoder_float_nopad_s1_b2t5h2d8_positions-rope` | ✓ | ✗ |" in text
    assert "<title>odeattn conformance matrix</title>" in to_html(reports)

    assert main(["conformance", "matrix", "spec1.json", "port.json", "--html", "m.html", "--markdown", "m.md"]) == 0
    assert (port / "m.md").read_text() == markdown(reports[::2])

    assert main(["conformance", "matrix", "spec1.json", "spec1.json"]) == 2
    assert "reports: spec1.json and spec1.json are the same report; expected each once" in capsys.readouterr().err
    again = json.loads((port / "spec1.json").read_text())
    again["results"][0]["status"] = "failed"  # the same shard run again, its answer changed: which one counts?
    (port / "again.json").write_text(json.dumps(again))
    assert main(["conformance", "matrix", "spec1.json", "again.json"]) == 2
    assert f"reports: {again['results'][0]['case']} on spec/float64 is in both spec1.json and again.json" in capsys.readouterr().err
    other = dict(json.loads((port / "spec1.json").read_text()), digest="0" * 64)
    (port / "other.json").write_text(json.dumps(other))
    assert main(["conformance", "matrix", "spec1.json", "other.json"]) == 2
    assert "reports: expected reports of one suite (one golden digest); got 2: spec1.json" in capsys.readouterr().err


def _port_module(folder):
    namespace = {}
    exec(compile(PORT, str(folder / "myport.py"), "exec"), namespace)
    return namespace


def test_the_fuzzer_counts_an_xfail_region_and_runs_no_skip_region(tmp_path):
    from odeattn.conformance.fuzzing.fuzz import fuzz

    port = _port_module(tmp_path)
    rope = {"backend": "port", "config": {"ode_use_pe": True, "positional_encoding": "rope"}, "reason": "RoPE is wrong"}
    (tmp_path / "x.json").write_text(json.dumps({"odeattn_expectations": 1, "expectations": [{**rope, "mode": "xfail"}]}))
    (tmp_path / "s.json").write_text(json.dumps({"odeattn_expectations": 1, "expectations": [{**rope, "mode": "skip"}]}))
    xfail, skip = expectations.load([tmp_path / "x.json"]), expectations.load([tmp_path / "s.json"])

    run = fuzz(port["Port"](), "float64", examples=30, expectations=xfail)
    ((label, (failed, passed)),) = run.expected.items()
    assert run.finding is None and failed > 0 and not run.failed  # the bug's region holds only expected failures
    run = fuzz(port["Fixed"](), "float64", examples=30, expectations=xfail)
    assert run.unexpected == [label] and run.expected[label][0] == 0 and run.failed  # strict: the fix is noticed
    run = fuzz(port["Port"](), "float64", examples=30, expectations=skip)
    assert run.finding is None and run.refusals.get(f"not run: {tmp_path / 's.json'}: expectations[0] (RoPE is wrong)", 0) > 0


def test_the_plugin_takes_the_expectations_file_and_a_shard(port, capsys):
    import subprocess

    script = __import__("pathlib").Path(sys.executable).with_name("pytest")
    if not script.exists():
        pytest.skip(f"no pytest script beside {sys.executable}")
    outcomes = []
    for i in (1, 2):
        done = subprocess.run([str(script), "-p", "no:cacheprovider", "-q", "-rA", "--odeattn-backend", "myport:Port",
                               "--odeattn-expectations", "expected.json", "--odeattn-shard", f"{i}/2", "--odeattn-examples", "0",
                               "-k", "positions-rope or decode_rk4_layer_norm_rope_pad"],
                              capture_output=True, text=True, cwd=port, timeout=300)
        outcomes.append(done.stdout)
        assert done.returncode == 0, done.stdout + done.stderr
    listed = subprocess.run([str(script), "-p", "no:cacheprovider", "--collect-only", "-q", "--odeattn-backend", "myport:Port",
                             "--odeattn-shard", "1/2", "--odeattn-examples", "0", "-k", "rope"],
                            capture_output=True, text=True, cwd=port, timeout=300).stdout
    collected = sorted(re.findall(r"odeattn\[port/float64/(\S+)\]", listed))
    assert main(["conformance", "--list", "-k", "rope", "--shard", "1/2"]) == 0  # the plugin splits the cases -k selected
    assert collected == sorted(capsys.readouterr().out.split()) and len(collected) > 1
    assert re.search(rf"^{len(collected)}/{len(load_cases())} tests collected \(\d+ deselected\)", listed, re.M), listed  # counted
    everything = "".join(outcomes)
    assert len(re.findall(r"^XFAIL \S*odeattn\[port/float64/\S+_positions-rope\]", everything, re.M)) == 9
    assert "SKIPPED [1] " in everything and "not run: expected.json: expectations[1] (no cache yet)" in everything
    assert all(o.count("XFAIL") for o in outcomes)  # each shard holds some of the nine
