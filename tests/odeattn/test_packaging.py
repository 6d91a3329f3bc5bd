"""What `pip install odeattn` puts on the import path: ode_ref and odeattn, nothing generic."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_has_two_top_level_names_and_the_golden_set(tmp_path):
    source = tmp_path / "src"  # a copy, so that the build leaves nothing in the repository; without the
    # JavaScript workers' node_modules (hundreds of MB), which no package's data names
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                                "node_modules"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("odeattn-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info" not in n} == {"ode_ref", "odeattn"}
    golden = {Path(n).name for n in names if n.startswith("odeattn/conformance/golden/")}
    assert "manifest.json" in golden and len(golden) == 1 + len(list((ROOT / "conformance" / "golden").glob("*.safetensors")))
    assert "odeattn/conformance/seal.py" in names and "odeattn/backends/torch/block.py" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "odeattn = odeattn.cli:main" in entry_points
