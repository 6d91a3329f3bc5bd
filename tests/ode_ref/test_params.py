import numpy as np
import pytest

import ode_ref as R

CFG = R.ODEConfig(hidden_size=8, num_heads=2)

SEED_KEYS = {
    "layer_norm": ["ode_func.norm.weight", "ode_func.norm.bias"],
    "rms_norm": ["ode_func.norm.weight"],
    "prms_norm": ["ode_func.norm.weight"],
    "flash_norm": [],
    "dynamic_tanh": ["ode_func.norm.alpha", "ode_func.norm.beta"],
    "derf": ["ode_func.norm.alpha", "ode_func.norm.s", "ode_func.norm.gamma", "ode_func.norm.beta"],
}


@pytest.mark.parametrize("norm", R.NORM_TYPES)
def test_names_are_the_seed_state_dict_keys(norm):
    cfg = R.ODEConfig(hidden_size=6, num_heads=2, norm_type=norm)
    shapes = R.param_shapes(cfg)
    assert list(shapes) == ["ode_func.qkv.weight", "ode_func.out_proj.weight"] + SEED_KEYS[norm]
    assert shapes["ode_func.qkv.weight"] == (18, 6)
    if norm == "derf":
        assert shapes["ode_func.norm.alpha"] == () and shapes["ode_func.norm.gamma"] == (6,)


def test_init_is_deterministic_and_documented_distribution():
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, norm_type="derf")
    a, b = R.init_params(cfg, seed=3), R.init_params(cfg, seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["ode_func.qkv.weight"], R.init_params(cfg, seed=4)["ode_func.qkv.weight"])
    assert np.abs(a["ode_func.qkv.weight"]).max() <= 0.25  # U(-1/sqrt(16), 1/sqrt(16))
    assert a["ode_func.norm.alpha"] == 1.0 and a["ode_func.norm.s"] == 0.0
    # a value written down once pins the generator stream (PCG64, uniform) across platforms and NumPy versions
    assert a["ode_func.qkv.weight"][0, 0] == -0.20717541642818782


@pytest.mark.parametrize("norm", R.NORM_TYPES)
def test_perturbed_norm_params_all_differ_from_identity(norm):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, norm_type=norm)
    ident, pert = R.init_params(cfg), R.init_params(cfg, perturb_norms=True)
    for k in R.param_shapes(cfg):
        if k.startswith("ode_func.norm."):
            assert (ident[k] != pert[k]).all()


@pytest.mark.parametrize("ext", [".safetensors", ".npz"])
def test_saved_params_load_back_unchanged(tmp_path, ext):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, norm_type="derf")
    p = R.init_params(cfg, perturb_norms=True)
    R.save_params(p, tmp_path / f"w{ext}")
    q = R.load_params(tmp_path / f"w{ext}")
    assert q.keys() == p.keys() and all(np.array_equal(p[k], q[k]) and p[k].shape == q[k].shape for k in p)


def _pickled_npz(d):
    np.savez(d / "obj.npz", a=np.array([object()], dtype=object))
    return d / "obj.npz"


def _junk_safetensors(d):
    (d / "junk.safetensors").write_bytes(b"not a safetensors file")
    return d / "junk.safetensors"


def _truncated_npz(d):
    R.save_params(R.init_params(R.ODEConfig(hidden_size=8, num_heads=2)), d / "p.npz")
    (d / "cut.npz").write_bytes((d / "p.npz").read_bytes()[:300])
    return d / "cut.npz"


def _npz_of_text(d):
    import zipfile

    with zipfile.ZipFile(d / "odd.npz", "w") as z:
        z.writestr("readme.txt", "hello")
    return d / "odd.npz"


def _pickle_named_npz(d):
    import pickle

    (d / "w.npz").write_bytes(pickle.dumps({"ode_func.qkv.weight": np.zeros((24, 8))}))
    return d / "w.npz"


def _npy_named_npz(d):
    np.save(d / "w.npy", np.zeros(3))
    (d / "w.npy").rename(d / "w.npz")
    return d / "w.npz"


def _text_named_npz(d):
    (d / "w.npz").write_text("ode_func.qkv.weight = 0\n")
    return d / "w.npz"


def _empty_npz(d):
    (d / "w.npz").write_bytes(b"")
    return d / "w.npz"


@pytest.mark.parametrize("make_file, why", [
    pytest.param(_pickle_named_npz, "it is a pickle, which is never loaded", id="pickle-named-npz"),
    pytest.param(_npy_named_npz, "it is a single .npy array", id="npy-named-npz"),
    pytest.param(_text_named_npz, "it starts with b'ode_fu'", id="text-named-npz"),
    pytest.param(_empty_npz, "it is empty", id="empty-npz"),
    pytest.param(_pickled_npz, "member 'a.npy': it holds pickled objects, which are never loaded", id="object-array-member"),
])
def test_a_file_named_npz_that_is_not_an_archive_of_arrays_is_refused_by_name(tmp_path, make_file, why):
    """np.load takes any file that is not a zip archive for a pickle, and refuses it with advice on
    unpickling that names no file; none of that reaches the user."""
    path = make_file(tmp_path)
    with pytest.raises(ValueError) as info:
        R.load_params(path)
    message = str(info.value)
    assert message.startswith(f"params file {str(path)!r}: not a NumPy .npz archive of arrays (") and why in message
    assert "allow_pickle" not in message and "pickle.load" not in message


@pytest.mark.parametrize("make_file, error, message", [
    pytest.param(_pickled_npz, ValueError, "pickled", id="pickled-object-array"),
    pytest.param(_junk_safetensors, ValueError, "not a readable safetensors file", id="not-safetensors"),
    pytest.param(lambda d: d / "w.pt", ValueError, r"expected a name ending in .safetensors or .npz; got '.*w.pt'",
                 id="unknown-extension"),
    pytest.param(lambda d: d / "missing.npz", FileNotFoundError, "no such file", id="missing-file"),
    pytest.param(_truncated_npz, ValueError, r"'.*cut.npz': not a readable .npz file", id="truncated-npz"),
    pytest.param(_npz_of_text, ValueError, r"member 'readme.txt' is not an .npy array", id="npz-member-not-an-array"),
])
def test_load_refuses_pickles_and_bad_files(tmp_path, make_file, error, message):
    path = make_file(tmp_path)
    with pytest.raises(error, match=message):
        R.load_params(path)


@pytest.mark.parametrize("ext", [".npz", ".safetensors"])
def test_save_refuses_an_object_array_and_writes_nothing(tmp_path, ext):
    params = R.init_params(R.ODEConfig(hidden_size=8, num_heads=2))
    with pytest.raises(ValueError, match=r"params\['extra'\]: expected a numeric array; got dtype object"):
        R.save_params({**params, "extra": np.array([object()], dtype=object)}, tmp_path / f"o{ext}")
    assert not (tmp_path / f"o{ext}").exists()


def test_save_into_a_missing_folder_is_refused(tmp_path):
    params = R.init_params(R.ODEConfig(hidden_size=8, num_heads=2))
    with pytest.raises(OSError, match=r"params file '.*/missing/w.safetensors': cannot be written"):
        R.save_params(params, tmp_path / "missing" / "w.safetensors")


def test_a_failed_save_leaves_the_file_that_was_there_unchanged(tmp_path):
    """Written whole or not at all (ode_ref.files.replacing): a dtype safetensors cannot store
    (float128) is refused by name, and the user's existing file keeps its bytes, no temporary left."""
    if not hasattr(np, "float128"):
        pytest.skip("this platform's NumPy has no float128")
    path = tmp_path / "w.safetensors"
    R.save_params(R.init_params(CFG), path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"^params\['x'\]: dtype float128 cannot be stored in the safetensors file"):
        R.save_params({"x": np.zeros(2, np.float128)}, path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


@pytest.mark.parametrize("name", ["W.NPZ", "W.Npz", "W.SAFETENSORS"])
def test_the_suffix_is_read_in_any_case_by_save_and_load_alike(tmp_path, name):
    """save_params('W.NPZ') writes W.NPZ itself (not W.NPZ.npz), which load_params reads back."""
    params = R.init_params(CFG)
    R.save_params(params, tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    back = R.load_params(tmp_path / name)
    assert all(np.array_equal(back[k], v) for k, v in params.items()) and set(back) == set(params)


def test_a_save_keeps_the_permissions_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "w.npz"
    path.write_bytes(b"old")
    path.chmod(0o640)
    R.save_params(R.init_params(CFG), path)
    assert path.stat().st_mode & 0o777 == 0o640
