"""Regenerate the committed gRPC code in percolake/v1 from proto/percolake/v1/*.proto.

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
PROTO_ROOT = ROOT / "proto"
OUT_PACKAGE = ROOT / "percolake" / "v1"

INIT = '"""Generated gRPC code for package percolake.v1: run scripts/gen_protos.py."""\n'


def generate(out_root: Path) -> None:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    bin_dir = Path(sys.executable).parent  # mypy-protobuf's plugins live beside python
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    subprocess.run(command, check=True, cwd=ROOT)
    (out_root / "percolake" / "v1" / "__init__.py").write_text(INIT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed code drifted")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / "percolake" / "v1"
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
