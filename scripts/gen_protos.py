"""Regenerate the committed gRPC code in wire/v1 from proto/percolake/v1/*.proto.

    .venv/bin/python scripts/gen_protos.py          # regenerate
    .venv/bin/python scripts/gen_protos.py --check  # exit 1 if the committed code drifted

The generated modules (and their .pyi stubs from mypy-protobuf) are committed so that
users need no code generator; a test runs --check.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto" / "percolake" / "v1"
# The protobuf package stays percolake.v1 (its directory in proto/ follows it, as buf lints);
# the Python modules live in the bottom layer, wire/v1. protoc's virtual path maps one onto
# the other, so the generated imports need no rewriting.
PYTHON_PACKAGE = "wire/v1"
OUT_PACKAGE = ROOT / PYTHON_PACKAGE

INIT = '"""Generated gRPC code for protobuf package percolake.v1: run scripts/gen_protos.py."""\n'


def generate(out_root: Path) -> None:
    protos = sorted(str(p.relative_to(ROOT)) for p in PROTO_DIR.glob("*.proto"))
    bin_dir = Path(sys.executable).parent  # mypy-protobuf's plugins live beside python
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PYTHON_PACKAGE}={PROTO_DIR.relative_to(ROOT)}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    subprocess.run(command, check=True, cwd=ROOT)
    (out_root / PYTHON_PACKAGE / "__init__.py").write_text(INIT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed code drifted")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / PYTHON_PACKAGE
        if args.check:
            names = sorted(p.name for p in fresh.iterdir() if p.is_file())
            committed = sorted(p.name for p in OUT_PACKAGE.glob("*") if p.is_file())
            _, mismatch, errors = filecmp.cmpfiles(fresh, OUT_PACKAGE, names, shallow=False)
            if mismatch or errors or names != committed:
                print(f"generated code drifted from proto/: {mismatch + errors or committed}")
                return 1
            return 0
        if OUT_PACKAGE.exists():
            shutil.rmtree(OUT_PACKAGE)
        shutil.copytree(fresh, OUT_PACKAGE)
    print(f"regenerated {OUT_PACKAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
